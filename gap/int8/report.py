"""The integer study's report: egg.c against nano-egg (the two corners), each departure's effect from the
fractional factorial, the learning curves, and the run's provenance, as summary.md, CSVs and a PNG.

Effects: ordinary least squares of the final validation bits/byte on the coded levels z_i = +-1 of the seven knobs
and one column per alias chain of two-factor interactions the fraction can tell apart (statsmodels, HC3 standard
errors: no equal-variance assumption across points). A knob's effect is 2 b_i: bits/byte with egg.c's value minus
with nano-egg's, averaged over the other knobs. The egg.c corner minus the nano-egg corner is 2 sum_i b_i (every
interaction column is +1 at both corners and cancels), so the main effects split the corners' gap additively.
Holm's adjustment across the seven main effects, and on its own across the alias chains (statsmodels.stats.multitest);
intervals and p values use Student's t on the residual degrees of freedom.

Responses: the final validation bits/byte (the headline), and as a check the mean of the validation measurements in
the run's last quarter (less sensitive to one late measurement; an arm whose weights random-walk moves both). The
corners' difference in bits/byte carries a BCa bootstrap interval (scipy.stats.bootstrap); "as fast" is also read
off the curves: the epochs the better corner needs to reach the other corner's final level.
"""
from __future__ import annotations

import itertools
import json
import warnings
from typing import NamedTuple

import numpy as np
import pandas as pd

from gap import stats
from gap.int8.study import KNOBS, arms, describe_knob, design_matrix
from gap.study import curves, outcome, plot_mean_curves, read_runs
from reporting import atomic_write, fmt, markdown_table
from spec.int8 import EGG_C_ORIGINAL, NANO_EGG_ORIGINAL

LEVEL = 0.95
LATE_FRACTION = 0.25          # the check response: mean validation bits/byte over the run's last quarter
RESPONSES = {"final_val_bpb": "final validation bits/byte",
             "late_val_bpb": f"mean validation bits/byte over the last {LATE_FRACTION:.0%} of epochs"}


def outcomes(folder: str, run_ids: set[str] | None = None) -> pd.DataFrame:
    """One row per finished run: arm, seed, final and late-mean validation bits/byte, wall and cpu seconds, coded
    levels."""
    by_name = {a.name: a for a in arms()}
    cv = curves(folder, run_ids)
    rows = []
    for r in read_runs(folder, run_ids):
        arm = by_name.get(r["arm"])
        if arm is None:
            continue
        row = {"arm": r["arm"], "seed": int(r["seed"]), "final_val_bpb": float(r["final_val_bpb"]),
               "late_val_bpb": late_mean(cv[r["arm"]][int(r["seed"])], int(r["epochs"]),
                                         float(r["final_val_bpb"])),
               "late_slope": late_slope(cv[r["arm"]][int(r["seed"])], int(r["epochs"])),
               "wall_s": float(r["wall_s"]), "cpu_s": float(r["cpu_s"])}
        row.update({k: arm.level(k) for k in KNOBS})
        rows.append(row)
    return pd.DataFrame(rows)


def late_mean(points: list[tuple[int, float]], epochs: int, final: float) -> float:
    """Mean validation bits/byte over the measurements after (1 - LATE_FRACTION) of the run's epochs (the final
    value when the curve holds none there)."""
    late = [v for e, v in points if e + 1 > (1 - LATE_FRACTION) * epochs and v == v]
    return float(np.mean(late)) if late else final


def late_slope(points: list[tuple[int, float]], epochs: int) -> float:
    """Least-squares slope of validation bits/byte per 100 epochs over the last half of the run's measurements:
    below 0 the run is still learning when it stops; near 0 or above, it has stalled or drifts back (NaN with fewer
    than 3 measurements there)."""
    late = [(e, v) for e, v in points if e + 1 > epochs / 2 and v == v]
    if len(late) < 3:
        return float("nan")
    e, v = np.asarray(late, float).T
    return float(np.polyfit(e, v, 1)[0] * 100)


def interaction_chains(matrix: np.ndarray) -> list[tuple[tuple[str, str], ...]]:
    """The two-factor interactions grouped by alias (equal product columns in the design), first member first."""
    groups: dict[bytes, list[tuple[str, str]]] = {}
    for i, j in itertools.combinations(range(len(KNOBS)), 2):
        groups.setdefault((matrix[:, i] * matrix[:, j]).tobytes(), []).append((KNOBS[i], KNOBS[j]))
    return [tuple(g) for g in groups.values()]


class Effects:
    """The fitted model of one response: main effects and alias-chain effects (2 b) with t intervals and
    Holm-adjusted p (each family on its own), the corners' gap it predicts, and its power."""

    def __init__(self, frame: pd.DataFrame, response: str = "final_val_bpb"):
        import statsmodels.api as sm
        chains = interaction_chains(design_matrix())
        X = frame[list(KNOBS)].astype(float).copy()
        for c, chain in enumerate(chains):
            X[f"chain{c}"] = frame[chain[0][0]].to_numpy(float) * frame[chain[0][1]].to_numpy(float)
        X = sm.add_constant(X)
        self.response = response
        self.fit = sm.OLS(frame[response].to_numpy(float), X).fit(cov_type="HC3", use_t=True)
        self.chains = chains
        self.rows = self._family(list(KNOBS), list(KNOBS), "knob")
        self.chain_rows = self._family([f"chain{c}" for c in range(len(chains))],
                                       [chain_label(chain) for chain in chains], "chain")
        self.sigma = float(np.sqrt(self.fit.scale))
        self.n = int(self.fit.nobs)
        self.df_resid = int(self.fit.df_resid)

    def _family(self, columns: list[str], labels: list[str], key: str) -> list[dict]:
        ci = self.fit.conf_int(1 - LEVEL)
        pvals = [float(self.fit.pvalues[c]) for c in columns]
        holm = stats.holm(pvals)
        return [{key: label, "effect": 2 * float(self.fit.params[c]), "lo": 2 * float(ci.loc[c, 0]),
                 "hi": 2 * float(ci.loc[c, 1]), "p": p, "p_holm": float(h)}
                for c, label, p, h in zip(columns, labels, pvals, holm)]

    def predicted_gap(self) -> float:
        """egg.c corner minus nano-egg corner, from the model: 2 sum_i b_i."""
        return 2 * float(sum(self.fit.params[k] for k in KNOBS))

    def detectable(self, power: float = 0.8) -> float:
        """The smallest main effect (bits/byte) a two-sided 5% test finds with `power` at these runs: each main
        effect compares the n/2 runs at egg.c's value with the n/2 at nano-egg's (statsmodels' t-test power)."""
        from statsmodels.stats.power import TTestIndPower
        d = TTestIndPower().solve_power(nobs1=self.n / 2, alpha=0.05, power=power, ratio=1.0)
        return float(d) * self.sigma

    def frame(self) -> pd.DataFrame:
        """effects.csv's rows of this response: main effects, then chains."""
        rows = [{"response": self.response, "kind": "main", "term": r["knob"], **_numbers(r)} for r in self.rows]
        rows += [{"response": self.response, "kind": "interaction chain", "term": r["chain"], **_numbers(r)}
                 for r in self.chain_rows]
        rows.append({"response": self.response, "kind": "predicted egg.c - nano-egg", "term": "+".join(KNOBS),
                     "effect": self.predicted_gap(), "lo": float("nan"), "hi": float("nan"), "p": float("nan"),
                     "p_holm": float("nan")})
        return pd.DataFrame(rows)


def _numbers(row: dict) -> dict:
    return {k: row[k] for k in ("effect", "lo", "hi", "p", "p_holm")}


def chain_label(chain: tuple[tuple[str, str], ...]) -> str:
    return " = ".join(f"{a} x {b}" for a, b in chain)


def verdict(row: dict) -> str:
    if row["p_holm"] >= 0.05:
        return "no effect shown"
    if "chain" in row:
        return "shown"
    return "slows learning (higher bits/byte)" if row["effect"] > 0 else "speeds learning (lower bits/byte)"


def corner_comparison(frame: pd.DataFrame, n_resamples: int) -> stats.Comparison | None:
    a = frame[frame.arm == "nano-egg"].sort_values("seed").final_val_bpb.to_numpy()
    b = frame[frame.arm == "egg.c"].sort_values("seed").final_val_bpb.to_numpy()
    if len(a) < 2 or len(b) < 2:
        return None
    return stats.compare(stats.sample(a), stats.sample(b), n_resamples=n_resamples, seed=0)


class Difference(NamedTuple):
    """egg.c corner minus nano-egg corner of one response, in bits/byte, with a bootstrap interval."""

    response: str
    diff: float
    lo: float
    hi: float
    method: str              # BCa, or percentile where BCa is undefined (e.g. a constant resample)


def corner_difference(frame: pd.DataFrame, n_resamples: int, response: str = "final_val_bpb") -> Difference | None:
    """mean(egg.c) - mean(nano-egg) with scipy.stats.bootstrap's BCa interval (each corner resampled on its own)."""
    from scipy.stats import bootstrap
    a = frame[frame.arm == "nano-egg"].sort_values("seed")[response].to_numpy(float)
    b = frame[frame.arm == "egg.c"].sort_values("seed")[response].to_numpy(float)
    if len(a) < 2 or len(b) < 2:
        return None

    def diff(x, y, axis=-1):
        return np.mean(y, axis=axis) - np.mean(x, axis=axis)
    for method in ("BCa", "percentile"):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            ci = bootstrap((a, b), diff, n_resamples=n_resamples, confidence_level=LEVEL, method=method,
                           random_state=np.random.default_rng(0)).confidence_interval
        if np.isfinite(ci.low) and np.isfinite(ci.high):
            break
    return Difference(response, float(diff(a, b)), float(ci.low), float(ci.high), method)


class CatchUp(NamedTuple):
    """How many epochs the better corner needs to reach the level the other corner ends at."""

    faster: str
    slower: str
    target: float            # the slower corner's mean final bits/byte
    epochs: list[int]        # per run of the faster corner: first measured epoch (1-based) at or below the target
    reached: int
    run_epochs: int


def catch_up(frame: pd.DataFrame, cv: dict) -> CatchUp | None:
    """The corner with the lower mean final bits/byte, read against the other's mean final level."""
    means = frame[frame.arm.isin(["nano-egg", "egg.c"])].groupby("arm").final_val_bpb.mean()
    if len(means) < 2:
        return None
    faster, slower = ("egg.c", "nano-egg") if means["egg.c"] <= means["nano-egg"] else ("nano-egg", "egg.c")
    target = float(means[slower])
    run_epochs = max(e for pts in cv[faster].values() for e, _ in pts) + 1   # the last measurement is the last epoch
    epochs, reached = [], 0
    for seed in sorted(cv[faster]):
        o = outcome(cv[faster][seed], target, run_epochs)
        epochs.append(o.epochs_to_target)
        reached += o.reached
    return CatchUp(faster, slower, target, epochs, reached, run_epochs)


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


def _answer(comp: stats.Comparison | None, diff: "Difference | None", eff: Effects | None,
            catch: "CatchUp | None") -> list[str]:
    if comp is None:
        return ["Not answered yet: both corners need at least 2 finished seeds."]
    faster = comp.mean_b < comp.mean_a
    shown = comp.ratio_hi < 1 or comp.ratio_lo > 1
    lines = [f"At matched size, population, tokens per step, corpus and seeds, egg.c's integer ES reaches "
             f"{comp.mean_b:.3f} validation bits/byte after the run against nano-egg's {comp.mean_a:.3f}: "
             + (f"difference {diff.diff:+.3f} [{diff.lo:+.3f}, {diff.hi:+.3f}] bits/byte ({int(LEVEL * 100)}% "
                f"{diff.method} bootstrap), " if diff is not None else "")
             + f"ratio {comp.ratio:.3f} [{comp.ratio_lo:.3f}, {comp.ratio_hi:.3f}], Welch p "
             f"{fmt(comp.welch_p, 2)}, {comp.n_a} vs {comp.n_b} seeds. "
             + ("So egg.c does **not** learn as fast as nano-egg: it ends higher." if shown and not faster else
                "So egg.c learns **faster** than nano-egg at this budget: it ends lower." if shown else
                "The corners are not told apart at these seeds.")]
    if catch is not None:
        lines += ["", _catch_up_line(catch)]
    if eff is not None:
        lines += ["", _departures_line(eff, comp)]
    return lines


def _catch_up_line(c: "CatchUp") -> str:
    spread = f"median {int(np.median(c.epochs))}, range {min(c.epochs)}-{max(c.epochs)}"
    return (f"Read on the curves: {c.faster} reaches the level {c.slower} ends at ({c.target:.3f} bits/byte after "
            f"{c.run_epochs} epochs) on {c.reached} of its {len(c.epochs)} seeds, at epoch {spread}"
            + (f" (a seed that never reaches it counts as {c.run_epochs})" if c.reached < len(c.epochs) else "")
            + f": about {c.run_epochs / max(np.median(c.epochs), 1):.1f}x fewer epochs.")


def _departures_line(eff: Effects, comp: stats.Comparison) -> str:
    ranked = sorted(eff.rows, key=lambda r: -abs(r["effect"]))
    shown_rows = [r for r in ranked if r["p_holm"] < 0.05]
    chains = [r for r in eff.chain_rows if r["p_holm"] < 0.05]
    return ("Which departures, by how much (bits/byte with egg.c's value minus nano-egg's, averaged over the other "
            "knobs; Holm over seven): " + "; ".join(
                f"**{r['knob']}** {r['effect']:+.3f} [{r['lo']:+.3f}, {r['hi']:+.3f}]" for r in shown_rows)
            + (". " if shown_rows else "none is shown. ")
            + (f"Two-factor interactions matter too ({len(chains)} of {len(eff.chain_rows)} alias chains, Holm p "
               f"< 0.05; largest {max(chains, key=lambda r: abs(r['effect']))['chain']} "
               f"{max(chains, key=lambda r: abs(r['effect']))['effect']:+.3f}), so a main effect is an average over "
               "settings of the other knobs, not the cost of one knob alone. " if chains else "")
            + f"The model's corner gap, 2 sum b_i = {eff.predicted_gap():+.3f}, against the observed "
              f"{comp.mean_b - comp.mean_a:+.3f}: the two-factor chains cancel at the corners, and the rest is the "
                     f"fraction's one unmodelled contrast (higher-order interaction), which differs between them.")


def _effect_table(rows: list[dict], key: str, describe: bool) -> str:
    head = [key if key == "knob" else "alias chain"] + (["what egg.c does"] if describe else [])
    body = []
    for r in sorted(rows, key=lambda r: -abs(r["effect"])):
        body.append([r[key]] + ([describe_knob(r[key]).split(": ", 1)[1]] if describe else [])
                    + [f"{r['effect']:+.3f}", f"[{r['lo']:+.3f}, {r['hi']:+.3f}]", fmt(r["p"], 2),
                       fmt(r["p_holm"], 2), verdict(r)])
    return markdown_table(head + ["effect (bits/byte)", f"{int(LEVEL * 100)}% CI", "p", "p (Holm)", "verdict"], body)


def _effect_lines(eff: Effects, check: Effects | None) -> list[str]:
    lines = ["## Each departure's effect (the 2^(7-3) fraction, resolution IV)", "",
             f"OLS of final bits/byte on the seven coded knobs and {len(eff.chains)} alias chains of two-factor "
             f"interactions, HC3 errors, Student's t, {eff.n} runs, {eff.df_resid} residual df, residual sd "
             f"{eff.sigma:.3f} bits/byte. Effect = 2 b: egg.c's value minus nano-egg's, averaged over the other "
             f"knobs (positive: the departure leaves the model worse).", "",
             _effect_table(eff.rows, "knob", True), "",
             "### Two-factor interactions (alias chains)", "",
             "Each chain's interactions are confounded in this fraction (none with a main effect): the model "
             "estimates their sum. Effect = 2 g: the chain's product column at +1 minus at -1; Holm over the "
             f"{len(eff.chain_rows)} chains.", "", _effect_table(eff.chain_rows, "chain", False), "",
             f"**Power**: at {eff.n} runs and this residual sd, a main effect of {eff.detectable():.3f} bits/byte "
             "is found with 80% probability (two-sided 5% t-test, before Holm).", ""]
    return lines + (_check_lines(eff, check) if check is not None else [])


def _check_lines(eff: Effects, check: Effects) -> list[str]:
    """The main effects again on the late-mean response: does any verdict depend on the last measurement?"""
    by = {r["knob"]: r for r in check.rows}
    changed = [r["knob"] for r in eff.rows if verdict(r) != verdict(by[r["knob"]])]
    rows = [[r["knob"], f"{r['effect']:+.3f} [{r['lo']:+.3f}, {r['hi']:+.3f}]", verdict(r),
             f"{by[r['knob']]['effect']:+.3f} [{by[r['knob']]['lo']:+.3f}, {by[r['knob']]['hi']:+.3f}]",
             verdict(by[r["knob"]])] for r in sorted(eff.rows, key=lambda r: -abs(r["effect"]))]
    return ["### Check: the same model on the late mean", "",
            f"Response: {RESPONSES['late_val_bpb']} (residual sd {check.sigma:.3f}). "
            + ("Every verdict is the same as on the final value." if not changed else
               f"Verdicts that change: {', '.join(changed)}."), "",
            markdown_table(["knob", "final: effect [95% CI]", "verdict", "late mean: effect [95% CI]", "verdict"],
                           rows), ""]


def _corner_lines(comp: stats.Comparison, diffs: list, cv: dict) -> list[str]:
    rows = [["final bits/byte (mean)", f"{comp.mean_a:.4f}", f"{comp.mean_b:.4f}"],
            ["seeds", comp.n_a, comp.n_b]]
    rows += [[f"egg.c - nano-egg, {RESPONSES[d.response]}", "",
              f"{d.diff:+.4f} [{d.lo:+.4f}, {d.hi:+.4f}] ({d.method})"] for d in diffs if d is not None]
    rows += [["egg.c / nano-egg (final)", "", f"{comp.ratio:.4f} [{comp.ratio_lo:.4f}, {comp.ratio_hi:.4f}]"],
             ["Welch p / Mann-Whitney p", "", f"{fmt(comp.welch_p, 2)} / {fmt(comp.mann_whitney_p, 2)}"],
             ["P(egg.c run lower)", "", f"{comp.p_improvement:.2f} [{comp.p_improvement_lo:.2f}, "
                                        f"{comp.p_improvement_hi:.2f}]"]]
    head, table = checkpoint_table(cv, ["nano-egg", "egg.c"])
    return ["## The corners", "", markdown_table(["", "nano-egg", "egg.c"], rows), "",
            "Validation bits/byte against epochs (mean over seeds):", "", markdown_table(head, table), ""]


def _run_lines(folder: str, header: dict, frame: pd.DataFrame, run_ids: set[str] | None) -> list[str]:
    lines = [f"- {k}: {v}" for k, v in header.items()]
    return lines + [
        f"- runs: {len(frame)} finished over {frame.arm.nunique()} design points; arms trained on the torch int8 "
        f"port (bit-equal to the JAX reference and the C side at every knob: `python -m parity int8`), which is "
        f"about 6x faster than the C side on this CPU",
        f"- versions: {', '.join(sorted({json.dumps(json.loads(r['versions'])) for r in read_runs(folder, run_ids)}))}",
        "- outcome: validation bits/byte after the last epoch (noise off; the validation part of the shipped "
        "corpus, 16 rows); curves every 50 epochs",
        f"- the originals: nano-egg is {NANO_EGG_ORIGINAL[0]} {NANO_EGG_ORIGINAL[1]} at {NANO_EGG_ORIGINAL[2][:7]} "
        f"(reproduced by the JAX reference, tests/jax_reference/test_int8_nano_egg.py); egg.c is {EGG_C_ORIGINAL[0]} "
        f"{EGG_C_ORIGINAL[1]} at {EGG_C_ORIGINAL[2][:7]} (its profile egg.c-cpumulti reproduced step by step, "
        "tests/c_int8/test_egg_c_conformance.py); the study's egg.c is the seven departures of profile egg.c (the "
        "portable file's missing MLP and nested gate clips are structure, not part of the question)",
        f"- cost: {frame.cpu_s.sum() / 60:.0f} CPU-minutes of training in all ({frame.cpu_s.mean():.0f} s of one core "
        f"per run on average, {frame.cpu_s.min():.0f}-{frame.cpu_s.max():.0f} s); each run on torch, device cpu, one "
        "thread", ""]


def write(folder: str, header: dict, n_resamples: int, run_ids: set[str] | None = None) -> str:
    """summary.md, outcomes.csv, effects.csv, curves.csv, curves.png and curves_by_point.png in folder; returns the
    summary's text. run_ids: the planned runs (default every run in the folder)."""
    from gap.int8 import curves as int8_curves
    frame = outcomes(folder, run_ids)
    if frame.empty:
        raise ValueError(f"{folder} holds no finished runs of this plan; train some first (drop --report-only), or "
                         "give the --epochs, --seeds and --corpus the runs were trained with")
    cv = curves(folder, run_ids)
    comp = corner_comparison(frame, n_resamples)
    diffs = [corner_difference(frame, n_resamples, r) for r in RESPONSES]
    complete = frame.groupby("arm").size().reindex([a.name for a in arms()]).fillna(0).astype(int)
    eff, check = (Effects(frame), Effects(frame, "late_val_bpb")) if (complete >= 2).all() else (None, None)
    lines = ["# Integer EGGROLL: does egg.c's integer ES learn the byte LM as fast as nano-egg's?", ""]
    lines += _answer(comp, diffs[0], eff, catch_up(frame, cv)) + ["", "## Run", ""] + _run_lines(folder, header, frame, run_ids)
    lines += _effect_lines(eff, check) if eff is not None else []
    lines += _corner_lines(comp, diffs, cv) if comp is not None else []
    lines += _point_lines(frame)
    text = "\n".join(lines) + "\n"
    atomic_write(f"{folder}/summary.md", text)
    atomic_write(f"{folder}/outcomes.csv", frame.to_csv(index=False))
    if eff is not None:
        atomic_write(f"{folder}/effects.csv", pd.concat([eff.frame(), check.frame()]).to_csv(index=False))
    atomic_write(f"{folder}/curves.csv", int8_curves.curve_table(cv, [a.name for a in arms()]).to_csv(index=False))
    corners = ("nano-egg", "egg.c")
    plot_mean_curves(cv, {a.name: {"lw": 2.2, "alpha": 1, "label": f"{a.name} ({len(cv[a.name])} seeds)"}
                          if a.name in corners else {"lw": 0.8, "alpha": 0.45, "label": None}
                          for a in arms() if a.name in cv},
                     f"{folder}/curves.png",
                     "Integer EGGROLL: egg.c's departures against nano-egg (thin: the other 14 design points)",
                     (7.5, 4.5), 8)
    int8_curves.plot_points(cv, arms(), f"{folder}/curves_by_point.png")
    return text


def _point_lines(frame: pd.DataFrame) -> list[str]:
    per_arm = frame.groupby("arm").agg(count=("final_val_bpb", "count"), mean=("final_val_bpb", "mean"),
                                       sd=("final_val_bpb", "std"), late=("late_val_bpb", "mean"),
                                       slope=("late_slope", "mean")).reindex([a.name for a in arms()]).dropna(how="all")
    return ["## Every design point", "",
            "Late slope: the least-squares slope of validation bits/byte per 100 epochs over the second half of the "
            "run (mean over seeds): below 0 the point is still learning when the run stops; near 0 or above, it has "
            "stalled or drifts back.", "",
            markdown_table(["point", "seeds", "final bits/byte mean", "sd", "late mean", "late slope /100 epochs"],
                           [[name, int(r["count"]), f"{r['mean']:.4f}", fmt(r["sd"], 3), f"{r['late']:.4f}",
                             f"{r['slope']:+.3f}"] for name, r in per_arm.iterrows()]),
            "", "![validation bits/byte against epochs, the corners](curves.png)", "",
            "![every design point](curves_by_point.png)", "",
            "Files: `runs.csv` (one row per run), `epochs.csv` (each run's curve), `curves.csv` (each point's mean "
            "curve), `outcomes.csv`, `effects.csv` (both responses), `curves.png`, `curves_by_point.png`."]
