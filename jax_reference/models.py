"""Models with the upstream HyperscaleES interface: `Parameter`, `MM`, `TMM`, `Linear`, `MLP`.

A model is a class of classmethods. `rand_init` returns a `CommonInit` (frozen_params,
params, scan_map, es_map) and `forward(noiser, frozen_noiser_params, noiser_params,
frozen_params, params, es_tree_key, iterinfo, *args)` runs it with every weight product
and every plain parameter routed through the noiser, so the noiser decides the noise.
Written from the documented behaviour of the public HyperscaleES models (GPL-3.0); no upstream code is copied.
"""
from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from jax_reference import emulation

# What the noiser does with a leaf (the values of `es_map`).
PARAM = 0       # full-rank noise (biases): param + sigma * eps
MM_PARAM = 1    # low-rank noise on a weight used in a matrix product
EMB_PARAM = 2   # embedding table: no noise, no update
EXCLUDED = 3    # no noise, no update


class CommonInit(NamedTuple):
    """What `rand_init` returns: static config, the parameter pytree and two maps of the same structure."""

    frozen_params: Any   # static config (e.g. the activation name) or None
    params: Any          # the trainable pytree
    scan_map: Any        # per leaf: tuple of scanned axes (() = none)
    es_map: Any          # per leaf: PARAM, MM_PARAM, EMB_PARAM or EXCLUDED


class CommonParams(NamedTuple):
    """Everything `_forward` needs, passed down the module tree as one value."""

    noiser: Any
    frozen_noiser_params: Any
    noiser_params: Any
    frozen_params: Any
    params: Any
    es_tree_key: Any
    iterinfo: Any        # (epoch, thread_id) or None for the unperturbed model


def layer_norm(x, eps=1e-5):
    """Parameter-free layer norm over the last axis (population variance)."""
    mean = jnp.mean(x, axis=-1, keepdims=True)
    var = jnp.var(x, axis=-1, keepdims=True)
    return (x - mean) / jnp.sqrt(var + eps)


def _pqn(x):
    return jax.nn.relu(layer_norm(x))


# Hidden activations by name. `tanh` is ours (upstream has relu, silu, pqn): the drifted
# torch ports used it, and the reference must be able to run what a knob asks for.
ACTIVATIONS = {
    "relu": jax.nn.relu,
    "silu": jax.nn.silu,
    "pqn": _pqn,
    "tanh": jnp.tanh,
}


def is_typed_key(key) -> bool:
    return jax.dtypes.issubdtype(getattr(key, "dtype", None), jax.dtypes.prng_key)


def as_typed_key(key):
    """A typed key array from either a typed key or a raw uint32 `PRNGKey` (last axis of 2 words)."""
    if is_typed_key(key):
        return key
    key = jnp.asarray(key)
    if key.dtype != jnp.uint32 or key.shape[-1:] != (2,):
        raise TypeError(
            f"expected a JAX key (jax.random.key(...) or a uint32 PRNGKey of shape (..., 2)), "
            f"got dtype {key.dtype} shape {key.shape}"
        )
    return jax.random.wrap_key_data(key)


def recursive_scan_split(param, base_key, scan_tuple):
    """One key per index of each scanned axis in scan_tuple, in order (an empty tuple: the key itself)."""
    if len(scan_tuple) == 0:
        return base_key
    keys = jax.random.split(base_key, param.shape[scan_tuple[0]])
    return jax.vmap(recursive_scan_split, in_axes=(None, 0, None))(param, keys, tuple(scan_tuple[1:]))


def simple_es_tree_key(params, base_key, scan_map):
    """Leaf i (JAX flatten order: dict keys sorted) gets `split(base_key, n_leaves)[i]`, split further along scanned axes."""
    leaves, treedef = jax.tree.flatten(params)
    keys = jax.random.split(as_typed_key(base_key), len(leaves))
    key_tree = jax.tree.unflatten(treedef, list(keys))
    # params is a prefix of scan_map (each leaf of params meets a tuple there).
    return jax.tree.map(recursive_scan_split, params, key_tree, scan_map)


def merge_inits(**parts: CommonInit) -> CommonInit:
    """Combine named sub-module inits into one dict-shaped init (frozen_params None if no part has any)."""
    frozen = {name: part.frozen_params for name, part in parts.items() if part.frozen_params is not None}
    return CommonInit(
        frozen or None,
        {name: part.params for name, part in parts.items()},
        {name: part.scan_map for name, part in parts.items()},
        {name: part.es_map for name, part in parts.items()},
    )


def merge_frozen(common: CommonInit, **extra) -> CommonInit:
    """Add static config entries to an init's frozen_params."""
    return common._replace(frozen_params=(common.frozen_params or {}) | extra)


def call_submodule(cls, name, common_params: CommonParams, *args, **kwargs):
    """Run sub-module `name` of the current params with its own slice of params, keys and frozen config."""
    frozen = common_params.frozen_params
    sub = common_params._replace(
        frozen_params=frozen[name] if frozen and name in frozen else None,
        params=common_params.params[name],
        es_tree_key=common_params.es_tree_key[name],
    )
    return cls._forward(sub, *args, **kwargs)


def noiser_args(common_params: CommonParams) -> tuple:
    """(frozen_noiser_params, noiser_params, param, base_key, iterinfo): how a leaf module calls its noiser."""
    return (common_params.frozen_noiser_params, common_params.noiser_params, common_params.params,
            common_params.es_tree_key, common_params.iterinfo)


class Model:
    """Base: `rand_init` builds a CommonInit; `forward` packs CommonParams and calls `_forward`."""

    @classmethod
    def rand_init(cls, key, *args, **kwargs) -> CommonInit:
        raise NotImplementedError(f"{cls.__name__}.rand_init is not implemented")

    @classmethod
    def forward(cls, noiser, frozen_noiser_params, noiser_params, frozen_params, params, es_tree_key,
                iterinfo, *args, **kwargs):
        common = CommonParams(noiser, frozen_noiser_params, noiser_params, frozen_params, params,
                              es_tree_key, iterinfo)
        return cls._forward(common, *args, **kwargs)

    @classmethod
    def _forward(cls, common_params: CommonParams, *args, **kwargs):
        raise NotImplementedError(f"{cls.__name__}._forward is not implemented")


class Parameter(Model):
    """A plain tensor with full-rank noise: `raw_value` if given, else normal(key, shape) * scale."""

    @classmethod
    def rand_init(cls, key, shape, scale, raw_value, dtype, *args, **kwargs):
        if raw_value is not None:
            value = raw_value.astype(dtype)
        else:
            value = (emulation.normal(key, shape) * scale).astype(dtype)
        return CommonInit(None, value, (), PARAM)

    @classmethod
    def _forward(cls, common_params, *args, **kwargs):
        return common_params.noiser.get_noisy_standard(*noiser_args(common_params))


class MM(Model):
    """Weight stored (out, in), used as x @ W.T; init normal(key, (out, in)) * (1 / sqrt(in))."""

    @classmethod
    def rand_init(cls, key, in_dim, out_dim, dtype, *args, **kwargs):
        scale = 1 / jnp.sqrt(in_dim)                     # float32 reciprocal, then a float32 product
        value = (emulation.normal(key, (out_dim, in_dim)) * scale).astype(dtype)
        return CommonInit(None, value, (), MM_PARAM)

    @classmethod
    def _forward(cls, common_params, x, *args, **kwargs):
        return common_params.noiser.do_mm(*noiser_args(common_params), x)



class InOutLeaf(Model):
    """A leaf stored (in, out), drawn normal(key, (in, out), dtype) * (1 / sqrt(in)) and read through the noiser's
    NOISER_METHOD (TMM's weight and Embedding's table differ in that method and their ES_MAP class only)."""

    ES_MAP, NOISER_METHOD = MM_PARAM, "do_Tmm"

    @classmethod
    def rand_init(cls, key, in_dim, out_dim, dtype, *args, **kwargs):
        scale = 1 / jnp.sqrt(in_dim)
        return CommonInit(None, emulation.normal(key, (in_dim, out_dim), dtype) * scale, (), cls.ES_MAP)

    @classmethod
    def _forward(cls, common_params, x, *args, **kwargs):
        return getattr(common_params.noiser, cls.NOISER_METHOD)(*noiser_args(common_params), x)


class TMM(InOutLeaf):
    """Weight stored (in, out), used as x @ W (do_Tmm); init normal(key, (in, out), dtype) * (1 / sqrt(in))."""

    ES_MAP, NOISER_METHOD = MM_PARAM, "do_Tmm"


class Embedding(InOutLeaf):
    """Table (vocab, dim), looked up by index (do_emb); the noiser leaves it unperturbed."""

    ES_MAP, NOISER_METHOD = EMB_PARAM, "do_emb"


class Linear(Model):
    """{"weight": MM, "bias": zeros(out)}; weight and bias are initialised from the same key."""

    @classmethod
    def rand_init(cls, key, in_dim, out_dim, use_bias, dtype, *args, **kwargs):
        parts = {"weight": MM.rand_init(key, in_dim, out_dim, dtype)}
        if use_bias:
            parts["bias"] = Parameter.rand_init(key, None, None, jnp.zeros(out_dim, dtype=dtype), dtype)
        return merge_inits(**parts)

    @classmethod
    def _forward(cls, common_params, x, *args, **kwargs):
        out = call_submodule(MM, "weight", common_params, x)
        if "bias" in common_params.params:
            out = out + call_submodule(Parameter, "bias", common_params)
        return out


class MLP(Model):
    """Linear layers "0".."L-1" with the named activation between them (not after the last)."""

    @classmethod
    def rand_init(cls, key, in_dim, out_dim, hidden_dims, use_bias, activation, dtype, *args, **kwargs):
        if activation not in ACTIVATIONS:
            raise ValueError(f"unknown activation {activation!r}; known: {', '.join(ACTIVATIONS)}")
        ins = [in_dim] + list(hidden_dims)
        outs = list(hidden_dims) + [out_dim]
        keys = jax.random.split(as_typed_key(key), len(ins))     # one key per layer
        layers = {str(t): Linear.rand_init(keys[t], ins[t], outs[t], use_bias, dtype) for t in range(len(ins))}
        return merge_frozen(merge_inits(**layers), activation=activation)

    @classmethod
    def _forward(cls, common_params, x, *args, **kwargs):
        n_layers = len(common_params.params)
        act = ACTIVATIONS[common_params.frozen_params["activation"]]
        for t in range(n_layers):
            x = call_submodule(Linear, str(t), common_params, x)
            if t != n_layers - 1:
                x = act(x)
        return x
