"""Adapters that break the protocol, one way each: the suite must name the method and what was expected.

Each class is the faithful numpy port (built by the loader as Class(cfg)) changed in one place."""
from __future__ import annotations

import numpy as np

from tests.ports.numpy_port import Drift, NumpyPort


class NoGradient:
    """Has every required method but `gradient`."""

    name, jax_compatible_rng = "no gradient", True

    def __init__(self, cfg):
        self._port = NumpyPort(cfg)
        self.noise, self.perturbed_linear, self.shape_fitness = (
            self._port.noise, self._port.perturbed_linear, self._port.shape_fitness)


class TransposedLinear(NumpyPort):
    """perturbed_linear returns (m, out, batch) instead of (m, batch, out)."""

    def perturbed_linear(self, W, A, B, x):
        return np.swapaxes(super().perturbed_linear(W, A, B, x), 1, 2)


class Float64Fitness(NumpyPort):
    """shape_fitness computes (and returns) in float64."""

    def shape_fitness(self, f, group_size=0):
        return super().shape_fitness(f, group_size).astype(np.float64)


class IntegerNoise(NumpyPort):
    """noise returns its B factors as int64."""

    def noise(self, shapes, seed, epoch, members, pop, sigma, rank):
        out = super().noise(shapes, seed, epoch, members, pop, sigma, rank)
        return {k: (v[0], np.rint(v[1]).astype(np.int64)) if isinstance(v, tuple) else v for k, v in out.items()}


class RaisingGradient(NumpyPort):
    """gradient fails inside the port."""

    def gradient(self, noise, shaped, sigma):
        raise ZeroDivisionError("population of zero members")


class BrokenConstructor:
    """The factory itself raises when called with the run's Config."""

    def __init__(self, cfg):
        raise RuntimeError("this port needs a GPU")


not_an_adapter = 42   # neither an adapter nor a factory


class _Dense(NumpyPort):
    """The faithful dense numpy port (dense_noise = True, weight noise E)."""

    def __init__(self, cfg):
        super().__init__(cfg, Drift(dense="product"))


class DenseTransposed(_Dense):
    """A dense port whose noise returns E as (m, in, out) instead of (m, out, in)."""

    def noise(self, shapes, seed, epoch, members, pop, sigma, rank):
        out = super().noise(shapes, seed, epoch, members, pop, sigma, rank)
        return {k: np.swapaxes(v, 1, 2) if k.endswith(".weight") else v for k, v in out.items()}


class DenseFloat64(_Dense):
    """A dense port whose E comes back in float64."""

    def noise(self, shapes, seed, epoch, members, pop, sigma, rank):
        out = super().noise(shapes, seed, epoch, members, pop, sigma, rank)
        return {k: v.astype(np.float64) if k.endswith(".weight") else v for k, v in out.items()}


class DenseUndeclared(_Dense):
    """Returns E without declaring dense_noise."""

    def __init__(self, cfg):
        super().__init__(cfg)
        self.dense_noise = False


class DenseWithFactorLinear(NumpyPort):
    """Declares dense_noise but its perturbed_linear still takes (W, A, B, x)."""

    def __init__(self, cfg):
        super().__init__(cfg)
        self.dense_noise = True

    def perturbed_linear(self, W, A, B, x):
        return super().perturbed_linear(W, A, B, x)


class DenseDeclaredVaguely(NumpyPort):
    """dense_noise is not a bool."""

    def __init__(self, cfg):
        super().__init__(cfg)
        self.dense_noise = "yes"


class SplitMisspelt(NumpyPort):
    """Gives forward and update noise apart under a wrong key."""

    def noise(self, shapes, seed, epoch, members, pop, sigma, rank):
        out = super().noise(shapes, seed, epoch, members, pop, sigma, rank)
        return {"forward": out, "updates": out}
