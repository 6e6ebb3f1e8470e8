"""The benchmark's outputs: a tidy CSV, a Markdown summary with ratio tables, a log-log plot."""
from __future__ import annotations

import csv
import os
from pathlib import Path
from typing import Iterable, NamedTuple, Sequence

from bench.ceilings import Ceilings

COLUMNS = ("impl", "model", "pop", "measure", "median", "p10", "p90", "unit", "device")
# Implementations in report order; the first is the one every ratio is taken against.
IMPLS = ("torch_impl", "torch_impl_jaxrng", "jax_reference", "hooks", "materialized", "loop")
# Extra rows: the machine's ceilings and floors.
EXTRA_IMPLS = ("machine",)
# torch_impl's forward handed the noise per member (the layout hooks, materialized and loop get) is a
# measure of torch_impl: `forward_members_*` rows, which separate the noise layout's gain from the style's.
MEMBERS = "torch_impl (per-member noise)"


class Context(NamedTuple):
    """What the summary says about the run besides the numbers."""

    command: str
    device: str
    jax_device: str
    threads: int
    cpu: str
    versions: dict[str, str]
    load_before: str
    load_after: str
    wall_s: float
    quick: bool
    models: tuple
    ceilings: list[tuple[str, Ceilings]]
    notes: list[str]
    agreement: str | None
    profile: list[str]


class Row(NamedTuple):
    """One measurement: the CSV's columns (median, p10, p90 over repeats)."""

    impl: str
    model: str
    pop: int
    measure: str
    median: float
    p10: float
    p90: float
    unit: str
    device: str


def write_csv(rows: Iterable[Row], path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(COLUMNS)
        for r in rows:
            w.writerow([r.impl, r.model, r.pop, r.measure, f"{r.median:.6g}", f"{r.p10:.6g}", f"{r.p90:.6g}",
                        r.unit, r.device])


def read_csv(path: Path) -> list[Row]:
    with open(path, newline="") as f:
        reader = csv.DictReader(f)
        if tuple(reader.fieldnames or ()) != COLUMNS:
            raise ValueError(f"{path}: columns {reader.fieldnames}, expected {list(COLUMNS)}")
        return [Row(d["impl"], d["model"], int(d["pop"]), d["measure"], float(d["median"]), float(d["p10"]),
                    float(d["p90"]), d["unit"], d["device"]) for d in reader]


def lookup(rows: Sequence[Row], impl: str, model: str, pop: int, measure: str) -> Row | None:
    for r in rows:
        if (r.impl, r.model, r.pop, r.measure) == (impl, model, pop, measure):
            return r
    return None


def fmt(v: float) -> str:
    """Numbers for tables: 3 significant figures, thousands separated."""
    if v == 0:
        return "0"
    if abs(v) >= 1000:
        return f"{v:,.0f}"
    return f"{v:.3g}"


# Round-by-round ratios (torch_impl's speed over the row's impl) stored beside each throughput measure.
PAIRED = {"forward_evals_per_s": "forward_ratio", "forward_noise_evals_per_s": "forward_noise_ratio"}


def ratio_stats(rows: Sequence[Row], impl: str, model: str, pop: int, paired_measure: str, a: Row | None,
                b: Row | None) -> tuple[float, float, float, bool] | None:
    """(median, low, high, round_by_round) of a / b: the round-by-round ratio row `paired_measure` of `impl`
    when the run recorded one, else the ratio of the medians with the pessimistic / optimistic pairing of
    the two spreads; None when neither is there."""
    paired = lookup(rows, impl, model, pop, paired_measure)
    if paired is not None:
        return paired.median, paired.p10, paired.p90, True
    if a is None or b is None:
        return None
    return a.median / b.median, a.p10 / b.p90, a.p90 / b.p10, False


def ratio_cell(rows: Sequence[Row], model: str, pop: int, paired_measure: str, a: Row | None, b: Row | None,
               impl: str) -> str:
    """"median (low-high)" of `ratio_stats`, "-" when not measured."""
    stats = ratio_stats(rows, impl, model, pop, paired_measure, a, b)
    return "-" if stats is None else f"{stats[0]:.2f} ({stats[1]:.2f}-{stats[2]:.2f})"


def ratio_table(rows: Sequence[Row], model: str, measure: str, impls: Sequence[str]) -> list[str]:
    """Markdown: per population, torch_impl's median and torch_impl / impl for each other impl.

    Cells are the quantiles of round-by-round ratios where the run recorded them (`ratio_cell`).
    """
    pops = sorted({r.pop for r in rows if r.model == model and r.measure == measure})
    others = [i for i in impls if i != "torch_impl" and any(
        r.impl == i and r.model == model and r.measure == measure for r in rows)]
    if not pops:
        return []
    head = ["pop", "torch_impl (median)"] + [f"/ {i}" for i in others]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for pop in pops:
        base = lookup(rows, "torch_impl", model, pop, measure)
        cells = [str(pop), fmt(base.median) if base else "-"]
        for other in others:
            o = lookup(rows, other, model, pop, measure)
            cells.append("-" if base is None or o is None
                         else ratio_cell(rows, model, pop, PAIRED.get(measure, ""), base, o, other))
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def plot_throughput(rows: Sequence[Row], models: Sequence[str], path: Path) -> None:
    """Forward throughput against population, log-log, a panel per model (dashed: with noise)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    models = [m for m in models if any(r.model == m and r.measure.startswith("forward") for r in rows)] or ["none"]
    fig, axes = plt.subplots(1, len(models), figsize=(6 * len(models), 4.5), squeeze=False)
    colors = dict(zip(IMPLS + EXTRA_IMPLS, plt.rcParams["axes.prop_cycle"].by_key()["color"]))
    for ax, model in zip(axes[0], models):
        for measure, style in (("forward_evals_per_s", "-"), ("forward_noise_evals_per_s", "--")):
            series = [(impl, impl, measure) for impl in IMPLS]
            if measure == "forward_evals_per_s":
                series.append((MEMBERS, "torch_impl", "forward_members_evals_per_s"))
            for label, impl, meas in series:
                pts = sorted((r.pop, r.median, r.p10, r.p90) for r in rows
                             if r.impl == impl and r.model == model and r.measure == meas)
                if not pts:
                    continue
                pops, med, lo, hi = zip(*pts)
                label = label + (" (+ noise)" if measure == "forward_noise_evals_per_s" else "")
                color = colors.get(impl) if label != MEMBERS else "gray"
                ax.plot(pops, med, style if label != MEMBERS else "-.", marker="o" if style == "-" else "s", ms=3,
                        color=color, label=label)
                ax.fill_between(pops, lo, hi, color=color, alpha=0.15)
        floor = sorted((r.pop, r.median) for r in rows
                       if r.impl == "machine" and r.model == model and r.measure == "floor_evals_per_s")
        if floor:
            ax.plot(*zip(*floor), ":", color="black", label="machine floor (ceiling)")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("population")
        ax.set_ylabel("member evaluations / s")
        ax.set_title(model)
        ax.grid(True, which="both", alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=7)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _impl_cols(rows: Sequence[Row], model: str, measure: str, impls: Sequence[str]) -> list[str]:
    return [i for i in impls if any(r.impl == i and r.model == model and r.measure == measure for r in rows)]


def _verdict(rows: Sequence[Row], base: Row | None, other: Row | None, name: str) -> str:
    """One goal line: torch_impl's speed over `name`'s, round by round when measured so."""
    if base is None or other is None:
        return f"- torch_impl vs {name}: not measured"
    measure = PAIRED.get(base.measure, "")
    r, lo, hi, paired = ratio_stats(rows, name, base.model, base.pop, measure, base, other)
    how = "rounds' p10-p90" if paired else "spread of the two"
    ci_lo = lookup(rows, name, base.model, base.pop, f"{measure}_ci95_low")
    ci_hi = lookup(rows, name, base.model, base.pop, f"{measure}_ci95_high")
    ci = ""
    if ci_lo is not None and ci_hi is not None:
        ci = f"95% CI of the median {ci_lo.median:.2f}-{ci_hi.median:.2f}x; "
        # The verdict follows the interval: "on par" when it holds 1.
        word = ("faster than" if ci_lo.median > 1 else "slower than" if ci_hi.median < 1
                else "on par with (the interval holds 1)")
    else:
        word = "faster than" if r >= 1 else "slower than"
    return (f"- torch_impl is {word} {name}: {r:.2f}x ({fmt(base.median)} vs {fmt(other.median)} {base.unit}; "
            f"{ci}{how} {lo:.2f}-{hi:.2f}x)")


def _busy(load: str) -> bool:
    """Whether a load-average string ("1.00, 0.50, 0.20") says other work ran: 1-minute load above half the cores."""
    try:
        return float(load.split(",")[0]) > 0.5 * (os.cpu_count() or 1)
    except ValueError:
        return True


def _ratio(rows: Sequence[Row], impl: str, model: str, pop: int, measure: str, a: Row | None,
           b: Row | None) -> str:
    """"1.23x (round-by-round p10-p90 1.10-1.40)", or "1.23x" from the medians, or "" (see ratio_stats)."""
    stats = ratio_stats(rows, impl, model, pop, measure, a, b)
    if stats is None:
        return ""
    r, lo, hi, paired = stats
    return f"{r:.2f}x (round-by-round p10-p90 {lo:.2f}-{hi:.2f})" if paired else f"{r:.2f}x"


def layout_table(rows: Sequence[Row], model: str) -> list[str]:
    """Markdown: per population, torch_impl with its grouped noise and with the noise per member, and the
    per-member forward against hooks: what the noise layout gives and what the functional style gives."""
    pops = sorted({r.pop for r in rows if r.model == model and r.measure == "forward_members_evals_per_s"})
    if not pops:
        return []
    lines = ["| pop | torch_impl (grouped noise) | torch_impl (per-member noise) | grouped / per-member | "
             "per-member / hooks |", "|---|---|---|---|---|"]
    for pop in pops:
        g = lookup(rows, "torch_impl", model, pop, "forward_evals_per_s")
        m = lookup(rows, "torch_impl", model, pop, "forward_members_evals_per_s")
        h = lookup(rows, "hooks", model, pop, "forward_evals_per_s")
        lines.append(f"| {pop} | {fmt(g.median) if g else '-'} | {fmt(m.median) if m else '-'} | "
                     f"{ratio_cell(rows, model, pop, 'forward_layout_ratio', g, m, 'torch_impl')} | "
                     f"{ratio_cell(rows, model, pop, 'forward_members_ratio', m, h, 'hooks')} |")
    return lines


def summary_markdown(rows: Sequence[Row], ctx) -> str:
    """The benchmark's summary page: environment, goal check, ratio tables, floors, step, generators."""
    L: list[str] = []
    add = L.append
    add("# Throughput benchmark" + (" (--quick: tiny sizes, not a measurement)" if ctx.quick else ""))
    add("")
    # Judged by the load before the run: the run's own threads raise the load seen after it.
    if _busy(ctx.load_before):
        add("Provisional numbers: the machine was shared with other jobs while this ran (load average "
            f"{ctx.load_before} before, {ctx.load_after} after), so absolute rates are noisy. Implementations "
            "were timed in turns (a, b, c, a, b, c, ...) so that load hits them alike and the ratios hold up "
            "better.")
    else:
        add(f"The machine was otherwise idle when the run began (load average {ctx.load_before}; "
            f"{ctx.load_after} after, which counts the run's own threads). "
            "Implementations were timed in turns (a, b, c, a, b, c, ...), so each ratio compares calls made "
            "under the same conditions.")
    add("")
    add(f"- command: `{ctx.command}`  (wall time {ctx.wall_s:.0f} s)")
    add(f"- torch device: {ctx.device} ({ctx.cpu}); torch threads (torch.get_num_threads()): {ctx.threads}; "
        f"JAX platform: {ctx.jax_device}")
    add("- versions: " + ", ".join(f"{k} {v}" for k, v in ctx.versions.items()))
    add("- OpenMP settings: " + ", ".join(f"{k}={os.environ.get(k, '(unset)')}" for k in
                                        ("OMP_NUM_THREADS", "OMP_WAIT_POLICY")) +
        " (with OMP_WAIT_POLICY unset, torch's OpenMP threads spin while they wait; on a machine shared "
        "with other jobs that alone can slow small torch ops several times, so compare loaded runs with care)")
    add("- models: " + "; ".join(f"`{m.name}` = {m.label}" for m in ctx.models))
    add("- every number is the median over timed repeats (warm-up calls excluded) with p10-p90 in brackets; "
        "throughput = population / seconds per call, one observation per member.")
    add("")

    add("## Machine ceilings (measured in this run)")
    add("")
    add("| when | dense float32 matmul GFLOP/s | memory copy GB/s (read + write) |")
    add("|---|---|---|")
    for when, c in ctx.ceilings:
        add(f"| {when} | {fmt(c.matmul_gflops.median)} ({fmt(c.matmul_gflops.p10)}-{fmt(c.matmul_gflops.p90)}) | "
            f"{fmt(c.copy_gbps.median)} ({fmt(c.copy_gbps.p10)}-{fmt(c.copy_gbps.p90)}) |")
    add("")
    add("The ceilings are measured with the run's own threads (and core pinning, if --threads was given), "
        "under whatever load the machine had, so the floors and fractions below are relative to what the "
        "machine gave this run. Floors use the best rates seen (the highest p90 of either measurement). The floor of a forward is "
        "max(FLOPs / peak, bytes / bandwidth) with FLOPs = 2 pop (in out + r (in + out)) per layer and bytes = "
        "weights and biases once + each distinct draw's A, B and bias noise once (the noise is antithetic: "
        "pop / 2 draws, each shared by a pair up to sign) + each layer's input and output once (float32); "
        "activations and bias adds are not counted, so the floor is optimistic.")
    add("")

    head = next(((r.model, r.pop) for r in rows if r.measure == "step_per_s"), None)
    if head is None:
        pops = sorted({r.pop for r in rows if r.model == "cartpole" and r.measure == "forward_evals_per_s"})
        head = ("cartpole", pops[len(pops) // 2]) if pops else None
    if head:
        model, pop = head
        add(f"## Goal check: `{model}` at pop {pop}")
        add("")
        add("Forward alone (the same noise values handed to every implementation; torch_impl reads them "
            "grouped by antithetic pair, as `sample_noise` returns them, the others per member):")
        base = lookup(rows, "torch_impl", model, pop, "forward_evals_per_s")
        for impl in IMPLS[1:]:
            o = lookup(rows, impl, model, pop, "forward_evals_per_s")
            if o is not None:
                add(_verdict(rows, base, o, impl))
        members = lookup(rows, "torch_impl", model, pop, "forward_members_evals_per_s")
        layout = _ratio(rows, "torch_impl", model, pop, "forward_layout_ratio", base, members)
        style = _ratio(rows, "hooks", model, pop, "forward_members_ratio", members,
                       lookup(rows, "hooks", model, pop, "forward_evals_per_s"))
        if members is not None and layout:
            add(f"- the same forward handed the noise per member: {fmt(members.median)} evals/s, so the grouped "
                f"layout gives {layout}" + (f" and the functional style alone, against hooks with the same "
                                           f"per-member noise, {style}" if style else "") + ".")
        add("")
        add("Noise generation plus forward (each side draws its own noise):")
        base = lookup(rows, "torch_impl", model, pop, "forward_noise_evals_per_s")
        for impl in ("torch_impl_jaxrng", "jax_reference"):
            o = lookup(rows, impl, model, pop, "forward_noise_evals_per_s")
            if o is not None:
                add(_verdict(rows, base, o, impl))
        jr = lookup(rows, "torch_impl_jaxrng", model, pop, "forward_noise_evals_per_s")
        jx = lookup(rows, "jax_reference", model, pop, "forward_noise_evals_per_s")
        if jr and jx:
            add(f"- torch_impl_jaxrng / jax_reference: {jr.median / jx.median:.2f}x")
        add("")
        for label, measure in (("torch_impl", "floor_fraction"), (MEMBERS, "floor_fraction_members")):
            f = lookup(rows, "torch_impl", model, pop, measure)
            if f:
                add(f"- {label} forward reaches {f.median:.0%} of the machine's floor ({f.p10:.0%}-{f.p90:.0%}); "
                    "the aim is 50% or more.")
        add("")

    for measure, title in (("forward_evals_per_s", "Forward throughput, noise given (evaluations/s)"),
                           ("forward_noise_evals_per_s", "Noise generation + forward (evaluations/s)")):
        for m in ctx.models:
            table = ratio_table(rows, m.name, measure, IMPLS)
            if table:
                add(f"## {title}: `{m.name}`")
                add("")
                add("torch_impl's median, then torch_impl's speed over each other implementation's (> 1: "
                    "torch_impl is faster): the median and p10-p90 of the ratio taken round by round (each "
                    "round calls every implementation once, in rotating order).")
                add("")
                L.extend(table)
                add("")
            layout = layout_table(rows, m.name) if measure == "forward_evals_per_s" else []
            if layout:
                add(f"Where the forward's gain comes from (`{m.name}`): torch_impl with the noise grouped by pair "
                    "and handed per member, and that per-member run against hooks (same noise, other style).")
                add("")
                L.extend(layout)
                add("")

    for m in ctx.models:
        impls = _impl_cols(rows, m.name, "floor_fraction", IMPLS)
        pops = sorted({r.pop for r in rows if r.model == m.name and r.measure == "floor_ms"})
        if not pops:
            continue
        add(f"## Floors and fraction achieved: `{m.name}`")
        add("")
        members = any(r.model == m.name and r.measure == "floor_fraction_members" for r in rows)
        cols = (["pop", "floor ms (compute / memory)", "torch_impl ms"] + [f"{i} fraction" for i in impls]
                + ([f"{MEMBERS} fraction"] if members else []))
        add("| " + " | ".join(cols) + " |")
        add("|" + "---|" * len(cols))
        for pop in pops:
            fl = lookup(rows, "machine", m.name, pop, "floor_ms")
            t = lookup(rows, "torch_impl", m.name, pop, "forward_ms")
            fc = lookup(rows, "machine", m.name, pop, "floor_compute_ms")
            fm = lookup(rows, "machine", m.name, pop, "floor_memory_ms")
            split = f" ({fc.median:.3g} / {fm.median:.3g})" if fc and fm else ""
            cells = [str(pop), f"{fl.median:.3g}{split}", f"{t.median:.3g}" if t else "-"]
            for i in impls:
                f = lookup(rows, i, m.name, pop, "floor_fraction")
                cells.append(f"{f.median:.1%}" if f else "-")
            if members:
                f = lookup(rows, "torch_impl", m.name, pop, "floor_fraction_members")
                cells.append(f"{f.median:.1%}" if f else "-")
            add("| " + " | ".join(cells) + " |")
        add("")

    steps = [r for r in rows if r.measure == "step_per_s"]
    if steps:
        model, pop = steps[0].model, steps[0].pop
        add(f"## One ES step: `{model}` at pop {pop}")
        add("")
        add("Noise, forward over one observation per member, fitness shaping, gradient and update. The fitness "
            "is synthetic (the sum of each member's outputs), so this times the ES machinery, not an "
            "environment. torch_impl runs ask, forward, tell; jax_reference runs one jitted function (its "
            "population forward with the EggRoll noiser, convert_fitnesses, do_updates).")
        add("")
        add("| impl | steps/s | step ms | noise ms | forward ms | tell ms | noise share of the step | "
            "steps/s with the noise cache |")
        add("|---|---|---|---|---|---|---|---|")
        for impl in IMPLS:
            s = lookup(rows, impl, model, pop, "step_per_s")
            if s is None:
                continue
            cell = lambda measure: (lambda r: f"{r.median:.3g}" if r else "-")(
                lookup(rows, impl, model, pop, measure))
            share = lookup(rows, impl, model, pop, "noise_share") or lookup(rows, impl, model, pop, "noise_share_est")
            share_s = "-" if share is None else (f"{share.median:.0%}" + (" (est.)" if share.measure.endswith("est")
                                                                          else ""))
            cached = lookup(rows, impl, model, pop, "step_cached_per_s")
            add(f"| {impl} | {fmt(s.median)} ({fmt(s.p10)}-{fmt(s.p90)}) | {cell('step_ms')} | "
                f"{cell('step_noise_ms')} | {cell('step_forward_ms')} | {cell('step_tell_ms')} | {share_s} | "
                f"{fmt(cached.median) + ' (' + fmt(cached.p10) + '-' + fmt(cached.p90) + ')' if cached else '-'} |")
        add("")
        add("With noise_reuse=0 (the presets) the noise never changes, and `sample_noise`'s optional cache "
            "(passed through `ask`) draws it once: the last column is the step with that cache warm. "
            "The other columns draw the noise every step, as the jitted reference does.")
        add("")
        add("jax_reference's noise ms is its noise drawn alone by a separately jitted function; its jitted step "
            "draws the noise inside the forward and again in do_updates (XLA may merge the two), so its share "
            "is an estimate: one such draw over the step time.")
        add("")

    gens = [r for r in rows if r.measure == "normal_ms"]
    if gens:
        model, pop = gens[0].model, gens[0].pop
        add(f"## Noise generators: the paper preset's factors ({pop // 2} pairs x (in + out, r) per layer of `{model}`)")
        add("")
        add("| generator | ms for all layers | normals/s |")
        add("|---|---|---|")
        names = {"torch_impl": "torch.randn (rng=torch)", "torch_impl_jaxrng": "torch_impl.random.normal (rng=jax)",
                 "jax_reference": "jax.random.normal (jit, vmap over keys)"}
        for r in gens:
            rate = lookup(rows, r.impl, r.model, r.pop, "normals_per_s")
            add(f"| {names.get(r.impl, r.impl)} | {r.median:.3g} ({r.p10:.3g}-{r.p90:.3g}) | "
                f"{fmt(rate.median) if rate else '-'} |")
        add("")
        add(f"- generator agreement: {ctx.agreement or 'torch_impl.random exposes no agreement measurement'}")
        add("")

    if ctx.profile:
        add("## Where torch_impl's forward spends its time (torch.profiler, 10 calls at the goal size)")
        add("")
        add("```")
        L.extend(ctx.profile)
        add("```")
        add("")

    add("## How it was measured")
    add("")
    add("- `torch_impl`: `torch_impl.model.forward` (per layer: addmm for the shared product and bias, bmm "
        "B^T x^T per antithetic pair, in-place baddbmm for the low-rank term, the bias noise, group-norm layer "
        "norm and in-place relu), with the noise as `sample_noise` returns it: grouped, one entry per pair. "
        "`torch_impl (per-member noise)`: the same forward handed the noise expanded per member "
        "(`torch_impl.noise.per_member`). `torch_impl_jaxrng`: the same forward, noise from "
        "`sample_noise(..., rng=jax)`. Forward alone gets the noise precomputed; forward+noise calls "
        "`sample_noise` then `forward` each time.")
    add("- `jax_reference`: `jax.jit(jax.vmap(MLP.forward))`; forward alone hands each member its noise "
        "(`population.make_cached_population_forward`), forward+noise lets the EggRoll noiser draw it inside "
        "the product (`make_population_forward`), which draws each antithetic pair's noise twice. "
        "Results waited for with `block_until_ready`.")
    add("- `hooks`: an `nn.Sequential` of `nn.Linear`; a context manager entered per call registers a forward "
        "hook on each Linear that looks its factors up and adds the batched low-rank term (x B by bmm, then "
        "an in-place baddbmm into the Linear's output) and the bias noise; torch_impl's activation code; "
        "no autograd (no_grad, parameters without grad).")
    add("- `materialized`: every member's `W + A_i B_i^T` formed by bmm, then one bmm with x; `loop`: a Python "
        "loop over members (small populations only).")
    add("- hooks, materialized and loop get the noise per member (expanded outside the timed call), as those "
        "styles look up a member's perturbation.")
    add("- Tests (tests/test_bench_impls.py) check every implementation against torch_impl's forward in float64 "
        "within a derived float32 rounding bound.")
    add("")
    if ctx.notes:
        add("## Notes and skipped measurements")
        add("")
        L.extend(f"- {n}" for n in ctx.notes)
        add("")
    return "\n".join(L) + "\n"
