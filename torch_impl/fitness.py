"""Fitness shaping: raw returns (pop,) -> the weights the gradient estimate uses.

`jax` is the reference's `convert_fitnesses`; the others are the shapings real ports used.
"""
from __future__ import annotations

import torch

METHODS = ("jax", "std", "std_unbiased", "rank")
JAX_EPS = 1e-5          # reference: sqrt(var + 1e-5)
STD_FLOOR = 1e-8        # std: all zeros below this spread
UNBIASED_EPS = 1e-8     # std_unbiased: std(ddof 1) + 1e-8


def check_fitness(f: torch.Tensor, pop: int | None = None) -> None:
    """Raise a ValueError that names the bad entries unless `f` is a finite 1-D vector (of length `pop`)."""
    if not isinstance(f, torch.Tensor):
        raise ValueError(f"fitness must be a torch.Tensor of shape (pop,), got {type(f).__name__}")
    if f.dim() != 1 or (pop is not None and f.shape[0] != pop):
        want = f"({pop},)" if pop is not None else "(pop,)"
        raise ValueError(f"fitness must have shape {want}, one value per member; got {tuple(f.shape)}")
    if f.numel() == 0:
        raise ValueError("fitness is empty; expected one value per population member")
    bad = ~torch.isfinite(f)
    if bad.any():
        idx = torch.nonzero(bad).flatten().tolist()
        shown = ", ".join(f"{i} ({f[i].item()})" for i in idx[:8]) + (" ..." if len(idx) > 8 else "")
        raise ValueError(f"fitness must be finite; {len(idx)} entries are NaN or inf at member(s) {shown}")


def centred_ranks(f: torch.Tensor) -> torch.Tensor:
    """Ranks scaled to [-0.5, 0.5]; tied values share the average of their ranks (scipy's 'average')."""
    n = f.shape[0]
    if n == 1:
        return torch.zeros_like(f)
    ordered, _ = torch.sort(f)
    lo = torch.searchsorted(ordered, f, right=False)        # members strictly below
    hi = torch.searchsorted(ordered, f, right=True)         # members at or below
    rank = (lo + hi - 1).to(f.dtype) / 2                     # average 0-based rank among ties
    return rank / (n - 1) - 0.5


def shape_fitness(f: torch.Tensor, method: str = "jax", group_size: int = 0) -> torch.Tensor:
    """Shaped fitness (pop,) in f's float dtype.

    jax:          (f - mean) / sqrt(var + 1e-5), ddof 0; with group_size > 0 each group's mean is
                  subtracted and the global variance divides (the reference's grouped form).
    std:          (f - mean) / std, ddof 0, no epsilon; all zeros when std < 1e-8.
    std_unbiased: (f - mean) / (std(ddof=1) + 1e-8).
    rank:         centred ranks in [-0.5, 0.5], ties averaged.
    The std variants honour group_size like jax does (group mean, global scale); rank does not take groups.
    """
    if method not in METHODS:
        raise ValueError(f"unknown fitness shaping {method!r}; allowed: {', '.join(METHODS)}")
    check_fitness(f)
    if not f.is_floating_point():
        f = f.to(torch.float32)
    n = f.shape[0]
    if group_size < 0 or (group_size and n % group_size):
        raise ValueError(f"group_size must be 0 or divide the population {n}, got {group_size}")
    if method == "rank":
        if group_size:
            raise ValueError("fitness=rank does not take group_size > 0; use group_size=0")
        return centred_ranks(f)
    if method == "std_unbiased" and n < 2:
        raise ValueError("fitness=std_unbiased needs at least 2 members (ddof=1)")

    if group_size:
        groups = f.reshape(-1, group_size)                                  # (pop / g, g)
        centred = (groups - groups.mean(dim=1, keepdim=True)).reshape(-1)
    else:
        centred = f - f.mean()
    var = f.var(correction=0)
    if method == "jax":
        return centred / torch.sqrt(var + JAX_EPS)
    if method == "std":
        std = torch.sqrt(var)
        return torch.zeros_like(f) if std < STD_FLOOR else centred / std
    return centred / (f.std(correction=1) + UNBIASED_EPS)
