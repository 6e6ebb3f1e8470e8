"""The GPU-precision arms of a study and how likely the published gap is as chance (issue 24's answer).

A TF32 arm is a torch arm with `matmul_precision=high`: what a published arm on an Ampere-or-newer GPU computed
(JAX's default float32 matmuls there are TF32; torch's stay float32 unless asked). Its float32 counterpart is the
same knobs at `highest`. Against the published design (10 seeds against 10), the chance of a ratio at least the
published one comes from gap.chance under each model: the faithful one (the drifted profile against the reference)
and the same with TF32 on the JAX side (against the reference's math in TF32).
"""
from __future__ import annotations

import math
from typing import NamedTuple

from gap import chance, published, stats
from gap.arms import Arm, torch_arm

ALPHA = 0.05
PRECISION_KNOB, TF32 = "matmul_precision", "high"


class Model(NamedTuple):
    """A model of the published comparison: which study arm stands for each published arm."""

    label: str
    base: str          # stands for the published JAX arm
    arm: str           # stands for the published torch arm


def tf32_arms(st) -> list[tuple[Arm, str]]:
    """(TF32 arm, its float32 counterpart's name) for each main torch arm with matmul_precision=high."""
    out = []
    for a in st.main_arms:
        if a.side == "torch" and getattr(a.knobs, PRECISION_KNOB) == TF32:
            out.append((a, torch_arm(a.knobs.replace(**{PRECISION_KNOB: "highest"}), st.reference.knobs).name))
    return out


def _tf32_of(st, name: str) -> str | None:
    return next((a.name for a, base in tf32_arms(st) if base == name), None)


def pairs(st) -> list[tuple[str, str]]:
    """The comparisons the verdict needs: each TF32 arm against its float32 counterpart, and the drifted profile
    (float32, and in TF32) against the reference's math in TF32."""
    out = [(base, a.name) for a, base in tf32_arms(st)]
    ref_tf32 = _tf32_of(st, st.faithful.name)
    if ref_tf32:
        out.append((ref_tf32, st.drifted.name))
        drifted_tf32 = _tf32_of(st, st.drifted.name)
        if drifted_tf32:
            out.append((ref_tf32, drifted_tf32))
    return out


def models(st) -> list[Model]:
    """The faithful model, then (with the TF32 arms) TF32 on the JAX side, and TF32 on both sides."""
    out = [Model("faithful model", st.reference.name, st.drifted.name)]
    ref_tf32 = _tf32_of(st, st.faithful.name)
    if ref_tf32:
        out.append(Model("faithful model plus TF32 on the JAX side", ref_tf32, st.drifted.name))
        drifted_tf32 = _tf32_of(st, st.drifted.name)
        if drifted_tf32:
            out.append(Model("TF32 on both sides", ref_tf32, drifted_tf32))
    return out


def chance_rows(st, samples: dict[str, stats.Sample], threshold: float, n: int, resamples: int,
                seed: int) -> list[dict]:
    """One row per model and bootstrap method: P(ratio of means >= threshold) at n seeds against n."""
    rows = []
    for m in models(st):
        if m.base not in samples or m.arm not in samples:
            continue
        for method in chance.METHODS:
            c = chance.gap_chance(samples[m.base].steps, samples[m.arm].steps, threshold, n, method, resamples, seed)
            rows.append({"model": m.label, "baseline": m.base, "arm": m.arm, "censored": samples[m.base].n_censored
                         + samples[m.arm].n_censored, **c._asdict()})
    return rows


def _ratio(c: stats.Comparison) -> str:
    return f"{c.ratio:.3f} [{c.ratio_lo:.3f}, {c.ratio_hi:.3f}]"


def _moves(c: stats.Comparison) -> str:
    if c.ratio_lo <= 1.0 <= c.ratio_hi and c.gehan_p >= ALPHA:
        return "no effect detected"
    return "more steps" if c.ratio > 1 else "fewer steps"


def cost_sentence(arm: str, base: str, cpu_s: dict[str, float]) -> str:
    """' A run of ARM cost X s of one core, Y x BASE's (...).' from the runs' mean cpu_s, or '' without both."""
    a, b = cpu_s.get(arm, math.nan), cpu_s.get(base, math.nan)
    if not (a > 0 and b > 0):
        return ""
    return (f" A run of `{arm}` cost {a:.0f} s of one core on average, {a / b:.2f}x `{base}`'s {b:.0f} s (on a CPU "
            "the knob rounds every matmul operand to TF32 in software; a GPU's TF32 is faster, not slower).")


def _precision_lines(st, cmps, cpu_s: dict[str, float]) -> list[str]:
    lines = []
    for a, base in tf32_arms(st):
        c = cmps.get((base, a.name))
        if c is None:
            continue
        side = "the reference's math" if base == st.faithful.name else f"`{base}`"
        lines.append(f"**TF32 matmuls on {side}** (`{a.name}` / `{base}`): {_ratio(c)}, Gehan p {c.gehan_p:.3f}: "
                     f"{_moves(c)}. With {min(c.n_a, c.n_b)} seeds per arm a difference of about "
                     f"{stats.detectable_diff(min(c.n_a, c.n_b), c.cv):.0%} is detected at 80% power."
                     + cost_sentence(a.name, base, cpu_s))
    return lines


def _chance_line(rows: list[dict], threshold: float, n: int) -> list[str]:
    two = [r for r in rows if r["method"] == "two_stage"]
    if not two:
        return []
    one = {r["model"]: r for r in rows if r["method"] == "one_stage"}
    parts = [f"{r['model']} (`{r['arm']}` against `{r['baseline']}`): {r['probability']:.1%}"
             + (f" (seed spread alone: {one[r['model']]['probability']:.1%})" if r["model"] in one else "")
             for r in two]
    return [f"**How likely a published-size gap is as chance** (a replication with {n} seeds per arm showing a ratio "
            f"of means >= {threshold:.3f}; two-stage bootstrap of the study's runs, Monte Carlo error below "
            f"{max(r['mc_se'] for r in two):.1%}): " + "; ".join(parts) + "."]


def _spreads(st, samples: dict[str, stats.Sample]) -> list[tuple[str, float, float]]:
    """(arm, CV, Brown-Forsythe p of equal spread with the published JAX arm: scipy's Levene test about the median)
    for the reference and its TF32 arm."""
    from scipy.stats import levene

    pj, _ = published.samples()
    return [(name, stats.cv(samples[name].steps), float(levene(pj.steps, samples[name].steps, center="median").pvalue))
            for name in (st.reference.name, _tf32_of(st, st.faithful.name)) if name in samples]


def _spread_line(st, samples: dict[str, stats.Sample]) -> list[str]:
    """The published JAX arm's seed-to-seed spread against the reference's and its TF32 arm's."""
    pj, _ = published.samples()
    parts = [f"`{name}` {v:.3f} (equal spread: Brown-Forsythe p {p:.3f})" for name, v, p in _spreads(st, samples)]
    if not parts:
        return []
    return [f"**Seed-to-seed spread**: the published JAX arm's CV is {stats.cv(pj.steps):.3f}; here "
            + ", ".join(parts) + "."]


def _unexplained_line(st, cmps, samples, published_cmp: stats.Comparison, rows: list[dict]) -> list[str]:
    """What the models leave unexplained: the gap's size when no model makes it likely enough, and the published JAX
    arm's spread when it differs from the reference's."""
    two = {r["model"]: r["probability"] for r in rows if r["method"] == "two_stage"}
    ref_tf32 = _tf32_of(st, st.faithful.name)
    c = cmps.get((ref_tf32, st.drifted.name)) if ref_tf32 else None
    out = []
    likely = [m for m, p in two.items() if m != "TF32 on both sides" and p >= ALPHA]
    if c is not None and c.ratio_lo <= published_cmp.ratio <= c.ratio_hi and likely:
        out.append(f"the published gap's size is not left unexplained: the published ratio lies inside "
                   f"`{st.drifted.name}` / `{ref_tf32}`'s interval, and a replication shows a gap that large by "
                   "chance with probability " + ", ".join(f"{two[m]:.0%} ({m})" for m in likely))
    else:
        out.append("the published gap's size: no model here makes it likely as chance (each below "
                   f"{ALPHA:.0%}) or the published ratio lies outside the TF32 interval")
    pj, _ = published.samples()
    spreads = {n: (v, p) for n, v, p in _spreads(st, samples)}
    ref_cv, ref_p = spreads.get(st.reference.name, (math.nan, 1.0))
    if ref_p < ALPHA and ref_cv > stats.cv(pj.steps):
        tf32 = spreads.get(ref_tf32) if ref_tf32 else None
        effect = "" if tf32 is None else (f"; TF32 does not narrow it (`{ref_tf32}` {tf32[0]:.3f})" if tf32[0] >= ref_cv
                                          else f"; TF32 narrows it to {tf32[0]:.3f} (`{ref_tf32}`)")
        out.append(f"the published JAX arm's narrower seed-to-seed spread (CV {stats.cv(pj.steps):.3f} against "
                   f"`{st.reference.name}` {ref_cv:.3f}, Brown-Forsythe p {ref_p:.3f}{effect}), which comes from "
                   "something the study does not model (another seed scheme, environment version or hardware)")
    return ["**What is still unexplained**: " + "; ".join(out) + "."]


def verdict_lines(st, cmps: dict, samples: dict[str, stats.Sample], published_cmp: stats.Comparison,
                  rows: list[dict], n: int, gap_line, cpu_s: dict[str, float] | None = None) -> list[str]:
    """TF32's effect on each side and what its arms cost (cpu_s: mean cpu seconds per run by arm), the published
    question with TF32 on the JAX side (gap_line: the report's own wording of a gap against the published ratio),
    the chance of a published-size gap, and the spread."""
    lines = _precision_lines(st, cmps, cpu_s or {})
    ref_tf32 = _tf32_of(st, st.faithful.name)
    if ref_tf32 and (ref_tf32, st.drifted.name) in cmps:
        lines += [("With TF32 on the JAX side, as the published JAX run most likely computed: "
                   + gap_line(ref_tf32, st.drifted.name, cmps[(ref_tf32, st.drifted.name)], published_cmp)[0])]
    lines += _chance_line(rows, published_cmp.ratio, n)
    if ref_tf32:
        lines += _spread_line(st, samples) + _unexplained_line(st, cmps, samples, published_cmp, rows)
    return lines


def section(rows: list[dict]) -> list[str]:
    """The chance table under each model and method."""
    if not rows:
        return []
    from reporting import markdown_table

    head = ["model", "arm / baseline", "method", "P(ratio >= threshold)", "Monte Carlo error", "censored runs"]
    body = [[r["model"], f"`{r['arm']}` / `{r['baseline']}`", r["method"].replace("_", "-"),
             f"{r['probability']:.2%}", f"{r['mc_se']:.2%}", r["censored"]] for r in rows]
    threshold, n, resamples = rows[0]["threshold"], rows[0]["n"], rows[0]["resamples"]
    return ["", "## How likely the published gap is as chance", "",
            f"The probability that a replication of the published design ({n} seeds per arm) shows a ratio of mean "
            f"steps to solve of at least {threshold:.3f} (the published one), predicted from this study's runs by "
            f"bootstrap ({resamples:,} replications, gap/chance.py). One-stage: a replication's seeds are drawn from "
            "each arm's runs (the spread of seeds alone, the arms' means held at the observed ones). Two-stage: "
            "each replication first draws a plausible arm from its runs, then its seeds from that (adds this "
            "study's own uncertainty about each arm; the verdict quotes it).", "",
            markdown_table(head, body)]

