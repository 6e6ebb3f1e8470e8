"""The factorial attribution's part of a study report: each drift's effect, the alias chains, the model's
predicted gap beside the observed and the published ones, and how much of the gap is left to noise."""
from __future__ import annotations

import math

import pandas as pd

from gap import factorial, stats
from reporting import markdown_table

ALPHA = 0.05


def _ci(ratio: float, lo: float, hi: float) -> str:
    return f"{ratio:.3f} [{lo:.3f}, {hi:.3f}]"


def _p(x: float) -> str:
    return "n/a" if x is None or math.isnan(x) else (f"{x:.3f}" if x >= 0.001 else f"{x:.1e}")


def verdict(e: factorial.Effect) -> str:
    """matters (Holm p < 0.05), possible (interval excludes 1 only), no effect detected."""
    if e.holm_p < ALPHA:
        return "matters"
    return "possible" if not e.lo <= 1.0 <= e.hi else "no effect detected"


def effects_frame(fit: factorial.Fit, d: factorial.Design) -> pd.DataFrame:
    """factorial.csv: one row per main effect and per alias chain, unrounded."""
    rows = []
    for kind, effects in (("main", fit.effects), ("interaction chain", fit.interactions)):
        for e in effects:
            rows.append({"kind": kind, "term": e.term,
                         "description": factorial.describe(d, e.term) if kind == "main" else "",
                         "ratio": e.ratio, "ratio_lo": e.lo, "ratio_hi": e.hi, "p": e.p, "holm_p": e.holm_p,
                         "verdict": verdict(e)})
    rows.append({"kind": "predicted all on / all off", "term": "+".join(f.knob for f in d.factors),
                 "description": f"torch:{d.profile} / torch:jax under the main-effects model", "ratio": fit.predicted,
                 "ratio_lo": fit.predicted_lo, "ratio_hi": fit.predicted_hi, "p": float("nan"),
                 "holm_p": float("nan"), "verdict": ""})
    return pd.DataFrame(rows)


def drift_lines(fit: factorial.Fit, d: factorial.Design) -> list[str]:
    """Which drifts cause how much: each main effect, grouped by verdict, largest first."""
    groups: dict[str, list[str]] = {"matters": [], "possible": [], "no effect detected": []}
    for e in sorted(fit.effects, key=lambda e: -abs(math.log(e.ratio))):
        groups[verdict(e)].append(f"{factorial.describe(d, e.term)}: x{_ci(e.ratio, e.lo, e.hi)}, "
                                  f"Holm p {_p(e.holm_p)}")
    titles = {"matters": "**Drifts that matter** (factorial main effect, Holm-adjusted p < 0.05; x = steps with "
                         "the drift on over off, averaged over the other drifts)",
              "possible": "**Possible effects** (95% interval excludes 1, not significant after Holm)",
              "no effect detected": "**No effect detected**"}
    lines = [titles[k] + ":\n" + "\n".join(f"  - {i}" for i in items) for k, items in groups.items() if items]
    strong = [e for e in fit.interactions if e.holm_p < ALPHA]
    if strong:
        lines.append("**Two-factor interactions that matter** (alias chains, Holm p < 0.05): " + "; ".join(
            f"{e.term} x{_ci(e.ratio, e.lo, e.hi)}" for e in strong))
    elif fit.interactions:
        top = max(fit.interactions, key=lambda e: abs(math.log(e.ratio)))
        lines.append(f"**No two-factor interaction matters** (none of the {len(fit.interactions)} alias chains has "
                     f"Holm p < 0.05; the largest is {top.term}, x{_ci(top.ratio, top.lo, top.hi)}, Holm p "
                     f"{_p(top.holm_p)}).")
    return lines


def prediction_line(fit: factorial.Fit, d: factorial.Design, observed: stats.Comparison | None,
                    observed_ref: stats.Comparison | None, published_cmp: stats.Comparison) -> list[str]:
    """The model's all-on / all-off ratio beside the observed profile ratios and the published one."""
    parts = [f"the model predicts `torch:{d.profile}` / `torch:jax` = {_ci(fit.predicted, fit.predicted_lo, fit.predicted_hi)}"]
    if observed is not None:
        parts.append(f"observed {_ci(observed.ratio, observed.ratio_lo, observed.ratio_hi)}")
    if observed_ref is not None:
        parts.append(f"observed against `jax_reference` {_ci(observed_ref.ratio, observed_ref.ratio_lo, observed_ref.ratio_hi)}")
    parts.append(f"published {_ci(published_cmp.ratio, published_cmp.ratio_lo, published_cmp.ratio_hi)}")
    return ["**Predicted beside observed**: " + "; ".join(parts) + "."]


def noise_line(fit: factorial.Fit, d: factorial.Design, gap: stats.Comparison | None,
               floor: stats.Comparison | None) -> list[str]:
    """log(profile / reference) split into the faithful floor, the drifts' modelled effect and what is left."""
    spread = (f"One seed's steps scatter around its point's mean by a factor of about x{math.exp(fit.sigma):.2f} "
              f"(log-scale sigma {fit.sigma:.3f}), the seed-to-seed noise no drift explains.")
    if gap is None or floor is None:
        return [f"**What is left to noise**: {spread}"]
    log_gap = math.log(gap.ratio)
    if abs(log_gap) < 1e-9 or gap.ratio_lo <= 1.0 <= gap.ratio_hi:
        return [f"**What is left to noise**: the observed `torch:{d.profile}` / `jax_reference` = "
                f"{_ci(gap.ratio, gap.ratio_lo, gap.ratio_hi)} covers 1, so at these seeds the gap itself is within "
                f"noise; the model's estimate of the drifts' combined effect is x{fit.predicted:.3f} "
                f"[{fit.predicted_lo:.3f}, {fit.predicted_hi:.3f}]. {spread}"]
    model, floor_log = math.log(fit.predicted), math.log(floor.ratio)
    rest = log_gap - model - floor_log
    return [f"**What is left to noise**: log(`torch:{d.profile}` / `jax_reference`) = {log_gap:+.3f} splits into the "
            f"drifts' modelled effect {model:+.3f} ({model / log_gap:.0%}), the faithful port against the reference "
            f"{floor_log:+.3f} ({floor_log / log_gap:.0%}) and a remainder {rest:+.3f} ({rest / log_gap:.0%}: "
            f"the profile's own seeds and interactions beyond the model). {spread}"]


def power_line(fit: factorial.Fit) -> list[str]:
    return [f"**Power**: with {fit.n_runs} runs over the design's points ({fit.n_censored} censored), a main effect of "
            f"10% is detected with probability {fit.power_10pct:.0%} (two-sided 5% test); {fit.runs_for_80pct} runs "
            "give 80%."]


def section(fit: factorial.Fit | None, d: factorial.Design) -> list[str]:
    """The `## Factorial attribution` section: the design, the effects table, the chains and the model check."""
    lines = ["", f"## Factorial attribution of the `{d.profile}` drifts", "",
             f"A two-level fraction of resolution {d.resolution} over the profile's {len(d.factors)} drifts: "
             f"{len(d.arms)} points, each a torch arm (the all-off point is `torch:jax`, the all-on point "
             f"`torch:{d.profile}`). Analysed with a {fit.model if fit else 'log-normal AFT'} model of steps to solve "
             "(lifelines; unsolved runs right-censored), main effects plus one column per alias chain of two-factor "
             "interactions. Ratios read steps with the drift on over off (above 1: the drift costs steps); intervals "
             "and p values use Student's t on the small-sample-corrected errors; Holm within main effects and within "
             "chains.", ""]
    lines.append(markdown_table(["factor", "off -> on"], [[f.knob, f"{f.off} -> {f.on}"] for f in d.factors]))
    if fit is None:
        return lines + ["", "Not fitted yet: the model needs a finished run at every point and at least one solved run."]
    rows = [[factorial.describe(d, e.term), _ci(e.ratio, e.lo, e.hi), _p(e.p), _p(e.holm_p), verdict(e)]
            for e in fit.effects]
    lines += ["", "### Main effects", "",
              markdown_table(["drift", "ratio [95% CI]", "p", "Holm p", "verdict"], rows)]
    rows = [[e.term, _ci(e.ratio, e.lo, e.hi), _p(e.p), _p(e.holm_p), verdict(e)] for e in fit.interactions]
    lines += ["", "### Two-factor interactions (alias chains)", "",
              "Each chain's interactions are confounded in this fraction: the model estimates their sum.", "",
              markdown_table(["alias chain", "ratio [95% CI]", "p", "Holm p", "verdict"], rows)]
    aic = ", ".join(f"{k} {v:.1f}" for k, v in fit.aic.items())
    lines += ["", f"Model: {fit.n_runs} runs, {fit.n_censored} censored; residual log-scale sigma {fit.sigma:.3f}. "
              f"AIC of the main-effects model: {aic} (lower fits better; the log-normal form is used)."]
    return lines
