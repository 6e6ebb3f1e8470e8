"""`python -m gap --task lm`: the LM study (gap.lm.study), resumable, then its report (gap.lm.report).

Exit status: 0 complete, 1 some runs failed (rerun to retry them), 2 bad usage or input, 130 interrupted.
"""
from __future__ import annotations

import argparse
import os
import shlex
import sys
import time

from gap import executors
from gap.lm import report as lm_report
from gap.lm import study as lm_study
from reporting import cpu_name
from spec.lm import LM_PRESETS


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m gap --task lm", description=__doc__.splitlines()[0])
    p.add_argument("--task", choices=("lm",), default="lm")
    p.add_argument("--preset", choices=sorted(LM_PRESETS), default=lm_study.PRESET,
                   help=f"LM hyper-parameters (default {lm_study.PRESET})")
    p.add_argument("--epochs", type=int, default=None, help="epochs per run (default: the preset's)")
    p.add_argument("--seeds", type=int, default=lm_study.MAIN_SEEDS,
                   help=f"seeds of jax_reference and torch:jax (default {lm_study.MAIN_SEEDS}): 42, 142, ...")
    p.add_argument("--knob-seeds", type=int, default=lm_study.KNOB_SEEDS,
                   help=f"seeds of each drift arm (default {lm_study.KNOB_SEEDS})")
    p.add_argument("--arms", default=None, help="comma-separated subset of the arms (see --plan)")
    p.add_argument("--target", type=float, default=lm_study.TARGET_BPB,
                   help=f"validation bits/byte for the epochs-to-target outcome (default {lm_study.TARGET_BPB})")
    p.add_argument("--corpus", default=None, help="the corpus file (default: the shipped rollout/data/corpus.txt)")
    p.add_argument("--workers", type=int, default=None, help="parallel runs, one thread each (default: CPU count)")
    p.add_argument("--out", default="runs/gap-lm", help="output folder, reused to resume (default runs/gap-lm)")
    p.add_argument("--from", dest="from_dir", default=None,
                   help="a study folder whose finished runs seed --out (nothing is retrained), e.g. reports/gap-lm")
    p.add_argument("--resamples", type=int, default=10_000, help="bootstrap resamples (default 10000)")
    p.add_argument("--plan", action="store_true", help="print the arms and run count, train nothing")
    p.add_argument("--report-only", action="store_true", help="write the report from the runs on disk")
    return p


def check_inputs(args) -> None:
    """Everything that can be refused before any work (ValueError with what would be right)."""
    if args.seeds < 2 or args.knob_seeds < 2:
        raise ValueError(f"--seeds and --knob-seeds must be >= 2 (a comparison needs a spread), got "
                         f"{args.seeds} and {args.knob_seeds}")
    if not args.target > 0:
        raise ValueError(f"--target must be a positive bits/byte value, got {args.target}")
    lm_study.check_run_inputs(args, "reports/gap-lm")


def main(argv: list[str] | None = None, trainer=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(argv)
    try:
        check_inputs(args)
        cfg = LM_PRESETS[args.preset]
        cfg = cfg if args.epochs is None else cfg.replace(epochs=args.epochs)
        names = None if args.arms is None else [n.strip() for n in args.arms.split(",") if n.strip()]
        specs = lm_study.plan(cfg, args.seeds, args.knob_seeds, names)
        specs = [s.__class__(s.arm, s.seed, s.config, args.corpus) for s in specs]
    except ValueError as err:
        print(f"gap: {err}", file=sys.stderr)
        return 2
    order = [a.name for a in lm_study.arms()]
    if args.plan:
        for arm in order:
            n = sum(s.arm.name == arm for s in specs)
            if n:
                print(f"{arm}: {n} seeds ({lm_study.describe_arm(arm)})")
        print(f"{len(specs)} runs at preset {args.preset} ({cfg.epochs} epochs each)")
        return 0
    if trainer is None:
        from gap.runs import train_lm_spec
        trainer = train_lm_spec
    workers = args.workers or os.cpu_count() or 1
    executor = executors.Local(workers)
    t0 = time.perf_counter()
    failed = lm_study.train_folder(specs, args.out, args.from_dir, trainer, executor, args.report_only)
    if failed is None:
        return 130
    header = {"title": "Does the torch port learn the byte-level LM as fast as the JAX reference?",
              "run": {"command": "python -m gap " + shlex.join(argv),
                      "preset": f"{args.preset}: {cfg}",
                      "seeds": f"{lm_study.seed_list(args.seeds)} (main arms), "
                               f"{lm_study.seed_list(args.knob_seeds)} (drift arms)",
                      "executor": f"{executor.describe()} on {cpu_name()}",
                      "versions": lm_report.versions_of(args.out),
                      "this invocation": f"{time.perf_counter() - t0:.0f} s, {len(failed)} failed"}}
    try:
        lm_report.write(args.out, header, order, args.resamples, args.target)
    except ValueError as err:
        print(f"gap: {err}", file=sys.stderr)
        return 2
    print(f"report: {os.path.join(args.out, 'summary.md')}")
    return 1 if failed else 0
