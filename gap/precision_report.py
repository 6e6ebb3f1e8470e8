"""The GPU-precision arms of a study and how likely the published gap is as chance (issues 24 and 32).

A TF32 arm is a torch arm with `matmul_precision=high`: on a CPU it emulates what an arm on an Ampere-or-newer GPU
computed (JAX's default float32 matmuls there are TF32; torch's stay float32 unless asked). Its float32 counterpart
is the same knobs at `highest`. Where the study holds the JAX reference measured on a GPU (an imported arm,
gap/imported.py: `jax_reference@gpu` at JAX's default precision, `jax_reference@gpu+highest`), that arm is "TF32 on
the JAX side" and the CPU emulation becomes a secondary model. Against the published design (10 seeds against 10),
the chance of a ratio at least the published one comes from gap.chance under each model.
"""
from __future__ import annotations

import math
from typing import NamedTuple

from gap import chance, imported, published, stats
from gap.arms import Arm, torch_arm

ALPHA = 0.05
PRECISION_KNOB, TF32 = "matmul_precision", "high"


class Model(NamedTuple):
    """A model of the published comparison: which study arm stands for each published arm."""

    label: str
    base: str                 # stands for the published JAX arm
    arm: str                  # stands for the published torch arm
    secondary: bool = False   # a CPU emulation of TF32 on the JAX side, beside the arm measured on a GPU


def tf32_arms(st) -> list[tuple[Arm, str]]:
    """(TF32 arm, its float32 counterpart's name) for each main torch arm with matmul_precision=high."""
    out = []
    for a in st.main_arms:
        if a.side == "torch" and getattr(a.knobs, PRECISION_KNOB) == TF32:
            out.append((a, torch_arm(a.knobs.replace(**{PRECISION_KNOB: "highest"}), st.reference.knobs).name))
    return out


def _tf32_of(st, name: str) -> str | None:
    return next((a.name for a, base in tf32_arms(st) if base == name), None)


def gpu_arms(st) -> tuple[str | None, str | None]:
    """(the reference measured on a GPU at JAX's default precision (TF32), the same at highest), each or None."""
    names = [a.name for a in getattr(st, "imported", ())]
    return imported.find(names, "gpu", "default"), imported.find(names, "gpu", "highest")


def pairs(st) -> list[tuple[str, str]]:
    """The comparisons the verdict needs: each TF32 arm against its float32 counterpart, and the drifted profile
    (float32, and in TF32) against the reference's math in TF32 (emulated); with the GPU arms, TF32 on the GPU
    against highest there, highest on the GPU against the CPU, and the drifted profile and the emulation against
    the measured TF32 arm."""
    out = [(base, a.name) for a, base in tf32_arms(st)]
    ref_tf32, drifted_tf32 = _tf32_of(st, st.faithful.name), _tf32_of(st, st.drifted.name)
    if ref_tf32:
        out += [(ref_tf32, st.drifted.name)] + ([(ref_tf32, drifted_tf32)] if drifted_tf32 else [])
    gpu, highest = gpu_arms(st)
    if highest:
        out += ([(highest, gpu)] if gpu else []) + [(st.reference.name, highest)]
    if gpu:
        out += [(gpu, name) for name in (st.drifted.name, drifted_tf32, ref_tf32) if name]
    return out


def models(st) -> list[Model]:
    """The faithful model, then TF32 on the JAX side and on both sides: with the JAX reference measured on a GPU
    where the study has it, and the CPU emulation (secondary beside a measured arm)."""
    out = [Model("faithful model", st.reference.name, st.drifted.name)]
    gpu, _ = gpu_arms(st)
    ref_tf32, drifted_tf32 = _tf32_of(st, st.faithful.name), _tf32_of(st, st.drifted.name)
    if gpu:
        out.append(Model("faithful model plus TF32 on the JAX side", gpu, st.drifted.name))
        if drifted_tf32:
            out.append(Model("TF32 on both sides, the torch side emulated", gpu, drifted_tf32))
    if ref_tf32:
        out.append(Model("faithful model plus TF32 on the JAX side, CPU emulation", ref_tf32, st.drifted.name,
                         gpu is not None))
        if drifted_tf32:
            out.append(Model("TF32 on both sides, CPU emulation", ref_tf32, drifted_tf32, gpu is not None))
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
                         + samples[m.arm].n_censored, **c._asdict(), "secondary": m.secondary})
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


def _power(c: stats.Comparison) -> str:
    n = min(c.n_a, c.n_b)
    return f"With {n} seeds per arm a difference of about {stats.detectable_diff(n, c.cv):.0%} is detected at 80% power."


def _precision_lines(st, cmps, cpu_s: dict[str, float]) -> list[str]:
    """TF32's effect on the reference measured on a GPU, then on each side as emulated on a CPU."""
    lines = []
    gpu, highest = gpu_arms(st)
    c = cmps.get((highest, gpu)) if gpu and highest else None
    if c is not None:
        lines.append(f"**TF32 matmuls on the JAX reference, measured on a GPU** (`{gpu}` / `{highest}`: JAX's default "
                     f"precision against `highest` on the same GPU): {_ratio(c)}, Gehan p {c.gehan_p:.3f}: "
                     f"{_moves(c)}. " + _power(c))
    for a, base in tf32_arms(st):
        c = cmps.get((base, a.name))
        if c is None:
            continue
        side = "the reference's math" if base == st.faithful.name else f"`{base}`"
        lines.append(f"**TF32 matmuls on {side}, emulated on a CPU** (`{a.name}` / `{base}`): {_ratio(c)}, Gehan p "
                     f"{c.gehan_p:.3f}: {_moves(c)}. " + _power(c) + cost_sentence(a.name, base, cpu_s))
    return lines


def _by_seed(runs, arm: str) -> dict[int, tuple[bool, float]]:
    g = runs[runs["arm"] == arm]
    return {int(s): (bool(v), float(x)) for s, v, x in zip(g["seed"], g["solved"], g["steps"])}


def _and(items: list[str]) -> str:
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " and " + items[-1]


def _seeds(seeds: list[int]) -> str:
    return ", ".join(map(str, seeds))


def platform_lines(st, runs) -> list[str]:
    """How often the reference measured on a GPU gives exactly the steps of this study's CPU runs, seed for seed,
    at `highest` and at JAX's default precision (TF32), and what that says."""
    gpu, highest = gpu_arms(st)
    cpu = _by_seed(runs, st.reference.name) if highest and not runs.empty else {}
    mine = _by_seed(runs, highest) if cpu else {}
    common = sorted(set(cpu) & set(mine))
    if not common:
        return []
    same = [s for s in common if cpu[s] == mine[s]]
    parted = [s for s in common if cpu[s] != mine[s]]
    line = (f"**The reference on a GPU at `highest`** (`{highest}`, float32 products) against this study's CPU runs "
            f"(`{st.reference.name}`): exactly the same steps to solve at {len(same)} of the {len(common)} seeds run"
            + (f" ({_seeds(same)})" if same else "")
            + ("; the runs part at seed" + ("s " if len(parted) > 1 else " ") + _and(
                [f"{s} ({mine[s][1]:,.0f} steps on the GPU, {cpu[s][1]:,.0f} on the CPU)" for s in parted])
               if parted else ""))
    if same:
        line += (". Equal to the last step, those runs took the same course on both platforms: at `highest` the GPU "
                 "computes the reference's arithmetic closely enough that no action of theirs came out otherwise")
    if parted:
        line += ("; what parted the other" + ("s" if len(parted) > 1 else "") + ", this data does not say (JAX's GPU "
                 "normals differ from its CPU normals in the last bits of some draws, and XLA's GPU kernels may sum "
                 "in another order; either can flip an action, and the runs part from there)")
    tf32 = _by_seed(runs, gpu) if gpu else {}
    both = sorted(set(cpu) & set(tf32))
    if both:
        tf32_same = [s for s in both if cpu[s] == tf32[s]]
        line += (f". At JAX's default precision on the same GPU (`{gpu}`, TF32) {len(tf32_same)} of {len(both)} seeds "
                 "give the CPU's steps" + (f" ({_seeds(tf32_same)})" if tf32_same else ""))
        if same and not set(same) & set(tf32_same) and set(same) <= set(both):
            line += ": TF32 alone parts the runs that `highest` keeps on the CPU's course"
    return [line + "."]


def _part(r: dict, one: dict) -> str:
    return (f"{r['model']} (`{r['arm']}` against `{r['baseline']}`): {r['probability']:.1%}"
            + (f" (seed spread alone: {one[r['model']]['probability']:.1%})" if r["model"] in one else ""))


def _chance_line(rows: list[dict], threshold: float, n: int) -> list[str]:
    two = [r for r in rows if r["method"] == "two_stage"]
    if not two:
        return []
    one = {r["model"]: r for r in rows if r["method"] == "one_stage"}
    secondary = [_part(r, one) for r in two if r.get("secondary")]
    return [f"**How likely a published-size gap is as chance** (a replication with {n} seeds per arm showing a ratio "
            f"of means >= {threshold:.3f}; two-stage bootstrap of the study's runs, Monte Carlo error below "
            f"{max(r['mc_se'] for r in two):.1%}): " + "; ".join(_part(r, one) for r in two if not r.get("secondary"))
            + "." + (" Secondary: " + "; ".join(secondary) + "." if secondary else "")]


def _spreads(st, samples: dict[str, stats.Sample]) -> list[tuple[str, float, float]]:
    """(arm, CV, Brown-Forsythe p of equal spread with the published JAX arm: scipy's Levene test about the median)
    for the reference and its TF32 arms (measured on a GPU, emulated on a CPU)."""
    from scipy.stats import levene

    pj, _ = published.samples()
    names = (st.reference.name, gpu_arms(st)[0], _tf32_of(st, st.faithful.name))
    return [(name, stats.cv(samples[name].steps), float(levene(pj.steps, samples[name].steps, center="median").pvalue))
            for name in names if name in samples]


def _spread_line(st, samples: dict[str, stats.Sample]) -> list[str]:
    """The published JAX arm's seed-to-seed spread against the reference's and its TF32 arms'."""
    pj, _ = published.samples()
    parts = [f"`{name}` {v:.3f} (equal spread: Brown-Forsythe p {p:.3f})" for name, v, p in _spreads(st, samples)]
    if not parts:
        return []
    return [f"**Seed-to-seed spread**: the published JAX arm's CV is {stats.cv(pj.steps):.3f}; here "
            + ", ".join(parts) + "."]


def _tf32_spread(names_cvs: list[tuple[str, float]], ref_cv: float) -> str:
    if not names_cvs:
        return ""
    listed = ", ".join(f"`{n}` {v:.3f}" for n, v in names_cvs)
    narrower = [v < ref_cv for _, v in names_cvs]
    word = "does not narrow it" if not any(narrower) else "narrows it" if all(narrower) else "narrows it in part"
    return f"; TF32 {word} ({listed})"


def _size_part(st, cmps, published_cmp: stats.Comparison, rows: list[dict]) -> str:
    """Whether chance accounts for the published gap's size under the main models (faithful, TF32 on the JAX side)."""
    likely = [r for r in rows if r["method"] == "two_stage" and not r.get("secondary") and r["arm"] == st.drifted.name
              and r["probability"] >= ALPHA]
    if not likely:
        return f"the published gap's size: no model here makes it likely as chance (each below {ALPHA:.0%})"
    tf32 = gpu_arms(st)[0] or _tf32_of(st, st.faithful.name)
    c = cmps.get((tf32, st.drifted.name)) if tf32 else None
    where = ""
    if c is not None:
        inside = c.ratio_lo <= published_cmp.ratio <= c.ratio_hi
        where = (f", {'and' if inside else 'though'} the published ratio {published_cmp.ratio:.3f} lies "
                 f"{'inside' if inside else 'outside'} `{st.drifted.name}` / `{tf32}`'s interval "
                 f"[{c.ratio_lo:.3f}, {c.ratio_hi:.3f}]")
    return (f"the published gap's size is not rare as chance (at least {ALPHA:.0%}): a replication shows a gap that "
            "large with probability " + ", ".join(f"{r['probability']:.0%} ({r['model']})" for r in likely) + where)


def _unexplained_line(st, cmps, samples, published_cmp: stats.Comparison, rows: list[dict]) -> list[str]:
    """What the models leave unexplained: the gap's size when no model makes it likely enough, and the published JAX
    arm's spread when it differs from the reference's."""
    out = [_size_part(st, cmps, published_cmp, rows)]
    pj, _ = published.samples()
    spreads = {n: (v, p) for n, v, p in _spreads(st, samples)}
    ref_cv, ref_p = spreads.get(st.reference.name, (math.nan, 1.0))
    if ref_p < ALPHA and ref_cv > stats.cv(pj.steps):
        tf32 = [(n, spreads[n][0]) for n in (gpu_arms(st)[0], _tf32_of(st, st.faithful.name)) if n in spreads]
        out.append(f"the published JAX arm's narrower seed-to-seed spread (CV {stats.cv(pj.steps):.3f} against "
                   f"`{st.reference.name}` {ref_cv:.3f}, Brown-Forsythe p {ref_p:.3f}{_tf32_spread(tf32, ref_cv)}), "
                   "which comes from something the study does not model (another seed scheme, environment version or "
                   "hardware)")
    return ["**What is still unexplained**: " + "; ".join(out) + "."]


def _jax_tf32_line(st, cmps, published_cmp: stats.Comparison, gap_line) -> list[str]:
    """The published question with TF32 on the JAX side: the arm measured on a GPU, the CPU emulation beside it."""
    gpu, drift, emu = gpu_arms(st)[0], st.drifted.name, _tf32_of(st, st.faithful.name)
    head = "With TF32 on the JAX side, as the published JAX run most likely computed"
    if gpu and (gpu, drift) in cmps:
        text = (f"{head} (`{gpu}`: the reference measured on a GPU at JAX's default precision): "
                + gap_line(gpu, drift, cmps[(gpu, drift)], published_cmp)[0])
        e, v = cmps.get((emu, drift)), cmps.get((gpu, emu))
        if e is not None:
            text += (f" The CPU emulation of that arm (`{emu}`, secondary) gave `{drift}` / `{emu}` = {_ratio(e)}, "
                     f"Gehan p {e.gehan_p:.3f}" + (f"; against the measured arm it needed `{emu}` / `{gpu}` = "
                                                   f"{_ratio(v)}, Gehan p {v.gehan_p:.3f}" if v is not None else "")
                     + ".")
        return [text]
    if emu and (emu, drift) in cmps:
        return [f"{head} (emulated on a CPU: `{emu}`): " + gap_line(emu, drift, cmps[(emu, drift)], published_cmp)[0]]
    return []


def verdict_lines(st, cmps: dict, samples: dict[str, stats.Sample], published_cmp: stats.Comparison,
                  rows: list[dict], n: int, gap_line, cpu_s: dict[str, float] | None = None, runs=None) -> list[str]:
    """TF32's effect on each side and what its arms cost (cpu_s: mean cpu seconds per run by arm), the reference on a
    GPU seed for seed against the CPU (runs: the run table), the published question with TF32 on the JAX side
    (gap_line: the report's own wording of a gap against the published ratio), the chance of a published-size gap,
    and the spread."""
    lines = _precision_lines(st, cmps, cpu_s or {}) + (platform_lines(st, runs) if runs is not None else [])
    lines += _jax_tf32_line(st, cmps, published_cmp, gap_line)
    lines += _chance_line(rows, published_cmp.ratio, n)
    if gpu_arms(st)[0] or _tf32_of(st, st.faithful.name):
        lines += _spread_line(st, samples) + _unexplained_line(st, cmps, samples, published_cmp, rows)
    return lines


def section(rows: list[dict]) -> list[str]:
    """The chance table under each model and method."""
    if not rows:
        return []
    from reporting import markdown_table

    head = ["model", "arm / baseline", "method", "P(ratio >= threshold)", "Monte Carlo error", "censored runs"]
    body = [[r["model"] + (" (secondary)" if r.get("secondary") else ""), f"`{r['arm']}` / `{r['baseline']}`",
             r["method"].replace("_", "-"), f"{r['probability']:.2%}", f"{r['mc_se']:.2%}", r["censored"]]
            for r in rows]
    threshold, n, resamples = rows[0]["threshold"], rows[0]["n"], rows[0]["resamples"]
    emulations = list(dict.fromkeys(r["baseline"] for r in rows if r.get("secondary")))
    emulated = ("" if not emulations else
                f" In the CPU emulation, {', '.join(f'`{e}`' for e in emulations)} (TF32 operand rounding on a CPU) "
                "stands for the JAX side in TF32; beside the JAX reference measured on a GPU it is secondary.")
    return ["", "## How likely the published gap is as chance", "",
            f"The probability that a replication of the published design ({n} seeds per arm) shows a ratio of mean "
            f"steps to solve of at least {threshold:.3f} (the published one), predicted from this study's runs by "
            f"bootstrap ({resamples:,} replications, gap/chance.py). One-stage: a replication's seeds are drawn from "
            "each arm's runs (the spread of seeds alone, the arms' means held at the observed ones). Two-stage: "
            "each replication first draws a plausible arm from its runs, then its seeds from that (adds this "
            "study's own uncertainty about each arm; the verdict quotes it)." + emulated, "",
            markdown_table(head, body)]
