"""`summary.md`, the tidy CSVs and the figures of a study, from what its folder holds."""
from __future__ import annotations

import math
import os
from typing import NamedTuple

import numpy as np
import pandas as pd

from gap import attribution as attr
from gap.drifts import describe_drift
from gap import factorial, factorial_report, imported, plots, precision_report, published, results, stats
from gap.runs import RunSpec
from gap.store import RunStore
from reporting import atomic_write, machine, markdown_table, versions
from spec.config import PRESET_NOTES, Config

ALPHA = 0.05


class StudyInfo(NamedTuple):
    """How the study was run, for the report's header."""

    command: str
    preset: str
    config: Config
    seeds: list[int]              # main arms
    attribution_seeds: list[int]  # attribution-only arms
    workers: int
    device: str
    wall_s: float                 # this invocation
    failed: list[str]
    notes: list[str]
    executor: str = "local"


# ---------------------------------------------------------------- formatting
def _steps(x: float) -> str:
    return "n/a" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:,.0f}"


def _p(x: float) -> str:
    if x is None or math.isnan(x):
        return "n/a"
    return f"{x:.3f}" if x >= 0.001 else f"{x:.1e}"


def _ratio(c: stats.Comparison) -> str:
    kind = "" if c.ratio_kind == "estimate" else f" ({c.ratio_kind})"
    return f"{c.ratio:.3f} [{c.ratio_lo:.3f}, {c.ratio_hi:.3f}]{kind}"


def _seconds(x: float) -> str:
    return "n/a" if math.isnan(x) else f"{x:.1f}"


def _pi(c: stats.Comparison) -> str:
    return f"{c.p_improvement:.2f} [{c.p_improvement_lo:.2f}, {c.p_improvement_hi:.2f}]"


def _covers_one(c: stats.Comparison) -> bool:
    return c.ratio_lo <= 1.0 <= c.ratio_hi


# ---------------------------------------------------------------- tables
def arm_table(runs: pd.DataFrame, samples: dict[str, stats.Sample], order: list[str]) -> pd.DataFrame:
    """One row per arm: seeds, solved, mean / median / IQM / CV of steps, wall time per run and throughput."""
    rows = []
    for arm in [a for a in order if a in samples]:
        s, g = samples[arm], runs[runs["arm"] == arm]
        rows.append({
            "arm": arm, "side": g["side"].iloc[0], "seeds": s.n, "solved": s.n - s.n_censored,
            "mean_steps": float(s.steps.mean()), "median_steps": float(np.median(s.steps)),
            "iqm_steps": stats.iqm(s.steps), "cv": stats.cv(s.steps),
            "mean_wall_s": float(g["wall_s"].mean()), "mean_cpu_s": float(g["cpu_s"].mean()),
            "steps_per_s": float(g["env_steps"].sum() / max(g["wall_s"].sum(), 1e-9)),
        })
    return pd.DataFrame(rows)


def _cmp_row(label: str, source: str, base: str, arm: str, c: stats.Comparison) -> dict:
    return {"comparison": label, "source": source, "baseline": base, "arm": arm, **c._asdict()}


def main_comparisons(st: attr.Study, samples: dict[str, stats.Sample], n_resamples: int,
                     seed: int) -> list[dict]:
    """Published torch vs jax first, then the study's: drifted and faithful vs reference, drifted vs faithful."""
    pj, pt = published.samples()
    rows = [_cmp_row("published: torch_eggroll vs jax_eggroll", "published", published.JAX_METHOD,
                     published.TORCH_METHOD, stats.compare(pj, pt, n_resamples, seed))]
    pairs = [(st.reference.name, st.drifted.name), (st.reference.name, st.faithful.name),
             (st.faithful.name, st.drifted.name)] + [(st.reference.name, o.name) for o in st.others]
    pairs += precision_report.pairs(st)
    for base, arm in dict.fromkeys(pairs):
        if base != arm and base in samples and arm in samples:
            rows.append(_cmp_row(f"{arm} vs {base}", "study", base, arm,
                                 stats.compare(samples[base], samples[arm], n_resamples, seed)))
    return rows


def attribution_frame(steps: list[attr.Step]) -> pd.DataFrame:
    rows = []
    for s in steps:
        row = {"view": s.view, "knob": s.knob, "without": s.without, "with_drift": s.with_drift,
               "holm_gehan_p": s.holm_p, "share_of_log_gap": s.share}
        if s.cmp is not None:
            row.update(s.cmp._asdict())
        rows.append(row)
    return pd.DataFrame(rows)


def same_steps(runs: pd.DataFrame, a: str, b: str) -> tuple[int, int]:
    """(seeds both arms ran, seeds where they needed exactly the same steps): a faithful port run from the
    same seed with the JAX-compatible generator can follow the reference step for step."""
    if runs.empty:
        return 0, 0
    x = runs[runs["arm"] == a].set_index("seed")
    y = runs[runs["arm"] == b].set_index("seed")
    common = x.index.intersection(y.index)
    equal = (x.loc[common, "steps"] == y.loc[common, "steps"]) & (x.loc[common, "solved"] == y.loc[common, "solved"])
    return len(common), int(equal.sum())


# ---------------------------------------------------------------- verdict
def _pairing_line(ref: str, faith: str, paired: tuple[int, int]) -> list[str]:
    if not paired[0]:
        return []
    return [f"Same seed, same run: `{faith}` needed exactly the steps of `{ref}` on {paired[1]} of {paired[0]} seeds"
            + (" (the port follows the reference step for step)." if paired[1] == paired[0] else
               " (where they differ, float32 rounding or a real difference sent the runs apart; the statistics "
               "below treat the arms as independent).")]


def _floor_line(ref: str, faith: str, floor: stats.Comparison | None) -> list[str]:
    """The faithful port against the reference: the noise floor of the study."""
    if floor is None:
        return []
    if _covers_one(floor) and floor.gehan_p >= ALPHA:
        res = stats.detectable_diff(min(floor.n_a, floor.n_b), floor.cv)
        return [f"**No gap between the faithful port and the reference**: `{faith}` / `{ref}` = {_ratio(floor)}, "
                f"Gehan p {_p(floor.gehan_p)}, Welch p {_p(floor.welch_p)}. With {min(floor.n_a, floor.n_b)} seeds "
                f"per arm this comparison would detect a difference of about {res:.0%} at 80% power (a 10% "
                f"difference: power {floor.power:.0%}; {floor.seeds_needed} seeds per arm give 80%)."]
    return [f"**The faithful port and the reference differ**: `{faith}` / `{ref}` = {_ratio(floor)}, Gehan p "
            f"{_p(floor.gehan_p)}. Either the port is not faithful (run `make parity`) or this is a chance result "
            f"({ALPHA:.0%} of studies); the attribution below is relative to `{faith}`."]


def _gap_line(ref: str, drift: str, gap: stats.Comparison | None, published_cmp: stats.Comparison) -> list[str]:
    """The drifted profile against the reference, beside the published ratio, with the answer in words."""
    if gap is None:
        return []
    if gap.ratio_kind == "no bound":
        return [f"**No gap verdict for `{drift}`**: runs of both arms hit the budget unsolved, so their ratio "
                "cannot be bounded; raise the budget (`--max-steps`)."]
    overlap = gap.ratio_lo <= published_cmp.ratio_hi and published_cmp.ratio_lo <= gap.ratio_hi
    if _covers_one(gap):
        covers = gap.ratio_lo <= published_cmp.ratio <= gap.ratio_hi
        answer = "**Not reproduced**: no gap detected" + (
            ", though the interval also covers the published ratio" if covers else
            ", though the interval overlaps the published interval (not the published ratio)" if overlap else
            ", and the interval excludes the published ratio and its interval")
    elif overlap:
        answer = "**Reproduced**: a gap, of a size consistent with the published one"
    else:
        answer = "**A gap of another size**: the interval excludes 1 and does not overlap the published interval"
    return [f"{answer}: `{drift}` / `{ref}` = {_ratio(gap)}, Gehan p {_p(gap.gehan_p)} (published, paper preset: "
            f"{_ratio(published_cmp)}, Welch p {_p(published_cmp.welch_p)})."]


def _other_lines(st: attr.Study, cmps) -> list[str]:
    """What each further profile (e.g. the functional port) costs against the reference."""
    out = []
    for o in st.others:
        c = cmps.get((st.reference.name, o.name))
        if c is None:
            continue
        if c.ratio_kind == "no bound":
            out.append(f"**What `{o.name}` costs**: no verdict (both arms censored).")
            continue
        word = "no difference detected" if _covers_one(c) else ("more steps" if c.ratio > 1 else "fewer steps")
        out.append(f"**What `{o.name}` costs**: `{o.name}` / `{st.reference.name}` = {_ratio(c)}, Gehan p "
                   f"{_p(c.gehan_p)}: {word}.")
    return out


def _drift_lines(st: attr.Study, steps: list[attr.Step]) -> list[str]:
    """Each drift, grouped by verdict (matters, possible, no effect detected, not run), with both views' ratios."""
    ladder = {s.knob: s for s in steps if s.view == "ladder"}
    single = {s.knob: s for s in steps if s.view == "single"}
    groups: dict[str, list[str]] = {"matters": [], "possible": [], "no effect detected": [], "not run": []}
    for k in dict.fromkeys(s.knob for s in steps):
        parts = []
        if k in single and single[k].cmp is not None:
            parts.append(f"alone x{_ratio(single[k].cmp)} (Holm p {_p(single[k].holm_p)})")
        if k in ladder and ladder[k].cmp is not None:
            share = ladder[k].share
            share_text = "" if math.isnan(share) else f", {share:.0%} of the log gap"
            parts.append(f"ladder step x{_ratio(ladder[k].cmp)} (Holm p {_p(ladder[k].holm_p)}{share_text})")
        groups[attr.verdict(steps, k, ALPHA)].append(
            f"{describe_drift(k, st.profile)}: " + ("; ".join(parts) if parts else "no runs"))
    titles = {"matters": "**Drifts that matter** (Holm-adjusted Gehan p < 0.05 in either view)",
              "possible": "**Possible effects** (95% interval excludes 1, not significant after Holm)",
              "no effect detected": "**No effect detected**", "not run": "**Not run**"}
    return [titles[key] + ":\n" + "\n".join(f"  - {i}" for i in items) for key, items in groups.items() if items]


def _power_notes(steps: list[attr.Step]) -> list[str]:
    """Where too few seeds make significance impossible, say so."""
    out = []
    for view in ("ladder", "single"):
        mine = [s.cmp for s in steps if s.view == view and s.cmp is not None]
        if mine:
            floor_p = max(stats.min_gehan_p(c.n_a, c.n_b) for c in mine) * len(mine)
            if floor_p >= ALPHA:
                n = min(min(c.n_a, c.n_b) for c in mine)
                out.append(f"Note: with {n} seeds per arm in the {view} view no drift can reach a Holm-adjusted "
                           f"p below {ALPHA} (the smallest possible is {floor_p:.3f} over {len(mine)} tests). Read "
                           f"\"possible\" as a lead, not a finding (a percentile bootstrap of so few seeds gives "
                           f"intervals too narrow), or run more seeds (`--attribution-seeds`).")
    return out


def _noise_line(st: attr.Study, cmps, steps: list[attr.Step]) -> list[str]:
    """How log(gap) splits into the drifts' part and the faithful port's (noise) part."""
    ref, faith, drift = st.reference.name, st.faithful.name, st.drifted.name
    gap, floor, whole = cmps.get((ref, drift)), cmps.get((ref, faith)), cmps.get((faith, drift))
    if gap is None or floor is None or whole is None:
        return []
    if _covers_one(gap):
        return [f"**What is left to noise**: all of it. `{drift}` / `{ref}` = {_ratio(gap)} covers 1, so there is "
                "no gap to attribute at this preset and seed count."]
    ladder = {s.knob: s for s in steps if s.view == "ladder"}
    log_gap = math.log(gap.ratio)
    matter = sum(math.log(s.cmp.ratio) for s in ladder.values()
                 if s.cmp is not None and attr.verdict(steps, s.knob, ALPHA) == "matters")
    split = (f" ({matter / log_gap:.0%} by the ladder steps of drifts that matter, "
             f"{(math.log(whole.ratio) - matter) / log_gap:.0%} by the other steps)") if ladder else ""
    noise_word = "covers 1: noise" if _covers_one(floor) else "excludes 1: not noise"
    return [f"**What is left to noise**: log({drift} / {ref}) = log({drift} / {faith}) + log({faith} / {ref}). The "
            f"drifts account for {math.log(whole.ratio) / log_gap:.0%} of it{split}; the faithful port against the "
            f"reference accounts for {math.log(floor.ratio) / log_gap:.0%}, whose interval {noise_word}. Ladder "
            "shares depend on the ladder's order; the single-drift view has none."]


def _factorial_lines(st: attr.Study, cmps, fit, published_cmp) -> list[str]:
    d = st.design
    if fit is None:
        return ["**Factorial attribution**: not fitted yet (a finished run at every design point is needed)."]
    ref, faith, drift = st.reference.name, st.faithful.name, st.drifted.name
    return (factorial_report.drift_lines(fit, d)
            + factorial_report.prediction_line(fit, d, cmps.get((faith, drift)), cmps.get((ref, drift)), published_cmp)
            + factorial_report.noise_line(fit, d, cmps.get((ref, drift)), cmps.get((ref, faith)))
            + factorial_report.power_line(fit))


def nothing_solved(runs: pd.DataFrame) -> bool:
    return not runs.empty and not bool(runs["solved"].any())


def verdict_lines(st: attr.Study, cmps: dict[tuple[str, str], stats.Comparison], steps: list[attr.Step],
                  published_cmp: stats.Comparison, paired: tuple[int, int] = (0, 0), fit=None,
                  runs: pd.DataFrame | None = None) -> list[str]:
    """The plain verdict: the noise floor, the reproduced gap, which drifts matter, what is left to noise, what the
    other profiles cost; nothing but that fact when no run solved."""
    if runs is not None and nothing_solved(runs):
        return [f"**Nothing solved**: none of the {len(runs)} runs reached a mean return of 475 within the budget, "
                "so there is no gap verdict and no attribution. Raise the budget (`--max-steps`) or check the "
                "preset."]
    ref, faith, drift = st.reference.name, st.faithful.name, st.drifted.name
    lines = (_pairing_line(ref, faith, paired) + _floor_line(ref, faith, cmps.get((ref, faith)))
             + (_gap_line(ref, drift, cmps.get((ref, drift)), published_cmp) if drift != faith else []))
    if st.design is not None:
        lines += _factorial_lines(st, cmps, fit, published_cmp)
    else:
        lines += _power_notes(steps) + _drift_lines(st, steps) + _noise_line(st, cmps, steps)
    return lines + _other_lines(st, cmps)


# ---------------------------------------------------------------- the whole report
def write(out: str, store: RunStore, specs: list[RunSpec], st: attr.Study, info: StudyInfo,
          n_resamples: int = stats.N_RESAMPLES, seed: int = 0) -> str:
    """Write summary.md, arms.csv, comparisons.csv, attribution.csv and the PNGs; returns the summary's path."""
    runs = results.run_table(store, specs)
    samples = results.samples(runs) if not runs.empty else {}
    epochs = results.epoch_table(store, runs["run_id"] if not runs.empty else [])
    order = [a.name for a in st.main_arms + list(st.imported) + st.attribution_arms]

    arms_df = arm_table(runs, samples, order)
    arms_df.to_csv(os.path.join(out, "arms.csv"), index=False)
    cmp_rows = main_comparisons(st, samples, n_resamples, seed)
    cmps = {(r["baseline"], r["arm"]): stats.Comparison(**{f: r[f] for f in stats.Comparison._fields})
            for r in cmp_rows}
    published_cmp = cmps[(published.JAX_METHOD, published.TORCH_METHOD)]
    steps = attr.attribute(st, samples, n_resamples, seed) if st.ladder else []
    fit = factorial.fit(runs, st.design) if st.design is not None and not runs.empty else None
    pd.DataFrame(cmp_rows).to_csv(os.path.join(out, "comparisons.csv"), index=False)
    if st.design is None:
        attribution_frame(steps).to_csv(os.path.join(out, "attribution.csv"), index=False)
    elif fit is not None:
        factorial_report.effects_frame(fit, st.design).to_csv(os.path.join(out, "factorial.csv"), index=False)

    figures = []
    groups = [("learning_curves.png", [a.name for a in st.main_arms], "main arms"),
              ("learning_curves_attribution.png", [a.name for a in st.attribution_arms], "attribution arms")]
    for name, arms, label in groups:
        mine = epochs[epochs["arm"].isin(arms)] if not epochs.empty else epochs
        if mine.empty:
            continue
        plots.learning_curves(results.learning_curves(mine), arms, os.path.join(out, name),
                              f"CartPole-v1: {label} (median, interquartile band)")
        figures.append((name, f"learning curves of the {label}"))
    if samples:
        plots.steps_per_seed(samples, order, os.path.join(out, "steps_to_solve.png"), "steps to solve per seed")
        figures.append(("steps_to_solve.png", "steps to solve per seed and arm"))
    if any(s.cmp is not None for s in steps):
        plots.ladder(steps, os.path.join(out, "attribution.png"), f"attribution of the {st.profile} gap")
        figures.append(("attribution.png", "attribution: ratio per drift with its interval"))
    if fit is not None:
        plots.effects(fit, os.path.join(out, "factorial.png"), f"factorial attribution of the {st.profile} drifts")
        figures.append(("factorial.png", "factorial main effects and interaction chains with 95% intervals"))

    paired = same_steps(runs, st.reference.name, st.faithful.name)
    verdict = verdict_lines(st, cmps, steps, published_cmp, paired, fit, runs)
    chance_rows = precision_report.chance_rows(st, samples, published_cmp.ratio, published_cmp.n_a, n_resamples, seed)
    if chance_rows:
        pd.DataFrame(chance_rows).to_csv(os.path.join(out, "chance.csv"), index=False)
    if not nothing_solved(runs):
        cpu_s = runs.groupby("arm")["cpu_s"].mean().to_dict() if "cpu_s" in runs else {}
        verdict += precision_report.verdict_lines(st, cmps, samples, published_cmp, chance_rows, published_cmp.n_a,
                                                  _gap_line, cpu_s, runs)
    text = _markdown(st, info, arms_df, cmp_rows, steps, verdict, figures, n_resamples, seed, runs, fit,
                     precision_report.section(chance_rows))
    path = os.path.join(out, "summary.md")
    atomic_write(path, text)
    return path


def where_runs_ran(runs: pd.DataFrame) -> list[str]:
    """One line per (host, versions, device) with its run count: a study's runs may come from many machines; then
    the runs imported from elsewhere, with where they ran and their measurer's note."""
    if runs.empty or "host" not in runs:
        return []
    mine = runs[[imported.is_imported(a) for a in runs["arm"]]].fillna("")
    g = runs.drop(mine.index).fillna("").groupby(["host", "versions", "device"], sort=True).size()
    lines = [f"- runs trained on: {host or 'unrecorded host'}, {vers or 'unrecorded versions'}, torch device "
             f"`{dev}`: {n} run(s)" for (host, vers, dev), n in g.items()]
    for (host, vers, dev, note), rows in mine.groupby(["host", "versions", "device", "note"], sort=True):
        arms = rows.groupby("arm", sort=False)
        lines.append("- runs imported (trained elsewhere; no study retrains them): " + ", ".join(
            f"`{arm}` {len(a)} run(s) at matmul precision {a['matmul_precision'].iloc[0]}" for arm, a in arms)
            + f"; on {host}, device {dev}, {vers}; {note}")
    return lines


def _header(st, info, runs: pd.DataFrame | None = None) -> list[str]:
    cfg, ref = info.config, st.reference.knobs
    lines = [
        f"# Gap study: does the torch port learn CartPole-v1 as fast as the JAX reference? (`{st.profile}`)", "",
        f"- command: `{info.command}`",
        f"- preset: `{info.preset}` ({PRESET_NOTES.get(info.preset, 'spec/config.py')}): pop {cfg.pop}, rank "
        f"{cfg.rank}, sigma {cfg.sigma}, lr {cfg.lr}, {cfg.layers} layers x {cfg.hidden}, group_size "
        f"{cfg.group_size}, budget {cfg.max_env_steps:,} env steps per run; reference knobs: sigma_decay "
        f"{ref.sigma_decay}, lr_decay {ref.lr_decay}, noise_reuse {ref.noise_reuse}, activation {ref.activation}, "
        f"optimizer {ref.optimizer}",
        f"- seeds: main arms {len(info.seeds)} ({', '.join(map(str, info.seeds))})"
        + (f"; attribution arms {len(info.attribution_seeds)} ({', '.join(map(str, info.attribution_seeds))})"
           if st.attribution_arms else ""),
        "- versions: " + ", ".join(f"{k} {val}" for k, val in versions().items()),
        f"- this invocation ran on: {machine()}; torch device `{info.device}`; runs on {info.executor}",
        f"- this invocation: {info.wall_s / 60:.1f} min" + (f"; FAILED runs: {len(info.failed)}" if info.failed else ""),
    ]
    lines += where_runs_ran(runs) if runs is not None else []
    return lines + [f"- note: {n}" for n in info.notes]


def _arms_section(arms_df) -> list[str]:
    lines = ["", "## Arms", ""]
    if arms_df.empty:
        return lines + ["No finished runs yet."]
    lines.append(markdown_table(
        ["arm", "side", "seeds", "solved", "mean steps", "median", "IQM", "CV", "wall s/run", "cpu s/run",
         "env steps/s"],
        [[f"`{r.arm}`", r.side, r.seeds, r.solved, _steps(r.mean_steps), _steps(r.median_steps),
          _steps(r.iqm_steps), f"{r.cv:.3f}", f"{r.mean_wall_s:.1f}", _seconds(r.mean_cpu_s), _steps(r.steps_per_s)]
         for r in arms_df.itertuples()]))
    return lines + ["", "A run that did not solve enters with the steps it reached (a lower bound): its arm's "
                    "mean, median and IQM are then lower bounds too."]


def _comparisons_section(info, cmp_rows) -> list[str]:
    lines = ["", "## The gap, beside the published numbers", "",
             f"Published: {published.SOURCE}. The same statistics on both."
             + ("" if info.preset == "paper" else
                " The published runs used the `paper` preset (pop 2048, 3 x 256); this study's preset is "
                "smaller, so its ratio need not equal the published one: agreement here means the same "
                "direction and overlapping intervals."), ""]
    header = ["comparison (arm / baseline)", "n", "mean baseline", "mean arm", "ratio of means [95% CI]",
              "Welch p", "Mann-Whitney p", "Gehan p", "P(arm faster) [95% CI]", "seeds for 10% at 80%",
              "power at n"]
    rows = []
    for r in cmp_rows:
        c = stats.Comparison(**{f: r[f] for f in stats.Comparison._fields})
        rows.append([r["comparison"], f"{c.n_b}/{c.n_a}", _steps(c.mean_a), _steps(c.mean_b), _ratio(c),
                     _p(c.welch_p), _p(c.mann_whitney_p), _p(c.gehan_p), _pi(c), c.seeds_needed, f"{c.power:.0%}"])
    return lines + [markdown_table(header, rows)]


def _attribution_section(st, steps) -> list[str]:
    if not steps:
        return []
    lines = ["", f"## Attribution of the `{st.profile}` gap", "",
             "Ratios are mean steps with the drift over mean steps without it (above 1: the drift costs "
             "steps). Ladder: the profile's drifts switched back to the reference's value one at a time, "
             "cumulatively, from `" + st.drifted.name + "` down to `" + st.faithful.name + "`; the step "
             "ratios multiply to the whole gap, and each step's share of its logarithm is given. Singles: "
             "each drift alone added to `" + st.faithful.name + "`. Gehan p values are Holm-adjusted "
             "within each view.", ""]
    for view, title in (("ladder", "Ladder (cumulative)"), ("single", "Each drift alone")):
        rows = []
        for s in (s for s in steps if s.view == view):
            base = [describe_drift(s.knob, st.profile), f"`{s.with_drift}` / `{s.without}`"]
            if s.cmp is None:
                rows.append(base + ["not run"] + [""] * 4)
                continue
            share = "" if math.isnan(s.share) else f"{s.share:.0%}"
            rows.append(base + [f"{s.cmp.n_b}/{s.cmp.n_a}", _ratio(s.cmp), _p(s.cmp.gehan_p), _p(s.holm_p), share])
        if rows:
            lines += [f"### {title}", "", markdown_table(["drift", "arms (with / without)", "n", "ratio [95% CI]",
                                                          "Gehan p", "Holm p", "share of log gap"], rows), ""]
    return lines


METHOD_FILES = [
    "- Ratio of means: mean(arm) / mean(baseline), percentile bootstrap 95% interval with {n_resamples:,} resamples "
    "(numpy seed {seed}), each arm resampled on its own. With censored runs the ratio is marked as a lower bound "
    "(censored in the arm only), an upper bound (baseline only) or no bound (both).",
    "- Welch: two-sided unequal-variance t-test on the steps (censored at their bounds: biased toward no difference "
    "when the slower arm is censored).",
    "- Mann-Whitney: two-sided, scipy's default method, censored runs tied above every solved run (exact handling "
    "when all runs share one budget). Gehan: the generalized Wilcoxon test for right censoring, normal "
    "approximation with Mantel's permutation variance (equal to Mann-Whitney without continuity correction when "
    "nothing is censored).",
    "- P(arm faster): the probability that a seed of the arm needs fewer steps than a seed of the baseline, ties "
    "and censored pairs that cannot be ordered count 1/2; percentile bootstrap interval.",
    "- Seeds needed: per arm, to detect a 10% difference of means at 80% power, two-sided alpha 0.05, normal "
    "approximation n = 2 (z_0.975 + z_0.8)^2 CV^2 / 0.1^2 with the pooled CV sqrt((CV_a^2 + CV_b^2) / 2); power at "
    "n from the same approximation.",
    "- Verdicts: a drift matters when its Holm-adjusted Gehan p is below 0.05 in either view (ladder or alone); "
    "possible when a 95% interval excludes 1 without that.",
    "- Learning curves: each run's population mean return interpolated linearly on a common env-step grid; a run "
    "that solved keeps its last value after it stopped; median and interquartile band over seeds.",
    "", "## Files", "",
    "- `runs.csv`: one row per finished run (arm, side, seed, solved, steps_to_solve, epochs, env_steps, wall_s, "
    "cpu_s, device, config, knobs, run_id, host, versions; for a run imported from elsewhere also matmul_precision "
    "and note); the study resumes from it. cpu_s is the run's own CPU time (one thread per worker), the cost of a "
    "run on an idle core (not recorded for imported runs).",
    "- `epochs.csv`: one row per epoch (run_id, arm, seed, epoch, env_steps, mean_return, max_return, sigma, lr, "
    "wall_s, grad_norms as JSON).",
    "- `arms.csv`, `comparisons.csv`, `attribution.csv` (ladder studies) or `factorial.csv` (factorial studies), "
    "`chance.csv` (studies with TF32 arms): the tables above, unrounded.",
]


def _method_section(n_resamples: int, seed: int) -> list[str]:
    return (["", "## Method", "",
             "- Steps to solve: cumulative env steps (sum of episode lengths) up to and including the first epoch "
             "whose population mean return is >= 475. A run that reaches its budget unsolved is censored, not "
             "dropped: it enters with the steps it reached, a lower bound."]
            + [line.format(n_resamples=n_resamples, seed=seed) for line in METHOD_FILES] + [""])


def _markdown(st, info, arms_df, cmp_rows, steps, verdict, figures, n_resamples, seed, runs=None, fit=None,
              chance_section=()) -> str:
    lines = _header(st, info, runs) + ["", "## Verdict", ""] + [f"- {x}" for x in verdict]
    if info.failed:
        lines += ["", "Failed runs (not in the statistics; rerun the command to retry them):", ""]
        lines += [f"- {f}" for f in info.failed]
    lines += _arms_section(arms_df) + _comparisons_section(info, cmp_rows) + _attribution_section(st, steps)
    lines += factorial_report.section(fit, st.design) if st.design is not None else []
    lines += list(chance_section)
    lines += ["", "## Figures", ""] + [f"![{cap}]({name})" for name, cap in figures]
    return "\n".join(lines + _method_section(n_resamples, seed))
