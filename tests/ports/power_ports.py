"""Planted drifts of the low-rank noise's variance on the worked GPT drawing from torch's generator (checked in
distribution, parity/tree/dist.py's mean-square rows; issue 53 item 5): the noise method overridden, the rest the
faithful port's."""
from __future__ import annotations

import numpy as np

from examples.gpt_adapter import GPTAdapter
from spec.tree_knobs import TreeKnobs


class VarianceScaled(GPTAdapter):
    """Every low-rank leaf's A times sqrt(c): E's variance c sigma^2 (c = 0.38: the rank-clamp port's variance
    without its zero columns)."""

    def __init__(self, c: float = 0.38, **settings):
        super().__init__(TreeKnobs(rng="torch"), **settings)
        self.c = c

    def noise(self, seed, epoch, members, pop, sigma, rank):
        out = super().noise(seed, epoch, members, pop, sigma, rank)
        return {k: (v[0] * np.float32(np.sqrt(self.c)), v[1]) if isinstance(v, tuple) else v for k, v in out.items()}


class RankClamp(GPTAdapter):
    """The rank clamped to each layer's smaller side min(a, b) where the requested rank is larger, the requested
    rank's sigma / sqrt(r) scale kept: the factors' columns beyond min(a, b) zeroed (variance min(a, b) / r)."""

    def __init__(self, **settings):
        super().__init__(TreeKnobs(rng="torch"), **settings)

    def noise(self, seed, epoch, members, pop, sigma, rank):
        out = super().noise(seed, epoch, members, pop, sigma, rank)
        for k, v in out.items():
            if isinstance(v, tuple):
                keep = min(v[0].shape[-2], v[1].shape[-2])
                out[k] = tuple(np.concatenate([f[..., :keep], np.zeros_like(f[..., keep:])], -1) for f in v)
        return out


class TorchRngAt(GPTAdapter):
    """The faithful torch-rng GPT at any settings (pop, rank, model)."""

    def __init__(self, **settings):
        super().__init__(TreeKnobs(rng="torch"), **settings)


class AskVarianceScaled(GPTAdapter):
    """The training loop's es_ask noise with every low-rank A times sqrt(c) (its steps taken on that noise); the
    noise method the faithful port's."""

    def __init__(self, c: float = 0.38, **settings):
        super().__init__(TreeKnobs(rng="torch"), **settings)
        self.c = c

    def es_ask(self, state, epoch):
        out = super().es_ask(state, epoch)
        return {k: (v[0] * np.float32(np.sqrt(self.c)), v[1]) if isinstance(v, tuple) else v for k, v in out.items()}
