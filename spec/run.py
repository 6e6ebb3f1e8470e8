"""What a training run returns and prints, the same on both sides (a nanoGPT-style log: one line per epoch)."""
from __future__ import annotations

import time
from typing import Iterable, Mapping, NamedTuple, TextIO

from spec.config import SOLVED_RETURN


class TrainResult(NamedTuple):
    solved: bool
    steps_to_solve: int | None
    epochs: int
    env_steps: int
    history: list[dict]   # per epoch: epoch, env_steps, mean_return, max_return, sigma, lr, grad_norm/<leaf>, wall_s


def epoch_row(epoch: int, env_steps: int, mean_return: float, max_return: float, sigma: float, lr: float,
              grad_norms: Mapping[str, float], wall_s: float) -> dict:
    """One entry of TrainResult.history."""
    row = {"epoch": epoch, "env_steps": env_steps, "mean_return": float(mean_return),
           "max_return": float(max_return), "sigma": float(sigma), "lr": float(lr)}
    row.update({f"grad_norm/{name}": float(grad_norms[name]) for name in sorted(grad_norms)})   # JAX leaf order
    row["wall_s"] = wall_s
    return row


def progress_line(row: dict) -> str:
    """`epoch    12  steps   1,234,567  mean  101.3  max   500     65,432 steps/s`."""
    rate = row["env_steps"] / max(row["wall_s"], 1e-9)
    return (f"epoch {row['epoch']:5d}  steps {row['env_steps']:>11,d}  mean {row['mean_return']:6.1f}  "
            f"max {row['max_return']:5.0f}  {rate:>9,.0f} steps/s")


def verdict_line(result: TrainResult, wall_s: float) -> str:
    """`solved in N env steps (E epochs, T s)` or `not solved within ...`."""
    if result.solved:
        return f"solved in {result.steps_to_solve:,d} env steps ({result.epochs} epochs, {wall_s:.1f} s)"
    return f"not solved within {result.env_steps:,d} env steps ({result.epochs} epochs, {wall_s:.1f} s)"


def quiet_line(result: TrainResult) -> str:
    """--quiet's one line: `steps_to_solve N` or `not solved (N steps)`."""
    return f"steps_to_solve {result.steps_to_solve}" if result.solved else f"not solved ({result.env_steps} steps)"


class Progress:
    """Prints a trainer's epochs: one line each on a file, one line rewritten in place on a terminal."""

    def __init__(self, stream: TextIO, enabled: bool = True):
        self.stream, self.enabled = stream, enabled
        self.live = enabled and stream.isatty()

    def epoch(self, row: dict) -> None:
        if self.enabled:
            line = progress_line(row)
            print(("\r" + line) if self.live else line, end="" if self.live else "\n", file=self.stream, flush=True)

    def done(self, result: TrainResult, wall_s: float) -> None:
        if self.enabled:
            print(("\n" if self.live else "") + verdict_line(result, wall_s), file=self.stream, flush=True)


def until_solved(epochs: Iterable[dict], max_env_steps: int, progress: Progress, start: float) -> TrainResult:
    """Both trainers' run: draw epoch rows (epoch_row's) while fewer than max_env_steps are spent, printing each,
    until the population's mean return reaches SOLVED_RETURN; the TrainResult (`start`: the run's perf_counter)."""
    rows, history, env_steps, solved_at = iter(epochs), [], 0, None
    while env_steps < max_env_steps:
        row = next(rows)
        env_steps = row["env_steps"]
        history.append(row)
        progress.epoch(row)
        if row["mean_return"] >= SOLVED_RETURN:
            solved_at = env_steps
            break
    result = TrainResult(solved_at is not None, solved_at, len(history), env_steps, history)
    progress.done(result, time.perf_counter() - start)
    return result
