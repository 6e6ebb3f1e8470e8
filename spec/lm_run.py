"""What an LM training run returns and prints, and its command line, the same on both sides (`--task lm`).

A run trains `cfg.epochs` epochs. Epoch e: the population scores its members' windows (`rollout.corpus`), the
noiser shapes the scores and updates; then, when (e + 1) % cfg.eval_every == 0 or e is the last epoch, the
validation bits/byte of the updated, unperturbed model are measured (NaN in the other rows). One history row
per epoch:
    epoch          e (0-based)
    train_bpb      -mean(scores) of the population at epoch e (the perturbed members, before the update)
    val_bpb        bits/byte on cfg.val_windows validation windows after the update, noise off; NaN if not measured
    tokens         scored tokens so far: (e + 1) * pop * seq_len
    tokens_per_s   pop * seq_len / the seconds epoch e's scoring and update took (validation excluded; epoch 0's
                   include any compilation); tokens / wall_s for a trainer that does not time its step
    wall_s         seconds since the run started (compilation and validation included)
The progress line's time left is (epochs - e - 1) times the mean wall time of epochs 1..e (epoch 0 compiles).
"""
from __future__ import annotations

import math
import os
from typing import Any, NamedTuple, TextIO

from spec.lm import LM_PRESETS, LMConfig


class LMTrainResult(NamedTuple):
    epochs: int
    val_bpb: float          # the last measured validation bits/byte (after the last epoch)
    tokens: int             # scored tokens in all
    wall_s: float
    history: tuple          # one dict per epoch (the module docstring's fields)
    params: Any             # the final parameters (the side's own pytree / tensors)


def lm_epoch_row(epoch: int, train_bpb: float, val_bpb: float, tokens: int, wall_s: float,
                 step_tokens: int | None = None, step_s: float | None = None) -> dict:
    """One entry of LMTrainResult.history; step_tokens / step_s: the tokens this epoch scored and the seconds its
    scoring and update took (without them tokens_per_s is tokens / wall_s)."""
    rate = step_tokens / max(step_s, 1e-9) if step_s is not None else tokens / max(wall_s, 1e-9)
    return {"epoch": epoch, "train_bpb": float(train_bpb), "val_bpb": float(val_bpb), "tokens": int(tokens),
            "tokens_per_s": rate, "wall_s": float(wall_s)}


def _clock(seconds: float) -> str:
    seconds = int(round(seconds))
    return f"{seconds // 60}:{seconds % 60:02d}"


def lm_progress_line(row: dict, epochs: int, left_s: float | None = None) -> str:
    """`epoch    49/1000  train 4.842 bpb  val 4.826 bpb     371,230 tok/s  left 0:12` (val `  -  ` if not measured).

    left_s: seconds left (LMProgress.time_left; NaN prints `?`); None: wall_s / (e + 1) per epoch left.
    """
    val = f"{row['val_bpb']:.3f}" if not math.isnan(row["val_bpb"]) else "  -  "
    if left_s is None:
        left_s = row["wall_s"] / (row["epoch"] + 1) * (epochs - row["epoch"] - 1)
    left = _clock(left_s) if math.isfinite(left_s) else "?"
    return (f"epoch {row['epoch']:5d}/{epochs}  train {row['train_bpb']:.3f} bpb  val {val} bpb  "
            f"{row['tokens_per_s']:>10,.0f} tok/s  left {left}")


def lm_verdict_line(result: LMTrainResult) -> str:
    """`validation 3.412 bits/byte after 300 epochs (9,830,400 tokens, 58.1 s)`."""
    return (f"validation {result.val_bpb:.3f} bits/byte after {result.epochs} epochs "
            f"({result.tokens:,d} tokens, {result.wall_s:.1f} s)")


class LMProgress:
    """Prints an LM run's epochs: one line each on a file, one line rewritten in place on a terminal.

    On a terminal the lines with a validation figure stay; others are overwritten by the next.
    """

    def __init__(self, stream: TextIO, epochs: int, enabled: bool = True):
        self.stream, self.epochs, self.enabled = stream, epochs, enabled
        self.live = enabled and stream.isatty()
        self.first_wall = math.nan     # wall_s at the end of epoch 0 (which holds the compilation)

    def time_left(self, row: dict) -> float:
        """(epochs - e - 1) * the mean wall time of epochs 1..e (NaN after epoch 0)."""
        if row["epoch"] == 0:
            self.first_wall = row["wall_s"]
            return math.nan
        return (row["wall_s"] - self.first_wall) / row["epoch"] * (self.epochs - row["epoch"] - 1)

    def epoch(self, row: dict) -> None:
        left = self.time_left(row)
        if not self.enabled:
            return
        line = lm_progress_line(row, self.epochs, left)
        if self.live:
            end = "\n" if not math.isnan(row["val_bpb"]) else ""
            print("\r" + line, end=end, file=self.stream, flush=True)
        else:
            print(line, file=self.stream, flush=True)

    def done(self, result: LMTrainResult) -> None:
        if self.enabled:
            print(lm_verdict_line(result), file=self.stream, flush=True)


# ----------------------------------------------------------------------------- the command line (`--task lm`)
TASKS = ("cartpole", "lm")
# flag dest -> LMConfig field: the shared override flags (spec.cli) that mean something for the LM.
LM_FLAGS = {"pop": "pop", "hidden": "d_hidden", "layers": "layers", "rank": "rank", "sigma": "sigma", "lr": "lr",
            "group_size": "group_size", "noise_reuse": "noise_reuse", "optimizer": "optimizer", "epochs": "epochs"}
# flag dest -> its spelling, for the flags one task has and the other does not.
CARTPOLE_ONLY = {"max_steps": "--max-steps", "sigma_decay": "--sigma-decay", "lr_decay": "--lr-decay",
                 "activation": "--activation"}
LM_ONLY = {"epochs": "--epochs", "corpus": "--corpus"}


def add_lm_arguments(parser, tasks: tuple[str, ...] = TASKS) -> None:
    """--task (one of `tasks`), --epochs, --corpus (the LM's own flags; the shared overrides come from spec.cli)."""
    parser.add_argument("--task", choices=tasks, default="cartpole", help="what to train (default cartpole)")
    parser.add_argument("--epochs", type=int, help="--task lm: number of epochs (default: the preset's)")
    parser.add_argument("--corpus", help="--task lm: a text file to train on (default: the shipped corpus)")


def check_task_flags(args, flags: dict[str, str], task: str) -> None:
    """ValueError naming the flags that were given but do nothing for `task`."""
    given = [spelling for dest, spelling in flags.items() if getattr(args, dest, None) not in (None, False)]
    if given:
        raise ValueError(f"{', '.join(given)} {'does' if len(given) == 1 else 'do'} not apply to --task {task}")


def lm_config(args) -> LMConfig:
    """LMConfig from --preset (default cpu) and the explicit flags; ValueError on an unknown preset or bad values."""
    preset = args.preset or "cpu"
    if preset not in LM_PRESETS:
        raise ValueError(f"--preset {preset} is not an LM preset; --task lm takes {', '.join(LM_PRESETS)}")
    check_task_flags(args, CARTPOLE_ONLY, "lm")
    return LM_PRESETS[preset].replace(**{field: getattr(args, dest) for dest, field in LM_FLAGS.items()
                                         if getattr(args, dest, None) is not None})


def check_corpus_path(path: str | None) -> str | None:
    """The path if it names a non-empty file (None: the shipped corpus); ValueError saying what is wrong otherwise."""
    if path is None:
        return None
    if not os.path.exists(path):
        raise ValueError(f"--corpus {path}: no such file; give a text file of at least a few thousand bytes")
    if not os.path.isfile(path):
        raise ValueError(f"--corpus {path} is not a file; give a text file")
    if os.path.getsize(path) == 0:
        raise ValueError(f"--corpus {path} is empty; give a text file of at least a few thousand bytes")
    return path
