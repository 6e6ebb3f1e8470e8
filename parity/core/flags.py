"""The flags every `python -m parity check --task ...` takes, built once for the cartpole, lm/tree and int8 parsers.

Each task's parser adds them with `add_task_flags` (its own defaults: --out folder, --size names, profiles, knobs)
and then its own extras (cartpole's --quick/--full, int8's --epochs, --no-c, ...). A flag a task cannot honour is
still parsed, so that `refuse` can exit 2 with a sentence saying why, before any work (argparse's "unrecognized
arguments" would not say it).
"""
from __future__ import annotations

import argparse
from typing import Mapping, Sequence

from spec.limits import device_arg, seed_arg
from spec.platform import add_reference_flags

COMMON_FLAGS = ("--out", "--seed", "--size", "--quiet", "--json", "--checks", "--device", "--reference-platform",
                "--reference-precision", "--against", "--port", "--torch", "--profile")
JSON_HELP = ("print the machine-readable result (result.json, always written beside summary.md) on stdout, and the "
             "progress and verdict lines on stderr")


def add_task_flags(p: argparse.ArgumentParser, *, out: str, sizes: Sequence[str], size_help: str,
                   profiles: Sequence[str], profile_default: str, knob_help: str, checks: Sequence[str],
                   port_help: str, against_help: str, seed_default: int | None = None,
                   size_default: str | None = None, size_choices: bool = True) -> argparse._MutuallyExclusiveGroup:
    """Add COMMON_FLAGS to `p` with the task's defaults; returns --size's mutually exclusive group (cartpole adds
    --quick and --full to it). `size_choices=False` leaves the size name to the task's own check (its message)."""
    p.add_argument("--profile", default=profile_default,
                   help=f"torch-side profile: {', '.join(profiles)} (default {profile_default})")
    p.add_argument("--torch", action="append", default=[], metavar="KNOB=VALUE",
                   help=f"torch-side knob, repeatable, applied after the profile ({knob_help})")
    p.add_argument("--port", metavar="MODULE:ATTR", help=port_help)
    p.add_argument("--out", default=out, help=f"report folder (default {out}, which git ignores)")
    seed_text = f"default {seed_default}" if seed_default is not None else "default 0, or the bundle's with --against"
    p.add_argument("--seed", type=seed_arg, default=seed_default, help=f"run seed in [0, 2**32 - 1] ({seed_text})")
    p.add_argument("--against", metavar="BUNDLE", help=against_help)
    group = p.add_mutually_exclusive_group()
    group.add_argument("--size", dest="size", default=size_default, choices=sorted(sizes) if size_choices else None,
                       help=size_help)
    p.add_argument("--device", type=device_arg, default="cpu",
                   help="torch device of the torch side: cpu, cuda or cuda:N (default cpu)")
    add_reference_flags(p)
    p.add_argument("--checks", default=None, metavar="CHECK,...",
                   help=f"comma-separated subset of {','.join(checks)} (default all)")
    p.add_argument("--quiet", action="store_true", help="no progress lines: only the verdict line")
    p.add_argument("--json", action="store_true", help=JSON_HELP)
    return group


def selected_checks(text: str | None, known: Sequence[str]) -> tuple[str, ...]:
    """--checks as a tuple in the order given (every known check when absent); ValueError naming an unknown one."""
    if text is None:
        return tuple(known)
    chosen = tuple(dict.fromkeys(c.strip() for c in text.split(",") if c.strip()))
    unknown = [c for c in chosen if c not in known]
    if unknown:
        raise ValueError(f"--checks: unknown check(s) {', '.join(unknown)}; known: {', '.join(known)}")
    if not chosen:
        raise ValueError(f"--checks: no check named; known: {', '.join(known)}")
    return chosen


def refuse(args: argparse.Namespace, task: str, reasons: Mapping[str, str]) -> None:
    """ValueError for the first flag in `reasons` ({'--port': why, ...}) that was given although `task` cannot honour
    it; the message says the task, the flag and why."""
    for flag, why in reasons.items():
        value = getattr(args, flag.lstrip("-").replace("-", "_"), None)
        if value not in (None, False, [], ()):
            raise ValueError(f"--task {task} does not take {flag}: {why}")
