"""The MLP's parameters as both sides name them: JAX's flatten order, layer shapes, layer count.

Params are named "{layer}.weight" (out, in) and "{layer}.bias" (out,), layers 0..L-1. JAX flattens the
params pytree {"0": {"bias", "weight"}, ...} with dict keys sorted as strings, so "0.bias" comes before
"0.weight" and layer "10" before layer "2"; leaf i in that order gets ES base key i. This module is the
MLP's view of `spec.tree` (the MLP is `spec.tree.mlp_tree(sizes)`), whose `flatten_order` is the one statement
of the order.
"""
from __future__ import annotations

from typing import Iterable, Sequence

from spec.tree import flatten_order


def leaf_names(n_layers: int) -> list[str]:
    """Parameter names in JAX's flatten order: layer keys sorted as strings, then "bias" before "weight"."""
    if n_layers < 1:
        raise ValueError(f"n_layers must be >= 1, got {n_layers}")
    return flatten_order(f"{layer}.{leaf}" for layer in range(n_layers) for leaf in ("weight", "bias"))


def param_shapes(sizes: Sequence[int]) -> dict[str, tuple[int, ...]]:
    """{name: shape} of the MLP with layer widths `sizes` (in, hidden..., out), in JAX's flatten order."""
    n_layers = len(sizes) - 1
    shapes: dict[str, tuple[int, ...]] = {}
    for name in leaf_names(n_layers):
        t = int(name.split(".")[0])
        shapes[name] = (sizes[t + 1],) if name.endswith(".bias") else (sizes[t + 1], sizes[t])
    return shapes


def n_layers_of(names: Iterable[str]) -> int:
    """How many Linear layers a set of parameter names holds (checks they are exactly 0..L-1's)."""
    names = set(names)
    n = sum(name.endswith(".weight") for name in names)
    if not n or names != set(leaf_names(n)):
        raise ValueError(f"params must hold '{{layer}}.weight' and '{{layer}}.bias' for layers 0..L-1, "
                         f"got {sorted(names)}")
    return n


def layer_dims(shapes: dict[str, Sequence[int]]) -> list[tuple[int, int]]:
    """(out, in) of each layer 0..L-1, from a {name: shape} dict."""
    return [tuple(shapes[f"{t}.weight"]) for t in range(n_layers_of(shapes))]
