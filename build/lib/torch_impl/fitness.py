"""Fitness shaping: raw returns (pop,) -> the weights the gradient estimate uses.

`jax` is the reference's `convert_fitnesses`; the others are the shapings real ports used (knob fitness).
"""
from __future__ import annotations

from typing import Callable

import torch

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


def _centred(f: torch.Tensor, group_size: int) -> torch.Tensor:
    """f minus its mean, or minus each group's mean with group_size > 0 (the reference's grouped form)."""
    if group_size:
        groups = f.reshape(-1, group_size)                                  # (pop / g, g)
        return (groups - groups.mean(dim=1, keepdim=True)).reshape(-1)
    return f - f.mean()


def shape_jax(f: torch.Tensor, group_size: int) -> torch.Tensor:
    """The reference's convert_fitnesses: (f - mean) / sqrt(var + 1e-5), ddof 0, the global variance."""
    return _centred(f, group_size) / torch.sqrt(f.var(correction=0) + JAX_EPS)


def shape_std(f: torch.Tensor, group_size: int) -> torch.Tensor:
    """(f - mean) / std, ddof 0, no epsilon; all zeros when std < 1e-8."""
    std = torch.sqrt(f.var(correction=0))
    return torch.zeros_like(f) if std < STD_FLOOR else _centred(f, group_size) / std


def shape_std_unbiased(f: torch.Tensor, group_size: int) -> torch.Tensor:
    """(f - mean) / (std(ddof=1) + 1e-8)."""
    if f.shape[0] < 2:
        raise ValueError("fitness=std_unbiased needs at least 2 members (ddof=1)")
    return _centred(f, group_size) / (f.std(correction=1) + UNBIASED_EPS)


def shape_rank(f: torch.Tensor, group_size: int) -> torch.Tensor:
    """Centred ranks in [-0.5, 0.5], ties averaged; takes no groups."""
    if group_size:
        raise ValueError("fitness=rank does not take group_size > 0; use group_size=0")
    return centred_ranks(f)


# knob fitness -> shaping (f (pop,), group_size) -> shaped (pop,)
SHAPINGS: dict[str, Callable[[torch.Tensor, int], torch.Tensor]] = {
    "jax": shape_jax,
    "std": shape_std,
    "std_unbiased": shape_std_unbiased,
    "rank": shape_rank,
}


def shape_fitness(f: torch.Tensor, method: str = "jax", group_size: int = 0) -> torch.Tensor:
    """Shaped fitness (pop,) in f's float dtype by the shaping `method` names (see SHAPINGS).

    The std variants honour group_size like jax does (group mean, global scale); rank does not take groups.
    """
    if method not in SHAPINGS:
        raise ValueError(f"unknown fitness shaping {method!r}; allowed: {', '.join(SHAPINGS)}")
    check_fitness(f)
    if not f.is_floating_point():
        f = f.to(torch.float32)
    n = f.shape[0]
    if group_size < 0 or (group_size and n % group_size):
        raise ValueError(f"group_size must be 0 or divide the population {n}, got {group_size}")
    return SHAPINGS[method](f, group_size)
