"""Small conveniences the tests share (no assertions here)."""
from __future__ import annotations

import torch

from spec.config import Config
from spec.knobs import Knobs
from torch_impl import noise as noise_mod


def noise_of(params: dict[str, torch.Tensor], cfg: Config, knobs: Knobs, seed: int, epoch: int, sigma: float,
             device: str = "cpu") -> noise_mod.Noise:
    """torch_impl's noise for a run seed at an epoch, as its trainer draws it (cfg gives pop and rank)."""
    plan = noise_mod.make_plan(cfg.pop, cfg.rank, knobs)
    shapes = noise_mod.shapes_of(params)
    return noise_mod.sample_noise(plan, noise_mod.seed_sources(plan, seed, shapes), shapes, epoch, sigma, device)
