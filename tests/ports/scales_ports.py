"""Planted gradient and step scales for the self-tests of issue 53's item 2 (tests/parity/tree/test_scales.py): the worked
GPT (examples/gpt_adapter.py) with its gradient times a factor real ports were seen to use (N/sigma on its 1-D
param leaves, 1/(sigma^2 sqrt(N)), sqrt(r)), or its update (or gradient) clipped per leaf at a round norm. Each is
built with the knobs it is checked under: TreeKnobs() draw by draw, TreeKnobs(rng="torch") in distribution."""
from __future__ import annotations

import math

import numpy as np
import torch

from examples.gpt_adapter import GPTAdapter

CLIP_NORM = 1.0          # the update's cap per leaf (issue 53's port)
CLIP_LR = 8.0            # a learning rate at which the GPT's steps exceed CLIP_NORM on its low-rank leaves
GRADIENT_CLIP = 0.1      # a gradient cap per leaf the GPT's low-rank gradients exceed at both test sizes


class ScaledGradient(GPTAdapter):
    """gradient times factor(self) on the leaves of the classes in `classes`."""

    classes = ("mm", "tmm", "param")

    def factor(self) -> float:
        raise NotImplementedError

    def gradient(self, noise, shaped, sigma):
        c = np.float32(self.factor())
        return {k: v * c if self.tree.leaf(k).cls in self.classes else v
                for k, v in super().gradient(noise, shaped, sigma).items()}


class ParamGradientNOverSigma(ScaledGradient):
    """The 1-D (param) leaves' gradient N/sigma times the reference's (a sum over members, divided by sigma once
    more); build it with freeze_nonlora=False so that they are perturbed."""

    classes = ("param",)

    def factor(self) -> float:
        return self.pop / self.sigma


class GradientOverSigma2SqrtN(ScaledGradient):
    """gradient 1/(sigma^2 sqrt(N)) times the reference's."""

    def factor(self) -> float:
        return 1 / (self.sigma ** 2 * math.sqrt(self.pop))


class GradientTimesSqrtRank(ScaledGradient):
    """gradient sqrt(r) times the reference's (the noise's 1/sqrt(r) left out of the estimate)."""

    def factor(self) -> float:
        return math.sqrt(self.rank)


def clip_leaf(step, cap: float):
    """step scaled to norm cap when its norm is above it (torch's clip_grad_norm_ rule, per leaf)."""
    norm = float(torch.linalg.vector_norm(torch.as_tensor(step, dtype=torch.float32)))
    return step * min(1.0, cap / (norm + 1e-6))


class UpdateClippedPerLeaf(GPTAdapter):
    """update (and es_tell's step) clipped per leaf at norm CLIP_NORM; build it with lr=CLIP_LR so that it binds."""

    def update(self, params, noise, shaped, sigma, lr):
        new = super().update(params, noise, shaped, sigma, lr)
        return {k: (params[k] + clip_leaf(new[k] - params[k], CLIP_NORM)).astype(np.float32) for k in params}

    def es_tell(self, state, noise, scores, epoch):
        before = state[0]
        after, seed = super().es_tell(state, noise, scores, epoch)
        return {k: before[k] + clip_leaf(after[k] - before[k], CLIP_NORM) for k in after}, seed


class GradientClippedPerLeaf(GPTAdapter):
    """gradient clipped per leaf at norm GRADIENT_CLIP (its update too: it steps on the clipped gradient)."""

    def gradient(self, noise, shaped, sigma):
        return {k: clip_leaf(v, GRADIENT_CLIP).astype(np.float32)
                for k, v in super().gradient(noise, shaped, sigma).items()}

    def update(self, params, noise, shaped, sigma, lr):
        g = self.gradient(noise, shaped, sigma)
        with torch.inference_mode():
            new = self.port.step({k: torch.as_tensor(v) for k, v in params.items()},
                                 {k: torch.as_tensor(v) for k, v in g.items()})
        return {k: v.numpy() for k, v in new.items()}
