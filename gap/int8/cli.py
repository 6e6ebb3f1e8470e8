"""`python -m gap --task int8`: the integer study (gap.int8.study), resumable, then its report (gap.int8.report).

Exit status: 0 complete, 1 some runs failed (rerun to retry them), 2 bad usage or input, 130 interrupted.
"""
from __future__ import annotations

import argparse
import os
import shlex
import sys
import time

from gap import executors
from gap.int8 import study as int8_study
from gap.lm import study as lm_study
from reporting import cpu_name


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m gap --task int8", description=__doc__.splitlines()[0])
    p.add_argument("--task", choices=("int8",), default="int8")
    p.add_argument("--epochs", type=int, default=None, help="epochs per run (default: the cpu preset's 800)")
    p.add_argument("--seeds", type=int, default=int8_study.SEEDS,
                   help=f"seeds per design point (default {int8_study.SEEDS}): 42, 142, ...")
    p.add_argument("--corpus", default=None, help="the corpus file (default: the shipped rollout/data/corpus.txt)")
    p.add_argument("--workers", type=int, default=None, help="parallel runs, one thread each (default: CPU count)")
    p.add_argument("--out", default="runs/gap-int8", help="output folder, reused to resume (default runs/gap-int8)")
    p.add_argument("--from", dest="from_dir", default=None,
                   help="a study folder whose finished runs seed --out (nothing is retrained), e.g. reports/gap-int8")
    p.add_argument("--resamples", type=int, default=10_000, help="bootstrap resamples (default 10000)")
    p.add_argument("--plan", action="store_true", help="print the design and run count, train nothing")
    p.add_argument("--report-only", action="store_true", help="write the report from the runs on disk")
    p.add_argument("--note", action="append", default=[],
                   help="a line for the report's run section, e.g. where imported runs were trained (repeatable)")
    return p


def check_inputs(args) -> None:
    """Everything that can be refused before any work (ValueError with what would be right)."""
    if args.seeds < 2:
        raise ValueError(f"--seeds must be >= 2 (an effect needs a spread), got {args.seeds}")
    if args.resamples < 100:
        raise ValueError(f"--resamples must be >= 100, got {args.resamples}")
    lm_study.check_run_inputs(args, "reports/gap-int8")


def main(argv: list[str] | None = None, trainer=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(argv)
    try:
        check_inputs(args)
        cfg = int8_study.default_config()
        cfg = cfg if args.epochs is None else cfg.replace(epochs=args.epochs)
        specs = int8_study.plan(cfg, args.seeds, args.corpus)
    except ValueError as err:
        print(f"gap: {err}", file=sys.stderr)
        return 2
    workers = args.workers or os.cpu_count() or 1
    if args.plan:
        for arm in int8_study.arms():
            print(f"{arm.name}: {args.seeds} seeds")
        print(f"{len(specs)} runs ({len(int8_study.arms())} design points x {args.seeds} seeds) at the "
              f"{int8_study.PRESET} preset, {cfg.epochs} epochs each, on the torch int8 port")
        per_run = int8_study.CPU_S_PER_EPOCH * cfg.epochs
        print(f"expected: about {len(specs) * per_run / workers / 60:.0f} min with {workers} worker(s) on idle cores "
              f"({per_run:.0f} s of one core per run)")
        return 0
    if trainer is None:
        from gap.runs import train_int8_spec
        trainer = train_int8_spec
    executor = executors.Local(workers)
    t0 = time.perf_counter()
    failed = lm_study.train_folder(specs, args.out, args.from_dir, trainer, executor, args.report_only)
    if failed is None:
        return 130
    from gap.int8 import report as int8_report
    header = {"command": "python -m gap " + shlex.join(argv), "preset": f"{int8_study.PRESET}: {cfg}",
              "seeds": str(int8_study.seed_list(args.seeds)), "executor": f"{executor.describe()} on {cpu_name()}",
              "this invocation": f"{time.perf_counter() - t0:.0f} s, {len(failed)} failed"}
    header.update({f"note {i}" if len(args.note) > 1 else "note": n for i, n in enumerate(args.note, 1)})
    try:
        int8_report.write(args.out, header, args.resamples, {s.run_id for s in specs})
    except ValueError as err:
        print(f"gap: {err}", file=sys.stderr)
        return 2
    print(f"report: {os.path.join(args.out, 'summary.md')}")
    return 1 if failed else 0
