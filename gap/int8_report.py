"""The integer study's report: egg.c against nano-egg (the two corners), each departure's effect from the
fractional factorial, the learning curves, and the run's provenance, as summary.md, CSVs and a PNG.

Effects: ordinary least squares of the final validation bits/byte on the coded levels z_i = +-1 of the seven knobs
and one column per alias chain of two-factor interactions the fraction can tell apart (statsmodels, HC3 standard
errors: no equal-variance assumption across points). A knob's effect is 2 b_i: bits/byte with egg.c's value minus
with nano-egg's, averaged over the other knobs. The egg.c corner minus the nano-egg corner is 2 sum_i b_i (every
interaction column is +1 at both corners and cancels), so the main effects split the corners' gap additively.
Holm's adjustment across the seven main effects (statsmodels.stats.multitest).
"""
from __future__ import annotations

import itertools
import json
from collections import defaultdict

import numpy as np
import pandas as pd

from gap import stats
from gap.int8_study import KNOBS, arms, describe_knob, design_matrix
from gap.lm_study import read_epochs, read_runs
from reporting import atomic_write, fmt, markdown_table
from spec.int8 import EGG_C_ORIGINAL, NANO_EGG_ORIGINAL

LEVEL = 0.95


def outcomes(folder: str) -> pd.DataFrame:
    """One row per finished run: arm, seed, final validation bits/byte, wall and cpu seconds, coded levels."""
    by_name = {a.name: a for a in arms()}
    rows = []
    for r in read_runs(folder):
        arm = by_name.get(r["arm"])
        if arm is None:
            continue
        row = {"arm": r["arm"], "seed": int(r["seed"]), "final_val_bpb": float(r["final_val_bpb"]),
               "wall_s": float(r["wall_s"]), "cpu_s": float(r["cpu_s"])}
        row.update({k: arm.level(k) for k in KNOBS})
        rows.append(row)
    return pd.DataFrame(rows)


def curves(folder: str) -> dict[str, dict[int, list[tuple[int, float]]]]:
    """arm -> seed -> [(epoch, val_bpb)] of committed runs."""
    done = {r["run_id"] for r in read_runs(folder)}
    out: dict[str, dict[int, list]] = defaultdict(lambda: defaultdict(list))
    for e in read_epochs(folder):
        if e["run_id"] in done:
            out[e["arm"]][int(e["seed"])].append((int(e["epoch"]), float(e["val_bpb"])))
    return out


def interaction_chains(matrix: np.ndarray) -> list[tuple[tuple[str, str], ...]]:
    """The two-factor interactions grouped by alias (equal product columns in the design), first member first."""
    groups: dict[bytes, list[tuple[str, str]]] = {}
    for i, j in itertools.combinations(range(len(KNOBS)), 2):
        groups.setdefault((matrix[:, i] * matrix[:, j]).tobytes(), []).append((KNOBS[i], KNOBS[j]))
    return [tuple(g) for g in groups.values()]


class Effects:
    """The fitted model: main effects (2 b_i) with intervals and Holm-adjusted p, and the corners it predicts."""

    def __init__(self, frame: pd.DataFrame):
        import statsmodels.api as sm
        from statsmodels.stats.multitest import multipletests
        chains = interaction_chains(design_matrix())
        X = frame[list(KNOBS)].astype(float).copy()
        for c, chain in enumerate(chains):
            X[f"chain{c}"] = frame[chain[0][0]].to_numpy(float) * frame[chain[0][1]].to_numpy(float)
        X = sm.add_constant(X)
        self.fit = sm.OLS(frame.final_val_bpb.to_numpy(float), X).fit(cov_type="HC3")
        ci = self.fit.conf_int(1 - LEVEL)
        self.chains = chains
        self.rows = []
        pvals = [float(self.fit.pvalues[k]) for k in KNOBS]
        holm = multipletests(pvals, method="holm")[1]
        for k, p_holm in zip(KNOBS, holm):
            self.rows.append({"knob": k, "effect": 2 * float(self.fit.params[k]), "lo": 2 * float(ci.loc[k, 0]),
                              "hi": 2 * float(ci.loc[k, 1]), "p": float(self.fit.pvalues[k]),
                              "p_holm": float(p_holm)})
        self.sigma = float(np.sqrt(self.fit.scale))
        self.n = int(self.fit.nobs)
        self.df_resid = int(self.fit.df_resid)

    def predicted_gap(self) -> float:
        """egg.c corner minus nano-egg corner, from the model: 2 sum_i b_i."""
        return 2 * float(sum(self.fit.params[k] for k in KNOBS))


def verdict(row: dict) -> str:
    if row["p_holm"] >= 0.05:
        return "no effect shown"
    return "slows learning (higher bits/byte)" if row["effect"] > 0 else "speeds learning (lower bits/byte)"


def corner_comparison(frame: pd.DataFrame, n_resamples: int) -> stats.Comparison | None:
    a = frame[frame.arm == "nano-egg"].sort_values("seed").final_val_bpb.to_numpy()
    b = frame[frame.arm == "egg.c"].sort_values("seed").final_val_bpb.to_numpy()
    if len(a) < 2 or len(b) < 2:
        return None
    return stats.compare(stats.sample(a), stats.sample(b), n_resamples=n_resamples, seed=0)


def checkpoint_table(cv: dict, names: list[str]) -> tuple[list[str], list[list[str]]]:
    """Mean validation bits/byte (and seeds) at each measured epoch, for the named arms."""
    epochs = sorted({e for n in names for pts in cv.get(n, {}).values() for e, _ in pts})
    header = ["epoch"] + names
    rows = []
    for e in epochs:
        row = [str(e + 1)]
        for n in names:
            vals = [v for pts in cv.get(n, {}).values() for ep, v in pts if ep == e]
            row.append(f"{np.mean(vals):.3f} (sd {np.std(vals, ddof=1):.3f})" if len(vals) > 1 else
                       (f"{vals[0]:.3f}" if vals else ""))
        rows.append(row)
    return header, rows


def plot(cv: dict, path: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(7.5, 4.5))
    for arm in arms():
        if arm.name not in cv:
            continue
        by_epoch = defaultdict(list)
        for pts in cv[arm.name].values():
            for e, v in pts:
                by_epoch[e].append(v)
        xs = sorted(by_epoch)
        corner = arm.name in ("nano-egg", "egg.c")
        ax.plot([x + 1 for x in xs], [np.mean(by_epoch[x]) for x in xs], lw=2.2 if corner else 0.8,
                alpha=1 if corner else 0.45, label=f"{arm.name} ({len(cv[arm.name])} seeds)" if corner else None)
    ax.set_xlabel("epoch")
    ax.set_ylabel("validation bits/byte (mean over seeds)")
    ax.set_title("Integer EGGROLL: egg.c's departures against nano-egg (thin: the other 14 design points)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _answer(comp: stats.Comparison | None, eff: Effects | None) -> list[str]:
    if comp is None:
        return ["Not answered yet: both corners need at least 2 finished seeds."]
    faster = comp.mean_b < comp.mean_a
    shown = comp.ratio_hi < 1 or comp.ratio_lo > 1
    lines = [f"At matched size, population, tokens per step, corpus and seeds, egg.c's integer ES reaches "
             f"{comp.mean_b:.3f} validation bits/byte after the run against nano-egg's {comp.mean_a:.3f}: ratio "
             f"{comp.ratio:.3f} [{comp.ratio_lo:.3f}, {comp.ratio_hi:.3f}] ({int(LEVEL * 100)}% bootstrap), Welch p "
             f"{fmt(comp.welch_p, 2)}, {comp.n_a} vs {comp.n_b} seeds. "
             + ("So egg.c does **not** learn as fast as nano-egg: it ends higher." if shown and not faster else
                "So egg.c learns **faster** than nano-egg at this budget: it ends lower." if shown else
                "The corners are not told apart at these seeds.")]
    if eff is not None:
        ranked = sorted(eff.rows, key=lambda r: -abs(r["effect"]))
        shown_rows = [r for r in ranked if r["p_holm"] < 0.05]
        lines.append("")
        lines.append(f"Which departures, by how much (bits/byte with egg.c's value minus nano-egg's, averaged over the "
                     f"other knobs; Holm over seven): " + "; ".join(
                         f"**{r['knob']}** {r['effect']:+.3f} [{r['lo']:+.3f}, {r['hi']:+.3f}]" for r in shown_rows)
                     + (". " if shown_rows else "none is shown. ")
                     + f"The model's corner gap, 2 sum b_i = {eff.predicted_gap():+.3f}, against the observed "
                       f"{comp.mean_b - comp.mean_a:+.3f}.")
    return lines


def _effect_lines(eff: Effects) -> list[str]:
    lines = ["## Each departure's effect (the 2^(7-3) fraction, resolution IV)", "",
             f"OLS of final bits/byte on the seven coded knobs and {len(eff.chains)} alias chains of two-factor "
             f"interactions, HC3 errors, {eff.n} runs, {eff.df_resid} residual df, residual sd "
             f"{eff.sigma:.3f} bits/byte. Effect = 2 b: egg.c's value minus nano-egg's.", ""]
    lines.append(markdown_table(["knob", "what egg.c does", "effect (bits/byte)", f"{int(LEVEL * 100)}% CI",
                                 "p", "p (Holm)", "verdict"],
                                [[r["knob"], describe_knob(r["knob"]).split(": ", 1)[1], f"{r['effect']:+.3f}",
                                  f"[{r['lo']:+.3f}, {r['hi']:+.3f}]", fmt(r["p"], 2), fmt(r["p_holm"], 2),
                                  verdict(r)] for r in sorted(eff.rows, key=lambda r: -abs(r["effect"]))]))
    chains = [" = ".join(f"{a} x {b}" for a, b in chain) for chain in eff.chains]
    return lines + ["", "Interaction chains fitted (aliased with each other, not with any main effect): "
                    + "; ".join(f"[{c}]" for c in chains), ""]


def _corner_lines(comp: stats.Comparison, cv: dict) -> list[str]:
    table = markdown_table(["", "nano-egg", "egg.c"],
                           [["final bits/byte (mean)", f"{comp.mean_a:.4f}", f"{comp.mean_b:.4f}"],
                            ["seeds", comp.n_a, comp.n_b],
                            ["egg.c / nano-egg", "", f"{comp.ratio:.4f} [{comp.ratio_lo:.4f}, {comp.ratio_hi:.4f}]"],
                            ["Welch p / Mann-Whitney p", "", f"{fmt(comp.welch_p, 2)} / {fmt(comp.mann_whitney_p, 2)}"],
                            ["P(egg.c run lower)", "", f"{comp.p_improvement:.2f} [{comp.p_improvement_lo:.2f}, "
                                                       f"{comp.p_improvement_hi:.2f}]"]])
    head, rows = checkpoint_table(cv, ["nano-egg", "egg.c"])
    return ["## The corners", "", table, "", "Validation bits/byte against epochs (mean over seeds):", "",
            markdown_table(head, rows), ""]


def _run_lines(folder: str, header: dict, frame: pd.DataFrame) -> list[str]:
    lines = [f"- {k}: {v}" for k, v in header.items()]
    return lines + [
        f"- runs: {len(frame)} finished over {frame.arm.nunique()} design points; arms trained on the torch int8 "
        f"port (bit-equal to the JAX reference and the C side at every knob: `python -m parity int8`), which is "
        f"about 6x faster than the C side on this CPU",
        f"- versions: {', '.join(sorted({json.dumps(json.loads(r['versions'])) for r in read_runs(folder)}))}",
        "- outcome: validation bits/byte after the last epoch (noise off; the validation part of the shipped "
        "corpus, 16 rows); curves every 50 epochs",
        f"- the originals: nano-egg is {NANO_EGG_ORIGINAL[0]} {NANO_EGG_ORIGINAL[1]} at {NANO_EGG_ORIGINAL[2][:7]} "
        f"(reproduced by the JAX reference, tests/test_int8_nano_egg.py); egg.c is {EGG_C_ORIGINAL[0]} "
        f"{EGG_C_ORIGINAL[1]} at {EGG_C_ORIGINAL[2][:7]} (its profile egg.c-cpumulti reproduced step by step, "
        "tests/test_egg_c_conformance.py); the study's egg.c is the seven departures of profile egg.c (the "
        "portable file's missing MLP and nested gate clips are structure, not part of the question)", ""]


def write(folder: str, header: dict, n_resamples: int) -> str:
    """summary.md, outcomes.csv, effects.csv and curves.png in folder; returns the summary's text."""
    frame = outcomes(folder)
    if frame.empty:
        raise ValueError(f"{folder} holds no finished runs; train some first (drop --report-only)")
    cv = curves(folder)
    comp = corner_comparison(frame, n_resamples)
    complete = frame.groupby("arm").size().reindex([a.name for a in arms()]).fillna(0).astype(int)
    eff = Effects(frame) if (complete >= 2).all() else None
    per_arm = frame.groupby("arm").final_val_bpb.agg(["count", "mean", "std"]).reindex(
        [a.name for a in arms()]).dropna(how="all")
    lines = ["# Integer EGGROLL: does egg.c's integer ES learn the byte LM as fast as nano-egg's?", ""]
    lines += _answer(comp, eff) + ["", "## Run", ""] + _run_lines(folder, header, frame)
    lines += _effect_lines(eff) if eff is not None else []
    lines += _corner_lines(comp, cv) if comp is not None else []
    lines += ["## Every design point", "",
              markdown_table(["point", "seeds", "final bits/byte mean", "sd"],
                             [[name, int(r["count"]), f"{r['mean']:.4f}", fmt(r["std"], 3)]
                              for name, r in per_arm.iterrows()]),
              "", "Files: `runs.csv` (one row per run), `epochs.csv` (each run's curve), `outcomes.csv`, `effects.csv`, "
              "`curves.png`."]
    text = "\n".join(lines) + "\n"
    atomic_write(f"{folder}/summary.md", text)
    atomic_write(f"{folder}/outcomes.csv", frame.to_csv(index=False))
    if eff is not None:
        atomic_write(f"{folder}/effects.csv", pd.DataFrame(eff.rows).to_csv(index=False))
    plot(cv, f"{folder}/curves.png")
    return text
