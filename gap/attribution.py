"""Which drift explains how much of the gap: the ladder from a drifted profile back to the faithful one.

Two views, both against the faithful torch arm `torch:jax`:
- the ladder: start at the drifted profile (rung 0) and switch its drifts back to the
  reference's value one at a time, cumulatively, in the profile's own order; the last rung
  is `torch:jax`. Step k compares rung k-1 (drift k still on) with rung k (drift k off);
  the step ratios multiply to the whole gap, so each step's share of log(gap) is defined.
- singles: each drift of the profile added alone to `torch:jax` (no interactions).
Every ratio reads "steps with the drift / steps without it": above 1, the drift costs steps.
"""
from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np

from gap import stats
from gap.arms import Arm, dedupe, jax_arm, profile_arm, torch_arm
from gap.drifts import drift_order
from gap.factorial import design as factorial_design
from spec.knobs import Knobs, RunSettings, as_knobs, profile


class Rung(NamedTuple):
    index: int                 # 0 = the drifted profile
    switched: str | None       # the knob switched back to the reference at this rung (None at rung 0)
    arm: Arm


class Study(NamedTuple):
    """The arms of one study: the main comparison (and other profiles to compare), then the attribution arms:
    a ladder and single drifts, or the points of a fractional factorial design (`gap.factorial.Design`); and the
    arms whose runs were imported from elsewhere."""

    profile: str
    reference: Arm             # jax_reference
    faithful: Arm              # torch:jax
    drifted: Arm               # torch:<profile>
    ladder: tuple[Rung, ...]   # empty without a ladder
    singles: tuple[tuple[str, Arm], ...]   # (knob, torch:jax + that drift alone)
    others: tuple[Arm, ...] = ()           # further main arms, e.g. torch:functional-port
    design: object = None                  # gap.factorial.Design, or None
    imported: tuple[Arm, ...] = ()         # JAX-side arms trained elsewhere (gap.imported): reported, never trained

    @property
    def main_arms(self) -> list[Arm]:
        return dedupe([self.reference, self.faithful, self.drifted, *self.others])

    @property
    def attribution_arms(self) -> list[Arm]:
        """Arms only the attribution needs (the main ones excluded)."""
        main = {a.name for a in self.main_arms}
        rest = [r.arm for r in self.ladder] + [a for _, a in self.singles]
        rest += list(self.design.arms) if self.design is not None else []
        return [a for a in dedupe(rest) if a.name not in main]


def ladder(profile_name: str, reference: RunSettings | Knobs | None = None) -> list[Rung]:
    """Rung 0 = the profile; rung k = the profile with its first k drifts switched back; last = reference."""
    reference = as_knobs(reference)
    knobs = profile(profile_name, reference)
    rungs = [Rung(0, None, torch_arm(knobs, reference))]
    for k, name in enumerate(drift_order(profile_name, reference), start=1):
        knobs = knobs.replace(**{name: getattr(reference, name)})
        rungs.append(Rung(k, name, torch_arm(knobs, reference)))
    return rungs


def singles(profile_name: str, reference: RunSettings | Knobs | None = None) -> list[tuple[str, Arm]]:
    """Each drift of the profile added alone to the reference knobs."""
    reference = as_knobs(reference)
    drifted = profile(profile_name, reference)
    return [(k, torch_arm(reference.replace(**{k: getattr(drifted, k)}), reference))
            for k in drift_order(profile_name, reference)]


DESIGNS = ("ladder", "factorial", "none")


def study(profile_name: str = "oop-port", reference: RunSettings | Knobs | None = None, design: str = "ladder",
          others: tuple[str, ...] = ()) -> Study:
    """jax_reference, torch:jax, torch:<profile> (and torch:<other> for each of `others`), and the attribution
    arms of `design`: the ladder and single drifts, a fractional factorial over the profile's drifts, or none."""
    if design not in DESIGNS:
        raise ValueError(f"--design must be one of {', '.join(DESIGNS)}, got {design!r}")
    ref = as_knobs(reference)
    return Study(
        profile=profile_name,
        reference=jax_arm(ref.run),
        faithful=torch_arm(ref, ref),
        drifted=profile_arm(f"torch:{profile_name}", ref.run),
        ladder=tuple(ladder(profile_name, ref)) if design == "ladder" else (),
        singles=tuple(singles(profile_name, ref)) if design == "ladder" else (),
        others=tuple(profile_arm(f"torch:{name}", ref.run) for name in others),
        design=factorial_design(profile_name, ref) if design == "factorial" else None,
    )


# ---------------------------------------------------------------- analysis
class Step(NamedTuple):
    """One attribution row: arm `with_drift` against `without`, for one knob."""

    view: str                  # "ladder" or "single"
    knob: str
    without: str               # baseline arm name
    with_drift: str            # arm name
    cmp: stats.Comparison | None   # None when an arm has no runs yet
    holm_p: float              # Gehan p, Holm-adjusted within its view
    share: float               # ladder only: log(step ratio) / log(whole gap); nan otherwise


def _compare(samples: dict[str, stats.Sample], base: str, arm: str, n_resamples: int, seed: int):
    if base not in samples or arm not in samples:
        return None
    return stats.compare(samples[base], samples[arm], n_resamples, seed)


def attribute(st: Study, samples: dict[str, stats.Sample], n_resamples: int = stats.N_RESAMPLES,
              seed: int = 0) -> list[Step]:
    """Ladder steps then singles, each with its comparison, Holm-adjusted p and (ladder) share of the gap."""
    whole = _compare(samples, st.faithful.name, st.drifted.name, n_resamples, seed)
    log_gap = math.log(whole.ratio) if whole is not None and whole.ratio != 1.0 else float("nan")
    rows: list[Step] = []
    for view, pairs in (
        ("ladder", [(r.switched, r.arm.name, prev.arm.name) for prev, r in zip(st.ladder, st.ladder[1:])]),
        ("single", [(k, st.faithful.name, a.name) for k, a in st.singles]),
    ):
        cmps = [_compare(samples, base, arm, n_resamples, seed) for _, base, arm in pairs]
        adjusted = stats.holm([c.gehan_p if c is not None else np.nan for c in cmps])
        for (knob, base, arm), c, hp in zip(pairs, cmps, adjusted):
            share = math.log(c.ratio) / log_gap if view == "ladder" and c is not None else float("nan")
            rows.append(Step(view, knob, base, arm, c, float(hp), share))
    return rows


def verdict(steps: list[Step], knob: str, alpha: float = 0.05) -> str:
    """`matters`, `possible` or `no effect detected` for one knob, from both views."""
    mine = [s for s in steps if s.knob == knob and s.cmp is not None]
    if any(s.holm_p < alpha for s in mine):
        return "matters"
    if any(s.cmp.ratio_lo > 1.0 or s.cmp.ratio_hi < 1.0 for s in mine):
        return "possible"
    return "no effect detected" if mine else "not run"
