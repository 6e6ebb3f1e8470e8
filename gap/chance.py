"""How likely a published-size gap is as chance: the ratio of mean steps to solve that a replication of the published
design (n seeds against n) would show, predicted from the study's runs of two arms.

Two predictive distributions, both bootstraps of the runs (no parametric model):
- `one_stage`: each replication draws its n seeds per arm from that arm's runs. It holds the arms' means at the
  observed ones, so it shows the seed-to-seed spread of a replication only.
- `two_stage`: each replication first draws a plausible population per arm (the arm's runs resampled: what the
  study's seeds say the arm could be), then its n seeds from that population. It adds the study's own uncertainty
  about each arm, and is the one the verdict quotes.
A run that did not solve enters with the steps it reached (a lower bound), as in the arm table.
"""
from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np

METHODS = ("one_stage", "two_stage")


class Chance(NamedTuple):
    """P(mean(arm) / mean(base) >= threshold) in a replication of n seeds against n, and its Monte Carlo error."""

    probability: float
    mc_se: float
    threshold: float
    n: int
    method: str
    resamples: int


def _replicated_means(steps: np.ndarray, n: int, method: str, rng: np.random.Generator, resamples: int) -> np.ndarray:
    """(resamples,) means of n seeds drawn as `method` says from the runs `steps`."""
    steps = np.asarray(steps, np.float64)
    if method == "two_stage":
        population = rng.choice(steps, size=(resamples, steps.size))          # a plausible arm per replication
        picks = rng.integers(0, steps.size, size=(resamples, n))
        return np.take_along_axis(population, picks, axis=1).mean(axis=1)
    return rng.choice(steps, size=(resamples, n)).mean(axis=1)


def gap_chance(base: np.ndarray, arm: np.ndarray, threshold: float, n: int = 10, method: str = "two_stage",
               resamples: int = 100_000, seed: int = 0) -> Chance:
    """The probability that a replication with n seeds per arm shows mean(arm) / mean(base) >= threshold."""
    if method not in METHODS:
        raise ValueError(f"method must be one of {', '.join(METHODS)}, got {method!r}")
    if n < 1 or resamples < 1 or len(base) < 1 or len(arm) < 1:
        raise ValueError(f"need n >= 1, resamples >= 1 and runs in both arms (n={n}, resamples={resamples}, "
                         f"{len(base)} and {len(arm)} runs)")
    rng = np.random.default_rng(seed)
    ratio = _replicated_means(arm, n, method, rng, resamples) / _replicated_means(base, n, method, rng, resamples)
    p = float(np.mean(ratio >= threshold))
    return Chance(p, math.sqrt(max(p * (1 - p), 1.0 / resamples) / resamples), float(threshold), n, method, resamples)


def text(c: Chance) -> str:
    """'2.1% (+- 0.1%)': the probability with its Monte Carlo standard error."""
    return f"{c.probability:.1%} (Monte Carlo error {c.mc_se:.1%})"
