"""The run's key scheme: where every random number of a training run comes from, for each generator (knob rng).

`rng=jax` is DESIGN.md's scheme, drawn by `torch_impl.random` (JAX's very numbers):
    model_key, es_key, action_key = split(key(seed), 3)
    leaf i (JAX flatten order) of the ES key tree: split(es_key, n_leaves)[i]
    a draw p of a leaf at noise generation g: normal(fold_in(fold_in(leaf key, g), p), shape)
    init of layer t: normal(split(model_key, n_layers)[t], (out, in))
    action uniforms of an epoch: uniform(fold_in(action_key, epoch), (MAX_STEPS, pop))
`rng=torch` keeps the layout and replaces each draw by a fresh torch generator seeded from
(seed, purpose, leaf index, generation), never torch's global state. `rng=jax-cpu` and `rng=jax-gpu` are JAX's scheme
with the normals of JAX's CPU or NVIDIA GPU backend (torch_impl.random's `backend`); plain `jax` is the CPU's.
"""
from __future__ import annotations

import functools
import math
from typing import Callable, NamedTuple, Sequence

import numpy as np
import torch

from rollout.cartpole import MAX_STEPS
from torch_impl import random as rnd

# Purposes of the torch generator's seeds (rng=torch): one stream per (seed, purpose, ...).
PURPOSE_INIT, PURPOSE_WEIGHT, PURPOSE_BIAS, PURPOSE_ACTION = 1, 2, 3, 4
_MASK64 = (1 << 64) - 1


def true_epoch(epoch: int, noise_reuse: int) -> int:
    """Which noise generation an epoch uses: 0 forever when noise_reuse == 0, else epoch // noise_reuse."""
    return 0 if noise_reuse == 0 else epoch // noise_reuse


# ----------------------------------------------------------------------------- JAX's scheme
class RunKeys(NamedTuple):
    model: torch.Tensor    # (2,) int64 key words
    es: torch.Tensor
    action: torch.Tensor


def run_keys(seed: int) -> RunKeys:
    """model_key, es_key, action_key = split(key(seed), 3)."""
    return RunKeys(*rnd.split(rnd.key(seed), 3))


def es_tree_keys(seed: int, names: Sequence[str]) -> dict[str, torch.Tensor]:
    """Leaf name -> base key (2,): split(es_key, n_leaves) in the given (JAX flatten) order."""
    keys = rnd.split(run_keys(seed).es, len(names))
    return {name: keys[i] for i, name in enumerate(names)}


def _jax_draws(source: torch.Tensor, generation: int, n_draws: int, shape: tuple[int, ...],
               device: str | torch.device, backend: str = "cpu") -> torch.Tensor:
    """normal(fold_in(fold_in(k, generation), p), shape) for p = 0..n_draws-1 in one batched call, computed on
    `device` (on CUDA the fused Triton kernel, keys folded in it, or the table runs there: drawing on the
    CPU and copying was 300x slower)."""
    fused = rnd.member_normals(source.reshape(1, 2), generation, n_draws, math.prod(shape), device,
                                       backend)
    if fused is not None:                                                          # CUDA: keys folded in the kernel
        return fused.view(n_draws, *shape)
    keys = rnd.fold_in(rnd.fold_in(source, generation), torch.arange(n_draws))   # (n_draws, 2)
    return rnd.normal(keys.to(device), shape, backend=backend)                     # (n_draws, *shape)


def _jax_init_normals(seed: int, dims: Sequence[tuple[int, int]], backend: str = "cpu") -> list[torch.Tensor]:
    """normal(split(model_key, n_layers)[t], (out, in)) for each layer (MLP.rand_init's draws)."""
    layer_keys = rnd.split(run_keys(seed).model, len(dims))                          # (L, 2)
    return [rnd.normal(layer_keys[t], dim, backend=backend) for t, dim in enumerate(dims)]


def _jax_action_uniforms(seed: int, epoch: int, pop: int) -> np.ndarray:
    """uniform(fold_in(action_key, epoch), (MAX_STEPS, pop)) float32 in [0, 1)."""
    return rnd.uniform(rnd.fold_in(run_keys(seed).action, epoch), (MAX_STEPS, pop)).cpu().numpy()


# ----------------------------------------------------------------------------- torch's generator
def torch_seed(*parts: int) -> int:
    """Mix integers into one 63-bit generator seed (splitmix64 per part): distinct tuples, unrelated streams."""
    state = 0x9E3779B97F4A7C15
    for part in parts:
        state = (state ^ (int(part) & _MASK64)) & _MASK64
        state = (state + 0x9E3779B97F4A7C15) & _MASK64
        z = state
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK64
        state = z ^ (z >> 31)
    return state >> 1


def torch_generator(device: str | torch.device, *parts: int) -> torch.Generator:
    """A fresh torch generator on `device`, seeded from (seed, purpose, ...): no global RNG state."""
    return torch.Generator(device=torch.device(device)).manual_seed(torch_seed(*parts))


def _torch_sources(seed: int, names: Sequence[str]) -> dict[str, tuple[int, int, int]]:
    """Leaf name -> (seed, purpose, leaf index)."""
    return {name: (int(seed), PURPOSE_WEIGHT if name.endswith(".weight") else PURPOSE_BIAS, leaf)
            for leaf, name in enumerate(names)}


def _torch_draws(source: tuple[int, int, int], generation: int, n_draws: int, shape: tuple[int, ...],
                 device: str | torch.device) -> torch.Tensor:
    """The same block as the JAX scheme's, from torch's generator seeded (seed, purpose, leaf, generation)."""
    gen = torch_generator(device, *source, generation)
    return torch.randn((n_draws, *shape), generator=gen, device=device, dtype=torch.float32)


def _torch_init_normals(seed: int, dims: Sequence[tuple[int, int]]) -> list[torch.Tensor]:
    return [torch.randn(*dim, generator=torch_generator("cpu", seed, PURPOSE_INIT, t)) for t, dim in enumerate(dims)]


def _torch_action_uniforms(seed: int, epoch: int, pop: int) -> np.ndarray:
    return torch.rand((MAX_STEPS, pop), generator=torch_generator("cpu", seed, PURPOSE_ACTION, epoch)).numpy()


# ----------------------------------------------------------------------------- the table
class Generator(NamedTuple):
    """One random-number scheme (a value of knob rng): every draw of a run, by purpose."""

    name: str
    leaf_sources: Callable[[int, Sequence[str]], dict]           # run seed, leaf names -> a source per leaf
    draws: Callable[[object, int, int, tuple, object], torch.Tensor]   # source, generation, n, shape, device
    init_normals: Callable[[int, Sequence[tuple[int, int]]], list[torch.Tensor]]   # run seed, (out, in) per layer
    action_uniforms: Callable[[int, int, int], np.ndarray]        # run seed, epoch, pop -> (MAX_STEPS, pop)

    def source_tag(self, source) -> tuple:
        """A hashable, comparable identity of a leaf source (what a cached draw was made from)."""
        return tuple(source.tolist()) if isinstance(source, torch.Tensor) else tuple(source)


def _jax_generator(name: str, backend: str) -> Generator:
    """JAX's scheme with the normals of JAX's `backend` (the uniforms are the same on every backend)."""
    return Generator(name, es_tree_keys, functools.partial(_jax_draws, backend=backend),
                     functools.partial(_jax_init_normals, backend=backend), _jax_action_uniforms)


GENERATORS: dict[str, Generator] = {
    "jax": _jax_generator("jax", "cpu"),
    "torch": Generator("torch", _torch_sources, _torch_draws, _torch_init_normals, _torch_action_uniforms),
    "jax-cpu": _jax_generator("jax-cpu", "cpu"),
    "jax-gpu": _jax_generator("jax-gpu", "gpu"),
}
