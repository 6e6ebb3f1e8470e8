"""egg.c's matrix noise (spec/int8_knobs.py, int8_noise=xorshift) in torch, the whole population in one product.

egg.c draws a matrix slice's factors from xorshift32 (x ^= x << 13; x ^= x >> 17; x ^= x << 5), A first then B, each
value (+1 if bit 0 else -1) * ((r >> 1) & 31), seeded
    seed = step_seed + pair + (999 for the head, else 100 l + k)     (uint32, wrapping; k: Wf 1, Uf 2, Wh 3, Uh 4,
    step_seed = base ^ (epoch * 0x9e3779b9)                           mlp.0 5, mlp.1 6; base = the run's seed)
xorshift32 is linear over GF(2): the state after k steps is M^k x for a fixed 32 x 32 bit matrix M. A value reads
only bits 0..5 of its state, so every draw of every pair and slice is one product
    values bits (S, 6 n) = bits(seeds) (S, 32) @ C (32, 6 n)  mod 2,    C[i, 6 (k-1) + j] = bit j of M^k e_i
(C built once per length n by running xorshift from the 32 unit states; a float32 product of 0/1 terms summing to
at most 32 is exact). No loop over pairs, slices or draws.
"""
from __future__ import annotations

import functools

import numpy as np
import torch

_MULT = 0x9E3779B9
_MASK = 0xFFFFFFFF
# the leaf's offset k in the seed (egg.c's matrix numbering); the head's is 999 with no layer term
SEED_OFFSET = {"blocks.att.Wf": 1, "blocks.att.Uf": 2, "blocks.att.Wh": 3, "blocks.att.Uh": 4,
               "blocks.mlp.0.weight": 5, "blocks.mlp.1.weight": 6, "head": 999}
_VALUE_BITS = 6                                   # bit 0: the sign; bits 1..5: the magnitude


@functools.lru_cache(maxsize=None)
def _draw_bits(n: int) -> np.ndarray:
    """C (32, 6 n) float32: bit j (0..5) of the state after k = 1..n steps from each unit state e_i."""
    state = (np.uint64(1) << np.arange(32, dtype=np.uint64)).astype(np.uint64)       # (32,) unit states
    out = np.empty((32, n, _VALUE_BITS), np.float32)
    for k in range(n):                            # built once per length: 32 states stepped together
        state ^= (state << np.uint64(13)) & np.uint64(_MASK)
        state ^= state >> np.uint64(17)
        state ^= (state << np.uint64(5)) & np.uint64(_MASK)
        out[:, k, :] = (state[:, None] >> np.arange(_VALUE_BITS, dtype=np.uint64)) & np.uint64(1)
    return out.reshape(32, n * _VALUE_BITS)


def draw_bits(n: int, device) -> torch.Tensor:
    return torch.from_numpy(_draw_bits(n)).to(device)


def values(seeds: torch.Tensor, n: int) -> torch.Tensor:
    """The first n xorshift values from each seed: seeds (...,) int64 holding uint32 -> (..., n) int8 in [-31, 31]."""
    shape = seeds.shape
    bits = ((seeds.reshape(-1, 1) >> torch.arange(32, device=seeds.device)) & 1).to(torch.float32)   # (S, 32)
    state_bits = torch.remainder(bits @ draw_bits(n, seeds.device), 2).to(torch.int32)
    state_bits = state_bits.view(-1, n, _VALUE_BITS)
    magnitude = (state_bits[..., 1:] << torch.arange(_VALUE_BITS - 1, device=seeds.device)).sum(-1)
    sign = 2 * state_bits[..., 0] - 1
    return (sign * magnitude).to(torch.int8).view(*shape, n)


def seeds(path: str, base: int, epoch: int, pairs: torch.Tensor, n_layer: int | None) -> torch.Tensor:
    """egg.c's seed of each (pair[, layer]) for a matrix leaf: (P,) or (P, L) int64 holding uint32."""
    step = (base & _MASK) ^ ((epoch * _MULT) & _MASK)
    offset = SEED_OFFSET[path]
    p = pairs.to(torch.int64).view(-1, 1) if n_layer is not None else pairs.to(torch.int64)
    if n_layer is None:
        return (step + p + offset) & _MASK
    layer = torch.arange(n_layer, device=p.device) * 100
    return (step + p + layer + offset) & _MASK


def factors(path: str, a: int, b: int, base: int, epoch: int, pairs: torch.Tensor, n_layer: int | None
            ) -> tuple[torch.Tensor, torch.Tensor]:
    """(A (P, *stack, a), B (P, *stack, b)) int8 of a matrix leaf stored (a, b): A drawn first, no member sign."""
    w = values(seeds(path, base, epoch, pairs, n_layer), a + b)
    return w[..., :a], w[..., a:]
