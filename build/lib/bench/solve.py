"""Time to solve: one CartPole training run of torch_impl and of jax_reference from the same seed, per preset.

Each side trains with its own defaults (torch_impl one torch thread; jax_reference XLA's own thread pool) in
this process, one after the other, so the two wall times come from the same machine state. The env steps to
solve are part of the row: with the JAX-compatible generator they are usually identical, so the time ratio is
the cost of the same work.
"""
from __future__ import annotations

import time
from typing import NamedTuple

from spec.config import PRESETS, Config

# (preset, seed): the cpu preset at seed 0, the paper preset at the published first seed.
SOLVE_RUNS = (("cpu", 0), ("paper", 42))
QUICK_BUDGET = 20_000          # --quick: a few epochs at the cpu preset, not a solve


class SolveTime(NamedTuple):
    preset: str
    impl: str                  # torch_impl | jax_reference
    seed: int
    solved: bool
    env_steps: int             # steps to solve, or the budget spent
    wall_s: float
    cpu_s: float               # process CPU time (all threads)


def _config(preset: str, quick: bool) -> Config:
    cfg, _ = PRESETS[preset]
    return cfg.replace(max_env_steps=QUICK_BUDGET, pop=64) if quick else cfg


def solve_once(preset: str, impl: str, seed: int, device: str = "cpu", quick: bool = False) -> SolveTime:
    """Train one run and time it (compilation included: a user's run pays it too)."""
    cfg, run = _config(preset, quick), PRESETS[preset][1]
    t0, c0 = time.perf_counter(), time.process_time()
    if impl == "jax_reference":
        from jax_reference.train import train as jax_train
        result = jax_train(cfg, run, seed, progress=False)
    else:
        from spec.knobs import Knobs
        from torch_impl.train import train as torch_train
        result = torch_train(cfg, Knobs.from_run(run), seed, device=device, progress=False)
    steps = result.steps_to_solve if result.solved else result.env_steps
    return SolveTime(preset, impl, seed, bool(result.solved), int(steps), time.perf_counter() - t0,
                     time.process_time() - c0)


def time_to_solve(device: str = "cpu", quick: bool = False, log=print,
                  runs: tuple[tuple[str, int], ...] = SOLVE_RUNS) -> list[SolveTime]:
    """Both sides at every (preset, seed) of `runs`, torch first."""
    out = []
    for preset, seed in runs:
        for impl in ("torch_impl", "jax_reference"):
            r = solve_once(preset, impl, seed, device, quick)
            what = f"solved at {r.env_steps:,} steps" if r.solved else f"not solved in {r.env_steps:,} steps"
            log(f"time to solve: {preset} seed {seed} {impl}: {what} in {r.wall_s:.1f} s (cpu {r.cpu_s:.1f} s)")
            out.append(r)
    return out
