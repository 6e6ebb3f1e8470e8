"""`python -m bench --device cuda`: the GPU section, bounded in time (issue 35), torch against JAX on one GPU.

Each group is timed side by side in one run (bench.measure.time_round_robin: turns, the order rotating), so its
ratios compare calls made under the same conditions:
- CartPole forward alone (noise given) at pop 2,048 and 16,384: torch_impl eager, torch_impl captured (its forward
  replayed from a CUDA graph, torch_impl.cuda_graphs) and jax_reference (its jitted forward, noise handed in);
- the byte LM's training step at the cpu preset (noise, population scores, update): torch_impl with its forwards
  captured (what `python -m torch_impl --task lm --device cuda` runs) and eager, and jax_reference's two jitted
  calls; tokens per second = pop * T per step;
- the integer LM's training step at the cpu preset: the same three (torch_impl's GEMMs on torch._int_mm).
The first call of each case (a capture, JAX's compilation) is reported apart from the per-call times. torch_impl
compiled (compile=on: torch.compile, 82 s on its first call on an H100) is measured last, once, in a subprocess
that cannot outlive the section's budget, and skipped with the reason when too little of it is left.
Aims (issue 35), each judged by the 95% interval of the round-by-round median ratio: met when it lies above the
aim, missed when below, else undecided.
"""
from __future__ import annotations

import json
import subprocess
import sys
import time
from typing import Callable, NamedTuple

import numpy as np
import torch

from bench import gpu_report
from bench.gpu_names import COMPILED, EAGER, FIRST_CALL_S, FORWARD_MS, GRAPHED, JAX, RATIO, STEP_MS, STEP_TOKENS, TORCH, \
    Aim
from bench.measure import Skipped, time_round_robin, torch_sync
from bench.report import RowLog
from bench.runners import Case, ModelSpec, forward_case, jax_device, jax_forward_case, jax_setup, make_inputs, \
    make_params, torch_noise

CARTPOLE = ModelSpec("cartpole", (4, 256, 256, 2))      # the paper preset's policy (bench.__main__.CARTPOLE)


class GpuPlan(NamedTuple):
    cartpole_pops: tuple[int, ...] = (2048, 16384)
    lm_preset: str | None = "cpu"         # None: the group is left out
    int8_preset: str | None = "cpu"
    warmup: int = 3
    repeats: int = 60
    min_repeats: int = 6
    group_budget_s: float = 12.0          # timed rounds of one group stop after this (once min_repeats done)
    max_call_s: float = 5.0
    max_first_call_s: float = 120.0
    deadline_s: float = 300.0             # the whole section, the report included
    compile_need_s: float = 110.0         # the compiled variant runs only with this much of the deadline left
    margin_s: float = 15.0                # kept for the report at the end
    quick: bool = False


GPU_FULL = GpuPlan()
GPU_QUICK = GpuPlan(cartpole_pops=(64, 128), lm_preset="selftest", int8_preset="selftest", warmup=1, repeats=3,
                    min_repeats=2, group_budget_s=0.3, max_first_call_s=60.0, deadline_s=240.0, compile_need_s=1e9,
                    margin_s=5.0, quick=True)


def aims(plan: GpuPlan) -> tuple[Aim, ...]:
    """Issue 35's aims: CartPole forward >= 1.0x JAX at each population, LM tokens/s >= 1.0x, int8 >= 0.5x."""
    steps = ((Aim("lm", 0, GRAPHED, 1.0, f"byte LM training tokens/s ({plan.lm_preset} preset) >= 1.0x JAX"),)
             if plan.lm_preset else ()) + \
        ((Aim("int8", 0, GRAPHED, 0.5, f"integer LM training tokens/s ({plan.int8_preset} preset) >= 0.5x JAX"),)
         if plan.int8_preset else ())
    return tuple(Aim("cartpole", p, GRAPHED, 1.0, f"CartPole forward at pop {p:,} >= 1.0x JAX")
                 for p in plan.cartpole_pops) + steps


# ----------------------------------------------------------------------------- cases
def graph_backend(device: torch.device, backend: Callable | None):
    """A fresh capture backend: CUDA graphs on CUDA; `backend()` where given (the CPU tests pass Emulated)."""
    from torch_impl import cuda_graphs
    return backend() if backend is not None else cuda_graphs.CudaBackend(device)


def cartpole_cases(pop: int, seed: int, device: torch.device, backend=None) -> dict[str, Case]:
    """The forward alone at `pop`: eager, replayed from a graph (its input refreshed in place), and JAX's jit."""
    from torch_impl import cuda_graphs
    from torch_impl.model import forward

    spec = CARTPOLE
    params, x = make_params(spec, seed, device), make_inputs(spec, pop, seed, device)
    noise = torch_noise(params, spec, pop, "torch", seed, device)
    graphs, static = cuda_graphs.Graphs(graph_backend(device, backend)), x.clone()

    def replayed():
        static.copy_(x)
        return graphs.run(pop, lambda: forward(params, static, noise, spec.activation))

    return {EAGER: forward_case(TORCH, params, x, noise, spec.activation, device),
            GRAPHED: Case(replayed, torch_sync(device), device.type),
            JAX: jax_forward_case(jax_setup(spec, params, seed), x.cpu().numpy(), pop)}


def lm_cases(preset: str, seed: int, device: torch.device, backend=None) -> tuple[dict[str, Case], int]:
    """One LM training step per call (epoch 0's noise, scores, update), each side; and the tokens a step scores."""
    from bench.lm import tokens
    from spec.lm import LM_PRESETS
    from torch_impl import cuda_graphs
    from torch_impl.tree import es as lm_es, lm

    cfg = LM_PRESETS[preset]
    es = lm_es.make(cfg)
    state = lm_es.init(es, seed, device)
    toks = torch.as_tensor(tokens(cfg, seed).astype(np.int64), device=device)
    graphed = cuda_graphs.GraphedCall(lm.forward, graph_backend(device, backend))

    def step(forward):
        def call():
            with torch.inference_mode():
                noise, _ = lm_es.ask(es, state)
                return lm_es.tell(es, state, noise, forward(state.params, toks, noise))[0].params
        return call

    sync = torch_sync(device)
    cases = {GRAPHED: Case(step(graphed), sync, device.type), EAGER: Case(step(lm.forward), sync, device.type),
             JAX: _jax_lm_step(cfg, seed)}
    return cases, cfg.pop * cfg.seq_len


def _jax_lm_step(cfg, seed: int) -> Case:
    import jax

    from bench.lm import tokens
    from jax_reference.lm.model import es_keys, init_lm, population_scores
    from jax_reference.lm.train import SOLVERS, make_update
    from jax_reference.noiser import EggRoll

    init = init_lm(cfg, seed)
    keys = es_keys(init.params, init.scan_map, seed)
    frozen, noiser_params = EggRoll.init_noiser(init.params, cfg.sigma, cfg.lr, solver=SOLVERS[cfg.optimizer],
                                                group_size=cfg.group_size, freeze_nonlora=cfg.freeze_nonlora,
                                                noise_reuse=cfg.noise_reuse, rank=cfg.rank)
    update = make_update(EggRoll, frozen, init.es_map, cfg.pop)
    toks = jax.numpy.asarray(tokens(cfg, seed))

    def call():
        scores = population_scores(EggRoll, frozen, noiser_params, init.params, keys, 0, toks)
        return update(noiser_params, init.params, keys, scores, jax.numpy.int32(0))

    return Case(call, jax.block_until_ready, jax_device())


def int8_inputs(cfg, seed: int) -> np.ndarray:
    """Epoch 0's (pop, T + 1) bytes of the shipped corpus in nano-egg's layout."""
    from rollout.corpus import load_corpus
    from rollout.int8_data import epoch_tokens, int8_streams, segment_offset, stream_layout, train_rows

    train_stream, _ = int8_streams(load_corpus())
    layout = stream_layout(len(train_stream), cfg)
    rows = train_rows(train_stream, layout.n_sequences, layout.segments, cfg.tokens_per_update)
    return epoch_tokens(rows, segment_offset(0, layout, cfg.tokens_per_update), cfg.tokens_per_update, cfg.pop,
                        cfg.group_size).astype(np.int64)


def int8_cases(preset: str, seed: int, device: torch.device, backend=None) -> tuple[dict[str, Case], int]:
    """One integer LM training step per call (epoch 0: noise, scores from zero states, votes), each side."""
    from spec.int8 import INT8_PRESETS
    from torch_impl import cuda_graphs
    from torch_impl.int8 import es as int8_es
    from torch_impl.int8.model import default_state, scores
    from torch_impl.int8.noise import member_view

    cfg = INT8_PRESETS[preset]
    es = int8_es.make(cfg)
    state = int8_es.init(es, seed, device)
    toks = torch.as_tensor(int8_inputs(cfg, seed), device=device)
    zero = default_state(cfg, cfg.pop, device)
    graphed = cuda_graphs.GraphedCall(scores, graph_backend(device, backend))

    def step(score):
        def call():
            with torch.inference_mode():
                noise, _ = int8_es.ask(es, state)
                s, _ = score(state.params, member_view(noise, cfg.pop), toks, zero, cfg.sigma_shift)
                return int8_es.tell(es, state, noise, s)[0].params
        return call

    sync = torch_sync(device)
    cases = {GRAPHED: Case(step(graphed), sync, device.type), EAGER: Case(step(scores), sync, device.type),
             JAX: _jax_int8_step(cfg, seed)}
    return cases, cfg.pop * cfg.tokens_per_update


def _jax_int8_step(cfg, seed: int) -> Case:
    import jax
    import jax.numpy as jnp

    from jax_reference.int8.model import EGG, QEggRoll, init_int8, population_scores, update
    from spec.int8 import thresholds

    init = init_int8(cfg, seed)
    frozen, noiser_params = QEggRoll.init_noiser(init.params, cfg.sigma_shift, thresholds(cfg)[0], noise_seed=seed,
                                                 noise_reuse=cfg.noise_reuse, rank=cfg.rank, use_clt=cfg.use_clt,
                                                 fast_fitness=cfg.fast_fitness)
    states = jnp.zeros((cfg.pop,) + EGG.default_state(init.params).shape, jnp.int8)
    toks = jnp.asarray(int8_inputs(cfg, seed))

    def call():
        s, _ = population_scores(frozen, noiser_params, init.params, init.es_tree_key, init.es_map, 0, toks, states)
        return update(frozen, noiser_params, init.params, init.es_tree_key, init.es_map, s, 0)

    return Case(call, jax.block_until_ready, jax_device())


# ----------------------------------------------------------------------------- the compiled variant, apart
def compiled_probe(pop: int, seed: int, timeout_s: float) -> dict:
    """torch_impl compiled (compile=on) at `pop` in a fresh process: its first call (the compilation) and the median
    of 20 calls after it; {"skipped": why} when it did not finish within timeout_s."""
    code = "import sys; from bench.gpu import _probe_main; _probe_main(int(sys.argv[1]), int(sys.argv[2]))"
    try:
        out = subprocess.run([sys.executable, "-c", code, str(pop), str(seed)], capture_output=True, text=True,
                             timeout=timeout_s)
    except subprocess.TimeoutExpired:
        return {"skipped": f"its first call (the compilation) did not finish within the {timeout_s:.0f} s left"}
    lines = [line for line in out.stdout.splitlines() if line.startswith("{")]
    if out.returncode or not lines:
        return {"skipped": "failed: " + ((out.stderr.strip().splitlines() or ["no output"])[-1])[:200]}
    return json.loads(lines[-1])


def _probe_main(pop: int, seed: int) -> None:
    from torch_impl.model import make_forward

    device = torch.device("cuda")
    spec = CARTPOLE
    params, x = make_params(spec, seed, device), make_inputs(spec, pop, seed, device)
    noise = torch_noise(params, spec, pop, "torch", seed, device)
    fn = make_forward(spec.activation, "highest", "on")
    with torch.no_grad():
        t0 = time.perf_counter()
        fn(params, x, noise)
        torch.cuda.synchronize()
        first = time.perf_counter() - t0
        times = []
        for _ in range(20):
            t0 = time.perf_counter()
            fn(params, x, noise)
            torch.cuda.synchronize()
            times.append(time.perf_counter() - t0)
    print(json.dumps({"first_call_s": first, "median_ms": 1e3 * float(np.median(times))}), flush=True)


# ----------------------------------------------------------------------------- the run
class GpuRun:
    """Runs the plan's groups against one deadline, collecting rows and notes."""

    def __init__(self, plan: GpuPlan, device: torch.device, seed: int, log: Callable[[str], None], backend=None):
        self.plan, self.device, self.seed, self.log, self.backend = plan, device, seed, log, backend
        self.rows, self.notes, self.start = RowLog(), [], time.perf_counter()

    def left(self) -> float:
        return self.plan.deadline_s - (time.perf_counter() - self.start)

    def group(self, model: str, pop: int, build: Callable, work: float | None = None) -> None:
        """Build and time one group (skipped, with a note, when the deadline is near); rows per case and ratios."""
        if self.left() < self.plan.margin_s + 2 * self.plan.group_budget_s:
            self.notes.append(f"{model} pop {pop}: skipped, {max(self.left(), 0):.0f} s of the "
                              f"{self.plan.deadline_s:.0f} s budget left")
            return
        cases = build()
        cases, work = cases if isinstance(cases, tuple) else (cases, work)
        p = self.plan
        # a first call (a compilation) cannot be interrupted: one slower than the time left skips its case after it
        timings, first = time_round_robin({k: (c.fn, c.sync) for k, c in cases.items()}, warmup=p.warmup,
                                          repeats=p.repeats, budget_s=min(p.group_budget_s, self.left() / 4),
                                          min_repeats=p.min_repeats, max_call_s=p.max_call_s,
                                          max_first_call_s=min(p.max_first_call_s, max(self.left() - p.margin_s, 1)))
        self.record(model, pop, cases, timings, first, work)

    def record(self, model: str, pop: int, cases: dict[str, Case], timings: dict, first: dict, work) -> None:
        done = {k: t for k, t in timings.items() if not isinstance(t, Skipped)}
        for k, t in timings.items():
            if isinstance(t, Skipped):
                self.notes.append(f"{model} pop {pop}: {k} skipped ({t.reason})")
        for k, t in done.items():
            d = cases[k].device
            self.rows.add_ms(k, model, pop, FORWARD_MS if model == "cartpole" else STEP_MS, t, d)
            if work is not None:
                self.rows.add_rate(k, model, pop, STEP_TOKENS, t, work, "tokens/s", d)
            self.rows.add_value(k, model, pop, FIRST_CALL_S, first.get(k, float("nan")), "s", d)
        for k in (GRAPHED, EAGER):
            if k in done and JAX in done:
                self.rows.add_ratio(k, model, pop, RATIO, done[k], done[JAX], cases[k].device)
        self.log(f"[{time.perf_counter() - self.start:6.1f} s] {model} pop {pop}: " + ", ".join(
            f"{k} {1e3 * t.median_s:.3f} ms (first call {first.get(k, float('nan')):.2f} s)" for k, t in done.items()))

    def compiled(self, pop: int) -> None:
        """The compiled variant once, apart, if the deadline leaves it the time its compilation needs."""
        budget = self.left() - self.plan.margin_s
        if budget < self.plan.compile_need_s:
            self.notes.append(f"{COMPILED} (compile=on) at pop {pop}: skipped, its first call compiles for about 82 s "
                              f"on an H100 (reports/bench-cuda-h100) and {max(budget, 0):.0f} s of the "
                              f"{self.plan.deadline_s:.0f} s budget were left")
            return
        result = compiled_probe(pop, self.seed, budget)
        if "skipped" in result:
            self.notes.append(f"{COMPILED} (compile=on) at pop {pop}: {result['skipped']}")
            return
        d = self.device.type
        self.rows.add_value(COMPILED, "cartpole", pop, FIRST_CALL_S, result["first_call_s"], "s", d)
        self.rows.add_value(COMPILED, "cartpole", pop, FORWARD_MS, result["median_ms"], "ms", d)
        self.log(f"{COMPILED} pop {pop}: first call {result['first_call_s']:.1f} s, then {result['median_ms']:.3f} ms")


def run(plan: GpuPlan, device: torch.device, seed: int, log: Callable[[str], None], backend=None) -> GpuRun:
    """Every group of the plan within its deadline (CartPole at each population, the LM, int8, the compiled
    variant last); `backend` (tests): a capture backend factory for a device without CUDA graphs."""
    r = GpuRun(plan, device, seed, log, backend)
    with torch.no_grad():
        for pop in plan.cartpole_pops:
            r.group("cartpole", pop, lambda pop=pop: cartpole_cases(pop, seed, device, backend))
        if plan.lm_preset is not None:
            r.group("lm", 0, lambda: lm_cases(plan.lm_preset, seed, device, backend))
        if plan.int8_preset is not None:
            r.group("int8", 0, lambda: int8_cases(plan.int8_preset, seed, device, backend))
    r.compiled(plan.cartpole_pops[0])
    return r


def write_section(plan: GpuPlan, device: torch.device, seed: int, out, command: str, log: Callable[[str], None],
                  backend=None) -> GpuRun:
    """Run the section and write bench.csv and summary.md under `out` (atomically, once everything is measured)."""
    from pathlib import Path

    from bench import report
    from reporting import atomic_write, versions

    r = run(plan, device, seed, log, backend)
    info = gpu_report.GpuInfo(command, _device_name(device), _versions(versions), *_jax_backend(), seed,
                              time.perf_counter() - r.start, plan.deadline_s, plan.quick, r.notes)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    report.write_csv(r.rows, out / "bench.csv")
    atomic_write(out / "summary.md", gpu_report.summary_markdown(
        r.rows, info, aims(plan), plan.cartpole_pops,
        {k: v for k, v in (("lm", plan.lm_preset), ("int8", plan.int8_preset)) if v}))
    return r


def _device_name(device: torch.device) -> str:
    return torch.cuda.get_device_name(device) if device.type == "cuda" else f"{device.type} (not a GPU: a test run)"


def _versions(versions: Callable) -> dict[str, str]:
    found = versions(("torch", "jax", "jaxlib", "triton", "numpy"))
    found["cuda"] = str(torch.version.cuda)
    return found


def _jax_backend() -> tuple[str, str]:
    import jax
    return jax.devices()[0].platform, str(jax.config.jax_default_matmul_precision)
