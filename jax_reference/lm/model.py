"""The byte-level recurrent LM of `spec/lm.py` in upstream HyperscaleES style: Model classes, blocks scanned.

Tree (spec.lm.lm_tree): {"embed": Embedding, "blocks": {ln1, shift, wz, bz, wh, ln2, up, down, h0} stacked on
axis 0 (scan_map (0,)), "ln_f": RMSNorm weight, "head": MM}. As in upstream's RWKV, the blocks run as one
`jax.lax.scan` over (block params, block ES keys), each step a `Block._forward` on slice l with slice l's keys.
Every weight product and plain parameter goes through the noiser; `h0` (EXCLUDED) and the embedding are read
as stored, as upstream reads its excluded leaves.

Intermediates (`member_score(..., intermediates=True)`): an insertion-ordered dict in forward order, each entry
named after the leaf whose op produced it, so the first entry where two sides part names the block and leaf:
    "embed"            (T, d)    embed[x_t]
    "blocks.{l}.ln1"   (T, d)    u = rms(e) * ln1[l]
    "blocks.{l}.shift" (T, d)    s = shift[l][0] * u_t + shift[l][1] * u_{t-1}
    "blocks.{l}.wz"    (T, d)    mm(wz[l], s)                (before bz and the sigmoid)
    "blocks.{l}.bz"    (T, d)    z = sigmoid(mm(wz[l], s) + bz[l])
    "blocks.{l}.wh"    (T, d)    c = mm(wh[l], s)
    "blocks.{l}.h0"    (T, d)    h, the cell's states (the recurrence h0 starts)
    "blocks.{l}.ln2"   (T, d)    v = rms(e + h) * ln2[l]
    "blocks.{l}.up"    (T, h)    tmm(up[l], v)               (before the relu)
    "blocks.{l}.down"  (T, d)    mm(down[l], relu(...))
    "blocks.{l}.out"   (T, d)    e after block l (the residual stream)
    "ln_f"             (T, d)    y = rms(e) * ln_f
    "head"             (T, 256)  logits
    "score"            ()        the member's log2-likelihood per byte
The names are spec.lm.intermediate_names(L); spec.lm.intermediate_leaf(name) maps one to (leaf path, block index or
None), e.g. "blocks.1.wz" -> ("blocks.wz", 1) (both re-exported here).

float32: inside a jitted graph (the scan's body, `population_scores`) XLA rewrites rms's `x / sqrt(m)` as
`x * rsqrt(m)` and fuses products with the sums after them, so compiled and op-by-op runs of the same formula part
by about an ulp per norm (about a third of the elements); a side that computes the formula as written can match
this one within a bound, not bit for bit.
"""
from __future__ import annotations

import math
from functools import lru_cache, partial

import jax
import jax.numpy as jnp
import numpy as np

from jax_reference import emulation
from jax_reference.models import (EXCLUDED, MM, TMM, CommonInit, Embedding, Model, Parameter, call_submodule,
                                  merge_inits, simple_es_tree_key)
from jax_reference.noiser import EggRoll
from jax_reference.population import population_iterinfos
from spec.lm import (BLOCK, BLOCK_INTERMEDIATES, H0_SCALE, RMS_EPS, TOP, VOCAB, LMConfig,  # noqa: F401
                     intermediate_leaf, intermediate_names)   # the last two re-exported for the suite

LN2 = np.float32(math.log(2.0))     # the score is mean log-probability / float32(ln 2): log2-likelihood per byte


def rms(x):
    """x / sqrt(mean(x * x) + 1e-5) over the last axis."""
    return x / jnp.sqrt(jnp.mean(x * x, axis=-1, keepdims=True) + RMS_EPS)


# ----------------------------------------------------------------------------- modules
class RMSNorm(Parameter):
    """rms(x) * weight; the weight is a Parameter leaf (full-rank noise unless freeze_nonlora), init ones."""

    @classmethod
    def rand_init(cls, key, dim, dtype, *args, **kwargs):
        return Parameter.rand_init(key, None, None, jnp.ones((dim,), dtype), dtype)

    @classmethod
    def _forward(cls, common_params, x, *args, **kwargs):
        return rms(x) * Parameter._forward(common_params)


class MinGRUCell(Model):
    """Token shift, then a minGRU-style cell; works on the block's own params (shift, wz, bz, wh, h0).

    s_t = shift[0] * u_t + shift[1] * u_{t-1};  z = sigmoid(wz s + bz);  c = wh s;  h_t = h_{t-1} + z_t (c_t - h_{t-1}).
    """

    @classmethod
    def _forward(cls, common_params, u, inter=None, *args, **kwargs):
        shift = call_submodule(Parameter, "shift", common_params)                        # (2, d)
        u_prev = jnp.concatenate([jnp.zeros_like(u[:1]), u[:-1]], axis=0)               # u_{-1} = 0
        s = shift[0] * u + shift[1] * u_prev
        wz_s = call_submodule(MM, "wz", common_params, s)
        z = jax.nn.sigmoid(wz_s + call_submodule(Parameter, "bz", common_params))
        c = call_submodule(MM, "wh", common_params, s)
        h0 = common_params.params["h0"]             # EXCLUDED: read as stored, never through the noiser

        def step(h, zc):
            z_t, c_t = zc
            h = h + z_t * (c_t - h)
            return h, h
        _, h = jax.lax.scan(step, h0, (z, c))                                           # (T, d)
        if inter is not None:
            inter.update(shift=s, wz=wz_s, bz=z, wh=c, h0=h)
        return h


class BlockMLP(Model):
    """down(relu(up(v))): `up` a TMM stored (in, out), `down` an MM stored (out, in)."""

    @classmethod
    def _forward(cls, common_params, v, inter=None, *args, **kwargs):
        up = call_submodule(TMM, "up", common_params, v)
        out = call_submodule(MM, "down", common_params, jax.nn.relu(up))
        if inter is not None:
            inter.update(up=up, down=out)
        return out


class Block(Model):
    """e + h(rms(e) * ln1), then + mlp(rms(.) * ln2); leaves in spec.lm.BLOCK order, keys split(key, 9)[j]."""

    @classmethod
    def rand_init(cls, key, d_model, d_hidden, dtype, *args, **kwargs):
        k = dict(zip(BLOCK, jax.random.split(key, len(BLOCK))))
        d, h = d_model, d_hidden
        parts = {
            "ln1": RMSNorm.rand_init(k["ln1"], d, dtype),
            "shift": Parameter.rand_init(k["shift"], None, None,
                                         jnp.stack([jnp.ones((d,), dtype), jnp.zeros((d,), dtype)]), dtype),
            "wz": MM.rand_init(k["wz"], d, d, dtype),
            "bz": Parameter.rand_init(k["bz"], None, None, jnp.zeros((d,), dtype), dtype),
            "wh": MM.rand_init(k["wh"], d, d, dtype),
            "ln2": RMSNorm.rand_init(k["ln2"], d, dtype),
            "up": TMM.rand_init(k["up"], d, h, dtype),           # stored (in, out) = (d, h)
            "down": MM.rand_init(k["down"], h, d, dtype),        # stored (out, in) = (d, h)
            "h0": Parameter.rand_init(k["h0"], (d,), H0_SCALE, None, dtype)._replace(es_map=EXCLUDED),
        }
        assert tuple(parts) == BLOCK
        return merge_inits(**parts)

    @classmethod
    def _forward(cls, common_params, e, collect=False, *args, **kwargs):
        """(e after the block (T, d), this block's intermediates or None)."""
        inter = {} if collect else None
        u = call_submodule(RMSNorm, "ln1", common_params, e)
        e = e + MinGRUCell._forward(common_params, u, inter)
        v = call_submodule(RMSNorm, "ln2", common_params, e)
        e = e + BlockMLP._forward(common_params, v, inter)
        if collect:
            inter.update(ln1=u, ln2=v, out=e)
            inter = {name: inter[name] for name in BLOCK_ENTRIES}
        return e, inter


BLOCK_ENTRIES = BLOCK_INTERMEDIATES   # forward order (spec.lm)


def scan_blocks(common_params, e, collect=False):
    """The blocks as one lax.scan over (stacked block params, block keys): (e (T, d), stacked intermediates)."""
    def body(e, block):
        params_l, keys_l = block
        return Block._forward(common_params._replace(params=params_l, es_tree_key=keys_l), e, collect)
    return jax.lax.scan(body, e, (common_params.params["blocks"], common_params.es_tree_key["blocks"]))


def unrolled_blocks(common_params, e, collect=False):
    """The same blocks as a Python loop over slices (a check on the scan): (e, stacked intermediates)."""
    n_layers = jax.tree.leaves(common_params.params["blocks"])[0].shape[0]
    collected = []
    for l in range(n_layers):
        take = partial(jax.tree.map, lambda a: a[l])
        e, inter = Block._forward(common_params._replace(params=take(common_params.params["blocks"]),
                                                         es_tree_key=take(common_params.es_tree_key["blocks"])),
                                  e, collect)
        collected.append(inter)
    return e, (jax.tree.map(lambda *xs: jnp.stack(xs), *collected) if collect else None)


class ByteLM(Model):
    """embed -> scanned blocks -> rms * ln_f -> head; keys split(model_key, 4) in spec.lm.TOP order."""

    @classmethod
    def rand_init(cls, key, cfg: LMConfig, dtype=jnp.float32, *args, **kwargs) -> CommonInit:
        k = dict(zip(TOP, jax.random.split(key, len(TOP))))
        block_keys = jax.random.split(k["blocks"], cfg.layers)
        one = Block.rand_init(block_keys[0], cfg.d_model, cfg.d_hidden, dtype)
        stacked = jax.vmap(lambda bk: Block.rand_init(bk, cfg.d_model, cfg.d_hidden, dtype).params)(block_keys)
        blocks = CommonInit(None, stacked, {name: (0,) for name in BLOCK}, one.es_map)   # every slice its own key
        parts = {"embed": Embedding.rand_init(k["embed"], VOCAB, cfg.d_model, dtype),
                 "blocks": blocks,
                 "ln_f": RMSNorm.rand_init(k["ln_f"], cfg.d_model, dtype),
                 "head": MM.rand_init(k["head"], cfg.d_model, VOCAB, dtype)}
        return merge_inits(**parts)

    @classmethod
    def _forward(cls, common_params, x, collect=False, unroll=False, *args, **kwargs):
        """logits (T, 256) of bytes x (T,), and the intermediates dict (or None)."""
        e0 = call_submodule(Embedding, "embed", common_params, x)
        e, blocks = (unrolled_blocks if unroll else scan_blocks)(common_params, e0, collect)
        y = call_submodule(RMSNorm, "ln_f", common_params, e)
        logits = call_submodule(MM, "head", common_params, y)
        if not collect:
            return logits, None
        inter = {"embed": e0}
        for l in range(blocks["out"].shape[0]):
            inter.update({f"blocks.{l}.{name}": blocks[name][l] for name in BLOCK_ENTRIES})
        inter.update(ln_f=y, head=logits)
        return logits, inter


# ----------------------------------------------------------------------------- plain functions
def run_keys(seed: int):
    """model_key, es_key, data_key = split(key(seed), 3) (the LM uses the first two)."""
    return jax.random.split(jax.random.key(seed), 3)


def init_lm(cfg: LMConfig, seed: int, dtype=jnp.float32) -> CommonInit:
    """ByteLM.rand_init(split(key(seed), 3)[0], cfg): params, scan_map ((0,) on every blocks leaf), es_map.

    Computed once per (cfg, seed, dtype, emulation settings) in a process: the eager init is several hundred small
    compiles and a check asks for the same init many times. Each call gets its own containers around the shared
    (immutable) arrays."""
    return jax.tree.map(lambda leaf: leaf, _init_lm(cfg, seed, jnp.dtype(dtype), emulation.tf32_on(),
                                                    emulation.normals_backend()))


@lru_cache(maxsize=16)
def _init_lm(cfg: LMConfig, seed: int, dtype, tf32: bool, normals: str) -> CommonInit:
    """init_lm's value; the emulation's settings are part of the key (they change the draws); evaluated eagerly
    even when asked for inside a trace, so the cache never keeps a tracer."""
    with jax.ensure_compile_time_eval():
        return ByteLM.rand_init(run_keys(seed)[0], cfg, dtype)


def es_keys(params, scan_map, seed: int):
    """simple_es_tree_key(params, split(key(seed), 3)[1], scan_map).

    Leaf i of the flatten order gets split(es_key, n_leaves)[i]; stacked leaves split again along axis 0 (keys (L,)).
    """
    return simple_es_tree_key(params, run_keys(seed)[1], scan_map)


def no_keys(params):
    """A key tree of Nones: what a noise-off forward (iterinfo None) can take instead of ES keys."""
    return jax.tree.map(lambda _: None, params)


def member_score(noiser, frozen_noiser_params, noiser_params, params, es_tree_key, iterinfo, tokens,
                 intermediates: bool = False, unroll: bool = False):
    """One member's log2-likelihood per byte of tokens (T + 1,) uint8/int: mean_t log_softmax(logits_t)[x_{t+1}] / ln 2.

    iterinfo (epoch, thread_id), or None for the unperturbed model. `intermediates=True` returns
    (score, dict) with the module docstring's entries; `unroll=True` runs the blocks as a Python loop.
    """
    tokens = jnp.asarray(tokens).astype(jnp.int32)
    logits, inter = ByteLM.forward(noiser, frozen_noiser_params, noiser_params, None, params, es_tree_key, iterinfo,
                                   tokens[:-1], collect=intermediates, unroll=unroll)
    logp = jax.nn.log_softmax(logits, axis=-1)
    score = jnp.mean(jnp.take_along_axis(logp, tokens[1:, None], axis=-1)) / LN2
    if not intermediates:
        return score
    inter["score"] = score
    return score, inter


def static_settings(frozen_noiser_params) -> tuple:
    """The forward's static settings (the solver dropped: the forward never uses it), hashable for jit."""
    return tuple(sorted((k, v) for k, v in frozen_noiser_params.items() if k != "solver"))


@partial(jax.jit, static_argnums=(0, 1))
def _population_scores(noiser, frozen_items, noiser_params, params, es_tree_key, epoch, tokens):
    frozen = dict(frozen_items)
    epochs, thread_ids = population_iterinfos(epoch, tokens.shape[0])
    one = lambda e, tid, toks: member_score(noiser, frozen, noiser_params, params, es_tree_key, (e, tid), toks)
    return jax.vmap(one)(epochs, thread_ids, tokens)


def population_scores(noiser, frozen_noiser_params, noiser_params, params, es_tree_key, epoch, tokens):
    """(pop,) float32: member m (thread_id m, iterinfo (epoch, m)) scores tokens[m] (pop, T + 1); jit'd vmap."""
    return _population_scores(noiser, static_settings(frozen_noiser_params), noiser_params, params, es_tree_key,
                              jnp.int32(epoch), jnp.asarray(tokens))


@jax.jit
def _val_scores(params, windows):
    one = lambda toks: member_score(EggRoll, {}, {}, params, no_keys(params), None, toks)
    return jax.vmap(one)(windows)


def val_bits_per_byte(params, windows) -> float:
    """Mean bits per byte (-score) of the unperturbed model over windows (n, T + 1): noise off."""
    return float(-jnp.mean(_val_scores(params, jnp.asarray(windows))))
