"""Population-level helpers around the noiser (ours, not upstream's): the parity suite, trainer and benchmark use them.

- `population_noise`: every member's noise in the torch `Noise` layout of DESIGN.md, drawn
  by the noiser's own `lowrank_factors` / `fullrank_eps`, so it is the noise `do_mm` uses.
- `make_population_forward` / `make_forward`: jitted perturbed (vmapped over thread ids)
  and plain forwards of a model such as `MLP`; `make_cached_population_forward` takes the
  noise drawn once (`member_noise_tree`) instead of drawing it at every call.
- `params_to_flat` / `flat_to_params`: the params pytree <-> {"0.weight": array, ...}.

A float32 subtlety worth knowing: inside a jitted graph XLA rewrites `normal(key) * s` as
`erf_inv(u) * (sqrt(2) * s)` when nothing stands between the draw and the product (the bias
noise), which rounds differently in about half the elements (1 ulp). `population_noise` gives
the values of the rule as written (the draw, then the product); a slice between the draw and
the product (the A factor, `Z[b:] * s`) keeps XLA from the rewrite.
"""
from __future__ import annotations

from functools import partial
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from jax_reference.models import MLP, MM_PARAM, PARAM, as_typed_key
from jax_reference.noiser import (EggRoll, fullrank_eps, lowrank_factors, lowrank_sigma, perturbed_matmul,
                                   signed_sigma)
from spec.tree import nest


class PopulationNoise(NamedTuple):
    """The torch side's Noise layout, as numpy arrays (names as in `params_to_flat`)."""

    A: dict[str, np.ndarray]      # weight name -> (pop, out, r), already times ±sigma/sqrt(r)
    B: dict[str, np.ndarray]      # weight name -> (pop, in, r)
    bias: dict[str, np.ndarray]   # plain-leaf name -> (pop, *shape), already times ±sigma; zeros if freeze_nonlora


def _path_name(path) -> str:
    parts = []
    for entry in path:
        for attr in ("key", "idx", "name"):
            if hasattr(entry, attr):
                parts.append(str(getattr(entry, attr)))
                break
        else:
            parts.append(str(entry))
    return ".".join(parts)


def leaf_names(params) -> list[str]:
    """Leaf names in JAX flatten order ("0.bias", "0.weight", "1.bias", ...): leaf i gets ES key i."""
    return [_path_name(path) for path, _ in jax.tree_util.tree_flatten_with_path(params)[0]]


def params_to_flat(params) -> dict[str, np.ndarray]:
    """{"0.weight": np.ndarray (out, in), "0.bias": (out,), ...} in flatten order."""
    return {_path_name(path): np.asarray(leaf) for path, leaf in jax.tree_util.tree_flatten_with_path(params)[0]}


def flat_to_params(flat: dict, dtype=None) -> dict:
    """The nested pytree {"0": {"bias": ..., "weight": ...}, ...} from dotted names (values copied to jnp arrays;
    spec.tree.nest, which refuses a name nested under a leaf)."""
    return nest({name: jnp.asarray(np.asarray(value), dtype=dtype) for name, value in flat.items()})


def population_iterinfos(epoch: int, pop: int):
    """(epochs (pop,), thread_ids (pop,)) int32: what do_updates takes for a whole population."""
    return jnp.full((pop,), epoch, dtype=jnp.int32), jnp.arange(pop, dtype=jnp.int32)


def member_noise_tree(frozen_noiser_params, noiser_params, params, es_tree_key, es_map, epoch, pop: int):
    """Every member's noise at `epoch`, as a pytree shaped like params (jit-friendly).

    MM leaf -> (A (pop, a, r) times ±sigma/sqrt(r), B (pop, b, r)); PARAM leaf -> (eps (pop, *shape),
    ±sigma (pop,)), kept apart so that `param + eps * s` is evaluated where the noiser evaluates it
    (XLA fuses it into one multiply-add); None for other leaves and for PARAM leaves with
    freeze_nonlora. Drawn by the noiser's own functions, vmapped over thread ids 0..pop-1.
    """
    iterinfos = population_iterinfos(epoch, pop)
    over_members = partial(jax.vmap, in_axes=(None, 0, None, None))

    def leaf_noise(param, key, es_class):
        key = as_typed_key(key)
        if key.ndim != 0 and es_class in (PARAM, MM_PARAM):
            raise ValueError(f"a scanned leaf (key shape {key.shape}) is not supported here; unscanned leaves only")
        if es_class == MM_PARAM:
            return over_members(partial(lowrank_factors, frozen_noiser_params))(
                lowrank_sigma(noiser_params, frozen_noiser_params), iterinfos, param, key)
        if es_class == PARAM and not frozen_noiser_params["freeze_nonlora"]:
            eps = jax.vmap(partial(fullrank_eps, frozen_noiser_params), in_axes=(0, None, None))(iterinfos, param, key)
            return eps, signed_sigma(noiser_params["sigma"], iterinfos[1])
        return None

    return jax.tree.map(leaf_noise, params, es_tree_key, es_map)


def population_noise(frozen_noiser_params, noiser_params, params, es_tree_key, es_map, epoch: int, pop: int
                     ) -> PopulationNoise:
    """Every member's noise at `epoch` in the torch Noise layout: A, B for MM leaves, ±sigma*eps for PARAM leaves."""
    if pop < 1:
        raise ValueError(f"pop must be >= 1, got {pop}")
    tree = member_noise_tree(frozen_noiser_params, noiser_params, params, es_tree_key, es_map, epoch, pop)
    flat_params, treedef = jax.tree.flatten(params)
    noises, classes = treedef.flatten_up_to(tree), treedef.flatten_up_to(es_map)
    A, B, bias = {}, {}, {}
    for name, param, noise, es_class in zip(leaf_names(params), flat_params, noises, classes):
        if es_class == MM_PARAM:
            A[name], B[name] = np.asarray(noise[0]), np.asarray(noise[1])     # (pop, out, r), (pop, in, r)
        elif es_class == PARAM and noise is None:                            # freeze_nonlora
            bias[name] = np.zeros((pop,) + tuple(np.shape(param)), dtype=np.dtype(param.dtype))
        elif es_class == PARAM:
            eps, s = noise                                                    # (pop, *shape), (pop,)
            bias[name] = np.asarray(eps * jnp.reshape(s, (pop,) + (1,) * (eps.ndim - 1)))
    return PopulationNoise(A, B, bias)


class CachedNoise(EggRoll):
    """EggRoll's products, with each member's noise handed in where the key would be.

    The key slot of an MM leaf carries its factors (A, B); of a PARAM leaf either (eps, +-sigma), as
    `member_noise_tree` gives it (so `param + eps * s` is evaluated where the noiser evaluates it), or the
    scaled noise itself, or None for no noise. The trainer draws once per epoch with it; the parity suite
    feeds it any port's factors, so both run EggRoll's own expressions on given noise.
    """

    @classmethod
    def do_mm(cls, frozen_noiser_params, noiser_params, param, base_key, iterinfo, x):
        return perturbed_matmul(x, param, None if iterinfo is None else base_key, stored_in_out=False)

    @classmethod
    def do_Tmm(cls, frozen_noiser_params, noiser_params, param, base_key, iterinfo, x):
        return perturbed_matmul(x, param, None if iterinfo is None else base_key, stored_in_out=True)

    @classmethod
    def get_noisy_standard(cls, frozen_noiser_params, noiser_params, param, base_key, iterinfo):
        if iterinfo is None or base_key is None or frozen_noiser_params.get("freeze_nonlora", False):
            return param
        if isinstance(base_key, tuple):
            eps, s = base_key
            return param + eps * s
        return param + base_key


def make_cached_population_forward(frozen_params, frozen_noiser_params, model=MLP):
    """Jitted f(noiser_params, params, noise_tree, x (pop, in)) -> (pop, out), noise_tree from `member_noise_tree`.

    The same expressions as `make_population_forward` on the same draws; the outputs agree to float32
    rounding (XLA fuses the in-graph draw with the bias's ±sigma product, see the module notes),
    e.g. within 2e-6 on a 4-256-256-2 MLP. 10x faster per call at pop 256, as nothing is redrawn.
    """
    def one_member(noiser_params, params, noise, x):
        return model.forward(CachedNoise, frozen_noiser_params, noiser_params, frozen_params, params, noise,
                             (0, 0), x)   # iterinfo only has to be non-None; the noise carries the member

    members = jax.vmap(one_member, in_axes=(None, None, 0, 0))
    return jax.jit(members)


def make_population_forward(frozen_params, frozen_noiser_params, model=MLP, noiser=EggRoll):
    """Jitted f(noiser_params, params, es_tree_key, epoch, x (pop, in), thread_ids=None) -> (pop, out).

    Member i runs `model.forward` with iterinfo (epoch, thread_ids[i]) on row i of x
    (thread_ids defaults to arange(pop)).
    """
    def one_member(noiser_params, params, es_tree_key, epoch, thread_id, x):
        return model.forward(noiser, frozen_noiser_params, noiser_params, frozen_params, params, es_tree_key,
                             (epoch, thread_id), x)

    members = jax.vmap(one_member, in_axes=(None, None, None, None, 0, 0))

    @jax.jit
    def forward(noiser_params, params, es_tree_key, epoch, x, thread_ids=None):
        if thread_ids is None:
            thread_ids = jnp.arange(x.shape[0], dtype=jnp.int32)
        return members(noiser_params, params, es_tree_key, jnp.asarray(epoch, dtype=jnp.int32),
                       jnp.asarray(thread_ids, dtype=jnp.int32), x)

    return forward


def make_forward(frozen_params, frozen_noiser_params, model=MLP, noiser=EggRoll):
    """Jitted f(noiser_params, params, x (n, in), es_tree_key=None) -> (n, out): the unperturbed model (iterinfo None).

    With iterinfo None no key is read, so any tree of the params' structure will do for es_tree_key.
    """
    @jax.jit
    def forward(noiser_params, params, x, es_tree_key=None):
        keys = params if es_tree_key is None else es_tree_key
        return model.forward(noiser, frozen_noiser_params, noiser_params, frozen_params, params, keys, None, x)

    return forward
