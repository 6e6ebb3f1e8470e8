"""The port's sigma schedule read over many epochs of its own es_ask / es_tell, with no rollout.

Why: the lockstep trajectory reads sigma_e / sigma_0 over its few epochs (parity.mlp.lockstep.read_sigma). A port that
keeps its draws across epochs is read exactly there; a port that draws afresh every epoch is read by an F test of
two epochs' mean squares, which cannot resolve the reference's 0.999^e over 3 epochs (0.4% in variance at epoch 2
against an interval of about +-3%). This reading takes enough epochs to resolve it.

The run: es_init from the reference's initial parameters, then `epochs` (Sizes.sigma_epochs) epochs of the port's
es_ask and es_tell on a fixed synthetic fitness stream (standard normal per member and epoch, from the suite's own
generator): the same for every port and independent of the noise, so no rollout is needed and whatever the port's
shaping or update does, it does to a stream that carries no signal about the noise. Per epoch e, the sigma-carrying
entries of every weight (A of the factors, or E of a dense port; a mirror repeats its pair's squares, which leaves
the mean unchanged) give y_e = log(mean square) - 2 log sigma_e, sigma_e the reference run's (parity.mlp.reference,
the preset's sigma_decay). A port with the reference's schedule has E[y_e] constant; a port decaying by d_port per
epoch has slope 2 log(d_port / d_ref). So the faithful side is compared with the reference's decay, never with 1.

Two readings, by whether the draws repeat (parity.mlp.noiseform.same_draws with the previous epoch):

- **repeated draws** (noise_reuse 0 or k > 1): epochs are not independent, but the ratio is exact. The epoch whose
  draws repeat its predecessor's gives c = (A_e / A_b) / (sigma_e / sigma_b)_ref, b the epoch that first drew them;
  |c - 1| <= 8u (parity.mlp.lockstep.SIGMA_OWN_DRAWS, whose derivation holds at any lag). One such ratio resolves any
  decay difference above 8u per epoch, far below the resolution wanted, so the run stops there.
- **fresh draws**: the y of epochs that drew their own noise are independent. The OLS slope of y on e over K of
  them is tested against 0 by its t statistic with K - 2 degrees of freedom, two-sided at `alpha`
  (scipy.stats.linregress; its standard error comes from the residuals, so the entries' distribution, which the
  noise check judges, does not enter: only the epochs' independence). Under the null each y_e is the log of a mean
  of many squares (log chi-square(n)/n for normal entries: standard deviation sqrt(trigamma(n/2)) ~ sqrt(2/n),
  skewness ~ -sqrt(2/n)) and the slope's weights e - mean(e) are antisymmetric, so the slope's third cumulant
  cancels and its distribution is symmetric and very nearly normal: the false-alarm rate is alpha.

Epochs (Sizes.sigma_epochs), from the resolution: the reading must tell a decay of RESOLUTION = 0.999 per epoch
relative to the reference's (the reference's decay against a constant sigma: every port surveyed) with power POWER.
With n independent normal A entries per epoch (pop/2 unmirrored members x sum over weights of out x r), the slope's
standard error is sqrt(trigamma(n/2) / S), S = sum (e - mean e)^2 = K (K^2 - 1) / 12, and the t test's power is the
noncentral t's at noncentrality 2 |log 0.999| / that error. `epochs_needed` is the least K with power >= POWER;
quick (pop 256, 4-64-64-2, r 4: n = 66,560, alpha 1e-4/3) would need 21 epochs, selftest (pop 32, 4-8-8-2: n = 1,152,
alpha 1e-4/2) 68, full (pop 2048, 4-256-256-2: n = 2,105,344, alpha 1e-4/8) 10, for a port that keeps factors.
A dense port's E = A B^T mixes each member's A and B fluctuations into every entry, so its log mean square varies
more than that of n independent normals: 3.1x at selftest, 3.6x at quick, 4.5x at 4-16-2 (simulated,
tests/parity/mlp/test_sigma_schedule.py). The epochs are therefore derived for `effective_entries` = n / DENSE_VARIANCE, with
DENSE_VARIANCE = 5 covering either form: quick needs 32 epochs, selftest 113, full 14. A port with more independent
entries (no antithetic pairs) is resolved better; one with fewer (a clipped rank) a little worse. False alarm: alpha per run (its share of the trajectory's budget, parity.mlp.checks.trajectory); missed
decay of 0.999 against the reference: at most 1 - POWER at the epoch count derived.
"""
from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np
from scipy import special, stats

from parity.mlp import noiseform
from parity.mlp.lockstep import SIGMA_OWN_DRAWS

RESOLUTION = -math.log(0.999)   # |log(d_port / d_ref)| per epoch the reading must resolve: 0.999 against 1
POWER = 0.999                   # chance of naming a decay that far from the reference's, at the derived epochs
DENSE_VARIANCE = 5.0            # a dense port's log mean square varies up to this many times n normals' (simulated)
MIN_FRESH = 4                   # fresh epochs below which no slope is tested (2 residual degrees of freedom)


# ----------------------------------------------------------------------------- epochs from the resolution
def independent_entries(pop: int, sizes: list[int], rank: int) -> int:
    """Independent normal A entries per epoch in the reference's layout: pop // 2 unmirrored members x sum of out x r."""
    return (pop // 2) * sum(out * rank for out in sizes[1:])


def effective_entries(pop: int, sizes: list[int], rank: int) -> float:
    """The n the epochs are derived for: independent_entries / DENSE_VARIANCE, so a dense port (E = A B^T, whose
    log mean square varies more) is resolved with the power too."""
    return independent_entries(pop, sizes, rank) / DENSE_VARIANCE


def slope_power(epochs: int, n: int, alpha: float, resolution: float = RESOLUTION) -> float:
    """Power of the two-sided t test of the slope over `epochs` fresh epochs of n normal entries each, against a
    decay of exp(-resolution) per epoch relative to the reference's: the noncentral t's tail beyond the critical
    value on the side of the decay (a lower bound: the other tail adds less than Phi(-nc), which a T < -crit < 0
    needs of its normal part)."""
    if epochs < MIN_FRESH:
        return 0.0
    spread = epochs * (epochs ** 2 - 1) / 12.0
    nc = 2 * resolution / math.sqrt(float(special.polygamma(1, n / 2)) / spread)
    df = epochs - 2
    crit = float(stats.t.isf(alpha / 2, df))
    return float(stats.nct.sf(crit, df, nc))


def epochs_needed(n: int, alpha: float, power: float = POWER, resolution: float = RESOLUTION) -> int:
    """The least number of fresh epochs whose slope test resolves `resolution` with `power` at `alpha`."""
    k = MIN_FRESH
    while slope_power(k, n, alpha, resolution) < power:
        k += 1
    return k


# ----------------------------------------------------------------------------- the run
class Draw(NamedTuple):
    """One epoch of the port's es_ask."""

    epoch: int
    log_ms: float      # log mean square of its sigma-carrying entries, minus 2 log of the reference's sigma_e
    first: int         # the epoch that drew these draws: itself, or an earlier one whose draws it repeats
    ratio: float       # repeated draws: (noise_e / noise_first) over the reference's sigma_e / sigma_first; else nan


def log_mean_square(noise: dict) -> float:
    """log of the mean square of every weight's sigma-carrying entries: A of the factors, E of a dense weight."""
    parts = [np.asarray(v[0] if isinstance(v, tuple) else v, np.float64).ravel()
             for v in (noise[k] for k in noiseform.weight_names(noise))]
    x = np.concatenate(parts)
    return float(np.log(np.mean(x * x)))


def collect(port, reference, params0: dict, seed: int, shapes: dict, pop: int, rank: int,
            fitness: np.ndarray) -> tuple[Draw, ...]:
    """es_ask / es_tell for len(fitness) epochs (fitness (epochs, pop): the synthetic stream), stopping at the first
    epoch whose draws repeat the previous epoch's (its ratio is exact). port: a parity.mlp.adapter.CheckedPort;
    reference: a parity.mlp.reference.ReferencePort (its sigma schedule)."""
    state = port.es_init(params0, seed)
    draws: list[Draw] = []
    prev = first = None
    for e in range(len(fitness)):
        noise = port.es_ask(state, e, shapes, pop, rank)
        sigma_e = reference.sigma_at(e)
        repeated = prev is not None and noiseform.same_draws(noise, prev)
        if repeated:
            b = draws[-1].first
            ratio = noiseform.scale_ratio(noise, first) / (sigma_e / reference.sigma_at(b))
        else:
            b, ratio, first = e, math.nan, noise
        draws.append(Draw(e, log_mean_square(noise) - 2 * math.log(sigma_e), b, ratio))
        if repeated:
            break
        state = port.es_tell(state, noise, np.asarray(fitness[e], np.float32), e)
        prev = noise
    return tuple(draws)


# ----------------------------------------------------------------------------- the readings
class Exact(NamedTuple):
    """Repeated draws: the port's sigma ratio over the reference's, read off the same draws."""

    epoch: int
    first: int
    ratio: float        # (sigma_e / sigma_first) port over reference
    value: float        # |ratio - 1|
    allowed: float = SIGMA_OWN_DRAWS

    @property
    def ok(self) -> bool:
        return math.isfinite(self.value) and self.value <= self.allowed

    @property
    def decay_ratio(self) -> float:
        """d_port / d_ref per epoch."""
        return self.ratio ** (1.0 / (self.epoch - self.first)) if self.ratio > 0 else math.nan


class Trend(NamedTuple):
    """Fresh draws: the slope of y_e over the epochs that drew their own noise, and its t test."""

    epochs: int         # fresh epochs in the fit (K)
    last: int           # the last epoch read
    slope: float        # per epoch; 2 log(d_port / d_ref) in expectation
    stderr: float
    t: float
    crit: float         # |t| above this fails (t quantile 1 - alpha/2, K - 2 degrees of freedom)
    alpha: float

    @property
    def ok(self) -> bool:
        return math.isfinite(self.t) and abs(self.t) <= self.crit

    @property
    def decay_ratio(self) -> float:
        """d_port / d_ref per epoch, as fitted."""
        return math.exp(self.slope / 2)


class Reading(NamedTuple):
    exact: Exact | None
    trend: Trend | None
    epochs: int         # epochs read (the run stops at the first repeated draws)


def trend(draws: tuple[Draw, ...], alpha: float) -> Trend | None:
    """The t test of the slope of log_ms on the epoch over the draws that are their epoch's own (None: fewer than
    MIN_FRESH)."""
    fresh = [d for d in draws if d.first == d.epoch]
    if len(fresh) < MIN_FRESH:
        return None
    x = np.array([d.epoch for d in fresh], np.float64)
    y = np.array([d.log_ms for d in fresh], np.float64)
    fit = stats.linregress(x, y)
    slope, se = float(fit.slope), float(fit.stderr)
    t = slope / se if se > 0 else (0.0 if slope == 0 else math.copysign(math.inf, slope))
    return Trend(len(fresh), draws[-1].epoch, slope, se, t, float(stats.t.isf(alpha / 2, len(fresh) - 2)), alpha)


def read(draws: tuple[Draw, ...], alpha: float) -> Reading:
    """Both readings of a run of draws (each None when the run gives it nothing to read)."""
    repeated = [d for d in draws if d.first != d.epoch]
    exact = None
    if repeated:
        d = max(repeated, key=lambda d: abs(d.ratio - 1))
        exact = Exact(d.epoch, d.first, d.ratio, abs(d.ratio - 1))
    return Reading(exact, trend(draws, alpha), len(draws))
