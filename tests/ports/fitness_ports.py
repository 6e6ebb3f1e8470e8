"""The worked GPT example with shape_fitness overridden the way ports write a fitness shaping other than the
reference's (f - group mean) / sqrt(var(all f) + 1e-5): each must be caught and named by what differs
(parity.tree.shaping). Each is torch on float32, as a port computes it."""
from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

from examples.gpt_adapter import GPTAdapter


def _groups(f: torch.Tensor, g: int) -> torch.Tensor:
    """f (n,) minus each group's mean (g members each; the whole population where g is 0)."""
    x = f.reshape(-1, g or f.numel())
    return (x - x.mean(1, keepdim=True)).reshape(-1)


class _Shaping(GPTAdapter):
    """shape_fitness as `formula(f (n,) float32 tensor, group_size)`."""

    @staticmethod
    def formula(f: torch.Tensor, g: int) -> torch.Tensor:
        raise NotImplementedError

    def shape_fitness(self, f, group_size):
        with torch.inference_mode():
            return self.formula(torch.as_tensor(np.asarray(f, np.float32)), group_size).numpy()


class EpsOutsideStd(_Shaping):
    """(f - group mean) / (std + 1e-5): the epsilon added to the standard deviation, not inside the root."""

    @staticmethod
    def formula(f, g):
        return _groups(f, g) / (f.std(unbiased=False) + 1e-5)


class LayerNormFitness(_Shaping):
    """F.layer_norm(f, eps=1e-6): another epsilon inside the root, and the whole population's mean."""

    @staticmethod
    def formula(f, g):
        return F.layer_norm(f, (f.numel(),), eps=1e-6)


class EpsInside1e8(_Shaping):
    """(f - group mean) / sqrt(var + 1e-8): group means, the global variance, another epsilon inside the root."""

    @staticmethod
    def formula(f, g):
        return _groups(f, g) / torch.sqrt(f.var(unbiased=False) + 1e-8)


class UnbiasedVar(_Shaping):
    """(f - group mean) / sqrt(var(ddof 1) + 1e-5): torch.var's default ddof."""

    @staticmethod
    def formula(f, g):
        return _groups(f, g) / torch.sqrt(f.var() + 1e-5)


class TorchStd(_Shaping):
    """(f - mean) / (f.std() + 1e-8): ddof 1 with the epsilon outside, groups ignored (the MLP's fitness=std_unbiased)."""

    @staticmethod
    def formula(f, g):
        return (f - f.mean()) / (f.std() + 1e-8)


class CentredOnly(_Shaping):
    """f - group mean, not divided by any spread."""

    @staticmethod
    def formula(f, g):
        return _groups(f, g)


class GroupsIgnored(_Shaping):
    """(f - mean) / sqrt(var + 1e-5): the reference's divisor, the whole population's mean."""

    @staticmethod
    def formula(f, g):
        return (f - f.mean()) / torch.sqrt(f.var(unbiased=False) + 1e-5)


class CentredRanks(_Shaping):
    """Centred ranks in [-0.5, 0.5] over the population (OpenAI-ES' shaping)."""

    @staticmethod
    def formula(f, g):
        ranks = torch.empty_like(f)
        ranks[torch.argsort(f)] = torch.arange(f.numel(), dtype=f.dtype)
        return ranks / (f.numel() - 1) - 0.5


class GroupOwnSpread(_Shaping):
    """(f - group mean) / sqrt(var(group) + 1e-5): each group by its own spread (the tree knob group_fitness=group_var)."""

    @staticmethod
    def formula(f, g):
        x = f.reshape(-1, g)
        return ((x - x.mean(1, keepdim=True)) / torch.sqrt(x.var(1, unbiased=False, keepdim=True) + 1e-5)).reshape(-1)


# (port, what its cause says, one phrase each fact)
PLANTED = {
    "EpsOutsideStd": ["(f - group mean) / (std + 1e-05)",
                      "eps 1e-05 added to the standard deviation, not inside the square root of the variance"],
    "LayerNormFitness": ["a layer norm of the fitness with eps 1e-06",
                         "centred by the whole population's mean, its groups of 4 ignored"],
    "EpsInside1e8": ["(f - group mean) / sqrt(var + 1e-08)",
                     "eps 1e-08 inside the square root of the variance, not the reference's 1e-05"],
    "UnbiasedVar": ["(f - group mean) / sqrt(var(ddof 1) + 1e-05)",
                    "the unbiased standard deviation (ddof 1, torch.std's default)"],
    "TorchStd": ["(f - mean) / (std(ddof 1) + 1e-08)", "eps 1e-08 added to the standard deviation",
                 "the unbiased standard deviation (ddof 1", "its groups of 4 ignored", "(as fitness=std_unbiased)"],
    "CentredOnly": ["f - group mean (not divided)", "centred only, not divided by the spread"],
    "GroupsIgnored": ["(f - mean) / sqrt(var + 1e-05)", "centred by the whole population's mean, its groups of 4 "
                                                          "ignored, not by each group's mean"],
    "CentredRanks": ["centred ranks in [-0.5, 0.5]", "(as fitness=rank)"],
    "GroupOwnSpread": ["(knob `group_fitness`): each group is divided by its own spread, not by the global variance"],
}
