"""`python -m gap --task int8`: the integer study (gap.int8.study), resumable, then its report (gap.int8.report).

Exit status: 0 complete, 1 some runs failed (rerun to retry them), 2 bad usage or input, 130 interrupted.
"""
from __future__ import annotations

from gap import study_cli
from gap.int8 import study as int8_study
from gap.study import seed_list


def add_flags(p) -> None:
    p.add_argument("--epochs", type=int, default=None, help="epochs per run (default: the cpu preset's 800)")
    p.add_argument("--seeds", type=int, default=int8_study.SEEDS,
                   help=f"seeds per design point (default {int8_study.SEEDS}): 42, 142, ...")


def check(args) -> None:
    if args.seeds < 2:
        raise ValueError(f"--seeds must be >= 2 (an effect needs a spread), got {args.seeds}")
    if args.resamples < 100:
        raise ValueError(f"--resamples must be >= 100, got {args.resamples}")


def plan(args):
    cfg = int8_study.default_config()
    cfg = cfg if args.epochs is None else cfg.replace(epochs=args.epochs)
    return cfg, int8_study.plan(cfg, args.seeds, args.corpus)


def show_plan(args, cfg, specs, workers) -> None:
    for arm in int8_study.arms():
        print(f"{arm.name}: {args.seeds} seeds")
    print(f"{len(specs)} runs ({len(int8_study.arms())} design points x {args.seeds} seeds) at the "
          f"{int8_study.PRESET} preset, {cfg.epochs} epochs each, on the torch int8 port")
    per_run = int8_study.CPU_S_PER_EPOCH * cfg.epochs
    print(f"expected: about {len(specs) * per_run / workers / 60:.0f} min with {workers} worker(s) on idle cores "
          f"({per_run:.0f} s of one core per run)")


def run_lines(args, cfg) -> dict:
    return {"preset": f"{int8_study.PRESET}: {cfg}", "seeds": str(seed_list(args.seeds))}


def write(args, run: dict, specs) -> str:
    from gap.int8 import report as int8_report
    return int8_report.write(args.out, run, args.resamples, {s.run_id for s in specs})


def trainer():
    from gap.runs import train_int8_spec
    return train_int8_spec


STUDY = study_cli.Study(
    task="int8", doc=__doc__, published="reports/gap-int8", plan_help="the design", add_flags=add_flags,
    check=check, plan=plan, show_plan=show_plan, run_lines=run_lines, write=write, trainer=trainer)


def main(argv: list[str] | None = None, trainer=None) -> int:
    return study_cli.main(STUDY, argv, trainer)
