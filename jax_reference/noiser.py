"""The EggRoll noiser: low-rank antithetic ES noise, fitness shaping and the optax update.

Same interface and numbers as the public HyperscaleES `EggRoll`, usable as a
drop-in: classmethods `init_noiser`, `do_mm`, `do_Tmm`, `do_emb`, `get_noisy_standard`,
`convert_fitnesses`, `do_updates` and the hooks upstream's variant noisers override
(`_do_update`, `_do_updates_original`, `_do_updates_batched`), with upstream's argument names,
its in-place update of `noiser_params["opt_state"]`, and no validation of values. The
module-level functions below are the pieces the class is made of; `population.py` reuses them
so the noise it exports is by construction the noise `do_mm` uses.
"""
from __future__ import annotations

from collections import defaultdict
from functools import partial
from typing import Any

import jax
import jax.numpy as jnp
import optax

from jax_reference import emulation
from jax_reference.models import EMB_PARAM, EXCLUDED, MM_PARAM, PARAM, as_typed_key

ES_CLASSES = (PARAM, MM_PARAM, EMB_PARAM, EXCLUDED)


# ----------------------------------------------------------------------------- noise of one member
def true_epoch(epoch, noise_reuse):
    """The epoch the noise is drawn for: 0 forever when noise_reuse == 0 (upstream's quirk), else epoch // noise_reuse.

    Arguments in the torch side's order (`torch_impl.keys.true_epoch(epoch, noise_reuse)`).
    """
    return 0 if noise_reuse == 0 else epoch // noise_reuse


def member_key(base_key, noise_reuse: int, iterinfo):
    """fold_in(fold_in(k, true_epoch), thread_id // 2): members 2p and 2p+1 share the key of pair p."""
    epoch, thread_id = iterinfo
    return jax.random.fold_in(jax.random.fold_in(base_key, true_epoch(epoch, noise_reuse)), thread_id // 2)


def signed_sigma(base_sigma, thread_id):
    """+sigma for even members, -sigma for odd ones (interleaved antithetic pairs)."""
    return jnp.where(thread_id % 2 == 0, base_sigma, -base_sigma)


def member_normal(frozen_noiser_params, iterinfo, key, shape, dtype):
    """normal(member key, shape): the draw both noise kinds start from."""
    return emulation.normal(member_key(as_typed_key(key), frozen_noiser_params["noise_reuse"], iterinfo),
                            shape, dtype)


def lowrank_factors(frozen_noiser_params, base_sigma, iterinfo, param, key):
    """(A * ±base_sigma, B) with Z = normal(member key, (a + b, r)), B = Z[:b], A = Z[b:]; param is (a, b).

    Callers pass base_sigma = sigma / sqrt(rank).   A: (a, r), B: (b, r).
    """
    a, b = param.shape
    z = member_normal(frozen_noiser_params, iterinfo, key, (a + b, frozen_noiser_params["rank"]), param.dtype)
    return z[b:] * signed_sigma(base_sigma, iterinfo[1]), z[:b]


def fullrank_eps(frozen_noiser_params, iterinfo, param, key):
    """The unscaled full-rank draw normal(member key, param.shape)."""
    return member_normal(frozen_noiser_params, iterinfo, key, param.shape, param.dtype)


def fullrank_noise(frozen_noiser_params, base_sigma, iterinfo, param, key):
    """eps * ±base_sigma (no sqrt(rank) here)."""
    return fullrank_eps(frozen_noiser_params, iterinfo, param, key) * signed_sigma(base_sigma, iterinfo[1])


def perturbed_matmul(x, param, factors, stored_in_out: bool):
    """EggRoll's perturbed product: x @ W.T + (x @ B) @ A.T for W (out, in), x @ W + (x @ A) @ B.T for W stored
    (in, out); the plain product when factors (A, B) is None. The noiser and the given-noise noiser both run it."""
    plain = emulation.matmul(x, param if stored_in_out else param.T)
    if factors is None:
        return plain
    A, B = factors
    first, second = (A, B) if stored_in_out else (B, A)
    return plain + emulation.matmul(emulation.matmul(x, first), second.T)


def lowrank_sigma(noiser_params, frozen_noiser_params):
    """The scale put on A: sigma / sqrt(rank), in float32 as upstream computes it."""
    return noiser_params["sigma"] / jnp.sqrt(frozen_noiser_params["rank"])


# ----------------------------------------------------------------------------- gradients of one leaf
def factor_grad(A, B, scores):
    """g = einsum('nir,njr->ij', f * A, B) / N from given factors A (N, a, r) (already times ±sigma/sqrt(r)), B (N, b, r)."""
    weighted = jnp.reshape(scores, scores.shape + (1, 1)) * A
    return emulation.einsum("nir,njr->ij", weighted, B) / scores.shape[0]


def noise_grad(eps, scores):
    """g = mean_i(f_i * eps_i) from given full-rank noise eps (N, *shape) (already times ±sigma)."""
    weighted = jnp.reshape(scores, scores.shape + (1,) * (eps.ndim - 1)) * eps
    return jnp.mean(weighted, axis=0)


def lowrank_grad(base_sigma, param, key, scores, iterinfos, frozen_noiser_params):
    """factor_grad of every member's factors for a low-rank leaf, drawn with the noiser's own key."""
    factors = jax.vmap(partial(lowrank_factors, frozen_noiser_params), in_axes=(None, 0, None, None))
    A, B = factors(base_sigma / jnp.sqrt(frozen_noiser_params["rank"]), iterinfos, param, key)  # (N,a,r),(N,b,r)
    return factor_grad(A, B, scores)


def fullrank_grad(base_sigma, param, key, scores, iterinfos, frozen_noiser_params):
    """noise_grad of every member's noise for a full-rank leaf; zero when freeze_nonlora."""
    if frozen_noiser_params["freeze_nonlora"]:
        return jnp.zeros_like(param)
    noise = jax.vmap(partial(fullrank_noise, frozen_noiser_params), in_axes=(None, 0, None, None))
    return noise_grad(noise(base_sigma, iterinfos, param, key), scores).astype(param.dtype)   # (N, *shape) -> shape


def no_grad(base_sigma, param, key, scores, iterinfos, frozen_noiser_params):
    """Embedding and excluded leaves: no update."""
    return jnp.zeros_like(param)


GRAD_FNS = {PARAM: fullrank_grad, MM_PARAM: lowrank_grad, EMB_PARAM: no_grad, EXCLUDED: no_grad}


def leaf_grad(frozen_noiser_params, sigma, param, key, scores, iterinfos, es_class):
    """The noiser's g for one leaf; scanned leaves (a key per leading index) are done slice by slice."""
    if es_class not in GRAD_FNS:
        raise ValueError(f"es_map value must be one of {ES_CLASSES} (PARAM, MM_PARAM, EMB_PARAM, EXCLUDED), got {es_class!r}")
    key = as_typed_key(key)
    if key.ndim == 0:
        return GRAD_FNS[es_class](sigma, param, key, scores, iterinfos, frozen_noiser_params)
    step = lambda _, pk: (0, leaf_grad(frozen_noiser_params, sigma, pk[0], pk[1], scores, iterinfos, es_class))
    return jax.lax.scan(step, 0, xs=(param, key))[1]


# ----------------------------------------------------------------------------- over the parameter tree
def map_leaves(fn, params, es_tree_key, es_map):
    """fn(param, typed key, es_class) on every leaf, one call per leaf: the per-leaf update path."""
    return jax.tree.map(lambda p, k, m: fn(p, as_typed_key(k), m), params, es_tree_key, es_map)


def leaf_buckets(flat_params, flat_keys, flat_classes) -> dict[tuple, list[int]]:
    """Leaf indices grouped by (shape, dtype, key shape, es class): the leaves one vmapped call can take together."""
    buckets: dict[tuple, list[int]] = defaultdict(list)
    for i, (p, k, m) in enumerate(zip(flat_params, flat_keys, flat_classes)):
        buckets[(jnp.shape(p), jnp.dtype(p.dtype), k.shape, m)].append(i)
    return buckets


def map_leaves_batched(fn, params, es_tree_key, es_map):
    """Like map_leaves, but fn is vmapped once per bucket of alike leaves (fewer, larger ops for XLA to compile)."""
    flat_params, treedef = jax.tree.flatten(params)
    flat_keys = [as_typed_key(k) for k in treedef.flatten_up_to(es_tree_key)]
    flat_classes = treedef.flatten_up_to(es_map)
    out: list[Any] = [None] * len(flat_params)
    for (_, _, _, es_class), idx in leaf_buckets(flat_params, flat_keys, flat_classes).items():
        stacked = jax.vmap(lambda p, k: fn(p, k, es_class))(jnp.stack([flat_params[i] for i in idx]),
                                                           jnp.stack([flat_keys[i] for i in idx]))
        for j, i in enumerate(idx):
            out[i] = stacked[j]
    return jax.tree.unflatten(treedef, out)


def leaf_mapper(frozen_noiser_params):
    """map_leaves_batched when frozen_noiser_params asks for use_batched_update, else map_leaves."""
    return map_leaves_batched if frozen_noiser_params.get("use_batched_update", False) else map_leaves


def es_grads(frozen_noiser_params, noiser_params, params, es_tree_key, fitnesses, iterinfos, es_map):
    """Pytree of g (before the -sqrt(N) scaling handed to the solver), per leaf or batched by (shape, class).

    Ours, for callers that log g (the trainer); it checks that fitnesses and iterinfos describe one
    population, and, like upstream's update, nothing about their values (NaN flows through).
    """
    check_population(fitnesses, iterinfos)
    sigma = noiser_params["sigma"]
    grad = lambda p, k, m: leaf_grad(frozen_noiser_params, sigma, p, k, fitnesses, iterinfos, m)
    return leaf_mapper(frozen_noiser_params)(grad, params, es_tree_key, es_map)


def solver_input(grad, n_members: int, dtype):
    """What the noiser hands optax: -(g * sqrt(N)), so a descent step moves params by +lr * sqrt(N) * g."""
    return -(grad * jnp.sqrt(n_members)).astype(dtype)


def apply_solver(frozen_noiser_params, noiser_params, params, directions):
    """The solver's step on the directions, applied; noiser_params["opt_state"] is updated in place (as upstream does).

    Returns (noiser_params, new params): the caller's dict itself, so code that ignores it keeps the new state.
    """
    updates, noiser_params["opt_state"] = frozen_noiser_params["solver"].update(
        directions, noiser_params["opt_state"], params)
    return noiser_params, optax.apply_updates(params, updates)


def apply_grads(frozen_noiser_params, noiser_params, params, grads, n_members: int):
    """The second half of do_updates: -(g * sqrt(N)) through the solver, applied, opt_state updated in place."""
    directions = jax.tree.map(lambda g, p: solver_input(g, n_members, p.dtype), grads, params)
    return apply_solver(frozen_noiser_params, noiser_params, params, directions)


def es_step(mapper, noiser, frozen_noiser_params, noiser_params, params, base_keys, fitnesses, iterinfos, es_map):
    """One ES step: noiser._do_update (overrides included) on the leaves as mapper walks them (map_leaves one by one,
    map_leaves_batched vmapped by bucket) at this population and sigma, then the solver's step (apply_solver's)."""
    sigma = noiser_params["sigma"]
    directions = mapper(lambda p, k, m: noiser._do_update(p, k, fitnesses, iterinfos, m, sigma, frozen_noiser_params),
                        params, base_keys, es_map)
    return apply_solver(frozen_noiser_params, noiser_params, params, directions)


def check_population(fitnesses, iterinfos) -> None:
    """Shapes only (the same eagerly and under jit): one fitness per member and (epochs, thread_ids) to match."""
    if iterinfos is None or len(iterinfos) != 2:
        raise ValueError("iterinfos must be (epochs (N,), thread_ids (N,)) for the whole population")
    n = fitnesses.shape[0] if getattr(fitnesses, "ndim", 0) == 1 else None
    if n is None:
        raise ValueError(f"fitnesses must be a 1-D array (one per member), got shape {getattr(fitnesses, 'shape', None)}")
    for name, arr in zip(("epochs", "thread_ids"), iterinfos):
        if jnp.shape(arr) != (n,):
            raise ValueError(f"iterinfos {name} must have shape ({n},) like fitnesses, got {jnp.shape(arr)}")


# ----------------------------------------------------------------------------- the noiser classes
class Noiser:
    """No noise at all: the interface every noiser has, with the plain model's behaviour."""

    @classmethod
    def init_noiser(cls, params, sigma, lr, *args, solver=None, solver_kwargs=None, **kwargs):
        """({}, {}): nothing to hold; extra arguments are ignored, as upstream's base noiser ignores them."""
        return {}, {}

    @classmethod
    def do_mm(cls, frozen_noiser_params, noiser_params, param, base_key, iterinfo, x):
        return emulation.matmul(x, param.T)

    @classmethod
    def do_Tmm(cls, frozen_noiser_params, noiser_params, param, base_key, iterinfo, x):
        return emulation.matmul(x, param)

    @classmethod
    def do_emb(cls, frozen_noiser_params, noiser_params, param, base_key, iterinfo, x):
        return param[x]

    @classmethod
    def get_noisy_standard(cls, frozen_noiser_params, noiser_params, param, base_key, iterinfo):
        return param

    @classmethod
    def convert_fitnesses(cls, frozen_noiser_params, noiser_params, raw_scores, num_episodes_list=None):
        return raw_scores

    @classmethod
    def do_updates(cls, frozen_noiser_params, noiser_params, params, base_keys, fitnesses, iterinfos, es_map):
        return noiser_params, params


class EggRoll(Noiser):
    """Low-rank ES noise: a rank-r perturbation (A*s) @ B.T per weight, full-rank noise on plain leaves.

    Built like upstream's so that its subclasses work here: do_updates -> _do_updates_original or
    _do_updates_batched -> cls._do_update per leaf (the solver input of one leaf). No value is
    validated (upstream validates none): our trainers and the parity suite check what they feed it.
    """

    @classmethod
    def init_noiser(cls, params, sigma, lr, *args, solver=None, solver_kwargs=None, group_size=0,
                    freeze_nonlora=False, noise_reuse=0, rank=1, use_batched_update=False, **kwargs):
        """(frozen_noiser_params, noiser_params = {"sigma", "opt_state"}); solver(lr, **solver_kwargs) defaults to optax.sgd.

        Extra positional and keyword arguments are ignored, as upstream ignores them, so one settings
        dict can serve several noisers. Settings are stored as given (sigma=0.0, rank=jnp.int32(2), ...).
        """
        solver = optax.sgd if solver is None else solver
        optimizer = solver(lr, **({} if solver_kwargs is None else solver_kwargs))
        frozen = {"group_size": group_size, "freeze_nonlora": freeze_nonlora, "noise_reuse": noise_reuse,
                  "solver": optimizer, "rank": rank, "use_batched_update": use_batched_update}
        return frozen, {"sigma": sigma, "opt_state": optimizer.init(params)}

    @classmethod
    def do_mm(cls, frozen_noiser_params, noiser_params, param, base_key, iterinfo, x):
        """x @ W.T + x @ B @ (A*s).T for W (out, in); the plain product when iterinfo is None."""
        factors = None if iterinfo is None else lowrank_factors(
            frozen_noiser_params, lowrank_sigma(noiser_params, frozen_noiser_params), iterinfo, param, base_key)
        return perturbed_matmul(x, param, factors, stored_in_out=False)

    @classmethod
    def do_Tmm(cls, frozen_noiser_params, noiser_params, param, base_key, iterinfo, x):
        """x @ W + x @ (A*s) @ B.T for W stored (in, out) (so a = in, b = out)."""
        factors = None if iterinfo is None else lowrank_factors(
            frozen_noiser_params, lowrank_sigma(noiser_params, frozen_noiser_params), iterinfo, param, base_key)
        return perturbed_matmul(x, param, factors, stored_in_out=True)

    @classmethod
    def do_emb(cls, frozen_noiser_params, noiser_params, param, base_key, iterinfo, x):
        """Embedding lookup without noise (embedding leaves are neither perturbed nor updated)."""
        return param[x]

    @classmethod
    def get_noisy_standard(cls, frozen_noiser_params, noiser_params, param, base_key, iterinfo):
        """param + normal * ±sigma, or param itself when iterinfo is None or freeze_nonlora."""
        if iterinfo is None or frozen_noiser_params["freeze_nonlora"]:
            return param
        return param + fullrank_noise(frozen_noiser_params, noiser_params["sigma"], iterinfo, param, base_key)

    @classmethod
    def convert_fitnesses(cls, frozen_noiser_params, noiser_params, raw_scores, num_episodes_list=None):
        """(f - mean) / sqrt(var + 1e-5), population variance; with groups, group means but the global variance."""
        group_size = frozen_noiser_params["group_size"]
        scale = jnp.sqrt(jnp.var(raw_scores, keepdims=True) + 1e-5)
        if group_size == 0:
            return (raw_scores - jnp.mean(raw_scores, keepdims=True)) / scale
        if raw_scores.size % group_size:
            raise ValueError(f"population {raw_scores.size} is not a multiple of group_size {group_size}")
        groups = raw_scores.reshape((-1, group_size))
        return ((groups - jnp.mean(groups, axis=-1, keepdims=True)) / scale).ravel()

    @classmethod
    def _do_update(cls, param, base_key, fitnesses, iterinfos, map_classification, sigma, frozen_noiser_params,
                   **kwargs):
        """One leaf's solver input -(g * sqrt(N)) in its dtype, g by es_map class: the hook subclasses override."""
        g = leaf_grad(frozen_noiser_params, sigma, param, base_key, fitnesses, iterinfos, map_classification)
        return solver_input(g, fitnesses.size, param.dtype)

    @classmethod
    def do_updates(cls, frozen_noiser_params, noiser_params, params, base_keys, fitnesses, iterinfos, es_map):
        """One ES step: _do_updates_batched if frozen_noiser_params["use_batched_update"], else _do_updates_original."""
        if frozen_noiser_params.get("use_batched_update", False):
            return cls._do_updates_batched(frozen_noiser_params, noiser_params, params, base_keys, fitnesses,
                                           iterinfos, es_map)
        return cls._do_updates_original(frozen_noiser_params, noiser_params, params, base_keys, fitnesses,
                                        iterinfos, es_map)

    @classmethod
    def _do_updates_original(cls, frozen_noiser_params, noiser_params, params, base_keys, fitnesses, iterinfos,
                             es_map):
        """cls._do_update leaf by leaf, then the solver; noiser_params["opt_state"] updated in place, both returned."""
        return es_step(map_leaves, cls, frozen_noiser_params, noiser_params, params, base_keys, fitnesses, iterinfos,
                       es_map)

    @classmethod
    def _do_updates_batched(cls, frozen_noiser_params, noiser_params, params, base_keys, fitnesses, iterinfos,
                            es_map):
        """cls._do_update vmapped over each bucket of alike leaves, then the solver; same contract as the original."""
        return es_step(map_leaves_batched, cls, frozen_noiser_params, noiser_params, params, base_keys, fitnesses,
                       iterinfos, es_map)


# Upstream's module-level names for the two draws (same signatures).
get_lora_update_params = lowrank_factors
get_nonlora_update_params = fullrank_noise

# Module-level names for callers that prefer functions to classmethods.
init_noiser = EggRoll.init_noiser
do_mm = EggRoll.do_mm
do_Tmm = EggRoll.do_Tmm
do_emb = EggRoll.do_emb
get_noisy_standard = EggRoll.get_noisy_standard
convert_fitnesses = EggRoll.convert_fitnesses
do_updates = EggRoll.do_updates
