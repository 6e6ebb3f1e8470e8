"""Integer EGGROLL in JAX: nano-egg's QEggRoll noiser and EGG model (spec/int8.py states the math), in int8/int32.

Upstream's Model style (jax_reference.models: CommonInit, Model, call_submodule, simple_es_tree_key): `QParameter`,
`QEmbedding`, `QMM`, `QMLP`, `EggLN`, `EggGRU`, `EggLayer`, `EGG`, each routing its leaf through the noiser, and
`QEggRoll` with nano-egg's noiser methods (init_noiser, do_mm, do_emb, get_noisy_standard, convert_fitnesses,
do_updates). Written from nano-egg's run.py at a04bab2 (GPL-3.0): facts only, no code copied.

Two departures in how, none in what:
- The 1 GiB noise table is never built. A window's entries are computed from their counters: bits(j) = y0 ^ y1
  of threefry2x32(key(seed) words; 0, j) (`jax.extend.random.threefry2x32_p`, what partitionable
  `jax.random.bits` computes for element j), looked up in an 8 MiB int8 table of int8(normal * 16) over the
  2^23 values of bits >> 9. That table is JAX's own `jax.random.normal` applied to the 2^23 patterns, through a
  PRNG implementation (`jax.extend.random.define_prng_impl`) whose random bits are `iota << 9`; so it is exact on
  the backend that builds it. Tests compare windows with `jax.random.normal(key(seed), (n,))` directly.
- LOG2TABLE (2^28 entries) is never built: `log2_entries` computes the entries a loss needs with integer
  thresholds (spec.int8.log2_entry), equal to nano-egg's float64 formula (tested at all 2^28 indices). DIVISION
  is computed, not looked up (`ln_divide`, tested against nano-egg's table built with jnp, entry by entry).
The forward (`CachedQEggRoll`) takes each member's noise drawn once per epoch rather than per token as nano-egg's
graph does (`QEggRoll`, drawing inside every op, is kept and tested to give the same numbers).
"""
from __future__ import annotations

from functools import lru_cache, partial
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.extend.random import define_prng_impl, threefry2x32_p

from jax_reference import emulation
from jax_reference.models import CommonInit, Model, call_submodule, merge_inits, noiser_args, simple_es_tree_key
from spec.int8 import (FIXED_POINT, HASH_MULT, LOG2_THRESHOLDS, LOGMAX, LUT_BITS, MAX, TABLE_MASK, TABLE_SIZE,
                       Int8Config, exp2_table, out_divisor)

PARAM, MM_PARAM, EMB_PARAM = 0, 1, 2     # QEggRoll's es_map: full rank, low rank, embedding (low rank too)
I8, I16, I32, U32 = jnp.int8, jnp.int16, jnp.int32, jnp.uint32


# ----------------------------------------------------------------------------- the noise table, window by window
def _pattern_bits(key, bit_width, shape):
    """Random bits that are `iota << 9`: element m carries the 23-bit pattern m (what the normal reads)."""
    del key
    if bit_width != 32:
        raise TypeError("the pattern generator only serves float32 draws")
    size = int(np.prod(shape))
    return lax.shift_left(lax.iota(U32, size), U32(32 - LUT_BITS)).reshape(shape)


_PATTERNS = define_prng_impl(
    key_shape=(1,), seed=lambda seed: jnp.zeros((1,), U32), split=lambda key, shape: jnp.zeros((*shape, 1), U32),
    random_bits=_pattern_bits, fold_in=lambda key, data: key, name="int8_lut_patterns")


def _pattern_normals(backend: str) -> jax.Array:
    """(2^23,) float32: JAX's normal of every value of bits >> 9, on this backend ("native": jax.random.normal
    itself) or another's (jax_reference.normals' table)."""
    if backend == "native":
        return jax.random.normal(jax.random.key(0, impl=_PATTERNS), (2 ** LUT_BITS,), jnp.float32)
    from jax_reference import normals
    return jnp.asarray(normals.normal_table(backend))


@lru_cache(maxsize=3)
def _normal_lut(backend: str) -> jax.Array:
    return (_pattern_normals(backend) * (2 ** FIXED_POINT)).astype(I8)


@lru_cache(maxsize=3)
def _init_lut(backend: str) -> jax.Array:
    return jnp.round(_pattern_normals(backend) * (2 ** FIXED_POINT)).astype(I8)


def normal_lut() -> jax.Array:
    """(2^23,) int8: int8(normal * 16) for every value of bits >> 9, by jax.random.normal itself (8 MiB); under
    jax_reference.emulation's normals, by that backend's normal (the same look-up: tests/parity/core/test_platform.py)."""
    return _normal_lut(emulation.normals_backend())


def init_lut() -> jax.Array:
    """(2^23,) int8: round(normal * 16) (half to even) for every value of bits >> 9: nano-egg's init, by pattern."""
    return _init_lut(emulation.normals_backend())


def table_key(seed: int) -> jax.Array:
    """The table's key words: key_data(key(seed)), (2,) uint32 = (0, seed)."""
    return jax.random.key_data(jax.random.key(seed))


def table_bits(key_words, counters):
    """bits(j) = y0 ^ y1 of threefry2x32(key_words; 0, j) for uint32 counters j < 2^30 (any shape)."""
    counters = jnp.asarray(counters, U32)
    # the high counter words are 0 (j < 2^30); written as counters & 0 so that, under vmap, both count words are
    # batched alike (the primitive's lowering wants them the same shape; zeros_like would come out unbatched)
    y0, y1 = threefry2x32_p.bind(jnp.asarray(key_words[0], U32), jnp.asarray(key_words[1], U32),
                                 counters & U32(0), counters)
    return y0 ^ y1


def table_entries(lut, key_words, counters):
    """TABLE[j] for uint32 counters j: LUT[bits(j) >> 9] (int8)."""
    return lut[(table_bits(key_words, counters) >> U32(32 - LUT_BITS)).astype(I32)]


def pair_hash(pair):
    """h(x) = ((x >> 16) ^ x) * 0x45d9f3b in int32 (wraps), as uint32 bits."""
    x = jnp.asarray(pair, I32)
    return lax.bitcast_convert_type(((x >> 16) ^ x) * I32(HASH_MULT), U32)


def window_start(leaf_key, true_ep, pair):
    """(key_data(fold_in(leaf_key, true_epoch))[0] ^ h(pair)) & (2^30 - 1), uint32 (unclamped)."""
    word0 = jax.random.key_data(jax.random.fold_in(leaf_key, true_ep))[0]
    return (word0 ^ pair_hash(pair)) & U32(TABLE_MASK)


def window(lut, key_words, start, n: int):
    """TABLE[c : c + n] with c = min(start, 2^30 - n) (dynamic_slice's clamp): (n,) int8."""
    c = jnp.minimum(jnp.asarray(start, U32), U32(TABLE_SIZE - n))
    return table_entries(lut, key_words, c + lax.iota(U32, n))


def true_epoch(epoch, noise_reuse: int):
    return jnp.zeros_like(epoch) if noise_reuse == 0 else epoch // noise_reuse


def member_window(noiser_params, frozen_noiser_params, iterinfo, key, n: int):
    """(window (n,) int8, sign +1/-1 int8) of member iterinfo = (epoch, thread_id) for the leaf with key."""
    epoch, thread_id = iterinfo
    start = window_start(key, true_epoch(jnp.asarray(epoch, I32), frozen_noiser_params["noise_reuse"]),
                         jnp.asarray(thread_id, I32) >> 1)
    sign = jnp.where(jnp.asarray(thread_id, I32) % 2 == 0, 1, -1).astype(I8)
    return window(noiser_params["NORMAL_LUT"], noiser_params["TABLE_KEY"], start, n), sign


def lowrank_factors(noiser_params, frozen_noiser_params, iterinfo, shape, key):
    """(A (a, r) int8 with the member's sign, B (b, r) int8) for a leaf stored (a, b): B first in the window."""
    a, b = shape
    r = frozen_noiser_params["rank"]
    w, sign = member_window(noiser_params, frozen_noiser_params, iterinfo, key, (a + b) * r)
    w = w.reshape(a + b, r)
    return w[b:] * sign, w[:b]


def fullrank_noise(noiser_params, frozen_noiser_params, iterinfo, shape, key):
    """E (shape) int32: W[2i] * W[2i + 1] times the member's sign."""
    size = int(np.prod(shape))
    w, sign = member_window(noiser_params, frozen_noiser_params, iterinfo, key, 2 * size)
    pairs = w.reshape(tuple(shape) + (2,)).astype(I32)
    return pairs[..., 0] * pairs[..., 1] * sign.astype(I32)


# ----------------------------------------------------------------------------- integer helpers
def _static(frozen_noiser_params) -> tuple:
    """The noiser's frozen settings as a hashable tuple of items: what a jitted function takes as its static part."""
    return tuple(sorted(frozen_noiser_params.items()))


def clip8(v):
    """clip(v, -127, 127) as int8."""
    return jnp.clip(v, -MAX, MAX).astype(I8)


def clipped_add(*values):
    """clip(sum in int32) as int8."""
    return clip8(sum(v.astype(I32) for v in values))


def ln_divide(numerator, m):
    """DIVISION[m][numerator]: clip(int16(numerator) // m), row 0 as XLA divides by zero (-1 for 0, else -2)."""
    v = jnp.asarray(numerator).astype(I16).astype(I32)
    m = jnp.asarray(m, I32)
    q = jnp.floor_divide(v, jnp.maximum(m, 1))
    return clip8(jnp.where(m == 0, jnp.where(v == 0, -1, -2), q))


def log2_entries(k):
    """LOG2TABLE[k] = int32(log2((k + 1) / 16) * 16) for int32 k in [0, 2^28), exactly (spec.int8.log2_entry)."""
    n = jnp.asarray(k, I32) + 1
    e = 31 - lax.clz(n)
    thresholds = jnp.asarray(np.array(LOG2_THRESHOLDS, dtype=np.int32))        # (29, 16)
    m = 16 * e + jnp.sum(n[..., None] >= thresholds[e][..., 1:], axis=-1).astype(I32)
    exact = (n & (n - 1)) == 0
    return jnp.where((n >= 16) | exact, m - 64, m - 63)


EXP2_TABLE = np.array(exp2_table(), dtype=np.int32)


def int_log_likelihood(logits, target):
    """ll = z[target] - LOG2[sum_v EXP2[z_v] - 1], z = logits + 128 (1/16 bit), int32."""
    z = logits.astype(I32) + 128
    return z[target] - log2_entries(jnp.sum(jnp.asarray(EXP2_TABLE)[z]) - 1)


# ----------------------------------------------------------------------------- the noiser
class QEggRoll:
    """nano-egg's integer noiser. noiser_params: TABLE_KEY (2,) uint32, NORMAL_LUT (2^23,) int8, sigma_shift,
    update_threshold (int32 scalars); frozen: noise_reuse, rank, use_clt, fast_fitness."""

    @classmethod
    def init_noiser(cls, params, sigma_shift, update_threshold, *args, noise_seed=0, noise_reuse=1, rank=1,
                    use_clt=True, fast_fitness=True, **kwargs):
        frozen = {"noise_reuse": int(noise_reuse), "rank": int(rank), "use_clt": bool(use_clt),
                  "fast_fitness": bool(fast_fitness)}
        return frozen, {"TABLE_KEY": table_key(noise_seed), "NORMAL_LUT": normal_lut(),
                        "sigma_shift": jnp.int32(sigma_shift), "update_threshold": jnp.int32(update_threshold)}

    # what an op reads for its leaf: drawn here from the key (nano-egg's graph); CachedQEggRoll reads it given
    @classmethod
    def _lowrank(cls, frozen_noiser_params, noiser_params, param, key, iterinfo):
        return lowrank_factors(noiser_params, frozen_noiser_params, iterinfo, param.shape, key)

    @classmethod
    def _fullrank(cls, frozen_noiser_params, noiser_params, param, key, iterinfo):
        return fullrank_noise(noiser_params, frozen_noiser_params, iterinfo, param.shape, key)

    @classmethod
    def do_mm(cls, frozen_noiser_params, noiser_params, param, base_key, iterinfo, x):
        """clip((x W^T [+ ((x B) A^T) >> (4 + ss)]) // (16 isqrt(in))): x (in,) int8 -> (out,) int8."""
        acc = jnp.dot(x.astype(I32), param.T.astype(I32))
        if iterinfo is not None:
            A, B = cls._lowrank(frozen_noiser_params, noiser_params, param, base_key, iterinfo)
            perturbation = jnp.dot(x.astype(I32), B.astype(I32)) @ A.T.astype(I32)
            acc = acc + (perturbation >> (FIXED_POINT + noiser_params["sigma_shift"]))
        return clip8(jnp.floor_divide(acc, out_divisor(param.shape[-1])))

    @classmethod
    def do_emb(cls, frozen_noiser_params, noiser_params, param, base_key, iterinfo, x):
        """E[tok] [then clip(E[tok] + ((A[tok] B^T) >> (4 + ss)))]."""
        row = param[x]
        if iterinfo is None:
            return row
        A, B = cls._lowrank(frozen_noiser_params, noiser_params, param, base_key, iterinfo)
        perturbation = jnp.dot(A[x].astype(I32), B.T.astype(I32))
        return clip8(row.astype(I32) + (perturbation >> (FIXED_POINT + noiser_params["sigma_shift"])))

    @classmethod
    def get_noisy_standard(cls, frozen_noiser_params, noiser_params, param, base_key, iterinfo):
        """P [then clip(P + (E >> (4 + ss)))]."""
        if iterinfo is None:
            return param
        E = cls._fullrank(frozen_noiser_params, noiser_params, param, base_key, iterinfo)
        return clip8(param.astype(I32) + (E >> (FIXED_POINT + noiser_params["sigma_shift"])))

    @classmethod
    def convert_fitnesses(cls, frozen_noiser_params, noiser_params, raw_scores, num_episodes_list=None):
        """sign(s_2k - s_2k+1) as int8, (pop/2,) (fast_fitness: the only path nano-egg can run)."""
        paired = jnp.reshape(raw_scores, (-1, 2))
        return jnp.sign(paired[:, 0] - paired[:, 1]).astype(I8)

    @classmethod
    def leaf_votes(cls, frozen_noiser_params, noiser_params, param, key, fitnesses, epoch, es_class):
        """Z (param's shape, int32): sum_k f_k N_k over pairs k, each with thread 2k's (+) noise."""
        return _leaf_votes(_static(frozen_noiser_params), int(es_class), noiser_params, param, key, fitnesses, epoch)

    @classmethod
    def apply_votes(cls, frozen_noiser_params, noiser_params, param, Z, pairs: int):
        """P moves by +1 (Z > 0) or -1 (Z <= 0) where |Z| * 16 >= thr * isqrt(pairs) * (256 if use_clt else 1)."""
        scale = (4 ** FIXED_POINT) if frozen_noiser_params["use_clt"] else 1
        bound = noiser_params["update_threshold"] * int(np.sqrt(pairs)) * scale
        p = param.astype(I32)
        moved = jnp.where(Z > 0, p + 1, p - 1)
        return clip8(jnp.where(jnp.abs(Z) * (2 ** FIXED_POINT) < bound, p, moved))

    @classmethod
    def do_updates(cls, frozen_noiser_params, noiser_params, params, base_keys, fitnesses, epoch, es_map):
        """(noiser_params, new params): every leaf voted on by the pairs; stacked leaves slice by slice."""
        pairs = fitnesses.shape[0]

        def one(param, key, es_class):
            Z = cls.leaf_votes(frozen_noiser_params, noiser_params, param, key, fitnesses, epoch, es_class)
            return cls.apply_votes(frozen_noiser_params, noiser_params, param, Z, pairs)

        def leaf(param, key, es_class):
            if key.shape == ():
                return one(param, key, es_class)
            return jax.vmap(lambda p, k: one(p, k, es_class))(param, key)
        return noiser_params, jax.tree.map(leaf, params, base_keys, es_map)


@partial(jax.jit, static_argnums=(0, 1))
def _leaf_votes(frozen_items, es_class, noiser_params, param, key, fitnesses, epoch):
    """QEggRoll.leaf_votes jitted once per settings, class and shapes: integer arithmetic, so the same integers as
    op by op (which ran a few hundred small kernels per leaf)."""
    frozen_noiser_params = dict(frozen_items)
    pairs = fitnesses.shape[0]
    iterinfos = (jnp.full((pairs,), epoch, I32), 2 * jnp.arange(pairs, dtype=I32))
    f = fitnesses.astype(I32)
    use_clt = frozen_noiser_params["use_clt"]
    if es_class == PARAM:
        E = jax.vmap(lambda it: fullrank_noise(noiser_params, frozen_noiser_params, it, param.shape, key))(
            iterinfos)
        E = E if use_clt else jnp.sign(E)
        return jnp.einsum("n,n...->...", f, E)
    A, B = jax.vmap(lambda it: lowrank_factors(noiser_params, frozen_noiser_params, it, param.shape, key))(
        iterinfos)
    A, B = A.astype(I32), B.astype(I32)
    if not use_clt:
        A, B = jnp.sign(A), jnp.sign(B)
    return jnp.einsum("nir,njr->ij", f[:, None, None] * A, B)


def tree_votes(frozen_noiser_params, noiser_params, params, es_tree_key, es_map, fitnesses, epoch):
    """{leaf: Z} shaped like params: QEggRoll.leaf_votes of every leaf (stacked leaves slice by slice, as do_updates
    votes), in one jitted program per settings and tree where leaf by leaf compiles one per leaf shape and class (the
    same integers; at d16 L2, 3.3 s of compiling against 4.3 s)."""
    return _tree_votes(_static(frozen_noiser_params), noiser_params, params, es_tree_key,
                       tuple(int(c) for c in jax.tree.leaves(es_map)), jnp.asarray(fitnesses), jnp.int32(epoch))


@partial(jax.jit, static_argnums=(0, 4))
def _tree_votes(frozen_items, noiser_params, params, es_tree_key, es_map_leaves, fitnesses, epoch):
    es_map = jax.tree.unflatten(jax.tree.structure(params), list(es_map_leaves))

    def leaf(param, key, es_class):
        one = lambda p, k: _leaf_votes(frozen_items, es_class, noiser_params, p, k, fitnesses, epoch)   # noqa: E731
        return one(param, key) if key.shape == () else jax.vmap(one)(param, key)
    return jax.tree.map(leaf, params, es_tree_key, es_map)


class CachedQEggRoll(QEggRoll):
    """QEggRoll whose ops read each leaf's noise given in place of its key ((A, B) or E, drawn by member_noise)."""

    @classmethod
    def _lowrank(cls, frozen_noiser_params, noiser_params, param, key, iterinfo):
        return key

    @classmethod
    def _fullrank(cls, frozen_noiser_params, noiser_params, param, key, iterinfo):
        return key


def member_noise(noiser_params, frozen_noiser_params, params, es_tree_key, es_map, iterinfo):
    """The member's noise per leaf (slices stacked like the leaf): (A, B) for low rank, E for full rank; jitted once
    per settings and shapes (integer arithmetic: the integers of an op-by-op run)."""
    return _member_noise(_static(frozen_noiser_params), tuple(jax.tree.leaves(es_map)), noiser_params, params,
                         es_tree_key, iterinfo)


@partial(jax.jit, static_argnums=(0, 1))
def _member_noise(frozen_items, es_map_leaves, noiser_params, params, es_tree_key, iterinfo):
    frozen_noiser_params = dict(frozen_items)
    es_map = jax.tree.unflatten(jax.tree.structure(params), list(es_map_leaves))

    def leaf(param, key, es_class):
        draw = ((lambda p, k: fullrank_noise(noiser_params, frozen_noiser_params, iterinfo, p.shape, k))
                if es_class == PARAM else
                (lambda p, k: lowrank_factors(noiser_params, frozen_noiser_params, iterinfo, p.shape, k)))
        if key.shape == ():
            return draw(param, key)
        return jax.vmap(draw)(param, key)
    return jax.tree.map(leaf, params, es_tree_key, es_map)


# ----------------------------------------------------------------------------- the model (nano-egg's EGG)
def _int8_normal(key, shape):
    """round(normal(key, shape) * 16) as int8 (round half to even)."""
    return jnp.round(emulation.normal(key, shape) * (2 ** FIXED_POINT)).astype(I8)


class QParameter(Model):
    """A full-rank leaf (biases, norm weights), read through get_noisy_standard."""

    @classmethod
    def rand_init(cls, key, raw_value, *args, **kwargs):
        return CommonInit(None, raw_value.astype(I8), (), PARAM)

    @classmethod
    def _forward(cls, common_params, *args, **kwargs):
        return common_params.noiser.get_noisy_standard(*noiser_args(common_params))


class QEmbedding(Model):
    """(vocab, d) int8, read through do_emb (low-rank noise on the stored shape, A's row picked by the token)."""

    @classmethod
    def rand_init(cls, key, vocab, d, *args, **kwargs):
        return CommonInit(None, _int8_normal(key, (vocab, d)), (), EMB_PARAM)

    @classmethod
    def _forward(cls, common_params, x, *args, **kwargs):
        return common_params.noiser.do_emb(*noiser_args(common_params), x)


class QMM(Model):
    """(out, in) int8, read through do_mm."""

    @classmethod
    def rand_init(cls, key, in_dim, out_dim, *args, **kwargs):
        return CommonInit(None, _int8_normal(key, (out_dim, in_dim)), (), MM_PARAM)

    @classmethod
    def _forward(cls, common_params, x, *args, **kwargs):
        return common_params.noiser.do_mm(*noiser_args(common_params), x)


class QLinear(Model):
    """{"weight": QMM} (nano-egg's MLP builds its Linears without bias)."""

    @classmethod
    def rand_init(cls, key, in_dim, out_dim, *args, **kwargs):
        return merge_inits(weight=QMM.rand_init(key, in_dim, out_dim))

    @classmethod
    def _forward(cls, common_params, x, *args, **kwargs):
        return call_submodule(QMM, "weight", common_params, x)


class QMLP(Model):
    """{"0": d -> 4d, "1": 4d -> d}, keys split(key, 2); no activation between (identity at a04bab2)."""

    @classmethod
    def rand_init(cls, key, d, *args, **kwargs):
        k = jax.random.split(key, 2)
        return merge_inits(**{"0": QLinear.rand_init(k[0], d, 4 * d), "1": QLinear.rand_init(k[1], 4 * d, d)})

    @classmethod
    def _forward(cls, common_params, x, inter=None, *args, **kwargs):
        hidden = call_submodule(QLinear, "0", common_params, x)
        if inter is not None:
            inter["mlp.0"] = hidden
        return call_submodule(QLinear, "1", common_params, hidden)


class EggLN(Model):
    """DIV[max(sum |x|, 1) // d][x * w]: an L1 norm without centring; weight init 16."""

    @classmethod
    def rand_init(cls, key, d, *args, **kwargs):
        return merge_inits(weight=QParameter.rand_init(None, jnp.full((d,), 2 ** FIXED_POINT, I8)))

    @classmethod
    def _forward(cls, common_params, x, *args, **kwargs):
        w = call_submodule(QParameter, "weight", common_params).astype(I32)
        m = jnp.maximum(jnp.sum(jnp.abs(x).astype(I32)), 1) // x.shape[-1]
        return ln_divide(x.astype(I32) * w, m)


class EggGRU(Model):
    """nano-egg's integer GRU: {Wf, Uf, bf, Wh, Uh, bh}; matrices keyed split(key, 4) as Wf, Uf, Wh, Uh."""

    @classmethod
    def rand_init(cls, key, d, *args, **kwargs):
        k = jax.random.split(key, 4)
        zeros = jnp.zeros((d,), I8)
        return merge_inits(Wf=QMM.rand_init(k[0], d, d), Uf=QMM.rand_init(k[1], d, d),
                           bf=QParameter.rand_init(None, zeros), Wh=QMM.rand_init(k[2], d, d),
                           Uh=QMM.rand_init(k[3], d, d), bh=QParameter.rand_init(None, zeros))

    @classmethod
    def _forward(cls, common_params, x, state, inter=None, *args, **kwargs):
        c = common_params
        f = clipped_add(call_submodule(QMM, "Wf", c, x), call_submodule(QMM, "Uf", c, state),
                        call_submodule(QParameter, "bf", c))
        gate = f.astype(I32) + MAX                                              # [0, 254]
        gated = ((gate * state.astype(I32)) >> (LOGMAX + 1)).astype(I8)
        cand = clipped_add(call_submodule(QMM, "Wh", c, x), call_submodule(QMM, "Uh", c, gated),
                           call_submodule(QParameter, "bh", c))
        step = ((gate * (cand.astype(I32) - state.astype(I32))) >> (LOGMAX + 1)).astype(I8)
        new = state + step                                                      # int8, wrapping (never shows)
        if inter is not None:
            inter.update(f=f, gated=gated, cand=cand, state=new)
        return new, new


class EggLayer(Model):
    """ln1 -> gru (+ residual) -> ln2 -> mlp (+ residual); keys split(key, 2) -> att, mlp."""

    @classmethod
    def rand_init(cls, key, d, *args, **kwargs):
        att_key, mlp_key = jax.random.split(key)
        return merge_inits(ln1=EggLN.rand_init(None, d), att=EggGRU.rand_init(att_key, d),
                           ln2=EggLN.rand_init(None, d), mlp=QMLP.rand_init(mlp_key, d))

    @classmethod
    def _forward(cls, common_params, x, state, inter=None, *args, **kwargs):
        c = common_params
        u = call_submodule(EggLN, "ln1", c, x)
        y, state = call_submodule(EggGRU, "att", c, u, state, inter)
        y = clipped_add(y, x)
        v = call_submodule(EggLN, "ln2", c, y)
        m = call_submodule(QMLP, "mlp", c, v, inter)
        out = clipped_add(m, y)
        if inter is not None:
            inter.update(ln1=u, att=y, ln2=v, mlp=m, out=out)
        return out, state


class EGG(Model):
    """emb -> n_layer EggLayers (one lax.scan over stacked params, keys and states) -> ln_out -> head."""

    @classmethod
    def rand_init(cls, key, vocab, n_layer, d, *args, **kwargs):
        key_emb, key_blocks, key_head = jax.random.split(key, 3)
        layers = [EggLayer.rand_init(k, d) for k in jax.random.split(key_blocks, n_layer)]
        stacked = jax.tree.map(lambda *xs: jnp.stack(xs), *[layer.params for layer in layers])
        scan_map = jax.tree.map(lambda _: (0,), layers[0].params)
        blocks = CommonInit(None, stacked, scan_map, layers[0].es_map)
        return merge_inits(emb=QEmbedding.rand_init(key_emb, vocab, d), blocks=blocks,
                           ln_out=EggLN.rand_init(None, d), head=QMM.rand_init(key_head, d, vocab))

    @classmethod
    def default_state(cls, params):
        """(n_layer, d) int8 zeros."""
        return jnp.zeros_like(params["blocks"]["att"]["bh"])

    @classmethod
    def _forward(cls, common_params, x, state, collect=False, *args, **kwargs):
        """(logits (256,), new state (n_layer, d)) for input byte x; collect=True adds a third value, the
        intermediates {"emb", "blocks": {name: (n_layer, ...)}, "ln_out"} (TRACE_NAMES)."""
        c = common_params
        e = call_submodule(QEmbedding, "emb", c, x)

        def body(h, inputs):
            params_l, keys_l, state_l = inputs
            inter = {} if collect else None
            h, state_l = EggLayer._forward(c._replace(params=params_l, es_tree_key=keys_l), h, state_l, inter)
            return h, (state_l, inter)
        h, (state, blocks) = lax.scan(body, e, (c.params["blocks"], c.es_tree_key["blocks"], state))
        y = call_submodule(EggLN, "ln_out", c, h)
        logits = call_submodule(QMM, "head", c, y)
        if not collect:
            return logits, state
        return logits, state, {"emb": e, "blocks": blocks, "ln_out": y}


# ----------------------------------------------------------------------------- keys, init, scoring
class Int8Init(NamedTuple):
    params: dict
    scan_map: dict
    es_map: dict
    es_tree_key: dict


def run_keys(seed: int):
    """(master, model_key, es_key): key(seed), fold_in(master, 0), fold_in(master, 1)."""
    master = jax.random.key(seed)
    return master, jax.random.fold_in(master, 0), jax.random.fold_in(master, 1)


def init_int8(cfg: Int8Config, seed: int) -> Int8Init:
    """EGG.rand_init(model_key, ...) and simple_es_tree_key(params, es_key, scan_map)."""
    _, model_key, es_key = run_keys(seed)
    init = EGG.rand_init(model_key, cfg.vocab, cfg.n_layer, cfg.n_embd)
    return Int8Init(init.params, init.scan_map, init.es_map,
                    simple_es_tree_key(init.params, es_key, init.scan_map))


def no_keys(params):
    return jax.tree.map(lambda _: None, params)


def member_scores(noiser, frozen_noiser_params, noiser_params, params, keys, iterinfo, inputs, targets, state):
    """(sum of ll over the tokens (int32), final state): the state zeroed before every input byte 0."""
    def step(state, tok):
        inp, tgt = tok
        state = lax.select(inp == 0, jnp.zeros_like(state), state)
        logits, state = EGG.forward(noiser, frozen_noiser_params, noiser_params, None, params, keys, iterinfo,
                                    inp, state)
        return state, int_log_likelihood(logits, tgt)
    state, lls = lax.scan(step, state, (inputs, targets))
    return jnp.sum(lls), state


# One member's intermediates per token, in forward order (what a parity check names when two sides part):
# per block l, "blocks.{l}.{name}" for name in BLOCK_TRACE; (T, d) each, "mlp.0" (T, 4d).
BLOCK_TRACE = ("ln1", "f", "gated", "cand", "state", "att", "ln2", "mlp.0", "mlp", "out")


def trace_names(n_layer: int) -> list[str]:
    """["emb", "blocks.0.ln1", ..., "blocks.{L-1}.out", "ln_out", "logits", "ll"]: the forward's order."""
    return ["emb"] + [f"blocks.{l}.{name}" for l in range(n_layer) for name in BLOCK_TRACE] + ["ln_out", "logits", "ll"]


def member_trace(noiser, frozen_noiser_params, noiser_params, params, keys, iterinfo, inputs, targets, state):
    """member_scores's run with every intermediate kept: {trace_names(L)[i]: (T, ...)} and the final state; jitted
    once per noiser, settings and shapes (op by op, its scan was traced and compiled again at every call)."""
    trace, state = _member_trace(noiser, _static(frozen_noiser_params), noiser_params, params, keys, iterinfo, inputs,
                                 targets, state)
    n_layer = sum(name.startswith("blocks.") and name.endswith(".out") for name in trace)
    return {name: trace[name] for name in trace_names(n_layer)}, state     # forward order (jit sorts a dict's keys)


@partial(jax.jit, static_argnums=(0, 1))
def _member_trace(noiser, frozen_items, noiser_params, params, keys, iterinfo, inputs, targets, state):
    frozen_noiser_params = dict(frozen_items)

    def step(state, tok):
        inp, tgt = tok
        state = lax.select(inp == 0, jnp.zeros_like(state), state)
        logits, state, inter = EGG.forward(noiser, frozen_noiser_params, noiser_params, None, params, keys, iterinfo,
                                           inp, state, collect=True)
        return state, (inter, logits, int_log_likelihood(logits, tgt))
    state, (inter, logits, lls) = lax.scan(step, state, (inputs, targets))
    n_layer = inter["blocks"]["out"].shape[1]
    trace = {"emb": inter["emb"]}
    for l in range(n_layer):
        trace.update({f"blocks.{l}.{name}": inter["blocks"][name][:, l] for name in BLOCK_TRACE})
    trace.update(ln_out=inter["ln_out"], logits=logits, ll=lls)
    return trace, state


def window_starts(frozen_noiser_params, params, es_tree_key, epoch, thread_ids, es_map):
    """Every member's clamped window start per leaf (slices stacked like the leaf): {leaf: (m, *stack) uint32}; one
    jitted program per settings and tree (integers: op by op compiled a few dozen small programs per call)."""
    return _window_starts(frozen_noiser_params.get("rank", 1), frozen_noiser_params["noise_reuse"],
                          tuple(int(c) for c in jax.tree.leaves(es_map)), params, es_tree_key, jnp.int32(epoch),
                          jnp.asarray(thread_ids, I32))


@partial(jax.jit, static_argnums=(0, 1, 2))
def _window_starts(rank: int, noise_reuse: int, es_map_leaves, params, es_tree_key, epoch, thread_ids):
    es_map = jax.tree.unflatten(jax.tree.structure(params), list(es_map_leaves))

    def leaf(param, key, es_class):
        def one(p, k, thread_id):
            n = 2 * p.size if es_class == PARAM else (p.shape[0] + p.shape[1]) * rank
            start = window_start(k, true_epoch(epoch, noise_reuse), thread_id >> 1)
            return jnp.minimum(start, U32(TABLE_SIZE - n))
        per_member = (lambda tid: one(param, key, tid)) if key.shape == () else \
            (lambda tid: jax.vmap(lambda p, k: one(p, k, tid))(param, key))
        return jax.vmap(per_member)(thread_ids)
    return jax.tree.map(leaf, params, es_tree_key, es_map)


@partial(jax.jit, static_argnums=(0, 4))
def _population_scores(frozen_items, noiser_params, params, es_tree_key, es_map_leaves, epoch, tokens, states):
    frozen = dict(frozen_items)
    es_map = jax.tree.unflatten(jax.tree.structure(params), list(es_map_leaves))

    def one(thread_id, toks, state):
        iterinfo = (epoch, thread_id)
        noise = member_noise(noiser_params, frozen, params, es_tree_key, es_map, iterinfo)
        return member_scores(CachedQEggRoll, frozen, noiser_params, params, noise, iterinfo, toks[:-1], toks[1:],
                             state)
    return jax.vmap(one)(jnp.arange(tokens.shape[0], dtype=I32), tokens.astype(I32), states)


def population_scores(frozen_noiser_params, noiser_params, params, es_tree_key, es_map, epoch, tokens, states):
    """(scores (pop,) int32, states (pop, n_layer, d)): member m is thread m at (epoch, m) on tokens[m] (T + 1,)."""
    return _population_scores(_static(frozen_noiser_params), noiser_params, params, es_tree_key,
                              tuple(jax.tree.leaves(es_map)), jnp.int32(epoch), jnp.asarray(tokens),
                              jnp.asarray(states))


def update(frozen_noiser_params, noiser_params, params, es_tree_key, es_map, scores, epoch):
    """New params after the epoch's vote on scores (pop,) (noiser_params carries the epoch's threshold):
    QEggRoll.do_updates as tree_votes's program and a small one applying the votes, so a run that also reads the
    votes (the parity suite) compiles them once, where one program for the update compiled them again (integers: the
    same values; tests/jax_reference/test_int8.py checks them against do_updates)."""
    fitnesses = _fitnesses(jnp.asarray(scores))
    votes = tree_votes(frozen_noiser_params, noiser_params, params, es_tree_key, es_map, fitnesses, epoch)
    return _apply_votes(frozen_noiser_params["use_clt"], noiser_params["update_threshold"], params, votes,
                        int(fitnesses.shape[0]))


@jax.jit
def _fitnesses(scores):
    return QEggRoll.convert_fitnesses({}, {}, scores)


@partial(jax.jit, static_argnums=(0, 4))
def _apply_votes(use_clt: bool, threshold, params, votes, pairs: int):
    """QEggRoll.apply_votes at every leaf (elementwise, so a stacked leaf's slices at once)."""
    apply = lambda p, z: QEggRoll.apply_votes({"use_clt": use_clt}, {"update_threshold": threshold}, p, z, pairs)  # noqa: E731
    return jax.tree.map(apply, params, votes)


@jax.jit
def _validation_scores(params, rows):
    zero = EGG.default_state(params)
    one = lambda row: member_scores(QEggRoll, {}, {}, params, no_keys(params), None, row[:-1], row[1:], zero)[0]
    return jax.vmap(one)(rows.astype(I32))


def validation_scores(params, rows) -> np.ndarray:
    """(val_rows,) int32: each row scored from a zero state with noise off."""
    return np.asarray(_validation_scores(params, jnp.asarray(rows)))
