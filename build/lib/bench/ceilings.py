"""The machine's ceilings (dense matmul GFLOP/s, copy GB/s) and the time floor of a forward.

The floor of a population forward is max(FLOPs / peak, bytes / bandwidth) for the least
work any implementation must do: the shared dense product, the rank-r product through the
member's own factors, and each layer's inputs, weights, factors and outputs moved once.
"""
from __future__ import annotations

from typing import NamedTuple, Sequence

import torch

from bench.measure import Summary, quantiles, time_calls, torch_sync

F32 = 4  # bytes per float32


class Ceilings(NamedTuple):
    """Measured peaks: dense float32 matmul GFLOP/s and large-copy GB/s (read + write bytes)."""

    matmul_gflops: Summary
    copy_gbps: Summary

    @property
    def peak_flops(self) -> float:
        """FLOP/s used for floors: the best matmul rate seen (a ceiling is what the machine can do)."""
        return self.matmul_gflops.p90 * 1e9

    @property
    def peak_bytes(self) -> float:
        """Bytes/s used for floors: the best copy rate seen."""
        return self.copy_gbps.p90 * 1e9


def measure_ceilings(device: torch.device, matmul_n: int = 2048, copy_mib: int = 256,
                     repeats: int = 10, budget_s: float = 5.0) -> Ceilings:
    """Time an (n, n) @ (n, n) float32 matmul and a `copy_mib` MiB tensor copy on `device`."""
    gen = torch.Generator(device="cpu").manual_seed(0)
    a = torch.randn(matmul_n, matmul_n, generator=gen).to(device)
    b = torch.randn(matmul_n, matmul_n, generator=gen).to(device)
    mm = time_calls(lambda: a @ b, torch_sync(device), warmup=2, repeats=repeats, budget_s=budget_s)
    gflops = quantiles([2.0 * matmul_n ** 3 / s / 1e9 for s in mm.seconds])
    del a, b
    n = copy_mib * 2 ** 20 // F32
    src = torch.rand(n, generator=gen).to(device)
    dst = torch.empty_like(src)
    cp = time_calls(lambda: dst.copy_(src), torch_sync(device), warmup=2, repeats=repeats, budget_s=budget_s)
    gbps = quantiles([2.0 * n * F32 / s / 1e9 for s in cp.seconds])
    return Ceilings(gflops, gbps)


class Work(NamedTuple):
    """Least work of one population forward: floating-point operations and bytes moved."""

    flops: float
    bytes: float


def forward_work(sizes: Sequence[int], pop: int, rank: int, batch: int = 1, bias_noise: bool = True,
                 draws: int | None = None) -> Work:
    """Minimum FLOPs and bytes of a low-rank population forward through an MLP of `sizes`.

    Per layer (in -> out), for `pop * batch` rows: 2*in*out FLOPs for the shared product and
    2*r*(in + out) for x @ B then @ A^T (activations and bias adds are not counted). Bytes:
    the weight and bias once, each distinct draw's A (out, r), B (in, r) and bias noise (out) once
    (`draws`: pop by default; pop / 2 with antithetic pairs, whose members share one draw up to sign),
    the layer's input read once and output written once (float32).
    """
    draws = pop if draws is None else draws
    if len(sizes) < 2 or pop < 1 or rank < 1 or batch < 1 or not 1 <= draws <= pop:
        raise ValueError(f"need >= 2 sizes, pop >= 1, rank >= 1, batch >= 1, 1 <= draws <= pop; "
                         f"got {sizes}, {pop}, {rank}, {batch}, {draws}")
    rows = pop * batch
    flops = 0.0
    nbytes = 0.0
    for d_in, d_out in zip(sizes[:-1], sizes[1:]):
        flops += 2.0 * rows * (d_in * d_out + rank * (d_in + d_out))
        weights = d_in * d_out + d_out
        factors = draws * (rank * (d_in + d_out) + (d_out if bias_noise else 0))
        acts = rows * (d_in + d_out)
        nbytes += F32 * (weights + factors + acts)
    return Work(flops, nbytes)


def floor_seconds(work: Work, ceilings: Ceilings) -> float:
    """The time floor: the slower of doing the FLOPs at peak and moving the bytes at peak."""
    return max(work.flops / ceilings.peak_flops, work.bytes / ceilings.peak_bytes)
