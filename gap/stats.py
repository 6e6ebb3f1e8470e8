"""Statistics for steps-to-solve samples, with runs that never solved kept as censored.

A run that did not solve within its budget is not dropped: its value is the number of
env steps it reached, a lower bound on its steps to solve (right censoring). Every
function here says how it treats those bounds. Pure numpy/scipy; every random draw
comes from an explicit seed.
"""
from __future__ import annotations

import math
import warnings
from typing import NamedTuple

import numpy as np
from scipy import stats as sps

N_RESAMPLES = 10_000   # bootstrap resamples unless told otherwise
LEVEL = 0.95           # two-sided interval level


class Sample(NamedTuple):
    """Steps to solve, one per seed; `censored[i]` marks a run that stopped unsolved at `steps[i]`."""

    steps: np.ndarray     # (n,) float64, > 0
    censored: np.ndarray  # (n,) bool

    @property
    def n(self) -> int:
        return int(self.steps.shape[0])

    @property
    def n_censored(self) -> int:
        return int(self.censored.sum())


def sample(steps, censored=None) -> Sample:
    """Check and pack one arm's steps (censored runs hold their lower bound)."""
    x = np.asarray(steps, dtype=np.float64)
    if x.ndim != 1 or x.size == 0:
        raise ValueError(f"steps must be a non-empty 1-D sequence, got shape {x.shape}")
    if not np.all(np.isfinite(x)) or np.any(x <= 0):
        raise ValueError(f"steps must be finite and > 0 (a censored run holds the steps it reached), got {x}")
    c = np.zeros(x.shape, bool) if censored is None else np.asarray(censored, dtype=bool)
    if c.shape != x.shape:
        raise ValueError(f"censored has shape {c.shape}, steps has shape {x.shape}; give one flag per run")
    return Sample(x, c)


# ---------------------------------------------------------------- location and spread
def iqm(x) -> float:
    """Interquartile mean: the mean of the middle 50% (25% trimmed from each end)."""
    return float(sps.trim_mean(np.asarray(x, dtype=np.float64), 0.25))


def cv(x) -> float:
    """Coefficient of variation, sample sd (ddof 1) over the mean; 0 for a single value."""
    x = np.asarray(x, dtype=np.float64)
    return float(x.std(ddof=1) / x.mean()) if x.size > 1 else 0.0


def pooled_cv(a: Sample, b: Sample) -> float:
    """sqrt of the mean of the two squared CVs (the spread the power analysis assumes for both arms)."""
    return math.sqrt((cv(a.steps) ** 2 + cv(b.steps) ** 2) / 2.0)


# ---------------------------------------------------------------- effect size
def ratio_of_means(a: Sample, b: Sample) -> float:
    """mean(b) / mean(a): above 1 means arm b needs more steps than baseline a."""
    return float(b.steps.mean() / a.steps.mean())


def ratio_bound(a: Sample, b: Sample) -> str:
    """What the ratio of means is when censored runs enter at their lower bound."""
    if not a.n_censored and not b.n_censored:
        return "estimate"
    if not a.n_censored:
        return "lower bound"     # only the numerator is understated
    if not b.n_censored:
        return "upper bound"     # only the denominator is understated
    return "no bound"            # both understated: direction unknown


def _resample_means(x: np.ndarray, rng: np.random.Generator, n_resamples: int) -> np.ndarray:
    idx = rng.integers(0, x.size, size=(n_resamples, x.size))   # (R, n)
    return x[idx].mean(axis=1)


def bootstrap_ratio_ci(a: Sample, b: Sample, n_resamples: int = N_RESAMPLES, seed: int = 0,
                       level: float = LEVEL) -> tuple[float, float]:
    """Percentile bootstrap interval of mean(b)/mean(a), each arm resampled on its own."""
    rng = np.random.default_rng(seed)
    ratios = _resample_means(b.steps, rng, n_resamples) / _resample_means(a.steps, rng, n_resamples)
    tail = (1.0 - level) / 2.0 * 100.0
    lo, hi = np.percentile(ratios, [tail, 100.0 - tail])
    return float(lo), float(hi)


# ---------------------------------------------------------------- pairwise order under censoring
def order_matrix(a: Sample, b: Sample) -> np.ndarray:
    """(n_a, n_b) scores: +1 where b_j surely needed fewer steps than a_i, -1 surely more, 0 tie or unknown.

    Gehan's rule: a censored run's true value exceeds its bound, so it is surely larger than any
    solved value at or below that bound; two censored runs, or a censored bound below a solved
    value, cannot be ordered.
    """
    x, cx = a.steps[:, None], a.censored[:, None]   # (n_a, 1)
    y, cy = b.steps[None, :], b.censored[None, :]   # (1, n_b)
    both = ~cx & ~cy
    b_less = (both & (y < x)) | (cx & ~cy & (y <= x))
    b_more = (both & (y > x)) | (cy & ~cx & (x <= y))
    return b_less.astype(np.float64) - b_more.astype(np.float64)


def prob_improvement(a: Sample, b: Sample) -> float:
    """P(b < a): the chance that a seed of arm b needs fewer steps than one of a; ties and unknowns count 1/2."""
    return float((order_matrix(a, b).mean() + 1.0) / 2.0)


def bootstrap_prob_improvement_ci(a: Sample, b: Sample, n_resamples: int = N_RESAMPLES, seed: int = 0,
                                  level: float = LEVEL) -> tuple[float, float]:
    """Percentile bootstrap interval of P(b < a), resampling seeds of each arm."""
    rng = np.random.default_rng(seed)
    scores = (order_matrix(a, b) + 1.0) / 2.0                      # (n_a, n_b) in {0, 1/2, 1}
    ia = rng.integers(0, a.n, size=(n_resamples, a.n))             # (R, n_a)
    ib = rng.integers(0, b.n, size=(n_resamples, b.n))             # (R, n_b)
    probs = scores[ia[:, :, None], ib[:, None, :]].mean(axis=(1, 2))  # (R,)
    tail = (1.0 - level) / 2.0 * 100.0
    lo, hi = np.percentile(probs, [tail, 100.0 - tail])
    return float(lo), float(hi)


# ---------------------------------------------------------------- tests
def welch_p(a: Sample, b: Sample) -> float:
    """Two-sided Welch t-test on the steps (censored runs at their lower bound); nan if both arms are constant."""
    if a.n < 2 or b.n < 2:
        return float("nan")
    if np.ptp(a.steps) == 0 and np.ptp(b.steps) == 0:
        return 1.0 if a.steps[0] == b.steps[0] else float("nan")
    with warnings.catch_warnings():   # one constant arm (e.g. all censored at the budget) is a valid input
        warnings.simplefilter("ignore", RuntimeWarning)
        return float(sps.ttest_ind(b.steps, a.steps, equal_var=False).pvalue)


def mann_whitney_p(a: Sample, b: Sample) -> float:
    """Two-sided Mann-Whitney U p (scipy's default method), censored runs as ties above every solved value.

    That tie rule is exact when all runs share one budget (a censored run then exceeds every
    solved one); `gehan` handles bounds that differ.
    """
    top = max(a.steps.max(), b.steps.max()) + 1.0
    x = np.where(a.censored, top, a.steps)
    y = np.where(b.censored, top, b.steps)
    if np.ptp(np.concatenate([x, y])) == 0:
        return 1.0
    return float(sps.mannwhitneyu(y, x, alternative="two-sided").pvalue)


class Gehan(NamedTuple):
    w: float   # sum of order scores; > 0 means b tends to need fewer steps
    z: float
    p: float   # two-sided, normal approximation with Mantel's permutation variance


def gehan(a: Sample, b: Sample) -> Gehan:
    """Gehan's generalized Wilcoxon test for right-censored samples (Mann-Whitney when nothing is censored)."""
    w = float(order_matrix(a, b).sum())
    pooled = sample(np.concatenate([a.steps, b.steps]), np.concatenate([a.censored, b.censored]))
    u = order_matrix(pooled, pooled).sum(axis=1)   # (N,) per run: # surely below it minus # surely above
    n = pooled.n
    var = a.n * b.n / (n * (n - 1)) * float(np.sum(u ** 2)) if n > 1 else 0.0
    if var == 0.0:
        return Gehan(w, 0.0, 1.0)
    z = w / math.sqrt(var)
    return Gehan(w, z, float(2.0 * sps.norm.sf(abs(z))))


def min_gehan_p(n_a: int, n_b: int) -> float:
    """The smallest two-sided p Gehan's test can give (complete separation, no ties or censoring)."""
    return float(2.0 * sps.norm.sf(math.sqrt(3.0 * n_a * n_b / (n_a + n_b + 1))))


def holm(pvalues) -> np.ndarray:
    """Holm's step-down adjustment (family-wise error); nan stays nan. statsmodels' multipletests(method="holm")
    gives the same numbers (tests/gap/test_stats.py) but runs a full gc.collect() per call: seconds in a process
    holding JAX and torch."""
    p = np.asarray(pvalues, dtype=np.float64)
    out = np.full(p.shape, np.nan)
    ok = np.flatnonzero(~np.isnan(p))
    order = ok[np.argsort(p[ok], kind="stable")]
    m, running = order.size, 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (m - rank) * p[i]))
        out[i] = running
    return out


# ---------------------------------------------------------------- power
def _z(q: float) -> float:
    return float(sps.norm.ppf(q))


def seeds_needed(cv_: float, rel_diff: float = 0.10, alpha: float = 0.05, power: float = 0.80) -> int:
    """Seeds per arm to detect a relative difference of means at the given power (two-sided alpha).

    Normal approximation for two arms that share the coefficient of variation `cv_`:
    n = 2 (z_{1-alpha/2} + z_power)^2 cv^2 / rel_diff^2, rounded up, at least 2.
    """
    if not rel_diff > 0:
        raise ValueError(f"rel_diff must be > 0, got {rel_diff}")
    n = 2.0 * (_z(1.0 - alpha / 2.0) + _z(power)) ** 2 * cv_ ** 2 / rel_diff ** 2
    return max(2, math.ceil(n - 1e-9))


def power_at(n: int, cv_: float, rel_diff: float = 0.10, alpha: float = 0.05) -> float:
    """Power of the same normal-approximation test with `n` seeds per arm (both tails)."""
    if cv_ == 0.0:
        return 1.0
    shift = rel_diff / (cv_ * math.sqrt(2.0 / n))
    crit = _z(1.0 - alpha / 2.0)
    return float(sps.norm.sf(crit - shift) + sps.norm.cdf(-crit - shift))


def detectable_diff(n: int, cv_: float, alpha: float = 0.05, power: float = 0.80) -> float:
    """Smallest relative difference of means detected at `power` with `n` seeds per arm (same approximation)."""
    return (_z(1.0 - alpha / 2.0) + _z(power)) * cv_ * math.sqrt(2.0 / n)


# ---------------------------------------------------------------- one comparison, everything at once
class Comparison(NamedTuple):
    """Arm b against baseline a: effect size with interval, tests, and power."""

    n_a: int
    n_b: int
    censored_a: int
    censored_b: int
    mean_a: float
    mean_b: float
    iqm_a: float
    iqm_b: float
    ratio: float
    ratio_lo: float
    ratio_hi: float
    ratio_kind: str          # estimate / lower bound / upper bound / no bound
    welch_p: float
    mann_whitney_p: float
    gehan_p: float
    p_improvement: float     # P(b < a)
    p_improvement_lo: float
    p_improvement_hi: float
    cv: float                # pooled CV
    seeds_needed: int        # per arm, 10% difference at 80% power
    power: float             # at min(n_a, n_b) seeds
    n_resamples: int


def compare(a: Sample, b: Sample, n_resamples: int = N_RESAMPLES, seed: int = 0,
            rel_diff: float = 0.10) -> Comparison:
    """Every statistic of the report for arm b against baseline a."""
    lo, hi = bootstrap_ratio_ci(a, b, n_resamples, seed)
    plo, phi = bootstrap_prob_improvement_ci(a, b, n_resamples, seed)
    c = pooled_cv(a, b)
    return Comparison(
        n_a=a.n, n_b=b.n, censored_a=a.n_censored, censored_b=b.n_censored,
        mean_a=float(a.steps.mean()), mean_b=float(b.steps.mean()),
        iqm_a=iqm(a.steps), iqm_b=iqm(b.steps),
        ratio=ratio_of_means(a, b), ratio_lo=lo, ratio_hi=hi, ratio_kind=ratio_bound(a, b),
        welch_p=welch_p(a, b), mann_whitney_p=mann_whitney_p(a, b), gehan_p=gehan(a, b).p,
        p_improvement=prob_improvement(a, b), p_improvement_lo=plo, p_improvement_hi=phi,
        cv=c, seeds_needed=seeds_needed(c, rel_diff), power=power_at(min(a.n, b.n), c, rel_diff),
        n_resamples=n_resamples,
    )
