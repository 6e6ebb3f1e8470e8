"""Time to solve: one CartPole training run of torch_impl and of jax_reference from the same seed, per preset.

Each side trains with its own defaults (torch_impl one torch thread; jax_reference XLA's own thread pool) in
this process, one after the other, so the two wall times come from the same machine state. The env steps to
solve are part of the row: with the JAX-compatible generator they are usually identical, so the time ratio is
the cost of the same work. torch_impl's run is also split into phases (PhaseClock, through train's `instrument`
hook): ask, the forward inside the rollout, the rest of the rollout, tell, and whatever is left (init, logging).
"""
from __future__ import annotations

import time
from typing import NamedTuple

from spec.config import PRESETS, Config

# (preset, seed): the cpu preset at seed 0, the paper preset at the published first seed.
SOLVE_RUNS = (("cpu", 0), ("paper", 42))
QUICK_BUDGET = 20_000          # --quick: a few epochs at the cpu preset, not a solve
# The exclusive phases of a torch_impl run, from train's instrumented phases (ask, rollout, forward, tell):
# "rollout" is the rollout without its forward calls (env physics, compaction, numpy <-> torch, action choice),
# "other" the run's time outside the three loop phases (init, logging).
PHASES = ("ask", "forward", "rollout", "tell", "other")


class PhaseTime(NamedTuple):
    phase: str                 # one of PHASES
    wall_s: float
    cpu_s: float               # process CPU time


class SolveTime(NamedTuple):
    preset: str
    impl: str                  # torch_impl | jax_reference
    seed: int
    solved: bool
    env_steps: int             # steps to solve, or the budget spent
    wall_s: float
    cpu_s: float               # process CPU time (all threads)
    phases: tuple[PhaseTime, ...] = ()   # torch_impl's breakdown (PHASES); () for jax_reference


class PhaseClock:
    """train's `instrument`: wraps each named phase so that every call adds its wall and process CPU time."""

    def __init__(self):
        self.totals: dict[str, list[float]] = {}     # phase -> [wall s, cpu s], summed over calls

    def __call__(self, name: str, fn):
        total = self.totals.setdefault(name, [0.0, 0.0])

        def timed(*args, **kwargs):
            w, c = time.perf_counter(), time.process_time()
            try:
                return fn(*args, **kwargs)
            finally:
                total[0] += time.perf_counter() - w
                total[1] += time.process_time() - c
        return timed


def breakdown(totals: dict[str, list[float]], wall_s: float, cpu_s: float) -> tuple[PhaseTime, ...]:
    """The exclusive PHASES from a PhaseClock's inclusive totals and the run's own wall and CPU time."""
    get = lambda name: totals.get(name, (0.0, 0.0))                               # noqa: E731
    ask, forward, rollout, tell = get("ask"), get("forward"), get("rollout"), get("tell")
    parts = {"ask": ask, "forward": forward, "rollout": [r - f for r, f in zip(rollout, forward)], "tell": tell}
    parts["other"] = [total - a - r - t for total, a, r, t in zip((wall_s, cpu_s), ask, rollout, tell)]
    return tuple(PhaseTime(name, *parts[name]) for name in PHASES)


def _config(preset: str, quick: bool) -> Config:
    cfg, _ = PRESETS[preset]
    return cfg.replace(max_env_steps=QUICK_BUDGET, pop=64) if quick else cfg


def solve_once(preset: str, impl: str, seed: int, device: str = "cpu", quick: bool = False) -> SolveTime:
    """Train one run and time it (compilation included: a user's run pays it too)."""
    cfg, run = _config(preset, quick), PRESETS[preset][1]
    clock = PhaseClock()
    t0, c0 = time.perf_counter(), time.process_time()
    if impl == "jax_reference":
        from jax_reference.train import train as jax_train
        result = jax_train(cfg, run, seed, progress=False)
    else:
        from spec.knobs import Knobs
        from torch_impl.train import train as torch_train
        result = torch_train(cfg, Knobs.from_run(run), seed, device=device, progress=False, instrument=clock)
    wall_s, cpu_s = time.perf_counter() - t0, time.process_time() - c0
    steps = result.steps_to_solve if result.solved else result.env_steps
    phases = breakdown(clock.totals, wall_s, cpu_s) if clock.totals else ()
    return SolveTime(preset, impl, seed, bool(result.solved), int(steps), wall_s, cpu_s, phases)


def time_to_solve(device: str = "cpu", quick: bool = False, log=print,
                  runs: tuple[tuple[str, int], ...] = SOLVE_RUNS) -> list[SolveTime]:
    """Both sides at every (preset, seed) of `runs`, torch first."""
    out = []
    for preset, seed in runs:
        for impl in ("torch_impl", "jax_reference"):
            r = solve_once(preset, impl, seed, device, quick)
            what = f"solved at {r.env_steps:,} steps" if r.solved else f"not solved in {r.env_steps:,} steps"
            log(f"time to solve: {preset} seed {seed} {impl}: {what} in {r.wall_s:.1f} s (cpu {r.cpu_s:.1f} s)"
                + "".join(f"; {p.phase} {p.cpu_s:.1f}" for p in r.phases) + (" cpu s" if r.phases else ""))
            out.append(r)
    return out
