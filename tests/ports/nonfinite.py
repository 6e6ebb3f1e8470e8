"""Ports that return NaN or inf on finite input, each a faithful example adapter with one method overridden: the suite
must fail the check that makes the call (exit 1), with the input and the likely cause, never call it a protocol break.

`NoEpsilonStd` is the commonest shaping written by hand, (f - f.mean()) / f.std(): NaN on a constant fitness vector.
The others put a NaN or an inf into one output of a faithful port, where a real port's bug would (a product, the
noise, a gradient, a forward, the optimizer's step)."""
from __future__ import annotations

import numpy as np

from examples.hooks_adapter import HooksAdapter
from examples.minimal_adapter import MinimalAdapter


def with_inf_in_A(noise: dict, path: str) -> dict:
    """noise with a +inf as the first entry of its last member's A at path (A copied, B as it was)."""
    A, B = noise[path]
    A = A.copy()
    A[-1].flat[0] = np.inf
    noise[path] = (A, B)
    return noise


def with_nan_at(out, index) -> np.ndarray:
    """A copy of the array out with a NaN at index (one output entry, as a buffer read before it is written)."""
    out = np.array(out)
    out[index] = np.nan
    return out


def with_nan_leaf(leaves: dict, path: str) -> dict:
    """leaves with the leaf at path all NaN (the others as they were)."""
    leaves[path] = np.full_like(leaves[path], np.nan)
    return leaves


class NoEpsilonStd(MinimalAdapter):
    """The minimal adapter shaping by (f - mean) / std with no epsilon (and no groups): NaN where f is constant."""

    name = "minimal adapter, (f - f.mean()) / f.std()"

    def shape_fitness(self, f, group_size=0):
        with np.errstate(invalid="ignore"):          # 0/0 on a constant vector: the NaN this port returns
            return (f - f.mean()) / f.std()


class NaNProduct(MinimalAdapter):
    """perturbed_linear with a NaN in member 1's first output (as a buffer read before it is written)."""

    def perturbed_linear(self, W, A, B, x):
        return with_nan_at(super().perturbed_linear(W, A, B, x), (1, 0, 0))


class InfNoise(MinimalAdapter):
    """noise whose last member's first A entry is +inf (a log(0) of a Box-Muller draw)."""

    def noise(self, shapes, seed, epoch, members, pop, sigma, rank):
        return with_inf_in_A(super().noise(shapes, seed, epoch, members, pop, sigma, rank), "0.weight")


class NaNGradient(MinimalAdapter):
    """gradient with its '1.weight' all NaN."""

    def gradient(self, noise, shaped, sigma):
        return with_nan_leaf(super().gradient(noise, shaped, sigma), "1.weight")


class NaNForward(HooksAdapter):
    """The hooks example whose forward returns NaN logits for its first member."""

    def forward(self, params, noise, x):
        return with_nan_at(super().forward(params, noise, x), 0)


class NaNStep(HooksAdapter):
    """The hooks example whose optimizer step returns NaN biases of layer 0 (as adam with eps = 0 on a zero gradient)."""

    def optimizer_step(self, params, state, noise, shaped, sigma, epoch):
        new, state = super().optimizer_step(params, state, noise, shaped, sigma, epoch)
        return with_nan_leaf(dict(new), "0.bias"), state


# --port takes an object or a class called with the run's config; the minimal adapter's classes take none
no_epsilon_std, nan_product, inf_noise, nan_gradient = NoEpsilonStd(), NaNProduct(), InfNoise(), NaNGradient()


# ----------------------------------------------------------------------------- the LM suite's tree protocol
from examples.lm_adapter import LMAdapter  # noqa: E402


class LMNaNProduct(LMAdapter):
    """perturbed_mm with a NaN in member 0's first output."""

    def perturbed_mm(self, W, A, B, x):
        return with_nan_at(super().perturbed_mm(W, A, B, x), (0, 0, 0))


class LMInfNoise(LMAdapter):
    """noise whose first low-rank leaf has a +inf in its last member's A."""

    def noise(self, seed, epoch, members, pop, sigma, rank):
        out = super().noise(seed, epoch, members, pop, sigma, rank)
        return with_inf_in_A(out, next(p for p, v in out.items() if isinstance(v, tuple)))


class LMNaNGradient(LMAdapter):
    """gradient with its head leaf all NaN."""

    def gradient(self, noise, shaped, sigma):
        return with_nan_leaf(super().gradient(noise, shaped, sigma), "head")


class LMNaNForward(LMAdapter):
    """forward whose member 1 scores NaN (its intermediates as they are)."""

    def forward(self, params, noise, tokens, intermediates=False):
        out = super().forward(params, noise, tokens, intermediates)
        scores = with_nan_at(out[0] if intermediates else out, 1)
        return (scores, out[1]) if intermediates else scores


class LMRaisingProduct(LMAdapter):
    """perturbed_mm that raises: a protocol break (exit 2), not a numerical failure."""

    def perturbed_mm(self, W, A, B, x):
        raise FloatingPointError("division by zero in the port's product")
