"""nano-egg's integer ES step in torch (spec/int8.py, "ES step"), as an evosax-style ask/tell over plain data.

    es = make(cfg)                      # the tree, the threshold schedule
    state = init(es, seed)              # int8 params, the leaf keys, epoch 0
    noise, state = ask(es, state)       # the epoch's PairNoise (per pair; noise.member_view signs it)
    state, info = tell(es, state, noise, scores)   # fitness signs, votes Z, the +-1 update; epoch + 1

tell, with the pairs' signs f_k = sign(s_2k - s_2k+1) (int8) and each pair's (+) noise (thread 2k: the pair's
windows unsigned):
    low rank (the embedding too)  Z = sum_k f_k A_k B_k^T           (use_clt off: sign(A_k) sign(B_k)^T)
    full rank                     Z = sum_k f_k E_k                 (use_clt off: sign(E_k))
    P' = clip(P if |Z| * 16 < thr_e * isqrt(pairs) * (256 if use_clt else 1) else P + (+1 if Z > 0 else -1))
in int32 as XLA computes it (products cast to int64 and reduced mod 2^32: exact, see int8/model.py). At thr_e = 0 every
entry moves and Z = 0 moves DOWN (nano-egg's quirk, kept). Every leaf is one batched product over its slices and the
pairs; the loop over the 13 leaves is there because their shapes differ.
"""
from __future__ import annotations

import math
from typing import NamedTuple

import torch

from spec.int8 import FIXED_POINT, Int8Config, int8_tree, threshold_at, thresholds
from spec.int8_knobs import NANO_EGG, Int8Knobs, evolves
from spec.jax_rng import check_backend
from spec.tree import Tree
from torch_impl.int8.model import I32, I64, clip8, init_params, int_matmul
from torch_impl.int8.noise import PairNoise, leaf_keys, normal_lut, population_noise

Params = dict[str, torch.Tensor]


class Int8ES(NamedTuple):
    cfg: Int8Config
    tree: Tree
    thresholds: tuple[int, ...]          # thr_e for e = 0..epochs-1 (spec.int8.thresholds)
    knobs: Int8Knobs = NANO_EGG          # egg.c's departures (spec/int8_knobs.py); nano-egg's by default
    backend: str = "cpu"                 # whose float32 normals the table and the init read: JAX's CPU's or GPU's


class Int8State(NamedTuple):
    params: Params                       # {path: int8 tensor at the tree's stacked shape}
    epoch: int
    keys: dict                           # {path: ES key (*stack, 2)}
    seed: int                            # the noise table's key: key(seed)


def make(cfg: Int8Config, knobs: Int8Knobs = NANO_EGG, backend: str = "cpu") -> Int8ES:
    return Int8ES(cfg, int8_tree(cfg), thresholds(cfg), knobs, check_backend(backend))


def init(es: Int8ES, seed: int, device: str | torch.device = "cpu", params: Params | None = None) -> Int8State:
    """Epoch 0: nano-egg's init (or the given params) and the ES leaf keys."""
    params = init_params(es.cfg, seed, device, es.backend) if params is None else params
    keys = {k: v.to(device) for k, v in leaf_keys(es.cfg, seed).items()}
    normal_lut(device, es.backend)                                        # build the 8 MiB LUT up front
    return Int8State(params, 0, keys, int(seed))


def ask(es: Int8ES, state: Int8State) -> tuple[PairNoise, Int8State]:
    """The population's noise at state.epoch, one PairNoise for the pop / 2 pairs."""
    return population_noise(es.tree, state.keys, state.seed, state.epoch, es.cfg.pairs, es.cfg.noise_reuse,
                            es.cfg.rank, normal_lut(next(iter(state.keys.values())).device, es.backend),
                            es.knobs), state


def threshold(es: Int8ES, epoch: int) -> int:
    """thr_e; past the configured epochs the schedule's formula goes on (spec.int8.threshold_at)."""
    if epoch < len(es.thresholds):
        return es.thresholds[epoch]
    return threshold_at(epoch, es.cfg.alpha, es.cfg.alpha_decay_timestep)


def fitness(scores: torch.Tensor) -> torch.Tensor:
    """sign(s_2k - s_2k+1) as int8 (pairs,), the difference in wrapping int32 as XLA's."""
    s = torch.as_tensor(scores).to(I32).view(-1, 2)
    return torch.sign(s[:, 0] - s[:, 1]).to(torch.int8)


def leaf_votes(tree: Tree, noise: PairNoise, f: torch.Tensor, use_clt: bool = True) -> dict[str, torch.Tensor]:
    """{path: Z int32 at the leaf's stacked shape}: sum_k f_k N_k with each pair's (+) noise (0 for a leaf that has
    no noise: one that does not evolve)."""
    f64 = f.to(I64)
    sign = (lambda t: t) if use_clt else torch.sign
    Z = {}
    for leaf in tree.leaves:
        if leaf.path not in noise.A and leaf.path not in noise.E:
            Z[leaf.path] = torch.zeros(leaf.shape, dtype=I32, device=f.device)
        elif leaf.cls == "param":
            E = sign(noise.E[leaf.path].to(I64))                                  # (K, *stack, *S)
            Z[leaf.path] = (f64.view(-1, *[1] * (E.dim() - 1)) * E).sum(0).to(I32)
        else:
            A = sign(noise.A[leaf.path].to(I64))                                  # (K, *stack, a)
            B = sign(noise.B[leaf.path].to(I64))                                  # (K, *stack, b)
            fA = f64.view(-1, *[1] * (A.dim() - 1)) * A
            # (*stack, a, K) @ (*stack, K, b): one batched integer product over the slices
            Z[leaf.path] = int_matmul(fA.movedim(0, -1), B.movedim(0, -2))
    return Z


def apply_votes(param: torch.Tensor, Z: torch.Tensor, thr: int, pairs: int, use_clt: bool = True,
                knobs: Int8Knobs = NANO_EGG) -> torch.Tensor:
    """+1 (Z > 0) or -1 (Z <= 0) where |Z| * 16 >= thr * isqrt(pairs) * (256 if use_clt else 1), clipped; int8.
    vote_threshold=fixed160 (egg.c): +1 where Z > 160, -1 where Z < -160, else held (no schedule)."""
    if knobs.vote_threshold == "fixed160":
        p = param.to(I32)
        return clip8(torch.where(Z > 160, p + 1, torch.where(Z < -160, p - 1, p)))
    bound = thr * math.isqrt(pairs) * ((4 ** FIXED_POINT) if use_clt else 1)
    p = param.to(I32)
    moved = torch.where(Z > 0, p + 1, p - 1)
    held = Z.to(I32).abs() * (2 ** FIXED_POINT) < bound                      # int32, as XLA (wraps alike)
    return clip8(torch.where(held, p, moved))


def update(es: Int8ES, params: Params, Z: dict, thr: int) -> Params:
    """The +-1 vote of every leaf under es.knobs (a leaf that does not evolve is kept as it is)."""
    return {leaf.path: apply_votes(params[leaf.path], Z[leaf.path], thr, es.cfg.pairs, es.cfg.use_clt, es.knobs)
            if evolves(leaf.cls, es.knobs) else params[leaf.path] for leaf in es.tree.leaves}


def tell(es: Int8ES, state: Int8State, noise: PairNoise, scores: torch.Tensor) -> tuple[Int8State, dict]:
    """One ES step from the members' scores (pop,) int32: fitness signs, votes, the update; the next epoch."""
    scores = torch.as_tensor(scores)
    if scores.shape != (es.cfg.pop,):
        raise ValueError(f"scores must have shape ({es.cfg.pop},), got {tuple(scores.shape)}")
    f = fitness(scores)
    Z = leaf_votes(es.tree, noise, f.to(next(iter(state.params.values())).device), es.cfg.use_clt)
    thr = threshold(es, state.epoch)
    params = update(es, state.params, Z, thr)
    return state._replace(params=params, epoch=state.epoch + 1), {"fitness": f, "votes": Z, "threshold": thr}


__all__ = ["Int8ES", "Int8State", "make", "init", "ask", "tell", "fitness", "leaf_votes", "apply_votes", "update",
           "threshold"]
