"""The GPU section's report (bench.gpu): the aims with a verdict each, per-call tables, first calls apart."""
from __future__ import annotations

import math
from typing import NamedTuple, Sequence

from bench.gpu_names import COMPILED, EAGER, FIRST_CALL_S, FORWARD_MS, GRAPHED, JAX, RATIO, STEP_TOKENS, Aim
from bench.names import CI_HIGH, CI_LOW
from bench.report import Measurement, lookup
from reporting import fmt, markdown_table


class GpuInfo(NamedTuple):
    """What the report says about the run besides the numbers."""

    command: str
    device: str                     # the GPU's name
    versions: dict[str, str]
    jax_backend: str                # jax.devices()[0].platform
    jax_precision: str              # jax_default_matmul_precision (None: the backend's default; TF32 on NVIDIA GPUs)
    seed: int
    wall_s: float
    deadline_s: float
    quick: bool
    notes: list[str]


class Verdict(NamedTuple):
    word: str                       # met, missed, undecided, not measured
    ratio: float
    ci: tuple[float, float]


def judge(rows: Sequence[Measurement], aim: Aim) -> Verdict:
    """The aim against the 95% interval of the median ratio over JAX: met above it, missed below it, else
    undecided (the interval holds the aim)."""
    r = lookup(rows, aim.impl, aim.model, aim.pop, RATIO)
    lo, hi = (lookup(rows, aim.impl, aim.model, aim.pop, RATIO + s) for s in (CI_LOW, CI_HIGH))
    if r is None or lo is None or hi is None:
        return Verdict("not measured", math.nan, (math.nan, math.nan))
    word = "met" if lo.median >= aim.target else "missed" if hi.median < aim.target else "undecided"
    return Verdict(word, r.median, (lo.median, hi.median))


def _cell(rows: Sequence[Measurement], impl: str, model: str, pop: int, measure: str) -> str:
    m = lookup(rows, impl, model, pop, measure)
    return "-" if m is None else f"{fmt(m.median)} ({fmt(m.p10)}-{fmt(m.p90)})"


def _ratio(rows: Sequence[Measurement], impl: str, model: str, pop: int) -> str:
    m = lookup(rows, impl, model, pop, RATIO)
    return "-" if m is None else f"{m.median:.2f}x ({m.p10:.2f}-{m.p90:.2f})"


def aims_section(rows: Sequence[Measurement], plan_aims: Sequence[Aim]) -> list[str]:
    table = []
    for aim in plan_aims:
        v = judge(rows, aim)
        ci = "-" if math.isnan(v.ratio) else f"{v.ci[0]:.2f}-{v.ci[1]:.2f}x"
        table.append([aim.label, "-" if math.isnan(v.ratio) else f"{v.ratio:.2f}x", ci, v.word])
    return ["## Aims (issue 35)", "",
            "torch_impl as its trainers run on CUDA (forwards replayed from CUDA graphs) over jax_reference's jit on "
            "the same GPU: the median of the round-by-round ratio (> 1: torch is faster) and its 95% interval; met "
            "when the interval lies at or above the aim, missed when below it, else undecided.", "",
            markdown_table(["aim", "torch / JAX", "95% CI", "verdict"], table), ""]


def cartpole_section(rows: Sequence[Measurement], pops: Sequence[int]) -> list[str]:
    table = [[f"{p:,}", _cell(rows, EAGER, "cartpole", p, FORWARD_MS), _cell(rows, GRAPHED, "cartpole", p, FORWARD_MS),
              _cell(rows, JAX, "cartpole", p, FORWARD_MS), _ratio(rows, GRAPHED, "cartpole", p),
              _ratio(rows, EAGER, "cartpole", p)] for p in pops]
    return ["## CartPole forward, noise given (ms per call: median, p10-p90)", "",
            markdown_table(["pop", "torch_impl eager", "torch_impl graphed", "jax_reference", "graphed / JAX",
                             "eager / JAX"], table), ""]


def step_section(rows: Sequence[Measurement], presets: dict[str, str]) -> list[str]:
    table = [[f"{model} ({preset})", *(_cell(rows, impl, model, 0, STEP_TOKENS) for impl in (GRAPHED, EAGER, JAX)),
              _ratio(rows, GRAPHED, model, 0), _ratio(rows, EAGER, model, 0)]
             for model, preset in presets.items()]
    return ["## Training steps (tokens/s: median, p10-p90)", "",
            "One step per call: epoch 0's noise, the population's scores, the update (torch_impl: ask, forward, tell; "
            "jax_reference: population_scores, update), tokens = pop x T.", "",
            markdown_table(["task", "torch_impl graphed", "torch_impl eager", "jax_reference", "graphed / JAX",
                             "eager / JAX"], table), ""]


def first_call_section(rows: Sequence[Measurement]) -> list[str]:
    firsts = [r for r in rows if r.measure == FIRST_CALL_S]
    table = [[r.impl, r.model + (f" pop {r.pop:,}" if r.pop else ""), f"{r.median:.2f}"] for r in firsts]
    compiled = lookup(rows, COMPILED, "cartpole", firsts[0].pop if firsts else 0, FORWARD_MS)
    lines = ["## First calls, apart from the per-call times", "",
             "A case's first call holds its one-off costs: capturing a CUDA graph (torch_impl graphed), compiling "
             "(jax_reference's jit, torch.compile), lazy initialisation. The tables above time later calls only.", "",
             markdown_table(["case", "group", "first call (s)"], table), ""]
    if compiled is not None:
        lines += [f"torch_impl compiled (compile=on), measured once in its own process: {compiled.median:.3f} ms per "
                  f"call after its first call.", ""]
    return lines


def summary_markdown(rows: Sequence[Measurement], info: GpuInfo, plan_aims: Sequence[Aim], pops: Sequence[int],
                     presets: dict[str, str]) -> str:
    versions = ", ".join(f"{k} {v}" for k, v in info.versions.items())
    lines = ["# GPU benchmark: torch_impl against JAX on one GPU", "",
             *(["**Quick run (tiny sizes): not a measurement.**", ""] if info.quick else []),
             f"- command: `{info.command}` (wall time {info.wall_s:.0f} s of a {info.deadline_s:.0f} s budget)",
             f"- device: {info.device}; JAX backend: {info.jax_backend}, default matmul precision "
             f"{info.jax_precision} (on NVIDIA GPUs JAX's default runs float32 matmuls as TF32; torch_impl's are "
             f"float32)",
             f"- versions: {versions}", f"- seed: {info.seed}",
             "- every case is timed in turns with the others of its group (the order rotating), so each ratio compares "
             "calls made under the same conditions", "",
             *aims_section(rows, plan_aims), *cartpole_section(rows, pops), *step_section(rows, presets),
             *first_call_section(rows)]
    if info.notes:
        lines += ["## Notes", "", *[f"- {n}" for n in info.notes], ""]
    return "\n".join(lines).rstrip() + "\n"
