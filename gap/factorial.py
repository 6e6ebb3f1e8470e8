"""Attribution as a designed experiment: a two-level fractional factorial over a profile's drifts, analysed
by an accelerated-failure-time model of steps-to-solve with censoring.

Design: each drift of the profile is a factor, off (the reference's value) or on (the profile's). The fraction
comes from pyDOE (`fracfact_by_res`): the fewest runs at resolution IV or better, so no main effect is aliased
with a two-factor interaction (7 drifts: 16 points, 2^(7-3)). Every point is an arm trained at several seeds.

Model: log(steps) = mu + sum_i b_i z_i + sum_c g_c w_c + sigma * eps, with z_i = +-1 the factor levels and w_c
one column per alias chain of two-factor interactions (the chains the fraction can tell apart), fitted by
lifelines' AFT fitters with unsolved runs right-censored at the steps they reached. A drift's effect is
exp(2 b_i): steps with the drift on over steps with it off, averaged over the other drifts. The all-on point
over the all-off point (the profile over the faithful port) is exp(2 sum_i b_i): the interaction columns are
+1 at both ends and cancel. Holm's adjustment and the power come from statsmodels.
"""
from __future__ import annotations

import math
import warnings
from typing import NamedTuple

import numpy as np
import pandas as pd

from gap import stats
from gap.arms import Arm, torch_arm
from gap.drifts import describe_drift, drift_order
from spec.knobs import Knobs, RunSettings, as_knobs, profile

RESOLUTION = 4
LEVEL = 0.95


class Factor(NamedTuple):
    knob: str
    off: object        # the reference's value
    on: object         # the profile's


class Design(NamedTuple):
    """The fraction: factors, one arm per point, the alias chains of two-factor interactions."""

    profile: str
    factors: tuple[Factor, ...]
    matrix: np.ndarray                       # (points, factors) of +-1
    arms: tuple[Arm, ...]                    # one per point
    chains: tuple[tuple[tuple[str, str], ...], ...]   # each: the two-factor interactions aliased together
    resolution: int

    def levels(self, arm_name: str) -> np.ndarray | None:
        """The +-1 levels of the point an arm trains, or None for an arm outside the design."""
        for arm, row in zip(self.arms, self.matrix):
            if arm.name == arm_name:
                return row
        return None


def _two_factor_chains(matrix: np.ndarray, knobs: list[str]) -> tuple[tuple[tuple[str, str], ...], ...]:
    """Groups of two-factor interactions whose columns are equal up to sign in this fraction."""
    groups: dict[bytes, list[tuple[str, str]]] = {}
    for i in range(len(knobs)):
        for j in range(i + 1, len(knobs)):
            col = matrix[:, i] * matrix[:, j]
            groups.setdefault((col * col[0]).astype(np.int8).tobytes(), []).append((knobs[i], knobs[j]))
    return tuple(tuple(g) for g in groups.values())


def resolution_of(matrix: np.ndarray) -> int:
    """3 when a main effect is aliased with a two-factor interaction, else at least 4 (what this study needs)."""
    k = matrix.shape[1]
    mains = {(matrix[:, i] * matrix[0, i]).astype(np.int8).tobytes() for i in range(k)}
    for i in range(k):
        for j in range(i + 1, k):
            col = matrix[:, i] * matrix[:, j]
            if (col * col[0]).astype(np.int8).tobytes() in mains:
                return 3
    return RESOLUTION


def design(profile_name: str, reference: RunSettings | Knobs | None = None) -> Design:
    """The resolution-IV fraction over the profile's drifts, one torch arm per point."""
    import pydoe

    ref = as_knobs(reference)
    drifted = profile(profile_name, ref)
    factors = tuple(Factor(k, getattr(ref, k), getattr(drifted, k)) for k in drift_order(profile_name, ref))
    if len(factors) < 2:
        raise ValueError(f"profile {profile_name!r} has {len(factors)} drift(s): a factorial needs at least 2")
    matrix = np.asarray(pydoe.fracfact_by_res(len(factors), RESOLUTION), dtype=np.int64)
    arms = tuple(torch_arm(ref.replace(**{f.knob: f.on if z > 0 else f.off for f, z in zip(factors, row)}), ref)
                 for row in matrix)
    knobs = [f.knob for f in factors]
    return Design(profile_name, factors, matrix, arms, _two_factor_chains(matrix, knobs), resolution_of(matrix))


# ---------------------------------------------------------------- the model
class Effect(NamedTuple):
    """One term's multiplicative effect on steps-to-solve (on over off), with its interval and tests."""

    term: str                  # a knob, or an alias chain "a:b = c:d"
    ratio: float               # exp(2 coefficient)
    lo: float
    hi: float
    p: float
    holm_p: float


class Fit(NamedTuple):
    model: str
    n_runs: int
    n_censored: int
    effects: tuple[Effect, ...]         # main effects (main-effects model), in the profile's order
    interactions: tuple[Effect, ...]    # one per alias chain (main effects + chains model)
    sigma: float               # residual scale of log steps (main-effects model, small-sample corrected)
    predicted: float           # all drifts on over all off: exp(2 sum b)
    predicted_lo: float
    predicted_hi: float
    aic: dict[str, float]      # main-effects model: log-normal (the one used) and Weibull (a check of the form)
    power_10pct: float         # of one main effect's test for a 10% effect, at these runs
    runs_for_80pct: int        # total runs (all points) that would give 80% power


def _frame(runs: pd.DataFrame, d: Design) -> pd.DataFrame:
    """One row per run of a design point: steps, solved, the +-1 factor columns and one column per chain."""
    knobs = [f.knob for f in d.factors]
    rows = []
    for r in runs.itertuples():
        z = d.levels(r.arm)
        if z is None:
            continue
        row = {"steps": float(r.steps), "solved": bool(r.solved), **dict(zip(knobs, z.astype(float)))}
        for c, chain in enumerate(d.chains):
            a, b = chain[0]
            row[f"chain{c}"] = row[a] * row[b]
        rows.append(row)
    return pd.DataFrame(rows)


class _Model(NamedTuple):
    """A fitted AFT model with its small-sample correction: residual dof and the factor on the MLE's errors."""

    fitter: object
    dof: int
    inflate: float             # sqrt(n / dof): the MLE's standard errors use sigma^2 = RSS / n


def _fit_aft(frame: pd.DataFrame, columns: list[str], kind: str = "lognormal") -> _Model:
    from lifelines import LogNormalAFTFitter, WeibullAFTFitter

    cls = LogNormalAFTFitter if kind == "lognormal" else WeibullAFTFitter
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        fitter = cls().fit(frame[columns + ["steps", "solved"]], duration_col="steps", event_col="solved")
    dof = max(1, len(frame) - len(columns) - 2)          # location terms, intercept, scale
    return _Model(fitter, dof, math.sqrt(len(frame) / dof))


def _effects(m: _Model, terms: list[str], labels: list[str]) -> list[Effect]:
    """exp(2 b) per term with t intervals and p values on the corrected errors; Holm within the family."""
    from scipy.stats import t as student

    summary = m.fitter.summary.loc["mu_"]
    coef = summary.loc[terms, "coef"].to_numpy()
    se = summary.loc[terms, "se(coef)"].to_numpy() * m.inflate
    p = 2 * student.sf(np.abs(coef / se), m.dof)
    holm = stats.holm(p)
    q = float(student.ppf(0.5 + LEVEL / 2, m.dof))
    return [Effect(label, math.exp(2 * b), math.exp(2 * (b - q * s)), math.exp(2 * (b + q * s)), float(pv), float(h))
            for label, b, s, pv, h in zip(labels, coef, se, p, holm)]


def _power(sigma: float, n_runs: int) -> tuple[float, int]:
    """Power of a main effect's two-sided 5% test for a 10% effect, and the runs for 80%, by statsmodels.

    In a two-level design each main effect compares n/2 runs at +1 with n/2 at -1: a two-sample comparison of
    log steps with standardized effect log(1.1) / sigma.
    """
    from statsmodels.stats.power import NormalIndPower

    effect = math.log(1.10) / sigma
    power = float(NormalIndPower().power(effect_size=effect, nobs1=n_runs / 2, alpha=0.05, ratio=1.0))
    per_level = NormalIndPower().solve_power(effect_size=effect, alpha=0.05, power=0.8, ratio=1.0)
    return power, int(math.ceil(2 * per_level))


def _predicted(m: _Model, knobs: list[str]) -> tuple[float, float, float]:
    """exp(2 sum b) and its interval: every drift on over every drift off."""
    from scipy.stats import t as student

    coef = m.fitter.summary.loc["mu_"].loc[knobs, "coef"].to_numpy()
    cov = m.fitter.variance_matrix_.loc["mu_", "mu_"].loc[knobs, knobs].to_numpy()
    total, se = 2 * float(coef.sum()), 2 * math.sqrt(float(np.ones(len(knobs)) @ cov @ np.ones(len(knobs))))
    q = float(student.ppf(0.5 + LEVEL / 2, m.dof)) * m.inflate
    return math.exp(total), math.exp(total - q * se), math.exp(total + q * se)


def fit(runs: pd.DataFrame, d: Design) -> Fit | None:
    """The AFT models on the design's runs (None until every point has a run and some run solved).

    Main effects come from the main-effects model (a resolution-IV fraction keeps them clear of two-factor
    interactions, whose effect goes to the residual); the alias chains from the model with both. Standard
    errors are the MLE's scaled by sqrt(n / dof) and intervals use Student's t with those dof: on simulated
    null data this keeps a main effect's false-alarm rate at about 5% (the plain Wald test gave 7%).
    """
    frame = _frame(runs, d)
    knobs = [f.knob for f in d.factors]
    if frame.empty or not frame["solved"].any() or len(frame.groupby(knobs)) < len(d.arms):
        return None
    chains = [f"chain{c}" for c in range(len(d.chains))]
    main, full = _fit_aft(frame, knobs), _fit_aft(frame, knobs + chains)
    weibull = _fit_aft(frame, knobs, "weibull")
    sigma = math.exp(float(main.fitter.summary.loc[("sigma_", "Intercept"), "coef"])) * main.inflate
    power, needed = _power(sigma, len(frame))
    labels = [" = ".join(f"{a}:{b}" for a, b in chain) for chain in d.chains]
    return Fit("log-normal AFT", len(frame), int((~frame["solved"]).sum()), tuple(_effects(main, knobs, knobs)),
               tuple(_effects(full, chains, labels)), sigma, *_predicted(main, knobs),
               {"log-normal": float(main.fitter.AIC_), "Weibull": float(weibull.fitter.AIC_)}, power, needed)


def describe(d: Design, knob: str) -> str:
    """A factor in the verdicts' words, with its two levels."""
    return describe_drift(knob, d.profile)
