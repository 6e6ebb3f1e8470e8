"""`python -m bench`: population-forward and ES-step throughput, against the machine's floor.

Writes `bench.csv` (impl, model, pop, measure, median, p10, p90, unit, device), `summary.md`
(ratio tables, floors, environment) and `throughput.png` under --out. `--device cuda` runs the GPU section instead
(bench.gpu: torch against JAX on one GPU, the issue's aims, bounded by --deadline, default 300 s) and writes
`bench.csv` and `summary.md`.
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path
from typing import Callable, NamedTuple, Sequence

import torch

from bench import ceilings as ceil
from bench import names as M
from bench import busy, report, runners, solve
from bench import tree as treebench
from bench import lm as lmbench
from bench.measure import (Skipped, Timing, quantiles,
                                  time_round_robin)
from bench.report import BenchInfo, Measurement, RowLog
from bench.runners import Case, ModelSpec
from reporting import cpu_name, versions
from spec.limits import available_bytes, check_fits, check_out_dir, estimate_population_bytes, seed_arg
from torch_impl.noise import per_member

CARTPOLE = ModelSpec("cartpole", (4, 256, 256, 2))
WIDE = ModelSpec("wide", (256, 1024, 1024, 256))


class BenchPlan(NamedTuple):
    """What to measure and how long each part may take."""

    models: tuple[ModelSpec, ...]
    pops: tuple[int, ...]
    caps: dict[tuple[str, str], int]   # (impl, model) -> largest population to run it at
    warmup: int
    repeats: int
    min_repeats: int
    group_budget_s: float              # timed rounds of one group stop after this (once min_repeats done)
    max_call_s: float                  # a case slower than this per call is skipped
    max_first_call_s: float            # ... and one whose first call (JAX compiles then) is slower than this
    headline: tuple[str, int]          # (model, pop) of the goal
    step_pop: int
    gen_pairs: int
    matmul_n: int
    copy_mib: int
    deadline_s: float                  # groups not started by then are skipped (said in the summary)
    headline_repeats: int = 15         # rounds and budget of the goal size's forward group, which decides
    headline_budget_s: float = 6.0     # the goal: more rounds there narrow its ratios
    rewarm_below_s: float = 0.05       # cases faster than this make an untimed call before each timed one
    sweep: tuple[str, ...] = ()        # models swept over pops (empty: all)
    quick: bool = False                # tiny sizes for tests: not a measurement
    solve_runs: tuple[tuple[str, int], ...] = solve.SOLVE_RUNS   # (preset, seed) timed to solve; () for none
    busy_seconds: float = busy.PROBE_SECONDS   # busy-machine section: seconds timed per probe (0: skip it)
    lm_pops: tuple[int, ...] = lmbench.LM_POPS    # the byte-level LM's population forward (() skips it)
    lm_run: bool = True                # time a cpu-preset LM training run per side (one thread, fresh process)
    tree_sizes: tuple[str, ...] = treebench.TREE_SIZES   # the tree suite per size, a fresh process each (() skips)


FULL = BenchPlan(
    models=(CARTPOLE, WIDE),
    pops=(256, 1024, 2048, 4096, 8192, 16384),
    caps={("loop", "cartpole"): 1024, ("loop", "wide"): 256,
          # materialized holds pop x out x in floats per layer: 1 GiB at 4096 (cartpole), 256 (wide)
          ("materialized", "cartpole"): 4096, ("materialized", "wide"): 256},
    warmup=2, repeats=15, min_repeats=3, group_budget_s=6.0, max_call_s=2.5, max_first_call_s=120.0,
    headline=("cartpole", 2048), step_pop=2048, gen_pairs=1024,
    matmul_n=2048, copy_mib=256, deadline_s=360.0, headline_repeats=60, headline_budget_s=30.0,
)
QUICK = BenchPlan(
    models=(CARTPOLE, ModelSpec("wide", (32, 128, 128, 32))),
    pops=(64,),
    caps={("loop", "cartpole"): 64, ("loop", "wide"): 64},
    warmup=1, repeats=2, min_repeats=2, group_budget_s=0.5, max_call_s=5.0, max_first_call_s=60.0,
    headline=("cartpole", 64), step_pop=64, gen_pairs=32,
    matmul_n=256, copy_mib=8, deadline_s=120.0, headline_repeats=2, headline_budget_s=0.5, quick=True,
    solve_runs=(("cpu", 0),), busy_seconds=0.5, lm_pops=lmbench.QUICK_POPS, tree_sizes=treebench.QUICK_SIZES,
)


def _load() -> str:
    try:
        return ", ".join(f"{v:.2f}" for v in os.getloadavg())
    except OSError:
        return "unknown"


class Bench:
    """Runs the plan's groups, collecting rows and notes; skips what the deadline leaves no time for."""

    def __init__(self, plan: BenchPlan, device: torch.device, seed: int, log: Callable[[str], None]):
        self.plan, self.device, self.seed, self.log = plan, device, seed, log
        self.rows = RowLog()
        self.notes: list[str] = []
        self.start = time.perf_counter()
        self.ceilings: list[tuple[str, ceil.Ceilings]] = []
        self._jax: dict[str, runners.JaxSetup] = {}
        self._params: dict[str, dict[str, torch.Tensor]] = {}
        self._per_member: dict[tuple[str, str, str], float] = {}   # (impl, model, measure) -> s per member
        self._forward_timings: list[tuple[ModelSpec, int, dict[str, tuple[Timing, str]]]] = []

    # -------------------------------------------------------------------------------- helpers
    def elapsed(self) -> float:
        return time.perf_counter() - self.start

    def out_of_time(self, what: str) -> bool:
        if self.elapsed() > self.plan.deadline_s:
            self.notes.append(f"skipped {what}: the run's time budget ({self.plan.deadline_s:.0f} s) was spent")
            return True
        return False

    def spec(self, name: str) -> ModelSpec:
        return next(m for m in self.plan.models if m.name == name)

    def params(self, spec: ModelSpec) -> dict[str, torch.Tensor]:
        if spec.name not in self._params:
            self._params[spec.name] = runners.make_params(spec, self.seed, self.device)
        return self._params[spec.name]

    def jax(self, spec: ModelSpec) -> runners.JaxSetup:
        if spec.name not in self._jax:
            self._jax[spec.name] = runners.jax_setup(spec, self.params(spec), self.seed)
        return self._jax[spec.name]

    def allowed(self, impl: str, spec: ModelSpec, pop: int) -> bool:
        cap = self.plan.caps.get((impl, spec.name))
        return cap is None or pop <= cap

    def predicted_ok(self, impl: str, spec: ModelSpec, pop: int, measure: str) -> bool:
        """False (and a note) when the last, smaller population's time per member predicts a call
        slower than max_call_s here: such a case would be skipped after costly warm-up calls anyway."""
        per = self._per_member.get((impl, spec.name, measure))
        if per is None or per * pop <= 1.5 * self.plan.max_call_s:
            return True
        label = {M.FORWARD: "forward", M.FORWARD_NOISE: "forward+noise"}.get(measure, measure)
        self.notes.append(f"{label} {spec.name} pop {pop}: {impl} skipped "
                          f"(predicted {per * pop:.1f} s per call from smaller populations; "
                          f"{self.plan.max_call_s:g} s allowed)")
        return False

    def remember(self, impl: str, spec: ModelSpec, pop: int, measure: str, timing: Timing) -> None:
        self._per_member[(impl, spec.name, measure)] = timing.median_s / pop

    def run_group(self, label: str, cases: dict[str, Case], headline: bool = False) -> dict[str, Timing]:
        """Time the cases in turns; note skips and first-call (compile) times; return the timings."""
        p = self.plan
        timings, first = time_round_robin({k: (c.fn, c.sync) for k, c in cases.items()}, warmup=p.warmup,
                                          repeats=p.headline_repeats if headline else p.repeats,
                                          budget_s=p.headline_budget_s if headline else p.group_budget_s,
                                          min_repeats=p.min_repeats, max_call_s=p.max_call_s,
                                          max_first_call_s=p.max_first_call_s, rewarm_below_s=p.rewarm_below_s)
        done = {}
        for name, t in timings.items():
            if isinstance(t, Skipped):
                self.notes.append(f"{label}: {name} skipped ({t.reason})")
            else:
                done[name] = t
        self.log(f"[{self.elapsed():6.1f} s] {label}: " + ", ".join(
            f"{k} {1e3 * t.median_s:.2f} ms (first call {first.get(k, float('nan')):.2f} s)" for k, t in done.items()))
        return done

    # -------------------------------------------------------------------------------- parts
    def measure_ceilings(self, when: str) -> None:
        scale = 4 if self.device.type == "cuda" else 1     # a GPU needs larger problems to reach its peaks
        c = ceil.measure_ceilings(self.device, scale * self.plan.matmul_n, scale * self.plan.copy_mib)
        self.ceilings.append((when, c))
        dev = self.device.type
        for measure, s, unit in ((M.MATMUL, c.matmul_gflops, "GFLOP/s"), (M.COPY, c.copy_gbps, "GB/s")):
            self.rows.append(Measurement("machine", "-", 0, f"{measure}_{when}", s.median, s.p10, s.p90, unit, dev))
        self.log(f"[{self.elapsed():6.1f} s] ceilings ({when}): matmul {c.matmul_gflops.median:.1f} "
                 f"(p90 {c.matmul_gflops.p90:.1f}) GFLOP/s, copy {c.copy_gbps.median:.1f} (p90 {c.copy_gbps.p90:.1f}) GB/s")

    def best_ceilings(self) -> ceil.Ceilings:
        """The highest rates seen in any ceiling measurement (a ceiling is what the machine can do)."""
        mm = max((c.matmul_gflops for _, c in self.ceilings), key=lambda s: s.p90)
        cp = max((c.copy_gbps for _, c in self.ceilings), key=lambda s: s.p90)
        return ceil.Ceilings(mm, cp)

    def forward_group(self, spec: ModelSpec, pop: int, extra: Sequence[str] = ()) -> None:
        """Forward alone (fixed noise) for every implementation allowed at this size."""
        if self.out_of_time(f"forward {spec.name} pop {pop}"):
            return
        params = self.params(spec)
        x = runners.make_inputs(spec, pop, self.seed, self.device)
        noise = runners.torch_noise(params, spec, pop, "torch", self.seed, self.device)
        # Expanded per member once for all the cases that read it so (forward_case's per_member is then a
        # no-op): at pop 16384 one copy is ~270 MB.
        members = per_member(noise)
        cases: dict[str, Case] = {}
        measure = M.FORWARD
        for impl in ("torch_impl", "torch_impl_members", "hooks", "materialized", "loop"):
            if self.allowed(impl, spec, pop) and self.predicted_ok(impl, spec, pop, measure):
                cases[impl] = runners.forward_case(impl, params, x, noise if impl == "torch_impl" else members,
                                                   spec.activation, self.device)
        if "torch_impl_jaxrng" in extra:
            jnoise = runners.torch_noise(params, spec, pop, "jax", self.seed, self.device)
            cases["torch_impl_jaxrng"] = runners.forward_case("torch_impl_jaxrng", params, x, jnoise,
                                                              spec.activation, self.device)
        for impl in (i for i in extra if i in runners.KNOB_IMPLS):
            cases[impl] = runners.forward_case(impl, params, x, noise, spec.activation, self.device)
        if self.allowed("jax_reference", spec, pop) and self.predicted_ok("jax_reference", spec, pop, measure):
            cases["jax_reference"] = runners.jax_forward_case(self.jax(spec), x.cpu().numpy(), pop)
        timings = self.run_group(f"forward {spec.name} pop {pop}", cases, headline=(spec.name, pop) == self.plan.headline)
        self.add_paired_ratios(spec, pop, timings, M.FORWARD_RATIO, cases)
        members, hooks = timings.get("torch_impl_members"), timings.get("hooks")
        if members is not None and "torch_impl" in timings:
            self.rows.add_ratio("torch_impl", spec.name, pop, M.LAYOUT_RATIO, timings["torch_impl"], members,
                           cases["torch_impl"].device)
        if members is not None and hooks is not None:
            self.rows.add_ratio("hooks", spec.name, pop, M.MEMBERS_RATIO, members, hooks, cases["hooks"].device)
        for impl, t in timings.items():
            d = cases[impl].device
            self.remember(impl, spec, pop, measure, t)
            # torch_impl handed per-member noise is a measure of torch_impl, not an implementation of its own.
            members_row = impl == "torch_impl_members"
            row_impl = "torch_impl" if members_row else impl
            self.rows.add_rate(row_impl, spec.name, pop, M.FORWARD_MEMBERS if members_row else M.FORWARD, t, pop,
                          "evals/s", d)
            self.rows.add_ms(row_impl, spec.name, pop, M.FORWARD_MEMBERS_MS if members_row else M.FORWARD_MS, t, d)
        self._forward_timings.append((spec, pop, {i: (t, cases[i].device) for i, t in timings.items()}))

    def add_paired_ratios(self, spec: ModelSpec, pop: int, timings: dict[str, Timing], measure: str,
                          cases: dict[str, Case]) -> None:
        """torch_impl's speed over each other implementation's, round by round (`measure` rows, unit x)."""
        base = timings.get("torch_impl")
        if base is None:
            return
        for impl, t in timings.items():
            if impl != "torch_impl" and impl != "torch_impl_members" and ":" not in impl:
                self.rows.add_ratio(impl, spec.name, pop, measure, base, t, cases[impl].device)

    def add_floors(self) -> None:
        """Floor rows and each forward's fraction of its floor, from the best ceilings of the whole run."""
        best = self.best_ceilings()
        dev = self.device.type
        for spec, pop, timings in self._forward_timings:
            # The benchmark's noise is antithetic (interleaved pairs): pop / 2 distinct draws are the least to read.
            work = ceil.forward_work(spec.sizes, pop, spec.rank, draws=pop // 2)
            floor = ceil.floor_seconds(work, best)
            self.rows.add_value("machine", spec.name, pop, M.FLOOR_MS, 1e3 * floor, "ms", dev)
            self.rows.add_value("machine", spec.name, pop, M.FLOOR_COMPUTE_MS, 1e3 * work.flops / best.peak_flops, "ms", dev)
            self.rows.add_value("machine", spec.name, pop, M.FLOOR_MEMORY_MS, 1e3 * work.bytes / best.peak_bytes, "ms", dev)
            self.rows.add_value("machine", spec.name, pop, M.FLOOR_EVALS, pop / floor, "evals/s", dev)
            for impl, (t, d) in timings.items():
                s = quantiles([floor / sec for sec in t.seconds])
                row_impl, measure = (("torch_impl", M.FLOOR_FRACTION_MEMBERS) if impl == "torch_impl_members"
                                     else (impl, M.FLOOR_FRACTION))
                self.rows.append(Measurement(row_impl, spec.name, pop, measure, s.median, s.p10, s.p90, "fraction", d))

    def forward_noise_group(self, spec: ModelSpec, pop: int, with_noise_alone: bool = False) -> None:
        """Noise generation plus the forward, per call, for torch_impl (both generators) and the reference."""
        if self.out_of_time(f"forward+noise {spec.name} pop {pop}"):
            return
        params = self.params(spec)
        x = runners.make_inputs(spec, pop, self.seed, self.device)
        measure = M.FORWARD_NOISE
        impls = [i for i in ("torch_impl", "torch_impl_jaxrng") if self.predicted_ok(i, spec, pop, measure)]
        cases = {i: runners.forward_noise_case(i, params, x, spec, pop, self.seed, self.device) for i in impls}
        if self.predicted_ok("jax_reference", spec, pop, measure):
            cases["jax_reference"] = runners.jax_forward_noise_case(self.jax(spec), x.cpu().numpy())
        if with_noise_alone:
            for i in impls:
                cases[i + ":noise"] = runners.noise_case(i, params, spec, pop, self.seed, self.device)
            cases["jax_reference:noise"] = runners.jax_noise_case(self.jax(spec), pop)
        timings = self.run_group(f"forward+noise {spec.name} pop {pop}", cases)
        self.add_paired_ratios(spec, pop, timings, M.FORWARD_NOISE_RATIO, cases)
        for name, t in timings.items():
            impl, _, what = name.partition(":")
            d = cases[name].device
            if what == "noise":
                self.rows.add_ms(impl, spec.name, pop, M.NOISE_MS, t, d)
            else:
                self.remember(impl, spec, pop, measure, t)
                self.rows.add_rate(impl, spec.name, pop, measure, t, pop, "evals/s", d)
                self.rows.add_ms(impl, spec.name, pop, M.FORWARD_NOISE_MS, t, d)

    def step_group(self, spec: ModelSpec, pop: int) -> None:
        """One full ES step per call, and torch_impl's step in pieces (noise, forward, tell)."""
        if self.out_of_time(f"ES step {spec.name} pop {pop}"):
            return
        cases: dict[str, Case] = {}
        for impl, rng in (("torch_impl", "torch"), ("torch_impl_jaxrng", "jax")):
            parts = runners.torch_step_cases(spec, pop, rng, self.seed, self.device)
            for piece in ("step", "step_cached", "noise", "forward", "tell"):
                cases[f"{impl}:{piece}"] = getattr(parts, piece)
        setup = self.jax(spec)
        x = runners.make_inputs(spec, pop, self.seed, self.device).cpu().numpy()
        cases["jax_reference:step"] = runners.jax_step_case(setup, x, pop)
        cases["jax_reference:noise"] = runners.jax_noise_case(setup, pop)
        timings = self.run_group(f"ES step {spec.name} pop {pop}", cases)
        for name, t in timings.items():
            impl, _, piece = name.partition(":")
            d = cases[name].device
            if piece in M.STEP_RATES:
                self.rows.add_rate(impl, spec.name, pop, M.STEP_RATES[piece], t, 1.0, "steps/s", d)
            self.rows.add_ms(impl, spec.name, pop, M.STEP_MS[piece], t, d)
        for impl in ("torch_impl", "torch_impl_jaxrng", "jax_reference"):
            step, noise = timings.get(f"{impl}:step"), timings.get(f"{impl}:noise")
            if step is None or noise is None:
                continue
            # The reference's jitted step draws the noise inside (forward and update, which XLA may merge):
            # one separately timed draw over the step is an estimate, not a measured share.
            measure = M.NOISE_SHARE_EST if impl == "jax_reference" else M.NOISE_SHARE
            self.rows.add_value(impl, spec.name, pop, measure, min(1.0, noise.median_s / step.median_s),
                           "fraction", cases[f"{impl}:step"].device)

    def busy_group(self) -> None:
        """The goal-size forward alone and beside CPU-bound competitors, each implementation in a fresh process."""
        if not self.plan.busy_seconds or self.device.type != "cpu":
            if self.plan.busy_seconds:
                self.notes.append("busy-machine section: CPU only (it loads CPU cores); skipped on " + self.device.type)
            return
        model, pop = self.plan.headline
        for p in busy.measure(pop, self.seed, self.log, self.plan.busy_seconds):
            s = quantiles([1e3 * t for t in p.seconds])
            self.rows.append(Measurement(p.impl, model, pop, M.BUSY_MS if p.busy else M.ALONE_MS, s.median, s.p10,
                                         s.p90, "ms", "cpu"))

    def solve_group(self) -> None:
        """Time to solve at each preset, torch_impl then jax_reference (after the throughput groups: no deadline)."""
        if not self.plan.solve_runs:
            return
        runs = tuple((preset, seed) for preset, seed in self.plan.solve_runs)
        times = solve.time_to_solve(self.device.type, self.plan.quick, self.log, runs)
        self.rows.extend(solve_rows(times, str(self.device)))

    def lm_group(self, pop: int) -> None:
        """The LM's population forward: torch_impl alone and with its rng=jax draws, against JAX's jit."""
        if self.out_of_time(f"LM forward pop {pop}"):
            return
        cfg = lmbench.lm_config(pop, self.plan.quick)
        cases = lmbench.torch_cases(cfg, self.seed, self.device)
        cases["jax_reference"] = lmbench.jax_case(cfg, self.seed)
        timings = self.run_group(f"LM forward pop {pop}", cases)
        model, n_tokens = "lm", pop * cfg.seq_len
        floor = lmbench.forward_flops(cfg) / self.best_ceilings().peak_flops
        self.rows.add_value("machine", model, pop, M.LM_FLOOR_MS, 1e3 * floor, "ms", self.device.type)
        for impl, t in timings.items():
            d = cases[impl].device
            self.rows.add_rate(impl, model, pop, M.LM_TOKENS, t, n_tokens, "tokens/s", d)
            self.rows.add_ms(impl, model, pop, M.LM_MS, t, d)
            s = quantiles([floor / sec for sec in t.seconds])
            self.rows.append(Measurement(impl, model, pop, M.LM_FLOOR_FRACTION, s.median, s.p10, s.p90, "fraction", d))
        jax_t = timings.get("jax_reference")
        for impl in ("torch_impl", "torch_impl+noise"):
            if impl in timings and jax_t is not None:
                self.rows.add_ratio(impl, model, pop, M.LM_RATIO, timings[impl], jax_t, cases[impl].device)

    def lm_run_group(self) -> None:
        """A cpu-preset LM training run per side, each in a fresh one-thread process (compilation included)."""
        if not self.plan.lm_run or self.device.type != "cpu":
            return
        for impl in ("torch_impl", "jax_reference"):
            r = lmbench.run_time(impl, self.plan.quick)
            self.log(f"LM run ({'selftest' if self.plan.quick else lmbench.RUN_PRESET} preset, one thread): {impl} "
                     f"{r.wall_s:.1f} s, validation {r.val_bpb:.3f} bits/byte" + ("" if r.ok else f" ({r.note})"))
            if not r.ok:
                self.notes.append(f"LM run {impl}: {r.note}")
            self.rows.add_value(impl, "lm:run", 0, M.LM_RUN_S, r.wall_s, "s", "cpu")
            self.rows.add_value(impl, "lm:run", 0, M.LM_RUN_BPB, r.val_bpb, "bits/byte", "cpu")

    def tree_group(self) -> None:
        """The tree suite on each size of the example GPT, each in a fresh process (bench.tree), stopped past twice
        the aim's time or 90% of the memory available at the start."""
        guard = treebench.memory_guard(available_bytes())
        for size in self.plan.tree_sizes:
            run = treebench.run_size(size, max_rss=guard)
            self.log(f"tree suite {size}: {treebench.verdict(run)}, {run.process.wall_s:.1f} s, peak RSS "
                     f"{run.process.peak_rss / 2 ** 30:.2f} GiB")
            if run.process.stopped or run.process.exit_code not in (0, 1):
                tail = run.process.output.strip().splitlines()[-1:] or ["no output"]
                self.notes.append(f"tree suite {size}: {treebench.verdict(run)} ({tail[0]})")
            self.rows.extend(tree_rows(run))

    def generator_group(self, spec: ModelSpec, pairs: int) -> None:
        """The paper preset's factor draws by torch.randn, torch_impl.random.normal and jax.random.normal."""
        if self.out_of_time("generator comparison"):
            return
        cases = runners.generator_cases(spec, pairs, self.seed, self.device)
        n = sum(pairs * a * b for a, b in runners.factor_shapes(spec))
        timings = self.run_group(f"normals {spec.name} {pairs} pairs", cases)
        for impl, t in timings.items():
            self.rows.add_ms(impl, spec.name, 2 * pairs, M.NORMAL_MS, t, cases[impl].device)
            self.rows.add_rate(impl, spec.name, 2 * pairs, M.NORMALS, t, n, "normals/s", cases[impl].device)


def solve_rows(times: list[solve.SolveTime], device: str) -> list[Measurement]:
    """Each training run as rows: its wall time, CPU time and env steps (model `solve:<preset>`, pop = its pop), and
    torch_impl's phases' wall and CPU times."""
    rows = []
    for t in times:
        pop = solve._config(t.preset, False).pop
        for measure, value, unit in ((M.SOLVE_S, t.wall_s, "s"), (M.SOLVE_CPU_S, t.cpu_s, "s"),
                                     (M.SOLVE_STEPS, float(t.env_steps) if t.solved else float("nan"), "steps")):
            rows.append(Measurement(t.impl, f"solve:{t.preset}", pop, measure, value, value, value, unit, device))
        for p in t.phases:
            for measure, value in ((M.SOLVE_PHASE_S + p.phase, p.wall_s), (M.SOLVE_PHASE_CPU_S + p.phase, p.cpu_s)):
                rows.append(Measurement(t.impl, f"solve:{t.preset}", pop, measure, value, value, value, "s", device))
    return rows


def tree_rows(run: treebench.TreeRun) -> list[Measurement]:
    """One size's tree-suite run as rows (impl parity_tree, model = the factory, pop = its population, 0 where its
    report gave none): wall seconds, peak RSS in GiB, parameters, exit code (nan when stopped), each check's
    seconds."""
    p, nan = run.process, float("nan")
    values = [(M.TREE_S, p.wall_s, "s"), (M.TREE_RSS, p.peak_rss / 2 ** 30, "GiB"),
              (M.TREE_PARAMS, float(run.params) if run.params else nan, "parameters"),
              (M.TREE_EXIT, nan if p.exit_code is None else float(p.exit_code), "code")]
    values += [(M.TREE_CHECK_S + check, s, "s") for check, s in run.checks.items()]
    return [Measurement("parity_tree", run.size, run.pop or 0, measure, v, v, v, unit, "cpu")
            for measure, v, unit in values]


def profile_forward(spec: ModelSpec, pop: int, device: torch.device, seed: int) -> list[str]:
    """torch.profiler's top operators of torch_impl's forward (10 calls), as table lines."""
    params = runners.make_params(spec, seed, device)
    x = runners.make_inputs(spec, pop, seed, device)
    noise = runners.torch_noise(params, spec, pop, "torch", seed, device)
    case = runners.forward_case("torch_impl", params, x, noise, spec.activation, device)
    case.sync(case.fn())
    with torch.profiler.profile() as prof:
        for _ in range(10):
            case.sync(case.fn())
    table = prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=10)
    return table.splitlines()


def run(plan: BenchPlan, device: torch.device, seed: int, log: Callable[[str], None]) -> tuple[list[Measurement], BenchInfo]:
    """Measure everything the plan asks for; return the rows and the summary's context."""
    load_before = _load()
    bench = Bench(plan, device, seed, log)
    with torch.no_grad():
        bench.measure_ceilings("start")
        head_model, head_pop = plan.headline
        head = bench.spec(head_model)
        bench.forward_group(head, head_pop, extra=("torch_impl_jaxrng", *runners.KNOB_IMPLS))
        bench.forward_noise_group(head, head_pop, with_noise_alone=True)
        bench.step_group(head, plan.step_pop)
        bench.generator_group(head, plan.gen_pairs)
        profile = profile_forward(head, head_pop, device, seed)
        # Populations outer, models inner: a run cut short by its deadline still covers every model.
        for pop in plan.pops:
            for spec in plan.models:
                if (plan.sweep and spec.name not in plan.sweep) or (spec.name, pop) == plan.headline:
                    continue
                bench.forward_group(spec, pop)
                bench.forward_noise_group(spec, pop)
        bench.measure_ceilings("end")
        bench.add_floors()
        for pop in plan.lm_pops:
            bench.lm_group(pop)
    bench.lm_run_group()
    bench.busy_group()
    bench.solve_group()
    bench.tree_group()
    agreement = runners.agreement_report(1 << 16 if plan.quick else 1 << 20)
    log(f"generator agreement: {agreement}")
    ctx = BenchInfo(
        command="", device=str(device), jax_device=runners.jax_device(), threads=torch.get_num_threads(),
        cpu=(cpu_name() if device.type == "cpu" else torch.cuda.get_device_name(device))
        + f"; process may run on cores {_cores()} of {os.cpu_count()}",
        versions=versions(("torch", "jax", "numpy")), load_before=load_before, load_after=_load(), wall_s=bench.elapsed(),
        quick=plan.quick, models=plan.models, ceilings=bench.ceilings, notes=bench.notes,
        agreement=agreement, profile=profile,
    )
    return bench.rows, ctx


def restrict(plan: BenchPlan, models: str | None, pops: str | None) -> BenchPlan:
    """The plan's sweep limited to the named models and populations (the goal size is always measured)."""
    if models is not None:
        names = [m.strip() for m in models.split(",") if m.strip()]
        known = {m.name for m in plan.models}
        unknown = sorted(set(names) - known)
        if unknown or not names:
            raise ValueError(f"--models takes names from {sorted(known)}, got {models!r}")
        plan = plan._replace(sweep=tuple(names))
    if pops is not None:
        try:
            values = tuple(int(p) for p in pops.split(",") if p.strip())
        except ValueError:
            values = ()
        if not values or any(p < 2 or p % 2 for p in values):
            raise ValueError(f"--pops takes even integers >= 2 separated by commas (antithetic pairs), got {pops!r}")
        plan = plan._replace(pops=values)
    return plan


def solve_plan(text: str | None, default: tuple[tuple[str, int], ...]) -> tuple[tuple[str, int], ...]:
    """--solve: comma-separated presets (each at its seed from solve.SOLVE_RUNS, else 0), or none."""
    if text is None:
        return default
    if text.strip() == "none":
        return ()
    seeds = dict(solve.SOLVE_RUNS)
    names = [n.strip() for n in text.split(",") if n.strip()]
    from spec.config import PRESETS
    unknown = [n for n in names if n not in PRESETS]
    if unknown or not names:
        raise ValueError(f"--solve takes presets from {sorted(PRESETS)} or none, got {text!r}")
    return tuple((n, seeds.get(n, 0)) for n in names)


def check_bench_memory(plan: BenchPlan, device: str) -> None:
    """Refuse populations whose forward cannot fit: the largest swept population on each model (3x for the noise
    copies the cases hold side by side), against the device's free memory."""
    if device == "cuda":
        available, where = torch.cuda.mem_get_info()[0], "the GPU"
    else:
        available, where = available_bytes(), "this machine"
    for spec in plan.models:
        if plan.sweep and spec.name not in plan.sweep:
            continue
        pop = max(plan.pops)
        est = estimate_population_bytes(pop, spec.sizes, spec.rank)
        est = est._replace(total=3 * est.total, parts={k: 3 * v for k, v in est.parts.items()})
        check_fits(estimate=est, pop=pop, available=available, where=where)


def _cores() -> list[int]:
    """The cores this process may run on (all of them where the OS cannot say)."""
    getter = getattr(os, "sched_getaffinity", None)
    return sorted(getter(0)) if getter else list(range(os.cpu_count() or 1))


def pin_threads(n: int) -> list[int]:
    """torch.set_num_threads(n) and pin every thread of this process to the first n allowed cores, so
    that JAX's thread pool (which no setting limits reliably) runs on the same cores. Returns the cores."""
    if not hasattr(os, "sched_setaffinity"):
        raise ValueError("--threads pins the process to cores, which this OS does not offer; leave it out")
    allowed = _cores()
    if not 1 <= n <= len(allowed):
        raise ValueError(f"--threads must be between 1 and {len(allowed)} (the cores this process may use), got {n}")
    cores = allowed[:n]
    for tid in os.listdir("/proc/self/task"):
        try:
            os.sched_setaffinity(int(tid), cores)
        except OSError:
            pass
    torch.set_num_threads(n)
    return cores


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m bench", description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cpu", help="torch device: cpu or cuda (default cpu)")
    ap.add_argument("--quick", action="store_true", help="tiny sizes and few repeats (for tests)")
    ap.add_argument("--out", default="runs/bench", help="output folder (default runs/bench, which git ignores; the published report is reports/bench)")
    ap.add_argument("--seed", type=seed_arg, default=0, help="seed of params, inputs and noise, in [0, 2**32 - 1] "
                                                               "(default 0)")
    ap.add_argument("--threads", type=int, default=None,
                    help="torch threads, and pin the whole process (JAX's threads too) to that many cores; "
                         "default: torch's own choice, no pinning. --threads 1 compares both sides on one "
                         "core, which holds up best on a machine shared with other jobs")
    ap.add_argument("--models", default=None,
                    help="comma-separated subset of the plan's models (cartpole, wide); default all")
    ap.add_argument("--pops", default=None,
                    help="comma-separated populations to sweep (default: 256,...,16384; quick: 64); the goal "
                         "size (cartpole at 2048) is always measured")
    ap.add_argument("--solve", default=None,
                    help="presets timed to solve, torch_impl against jax_reference (default cpu,paper; 'none' "
                         "skips them; the paper run costs about 5 minutes of 2 cores)")
    ap.add_argument("--busy-seconds", type=float, default=None,
                    help="busy-machine section: seconds timed per probe (default 5, quick 0.5; 0 skips the section)")
    ap.add_argument("--tree-sizes", default=None,
                    help="the tree suite's sizes, comma-separated from " + ", ".join(treebench.TREE_SIZES) +
                         " (examples.gpt_adapter's factories; default all, about 6 minutes of 2 cores, quick: "
                         "GPTAdapter), or none")
    ap.add_argument("--deadline", type=float, default=None,
                    help="seconds after which remaining groups are skipped (default: 360, quick 120); with --device "
                         "cuda the whole section's bound (default 300)")
    return ap.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    try:
        args = parse_args(argv)
    except SystemExit as exit_:
        return int(exit_.code or 0)
    if args.device not in ("cpu", "cuda"):
        print(f"error: --device must be cpu or cuda, got {args.device!r}", file=sys.stderr)
        return 2
    if args.device == "cuda" and not torch.cuda.is_available():
        print("error: --device cuda asked for, but torch sees no CUDA device; use --device cpu", file=sys.stderr)
        return 2
    if args.deadline is not None and not args.deadline > 0:
        print(f"error: --deadline must be > 0 seconds, got {args.deadline}", file=sys.stderr)
        return 2
    if args.threads is not None:
        try:
            pin_threads(args.threads)
        except ValueError as err:
            print(f"error: {err}", file=sys.stderr)
            return 2
    if args.device == "cuda":
        return main_gpu(args, argv)
    plan = QUICK if args.quick else FULL
    if args.deadline is not None:
        plan = plan._replace(deadline_s=args.deadline)
    if args.busy_seconds is not None:
        if args.busy_seconds < 0:
            print(f"error: --busy-seconds must be >= 0, got {args.busy_seconds}", file=sys.stderr)
            return 2
        plan = plan._replace(busy_seconds=args.busy_seconds)
    try:
        plan = restrict(plan, args.models, args.pops)
        plan = plan._replace(solve_runs=solve_plan(args.solve, plan.solve_runs),
                             tree_sizes=treebench.check_sizes(args.tree_sizes, plan.quick))
    except ValueError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    try:
        check_out_dir(args.out)
        check_bench_memory(plan, args.device)
    except ValueError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    rows, ctx = run(plan, torch.device(args.device), args.seed, lambda m: print(m, flush=True))
    command = "python -m bench " + " ".join(argv if argv is not None else sys.argv[1:])
    ctx = ctx._replace(command=command.strip())
    report.write_csv(rows, out / "bench.csv")
    report.plot_throughput(rows, [m.name for m in plan.models], out / "throughput.png")
    (out / "summary.md").write_text(report.summary_markdown(rows, ctx))
    print(f"wrote {out / 'bench.csv'}, {out / 'summary.md'}, {out / 'throughput.png'} in {ctx.wall_s:.0f} s")
    return 0


CPU_ONLY_FLAGS = {"solve": "--solve", "busy_seconds": "--busy-seconds", "models": "--models",
                  "tree_sizes": "--tree-sizes"}


def main_gpu(args: argparse.Namespace, argv: Sequence[str] | None) -> int:
    """--device cuda: the GPU section (bench.gpu), its input checked before any work."""
    os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")   # JAX beside torch on one GPU: allocate as used
    from bench import gpu

    given = [flag for dest, flag in CPU_ONLY_FLAGS.items() if getattr(args, dest, None) is not None]
    plan = gpu.GPU_QUICK if args.quick else gpu.GPU_FULL
    try:
        if given:
            raise ValueError(f"{', '.join(given)} belong to the CPU bench; the GPU section (--device cuda) takes "
                             f"--pops, --deadline, --seed, --quick, --threads and --out")
        if args.pops is not None:
            plan = plan._replace(cartpole_pops=restrict(FULL, None, args.pops).pops)
        if args.deadline is not None:
            plan = plan._replace(deadline_s=args.deadline)
        check_out_dir(args.out)
        check_bench_memory(FULL._replace(pops=plan.cartpole_pops, models=(CARTPOLE,)), "cuda")
    except ValueError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    command = ("python -m bench " + " ".join(argv if argv is not None else sys.argv[1:])).strip()
    r = gpu.write_section(plan, torch.device("cuda"), args.seed, args.out, command, lambda m: print(m, flush=True))
    print(f"wrote {Path(args.out) / 'bench.csv'}, {Path(args.out) / 'summary.md'} in "
          f"{time.perf_counter() - r.start:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
