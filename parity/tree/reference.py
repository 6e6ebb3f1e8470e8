"""The JAX reference on a parameter tree, as numpy: each leaf's noise, shaping, gradients, the optimizer step and the
perturbed products on ANY declared tree (a spec.tree.TreeRun, or the LM's spec.lm.LMConfig: anything with a `tree`
and the ES settings), and the signatures of the tree drifts, drawn from JAX's own keys, so a check can name the one a
side has; the LM's own init, scores and training epoch (the model the project ships).

Only this module of the LM suite imports jax_reference (like parity/mlp/reference.py for the MLP). `on_platform`
runs every function here on a spec.platform.ReferencePlatform (jax_reference.platform.scope); the draws go through
jax_reference.emulation.normal and the reference's own products through its matmul, so gpu-sim and TF32 reach them,
while the suite's own arithmetic (each member's A B^T for the noise check) is pinned to float32 (HIGHEST).
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from jax_reference import emulation
from jax_reference.lm import model as jlm
from jax_reference.models import recursive_scan_split, simple_es_tree_key
from jax_reference.noiser import EggRoll, apply_grads, es_grads, true_epoch
from jax_reference.population import population_iterinfos
from spec.lm import LMConfig
from spec.jax_rng import size_bucket
from spec.platform import ReferencePlatform
from spec.tree import Leaf, nest

NAME = "jax_reference"
HIGHEST = jax.lax.Precision.HIGHEST        # the suite's own products (A B^T), float32 whatever the platform


def _flat(tree_dict, prefix="") -> dict:
    out = {}
    for k, v in tree_dict.items():
        path = f"{prefix}{k}"
        out.update(_flat(v, path + ".") if isinstance(v, dict) else {path: v})
    return out


def init(cfg: LMConfig, seed: int) -> dict[str, np.ndarray]:
    return {p: np.asarray(v) for p, v in _flat(jlm.init_lm(cfg, seed).params).items()}


def noiser(cfg):
    """(frozen noiser params, noiser params) of the configuration: the second a fresh dict each call (apply_grads sets
    its opt_state in place), over one kept initialisation."""
    frozen, nparams = _noiser(cfg)
    return frozen, dict(nparams)


@functools.lru_cache(maxsize=8)
def _noiser(cfg):
    """EggRoll.init_noiser on the tree's zeros, once per configuration (the zeros of every leaf: 0.65 GB and 0.3 s at
    GPT-2's size, where the suite asks for the noiser some twenty times)."""
    return EggRoll.init_noiser(nest({p: jnp.zeros(s) for p, s in matrix_shapes(cfg.tree).items()}), cfg.sigma, cfg.lr,
                               group_size=cfg.group_size, freeze_nonlora=cfg.freeze_nonlora,
                               noise_reuse=cfg.noise_reuse, rank=cfg.rank)


def matrix_shapes(tree) -> dict[str, tuple[int, ...]]:
    """{path: shape} as upstream's noiser takes the tree: an N-D mm leaf at its stack and declared matrix (its noise,
    gradient and step are an mm's at that shape, reshaped back to the stored one), every other leaf as stored."""
    return {leaf.path: leaf.matrix_shape for leaf in tree.leaves}


def _stored(cfg, flat: dict) -> dict[str, np.ndarray]:
    """The noiser's per-leaf arrays at the matrix shapes (matrix_shapes) back at the leaves' stored shapes."""
    return {k: np.asarray(v).reshape(cfg.tree.leaf(k).shape) for k, v in flat.items()}


def slice_keys(cfg, seed: int, leaf: Leaf, variant: str = "faithful"):
    """(*stack,) typed keys of a stacked leaf (or a scalar key), the stack its leading scanned axes: faithful
    (recursive_scan_split, flatten-order index), `shared` (the leaf's key for every slice), `insertion` (the index
    in declaration order). cfg: spec.lm.LMConfig or spec.tree.TreeRun (anything with a `tree`)."""
    tree = cfg.tree
    index = tree.index(leaf.path, "insertion" if variant == "insertion" else "sorted")
    base = jax.random.split(jlm.run_keys(seed)[1], len(tree.leaves))[index]
    if not leaf.scan_axes:
        return base
    if variant == "shared":
        return jnp.stack([base] * leaf.n_slices).reshape(leaf.stack_shape)
    return recursive_scan_split(jnp.zeros(leaf.shape), base, leaf.scan_axes)


def _per_slices(fn, keys, leaf: Leaf, *rest):
    """fn(key, *rest) over every slice key of a leaf, the members' axis first: (m, *stack, ...) (vmap over the
    flattened slices, then the stack put back)."""
    if not leaf.scan_axes:
        return fn(keys, *rest)
    out = jax.vmap(fn, in_axes=(0,) + (None,) * len(rest), out_axes=1)(keys.reshape(-1), *rest)
    return out.reshape(out.shape[:1] + leaf.stack_shape + out.shape[2:])


def _draw_shape(cfg, leaf: Leaf) -> tuple[int, ...]:
    """One draw's shape: (a + b, r) for a low-rank leaf's factors ((a, b) an N-D mm slice's declared matrix: the
    reference draws such a leaf by its key index at its matrix's shape), else the slice shape."""
    return (sum(leaf.factor_dims), cfg.rank) if leaf.cls in ("mm", "tmm") else leaf.slice_shape


@functools.partial(jax.jit, static_argnums=(0,))
def _flat_normals(length: int, keys, g, pairs):
    """normal(fold_in(fold_in(key, g), p), (length,)) for every key (k,) and pair p (n,): (n, k, length) float32,
    jitted once per bucketed size (and emulation state, part of jit's key)."""
    def one(key, p):
        return emulation.normal(jax.random.fold_in(jax.random.fold_in(key, g), p), (length,))
    return jax.vmap(jax.vmap(one, in_axes=(0, None)), in_axes=(None, 0))(keys, pairs)


@functools.lru_cache(maxsize=16)
def _draws(cfg, seed: int, g: int, leaf: Leaf, variant: str, platform: tuple) -> np.ndarray:
    """draws' array (read-only), kept per inputs and emulation state `platform` (the checks ask for the same leaf's
    noise several times). JAX's threefry bits depend only on an entry's flat index (jax_threefry_partitionable, on
    since JAX 0.5), so the first prod(shape) normals of a longer draw are the draw of `shape`: one compiled draw of a
    bucketed length, slice count and pair count serves every leaf (tests/parity/tree/test_check.py checks it bit for bit
    against jax.random.normal of the slice's own shape)."""
    keys = slice_keys(cfg, seed, leaf, variant)
    shape = _draw_shape(cfg, leaf)
    size, pairs = int(np.prod(shape)), cfg.pop // 2
    flat = keys.reshape(-1) if leaf.scan_axes else keys[None]
    k = flat.shape[0]
    padded = jnp.concatenate([flat, jnp.broadcast_to(flat[:1], (size_bucket(k) - k,))])
    z = np.asarray(_flat_normals(size_bucket(size), padded, jnp.uint32(g),
                                 jnp.arange(size_bucket(pairs), dtype=jnp.uint32)))
    z = z[:pairs, :k, :size].reshape((pairs,) + leaf.stack_shape + shape)
    z.flags.writeable = False
    return z


def draws(cfg, seed: int, epoch: int, leaf: Leaf, variant: str = "faithful") -> np.ndarray:
    """The raw JAX normals behind one leaf's noise, one draw per antithetic pair p (members 2p and 2p+1 share it):
    normal(fold_in(fold_in(slice key, true epoch), p)) of shape (a + b, r) (low-rank) or the slice shape (param),
    laid out (pop // 2, *stack, ...) float32; keys as slice_keys(variant). Everything else about the noise (signs,
    scales, products) is numpy arithmetic on these (parity.tree.numpy_reference)."""
    if not jax.config.jax_threefry_partitionable:
        return _eager_draws(cfg, seed, epoch, leaf, variant)
    platform = (emulation.tf32_on(), emulation.normals_backend())
    return _draws(cfg, seed, true_epoch(epoch, cfg.noise_reuse), leaf, variant, platform)


def _eager_draws(cfg, seed: int, epoch: int, leaf: Leaf, variant: str) -> np.ndarray:
    """draws op by op, each slice's own shape: where threefry's bits are not by flat index (partitionable off)."""
    keys = slice_keys(cfg, seed, leaf, variant)
    g = true_epoch(epoch, cfg.noise_reuse)
    shape = _draw_shape(cfg, leaf)

    def one(key, p):
        return emulation.normal(jax.random.fold_in(jax.random.fold_in(key, g), p), shape)

    return np.asarray(_per_slices(jax.vmap(one, in_axes=(None, 0)), keys, leaf, jnp.arange(cfg.pop // 2)))


def _members(cfg, seed: int, epoch: int, leaf: Leaf, variant: str = "faithful") -> np.ndarray:
    """Every member's draw (pop, *stack, ...): member m draws pair m // 2's."""
    return draws(cfg, seed, epoch, leaf, variant)[np.arange(cfg.pop) // 2]


def _low_scale(cfg) -> np.float32:
    """sigma / sqrt(r) in float32, as the noiser computes it."""
    return np.float32(jnp.float32(cfg.sigma) / jnp.sqrt(cfg.rank))


def leaf_noise(cfg, seed: int, epoch: int, leaf: Leaf, variant: str = "faithful"):
    """Every member's noise of one leaf in the tree protocol's form, float32 as upstream forms it: low-rank (A (pop,
    *stack, a, r) = the draw's last a rows times +-sigma/sqrt(r), B (pop, *stack, b, r) its first b rows; variant
    `tmm_transposed`: an (in, out) weight's draw split as a transposed mm, B the scaled last rows), else eps (pop,
    *shape). The signed scales are float32 products (exact in numpy as in JAX)."""
    z = _members(cfg, seed, epoch, leaf, variant)
    sign = np.where(np.arange(cfg.pop) % 2 == 0, np.float32(1), np.float32(-1)).reshape((-1,) + (1,) * (z.ndim - 1))
    if leaf.cls == "param":
        return z * (sign * np.float32(cfg.sigma))
    a, b = leaf.factor_dims
    s = sign * _low_scale(cfg)
    if variant == "tmm_transposed":
        return z[..., :a, :], z[..., a:, :] * s
    return z[..., b:, :] * s, z[..., :b, :]


def dense_noise(cfg, seed: int, epoch: int, leaf: Leaf, variant: str = "faithful", block=None) -> np.ndarray:
    """Every member's perturbation of one leaf at its stored shape (pop, *shape), float32, as upstream draws it
    (leaf_noise's A B^T, JAX's float32 product (HIGHEST), member by member, or eps); `block` (a
    parity.tree.blocks.Block): only that block, (members, slices, rows, b)."""
    from parity.tree import blocks
    value = leaf_noise(cfg, seed, epoch, leaf, variant)
    blk = blocks.whole(leaf, cfg.pop) if block is None else block
    if leaf.cls == "param":
        out = blocks.take(leaf, value, blk)
    else:
        left, right = blocks.take(leaf, value[0], blk), blocks.take(leaf, value[1], blk, rows=False)
        fn = jax.vmap(lambda x, y: jnp.matmul(x, y.T, precision=HIGHEST))         # over the members
        if not leaf.scan_axes:
            out = np.asarray(fn(jnp.asarray(left[:, 0]), jnp.asarray(right[:, 0])))[:, None]
        else:                                                                     # the slices as one vmapped axis
            out = np.asarray(jax.vmap(fn, in_axes=1, out_axes=1)(jnp.asarray(left), jnp.asarray(right)))
    return out.reshape((cfg.pop,) + leaf.shape) if block is None else out


def abs_factors(cfg, seed: int, epoch: int, leaf: Leaf) -> tuple[np.ndarray, np.ndarray]:
    """(|A| (pop, *stack, a, r), |B| (pop, *stack, b, r)) float64: the draws times the float32 sigma / sqrt(r),
    unrounded: what |A| |B|^T, the scale of a low-rank product's rounding, is formed from."""
    z = _members(cfg, seed, epoch, leaf).astype(np.float64)
    b = leaf.factor_dims[1]
    return np.abs(z[..., b:, :] * float(_low_scale(cfg))), np.abs(z[..., :b, :])


def factors_abs_product(cfg, seed: int, epoch: int, leaf: Leaf, block=None) -> np.ndarray:
    """|A| |B|^T per member at the stored shape (pop, *shape), float64 (abs_factors'); `block`: only that block."""
    from parity.tree import blocks
    return blocks.dense_block(leaf, abs_factors(cfg, seed, epoch, leaf), block)


def shape(cfg, f: np.ndarray) -> np.ndarray:
    frozen, params = noiser(cfg)
    return np.asarray(EggRoll.convert_fitnesses(frozen, params, jnp.asarray(f, jnp.float32)))


def scores(cfg: LMConfig, seed: int, params: dict, epoch: int, tokens: np.ndarray, noise: bool):
    """(scores (m,), intermediates {name: (m, ...)}) of every member on tokens (m, T + 1)."""
    frozen, nparams = noiser(cfg)
    p = nest({k: jnp.asarray(v) for k, v in params.items()})
    init = jlm.init_lm(cfg, seed)
    keys = jlm.es_keys(p, init.scan_map, seed) if noise else jlm.no_keys(p)
    epochs, tids = population_iterinfos(epoch, tokens.shape[0])
    s, inter = _member_scores(jlm.static_settings(frozen), noise, nparams, p, keys, epochs, tids, jnp.asarray(tokens))
    return np.asarray(s), {k: np.asarray(v) for k, v in inter.items()}


@functools.partial(jax.jit, static_argnums=(0, 1))
def _member_scores(settings, noise, nparams, p, keys, epochs, tids, tokens):
    """Every member's (score, intermediates), jitted once per settings and shapes (params, keys and tokens are
    arguments: a closure would make each call a new function, traced and compiled again with its params inlined)."""
    frozen = dict(settings)

    def one(e, t, toks):
        return jlm.member_score(EggRoll, frozen, nparams, p, keys, (e, t) if noise else None, toks, intermediates=True)
    return jax.vmap(one)(epochs, tids, tokens)


def scores_dense(cfg: LMConfig, params: dict, dense: dict, tokens: np.ndarray):
    """(scores (m,), intermediates) of the reference's forward with noise off on member i's params + dense[path][i]
    (E (m, *shape) float32 for the leaves given; W + E rounded once in float32): the reference on a port's own
    draws, for the in-distribution mode (parity.tree.dist)."""
    frozen, nparams = noiser(cfg)
    m = tokens.shape[0]
    batched = {k: jnp.asarray(v)[None] + jnp.asarray(dense[k]) if k in dense else
               jnp.broadcast_to(jnp.asarray(v), (m,) + np.shape(v)) for k, v in params.items()}
    s, inter = _dense_scores(jlm.static_settings(frozen), nparams, batched, jnp.asarray(tokens))
    return np.asarray(s), {k: np.asarray(v) for k, v in inter.items()}


@functools.partial(jax.jit, static_argnums=(0,))
def _dense_scores(settings, nparams, batched, tokens):
    """scores_dense's forward, noise off, vmapped over the members' params: jitted once per settings and shapes."""
    frozen = dict(settings)

    def one(p, toks):
        nested = nest(p)
        return jlm.member_score(EggRoll, frozen, nparams, nested, jlm.no_keys(nested), None, toks, intermediates=True)
    return jax.vmap(one)(batched, tokens)


def es_maps(tree) -> tuple[dict, dict]:
    """(scan_map, es_map) of a spec.tree.Tree as upstream's nested dicts (scanned axes, es_map classes)."""
    return (nest({leaf.path: leaf.scan_axes for leaf in tree.leaves}),
            nest({leaf.path: leaf.es_class for leaf in tree.leaves}))


@functools.lru_cache(maxsize=8)
def _grads_fn(cfg):
    """(es_grads jitted for this configuration's tree and settings, its params as shapes): compiled once per
    configuration, where eager es_grads would trace every stacked leaf's lax.scan again at each call. The params are
    jax.ShapeDtypeStructs (their values never enter the estimate): with zeros closed over, the first call left 1.4 GB
    more resident at GPT-2's shapes (0.1 GB so)."""
    frozen, nparams = noiser(cfg)
    params = nest({p: jax.ShapeDtypeStruct(s, jnp.float32) for p, s in matrix_shapes(cfg.tree).items()})
    es_map = es_maps(cfg.tree)[1]
    return jax.jit(lambda keys, shaped, epochs, tids: es_grads(frozen, nparams, params, keys, shaped, (epochs, tids),
                                                               es_map)), params


def grads(cfg, seed: int, epoch: int, shaped: np.ndarray) -> dict[str, np.ndarray]:
    """The noiser's g per leaf for shaped fitness (pop,), drawn with the reference's own keys (simple_es_tree_key
    of split(key(seed), 3)[1] on the tree; the values of the params do not enter the estimate), under jit as a
    training step runs it."""
    fn, params = _grads_fn(cfg)
    keys = simple_es_tree_key(params, jlm.run_keys(seed)[1], es_maps(cfg.tree)[0])
    epochs, tids = population_iterinfos(epoch, cfg.pop)
    g = fn(keys, jnp.asarray(shaped, jnp.float32), epochs, tids)
    return _stored(cfg, _flat(g))


def update(cfg, params: dict, grads: dict) -> dict[str, np.ndarray]:
    """One optax-sgd step of the noiser on given per-leaf gradients (apply_grads: -(g sqrt(N)) to the solver), the
    leaves at the noiser's shapes (matrix_shapes) and back."""
    frozen, nparams = noiser(cfg)
    shapes = matrix_shapes(cfg.tree)
    p = nest({k: jnp.asarray(v).reshape(shapes.get(k, np.shape(v))) for k, v in params.items()})
    g = nest({k: jnp.asarray(v).reshape(shapes.get(k, np.shape(v))) for k, v in grads.items()})
    _, new = apply_grads(frozen, nparams, p, g, cfg.pop)
    return {k: np.asarray(v).reshape(np.shape(params[k])) for k, v in _flat(new).items()}


def product(W: np.ndarray, A: np.ndarray, B: np.ndarray, x: np.ndarray, form: str) -> np.ndarray:
    """EggRoll.do_mm / do_Tmm's expression on given factors, float32 under jit: mm x @ W.T + (x @ B) @ A.T (x (m,
    batch, b)), tmm x @ W + (x @ A) @ B.T (x (m, batch, a)), vmapped over the members."""
    return np.asarray(_product(form, jnp.asarray(W), jnp.asarray(A), jnp.asarray(B), jnp.asarray(x)))


@functools.partial(jax.jit, static_argnums=(0,))
def _product(form: str, W, A, B, x):
    """product's expression, jitted once per form and shapes (W an argument, not a constant of each call's graph)."""
    mm = emulation.matmul                                        # the reference's products (TF32 under gpu-sim)
    if form == "mm":
        fn = lambda a, b, xi: mm(xi, W.T) + mm(mm(xi, b), a.T)    # noqa: E731
    else:
        fn = lambda a, b, xi: mm(xi, W) + mm(mm(xi, a), b.T)      # noqa: E731
    return jax.vmap(fn)(A, B, x)


def epoch_step(cfg: LMConfig, seed: int, params: dict, epoch: int, tokens: np.ndarray) -> dict:
    """One reference training epoch from params: the members' scores on tokens (pop, T + 1), shaped fitness, the
    per-leaf gradient and the new params (what lm_train's step does, in its parts, jitted as its update is)."""
    frozen, nparams = noiser(cfg)
    p = nest({k: jnp.asarray(v) for k, v in params.items()})
    init = jlm.init_lm(cfg, seed)
    keys = jlm.es_keys(p, init.scan_map, seed)
    s = jlm.population_scores(EggRoll, frozen, nparams, p, keys, epoch, tokens)
    epochs, tids = population_iterinfos(epoch, cfg.pop)
    shaped, g, new = _step_fn(cfg)(nparams, p, keys, s, epochs, tids)
    return {"scores": np.asarray(s), "shaped": np.asarray(shaped), "grads": {k: np.asarray(v) for k, v in _flat(g).items()},
            "params": {k: np.asarray(v) for k, v in _flat(new).items()}}


@functools.lru_cache(maxsize=8)
def _step_fn(cfg: LMConfig):
    """(noiser_params, params, es keys, scores, epochs, thread ids) -> (shaped, g, new params), jitted once per
    configuration (eagerly, es_grads traced every stacked leaf's lax.scan again at each call)."""
    frozen, _ = noiser(cfg)
    es_map = jlm.init_lm(cfg, 0).es_map              # the classes of the model's leaves (no seed enters them)

    def step(nparams, p, keys, scores, epochs, tids):
        shaped = EggRoll.convert_fitnesses(frozen, nparams, scores)
        g = es_grads(frozen, nparams, p, keys, shaped, (epochs, tids), es_map)
        return shaped, g, apply_grads(frozen, nparams, p, g, cfg.pop)[1]
    return jax.jit(step)


class OnPlatform:
    """This module's functions, each run inside jax_reference.platform.scope(platform): tree_check's reference."""

    def __init__(self, platform: ReferencePlatform):
        self.platform = platform

    def __getattr__(self, name: str):
        if name not in _FUNCTIONS:
            raise AttributeError(f"{__name__} has no {name!r}")
        fn = _FUNCTIONS[name]
        if not callable(fn) or name.startswith("_") or isinstance(fn, type):
            return fn

        @functools.wraps(fn)
        def scoped(*args, **kwargs):
            from jax_reference.platform import scope
            with scope(self.platform):
                return fn(*args, **kwargs)
        return scoped

    def float32(self) -> "OnPlatform":
        """The same reference with its products pinned to float32 (--reference-precision highest): what a TF32
        reference's own rounding is measured against (tree_check's forward and trajectory)."""
        return OnPlatform(self.platform.replace(precision_requested="highest", precision="float32"))

    def on_other_normals(self) -> "OnPlatform | None":
        """The same reference on the other backend's normals, or None where that table is not at hand."""
        from jax_reference.platform import normals_available
        other = self.platform.replace(normals="cpu" if self.platform.normals == "gpu" else "gpu")
        return OnPlatform(other) if normals_available(other) else None


_FUNCTIONS = globals()    # this module's names, read without looking the module up again (a test run in-process may
                          # have taken it out of sys.modules)


def on_platform(platform: ReferencePlatform | None = None) -> OnPlatform:
    """The reference on `platform` (default: where JAX runs, at its default precision), its compiles kept on disk
    (parity.core.platform.enable_compile_cache)."""
    from jax_reference.platform import resolve
    from parity.core import platform as core_platform
    core_platform.enable_compile_cache()
    return OnPlatform(platform or resolve())
