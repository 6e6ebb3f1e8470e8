"""Where a tree model's random numbers come from: ES key sources per leaf and slice, and the LM's init.

rng=jax (spec/tree.py's key scheme, drawn by `torch_impl.random`, JAX's very numbers):
    model_key, es_key, _ = split(key(seed), 3)
    leaf i of the `leaf_order` (sorted: JAX's flatten order `tree.paths`; insertion: `tree.declared`) gets
    split(es_key, n_leaves)[i]; a stacked leaf's slices get recursive_scan_split of it (stack_keys=split) or
    that one key for every slice (stack_keys=shared); keys (*stack_shape, 2).
rng=torch keeps the layout and replaces each draw by a fresh torch generator seeded from
(seed, purpose, leaf index, generation) that draws every slice of the leaf at once (slice-major, one
batched call; stack_keys=shared draws one slice and repeats it); never torch's global state.
Init (`init_lm`): spec.lm.init_plan's keys and scales (rng=jax), or a generator per (seed, PURPOSE_INIT,
declared leaf index) (rng=torch). rng=jax-cpu and rng=jax-gpu are rng=jax with the normals of JAX's CPU or NVIDIA
GPU backend (plain jax: the CPU's).
"""
from __future__ import annotations

import functools
import math
from typing import Callable, Mapping, NamedTuple, Sequence

import torch

from spec.lm import H0_SCALE, TOP, BLOCK, LMConfig, init_plan, lm_tree
from spec.tree import Leaf, Tree
from torch_impl import random as rnd
from torch_impl.keys import PURPOSE_INIT, run_keys, torch_generator

PURPOSE_TREE_NOISE = 5       # rng=torch: the tree noise's generator purpose (CartPole's use 1..4)


# ----------------------------------------------------------------------------- knob tables
# knob leaf_order -> the order leaf keys are handed out in
LEAF_ORDERS: dict[str, Callable[[Tree], list[str]]] = {
    "sorted": lambda tree: list(tree.paths),
    "insertion": lambda tree: list(tree.declared),
}


def split_slices(leaf_key: torch.Tensor, leaf: Leaf) -> torch.Tensor:
    """recursive_scan_split: (*stack_shape, 2), slice (i0, i1, ..) = split(..split(k, n0)[i0].., n1)[i1]."""
    keys = leaf_key
    for n in leaf.stack_shape:
        keys = rnd.split(keys, n)             # (..., n, 2): the batch dims stay first
    return keys


def shared_slices(leaf_key: torch.Tensor, leaf: Leaf) -> torch.Tensor:
    """Every slice gets the leaf's own key: (*stack_shape, 2) all equal (a port's mistake)."""
    return leaf_key.expand(*leaf.stack_shape, 2).clone()


# knob stack_keys -> (leaf key, leaf) -> slice keys (*stack_shape, 2)
STACK_KEYS: dict[str, Callable[[torch.Tensor, Leaf], torch.Tensor]] = {
    "split": split_slices,
    "shared": shared_slices,
}


def es_leaf_keys(tree: Tree, es_key: torch.Tensor, leaf_order: str = "sorted",
                 stack_keys: str = "split") -> dict[str, torch.Tensor]:
    """path -> ES keys (*stack_shape, 2) int64 (shape (2,) for an unstacked leaf): JAX's simple_es_tree_key."""
    order = LEAF_ORDERS[leaf_order](tree)
    keys = rnd.split(es_key, len(order))                                   # (n_leaves, 2)
    slices = STACK_KEYS[stack_keys]
    return {path: slices(keys[order.index(path)], tree.leaf(path)) for path in tree.paths}


class TorchSource(NamedTuple):
    """rng=torch: where a leaf's draws come from. Each generation: one generator (seed, purpose, leaf, g)."""

    seed: int
    leaf: int                 # the leaf's index in the knob leaf_order's order
    distinct: int             # slices drawn (n_slices, or 1 for stack_keys=shared)


def torch_leaf_sources(tree: Tree, seed: int, leaf_order: str = "sorted",
                       stack_keys: str = "split") -> dict[str, TorchSource]:
    order = LEAF_ORDERS[leaf_order](tree)
    return {leaf.path: TorchSource(int(seed), order.index(leaf.path),
                                   leaf.n_slices if stack_keys == "split" else 1) for leaf in tree.leaves}


# ----------------------------------------------------------------------------- the draws of one leaf
def jax_member_normals(slice_keys: torch.Tensor, generation: int, n_draws: int, shape: Sequence[int],
                       device: str | torch.device = "cpu", backend: str = "cpu") -> torch.Tensor:
    """normal(fold_in(fold_in(k_s, generation), p), shape) for draw p and every slice key k_s, in one call:
    (n_draws, *stack_shape, *shape) from slice keys (*stack_shape, 2)."""
    stack = tuple(slice_keys.shape[:-1])
    fused = rnd.member_normals(slice_keys.reshape(-1, 2), generation, n_draws, math.prod(shape), device,
                                      backend)
    if fused is not None:                                          # CUDA: one launch, the keys folded in the kernel
        return fused.reshape(n_draws, *stack, *shape)
    flat = rnd.fold_in(slice_keys.reshape(-1, 2), generation)                              # (S, 2)
    keys = rnd.fold_in(flat.unsqueeze(0), torch.arange(n_draws).unsqueeze(1))              # (P, S, 2)
    z = rnd.normal(keys.to(device), tuple(shape), table=True, backend=backend)    # (P, S, *shape); the table pays
    return z.reshape(n_draws, *stack, *shape)


def torch_member_normals(source: TorchSource, stack: Sequence[int], generation: int, n_draws: int,
                         shape: Sequence[int], device: str | torch.device = "cpu") -> torch.Tensor:
    """The same block from torch's generator (seed, PURPOSE_TREE_NOISE, leaf, generation): slice-major draw."""
    gen = torch_generator(device, source.seed, PURPOSE_TREE_NOISE, source.leaf, generation)
    z = torch.randn((source.distinct, n_draws, *shape), generator=gen, device=device)     # (S', P, *shape)
    z = z.expand(math.prod(stack), n_draws, *shape) if source.distinct == 1 else z
    return z.transpose(0, 1).reshape(n_draws, *stack, *shape)


class TreeGenerator(NamedTuple):
    """A value of knob rng for trees: leaf sources, the member draws, the LM's init normals."""

    name: str
    sources: Callable[[Tree, int, str, str], dict]                 # tree, seed, leaf_order, stack_keys
    draws: Callable[[object, Leaf, int, int, tuple, object], torch.Tensor]   # source, leaf, gen, n, shape, dev
    init_normals: Callable[[LMConfig, int], dict[str, torch.Tensor]]         # cfg, seed -> unscaled normals


def _jax_sources(tree: Tree, seed: int, leaf_order: str, stack_keys: str) -> dict[str, torch.Tensor]:
    return es_leaf_keys(tree, run_keys(seed).es, leaf_order, stack_keys)


def _jax_draws(source, leaf: Leaf, generation: int, n_draws: int, shape, device, backend: str = "cpu") -> torch.Tensor:
    return jax_member_normals(source, generation, n_draws, shape, device, backend)


def _torch_draws(source, leaf: Leaf, generation: int, n_draws: int, shape, device) -> torch.Tensor:
    return torch_member_normals(source, leaf.stack_shape, generation, n_draws, shape, device)


# ----------------------------------------------------------------------------- the LM's init
def jax_init_normals(cfg: LMConfig, seed: int, backend: str = "cpu") -> dict[str, torch.Tensor]:
    """path -> the unscaled normal each "normal"/"h0" leaf of init_plan draws (stacked leaves: (L, *slice))."""
    tree, plan = lm_tree(cfg), init_plan(cfg)
    top = rnd.split(run_keys(seed).model, len(TOP))                                   # (4, 2)
    block_keys = rnd.split(rnd.split(top[TOP.index("blocks")], cfg.layers), len(BLOCK))   # (L, 9, 2)
    out = {}
    for path, rule in plan.items():
        if rule.kind not in ("normal", "h0"):
            continue
        leaf = tree.leaf(path)
        k = top[rule.top] if rule.block is None else block_keys[:, rule.block]
        out[path] = rnd.normal(k, leaf.slice_shape, backend=backend)
    return out


def torch_init_normals(cfg: LMConfig, seed: int) -> dict[str, torch.Tensor]:
    """rng=torch: a generator per (seed, PURPOSE_INIT, declared leaf index) for each drawn leaf."""
    tree, plan = lm_tree(cfg), init_plan(cfg)
    return {path: torch.randn(tree.leaf(path).shape, generator=torch_generator("cpu", seed, PURPOSE_INIT, i))
            for i, path in enumerate(tree.declared) if plan[path].kind in ("normal", "h0")}


def fan_in_scale(fan_in: int) -> torch.Tensor:
    """1 / jnp.sqrt(fan_in) in float32: the sqrt of a float32 rounded, then the reciprocal rounded."""
    return torch.reciprocal(torch.sqrt(torch.tensor(float(fan_in), dtype=torch.float32)))


def init_lm(cfg: LMConfig, seed: int, rng: str = "jax", device: str | torch.device = "cpu") -> dict[str, torch.Tensor]:
    """The LM's initial params {path: float32 tensor at the tree's (stacked) shape} per spec.lm.init_plan."""
    tree, plan = lm_tree(cfg), init_plan(cfg)
    normals = TREE_GENERATORS[rng].init_normals(cfg, seed)
    params = {}
    for leaf in tree.leaves:
        rule = plan[leaf.path]
        if rule.kind == "normal":
            value = normals[leaf.path] * fan_in_scale(rule.fan_in)
        elif rule.kind == "h0":
            value = normals[leaf.path] * torch.tensor(H0_SCALE, dtype=torch.float32)
        elif rule.kind == "shift":
            value = torch.stack([torch.ones(cfg.d_model), torch.zeros(cfg.d_model)]).expand(leaf.shape)
        else:
            value = (torch.ones if rule.kind == "ones" else torch.zeros)(leaf.shape)
        params[leaf.path] = value.to(torch.float32).contiguous().to(device)
    return params


# knob rng -> the tree generator
def _jax_tree_generator(name: str, backend: str) -> TreeGenerator:
    """JAX's keys with the normals of JAX's `backend` (knob rng: jax and jax-cpu the CPU's, jax-gpu an NVIDIA GPU's)."""
    return TreeGenerator(name, _jax_sources, functools.partial(_jax_draws, backend=backend),
                         functools.partial(jax_init_normals, backend=backend))


TREE_GENERATORS: dict[str, TreeGenerator] = {
    "jax": _jax_tree_generator("jax", "cpu"),
    "torch": TreeGenerator("torch", torch_leaf_sources, _torch_draws, torch_init_normals),
    "jax-cpu": _jax_tree_generator("jax-cpu", "cpu"),
    "jax-gpu": _jax_tree_generator("jax-gpu", "gpu"),
}


def source_tag(source) -> tuple:
    """A hashable identity of a leaf source (what a cached draw was made from)."""
    return tuple(source.reshape(-1).tolist()) if isinstance(source, torch.Tensor) else tuple(source)


def check_sources(tree: Tree, sources: Mapping[str, object]) -> None:
    missing = sorted(set(tree.paths) - set(sources))
    if missing:
        raise ValueError(f"the key sources lack leaves {missing}; expected one per leaf of {tree.paths}")
