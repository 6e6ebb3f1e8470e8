"""The LM study's report: per-arm outcomes, the port against the reference, each drift against the port,
learning curves, and the run's provenance, as summary.md, CSVs and a PNG."""
from __future__ import annotations

import json
import os

import numpy as np
import pandas as pd

from gap import stats
from gap.lm.study import TARGET_BPB, describe_arm
from gap.study import curves, outcome, plot_mean_curves, read_runs
from reporting import atomic_write, fmt, markdown_table


def outcomes(folder: str, target: float = TARGET_BPB) -> pd.DataFrame:
    """One row per run: arm, seed, final validation bits/byte, epochs to target and whether it was reached."""
    cv = curves(folder)
    rows = []
    for r in read_runs(folder):
        o = outcome(cv[r["arm"]][int(r["seed"])], target, int(r["epochs"]))
        rows.append({"arm": r["arm"], "seed": int(r["seed"]), "final_val_bpb": float(r["final_val_bpb"]),
                     "epochs_to_target": o.epochs_to_target, "reached": o.reached, "wall_s": float(r["wall_s"]),
                     "cpu_s": float(r["cpu_s"])})
    return pd.DataFrame(rows)


def samples(frame: pd.DataFrame, arm: str) -> tuple[stats.Sample, stats.Sample]:
    """(final bits/byte, epochs to target with censoring) of one arm."""
    sub = frame[frame.arm == arm].sort_values("seed")
    return (stats.sample(sub.final_val_bpb.to_numpy()),
            stats.sample(sub.epochs_to_target.to_numpy(), ~sub.reached.to_numpy(bool)))


def comparisons(frame: pd.DataFrame, order: list[str], n_resamples: int) -> pd.DataFrame:
    """torch:jax against jax_reference, and every drift arm against torch:jax, on both outcomes (Holm over the
    drift arms within each outcome)."""
    pairs = [("jax_reference", "torch:jax")] + [("torch:jax", a) for a in order if a.startswith("torch:") and "=" in a]
    rows = []
    for base, arm in pairs:
        if base not in set(frame.arm) or arm not in set(frame.arm):
            continue
        (fa, ea), (fb, eb) = samples(frame, base), samples(frame, arm)
        for outcome_name, a, b in (("final validation bits/byte", fa, fb), ("epochs to target", ea, eb)):
            c = stats.compare(a, b, n_resamples=n_resamples, seed=0)
            rows.append({"outcome": outcome_name, "baseline": base, "arm": arm, "drift": describe_arm(arm),
                         "n": f"{c.n_a} vs {c.n_b}", "censored": f"{c.censored_a} vs {c.censored_b}",
                         "mean_base": c.mean_a, "mean_arm": c.mean_b, "ratio": c.ratio, "ratio_lo": c.ratio_lo,
                         "ratio_hi": c.ratio_hi, "ratio_kind": c.ratio_kind, "welch_p": c.welch_p,
                         "mann_whitney_p": c.mann_whitney_p, "gehan_p": c.gehan_p, "cv": c.cv, "power_10pct": c.power,
                         "seeds_needed_10pct": c.seeds_needed})
    out = pd.DataFrame(rows)
    if out.empty:
        return out
    out["p"] = np.where(out.outcome == "epochs to target", out.gehan_p, out.welch_p)
    out["p_holm"] = np.nan
    for name in out.outcome.unique():
        drift = (out.outcome == name) & (out.baseline == "torch:jax")
        out.loc[drift, "p_holm"] = stats.holm(out.loc[drift, "p"].to_numpy())
        main = (out.outcome == name) & (out.baseline == "jax_reference")
        out.loc[main, "p_holm"] = out.loc[main, "p"]
    return out


def verdict_word(row) -> str:
    covers = row.ratio_lo <= 1.0 <= row.ratio_hi
    if row.p_holm < 0.05 and not covers:
        return "slower" if row.ratio > 1 else "faster"
    return "no difference detected"


def answer(comp: pd.DataFrame, target: float) -> list[str]:
    """The study's answer in a few lines: the port against the reference, then each drift against the port."""
    if comp.empty:
        return ["Not enough arms have finished runs for a comparison yet."]
    out = []
    for r in comp[comp.baseline == "jax_reference"].itertuples():
        out.append(f"- **{r.outcome}**, torch:jax / jax_reference = {fmt(r.ratio)} [{fmt(r.ratio_lo)}, "
                   f"{fmt(r.ratio_hi)}] (p {fmt(r.p, 3)}, {r.n} seeds): {verdict_word(r)}.")
    for r in comp[comp.baseline == "torch:jax"].itertuples():
        out.append(f"- {r.drift} (`{r.arm[len('torch:'):]}`), **{r.outcome}**: {fmt(r.ratio)} x the faithful "
                   f"port's [{fmt(r.ratio_lo)}, {fmt(r.ratio_hi)}] (Holm p {fmt(r.p_holm, 3)}): {verdict_word(r)}.")
    return [f"Target for the second outcome: validation bits/byte <= {target}.", ""] + out


TITLE = "Does the torch port learn the byte-level LM as fast as the JAX reference?"


def write(folder: str, run: dict, order: list[str], n_resamples: int, target: float = TARGET_BPB) -> str:
    """summary.md, outcomes.csv, comparisons.csv and curves.png in `folder` (`run`: the run section's lines);
    returns the summary's text."""
    frame = outcomes(folder, target)
    if frame.empty:
        raise ValueError(f"{folder} holds no finished runs; train some first (drop --report-only)")
    order = [a for a in order if a in set(frame.arm)] + sorted(set(frame.arm) - set(order))
    comp = comparisons(frame, order, n_resamples)
    cv = curves(folder)
    plot_mean_curves(cv, {arm: {"label": f"{arm} ({len(cv[arm])} seeds)"} for arm in order if arm in cv},
                     os.path.join(folder, "curves.png"), "Byte-level LM: does the torch port learn as fast?", (7, 4.2),
                     7, target)
    frame.to_csv(os.path.join(folder, "outcomes.csv"), index=False)
    comp.to_csv(os.path.join(folder, "comparisons.csv"), index=False)
    per_arm = []
    for arm in order:
        sub = frame[frame.arm == arm]
        per_arm.append([arm, describe_arm(arm), len(sub), fmt(sub.final_val_bpb.mean()),
                        fmt(sub.final_val_bpb.std(ddof=1) if len(sub) > 1 else 0.0),
                        f"{int(sub.reached.sum())}/{len(sub)}", fmt(sub.epochs_to_target.mean(), 4),
                        fmt(sub.cpu_s.mean(), 3)])
    lines = [f"# {TITLE}", "", *answer(comp, target), ""]
    lines += ["## Arms", "", markdown_table(
        ["arm", "what it is", "seeds", "final val bits/byte (mean)", "sd", "reached target",
         "epochs to target (mean, censored at the run's length)", "CPU s per run"], per_arm), ""]
    if not comp.empty:
        lines += ["## Comparisons", "",
                  "Ratio = arm mean / baseline mean (above 1: the arm ends worse, or needs more epochs), 95% "
                  "bootstrap interval; p: Welch for bits/byte, Gehan (censoring-aware) for epochs to target; "
                  "the drift arms' p are Holm-adjusted within each outcome; power to detect a 10% difference at "
                  "these seeds.", ""]
        lines.append(markdown_table(
            ["outcome", "arm vs baseline", "drift", "n", "ratio [95% CI]", "p (Holm)", "Mann-Whitney p", "power 10%",
             "verdict"],
            [[r.outcome, f"{r.arm} vs {r.baseline}", r.drift, r.n,
              f"{fmt(r.ratio)} [{fmt(r.ratio_lo)}, {fmt(r.ratio_hi)}]" + ("" if r.ratio_kind == "estimate" else f" ({r.ratio_kind})"),
              fmt(r.p_holm, 3), fmt(r.mann_whitney_p, 3), fmt(r.power_10pct, 2), verdict_word(r)]
             for r in comp.itertuples()]))
        lines.append("")
    lines += ["![validation curves](curves.png)", "", "## Run", ""]
    lines += [f"- {k}: {v}" for k, v in run.items()]
    lines += ["", "Files: `runs.csv` (one row per run), `epochs.csv` (validation curves), `outcomes.csv`, "
              "`comparisons.csv`, `curves.png`.", ""]
    text = "\n".join(lines)
    atomic_write(os.path.join(folder, "summary.md"), text)
    return text


def versions_of(folder: str) -> str:
    """The versions the runs recorded (a study may mix machines), each once."""
    seen = {json.loads(r["versions"]) for r in read_runs(folder)}
    return "; ".join(str(v) if not isinstance(v, dict) else ", ".join(f"{k} {x}" for k, x in v.items())
                     for v in sorted(seen, key=str))
