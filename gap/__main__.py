"""`python -m gap`: train every arm over seeds (resumable), then write the report.

Exit status: 0 the study and its report are complete, 1 some runs failed (rerun to retry
them), 2 bad usage or input, 130 interrupted (rerun the same command to resume).
"""
from __future__ import annotations

import argparse
import os
import shlex
import sys
import time
from typing import NamedTuple

from gap import report, stats
from gap.arms import Arm, dedupe, profile_arm
from gap.attribution import study as build_study
from gap.runs import RunStore, run_all, run_specs, train_spec
from spec.config import PRESETS
from spec.knobs import PROFILES, KnobError

DEFAULT_PRESET = "gap"

# The default study fits 30 minutes on 2 idle cores (measured one-thread cost: 35-50 s per solving
# run, ~100 s per run censored at the gap preset's 10 M budget): 3 main arms x 8 seeds + 12
# attribution arms x 3 seeds = 60 runs, about 25 minutes.
DEFAULT_SEEDS = 8              # main arms (jax_reference, torch:jax, torch:<profile>)
DEFAULT_ATTRIBUTION_SEEDS = 3  # every other arm of the ladder and the singles
CPU_S_PER_RUN = 45.0           # measured mean one-thread cost of a solving run at the cpu/gap preset


def seed_list(n: int, first: int = 42, stride: int = 100) -> list[int]:
    """42, 142, 242, ...: the published benchmark's seeds."""
    if n < 1:
        raise ValueError(f"need at least 1 seed, got {n}")
    return [first + stride * i for i in range(n)]


def _parse_seeds(text: str) -> list[int]:
    try:
        seeds = [int(s) for s in text.replace(" ", "").split(",") if s]
    except ValueError:
        raise argparse.ArgumentTypeError(f"--seed-list takes comma-separated integers, got {text!r}") from None
    if not seeds or len(set(seeds)) != len(seeds):
        raise argparse.ArgumentTypeError(f"--seed-list needs distinct seeds, got {text!r}")
    return seeds


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m gap", description=__doc__.splitlines()[0])
    p.add_argument("--preset", choices=sorted(PRESETS), default=DEFAULT_PRESET,
                   help=f"hyper-parameters (default {DEFAULT_PRESET}: cpu with a 10M-step budget; "
                        f"paper: the published run)")
    p.add_argument("--seeds", type=int, default=None,
                   help=f"seeds per main arm (default {DEFAULT_SEEDS}): 42, 142, ...")
    p.add_argument("--seed-list", type=_parse_seeds, default=None, help="explicit seeds, e.g. 0,1,2 (all arms)")
    p.add_argument("--attribution-seeds", type=int, default=None,
                   help=f"seeds per attribution-only arm, the first of the main seeds (default: "
                        f"min(main seeds, {DEFAULT_ATTRIBUTION_SEEDS}))")
    p.add_argument("--profile", default="oop-port", help="the drifted profile to attribute (default oop-port)")
    p.add_argument("--arms", default=None,
                   help="comma-separated subset of the planned arms (see --plan), or jax_reference / torch:<profile>")
    p.add_argument("--no-ladder", action="store_true", help="only the main arms, no attribution")
    p.add_argument("--workers", type=int, default=None,
                   help="parallel runs, one thread each (default: the CPU count; 1 with a cuda device)")
    p.add_argument("--out", default="reports/gap", help="output folder (default reports/gap); reused to resume")
    p.add_argument("--max-steps", type=int, default=None, help="env-step budget per run (default: the preset's)")
    p.add_argument("--device", default="cpu", help="torch device for the torch side (cpu, cuda)")
    p.add_argument("--resamples", type=int, default=stats.N_RESAMPLES, help="bootstrap resamples (default 10000)")
    p.add_argument("--plan", action="store_true", help="print the arms and run count, train nothing")
    p.add_argument("--report-only", action="store_true", help="write the report from the runs on disk, train nothing")
    return p


def _select(study, names: str | None) -> tuple[list[Arm], list[Arm]]:
    """(main arms, attribution arms) after --arms; unknown names are an error that lists the known ones."""
    main, extra = study.main_arms, study.attribution_arms
    if names is None:
        return main, extra
    planned = {a.name: a for a in main + extra}
    wanted = [n.strip() for n in names.split(",") if n.strip()]
    chosen = []
    for n in wanted:
        if n in planned:
            chosen.append(planned[n])
            continue
        try:
            chosen.append(profile_arm(n))
        except KnobError:
            raise KnobError(f"unknown arm {n!r}; planned arms: {', '.join(planned)}; or jax_reference / "
                            f"torch:<profile> with profile one of {', '.join(PROFILES)}") from None
    chosen = dedupe(chosen)
    main_names = {a.name for a in main}
    return [a for a in chosen if a.name in main_names], [a for a in chosen if a.name not in main_names]


class StudyPlan(NamedTuple):
    """What the arguments ask for: the preset's config, the seeds, the study and the arms to run."""

    cfg: object
    seeds: list[int]
    attribution_seeds: list[int]
    study: object
    main_arms: list[Arm]
    extra_arms: list[Arm]


def plan_study(args) -> StudyPlan:
    """The study the arguments describe; raises ValueError / KnobError for bad input."""
    for flag, value, least in (("--max-steps", args.max_steps, 1), ("--workers", args.workers, 1),
                               ("--seeds", args.seeds, 1), ("--attribution-seeds", args.attribution_seeds, 1),
                               ("--resamples", args.resamples, 100)):
        if value is not None and value < least:
            raise ValueError(f"{flag} must be >= {least}, got {value}")
    cfg, reference = PRESETS[args.preset]
    if args.max_steps is not None:
        cfg = cfg.replace(max_env_steps=args.max_steps)
    seeds = args.seed_list or seed_list(args.seeds or DEFAULT_SEEDS)
    n_attr = args.attribution_seeds or min(len(seeds), DEFAULT_ATTRIBUTION_SEEDS)
    if args.seed_list and n_attr > len(seeds):
        raise ValueError(f"--attribution-seeds {n_attr} is more than the {len(seeds)} seeds of --seed-list")
    attr_seeds = seeds[:n_attr] if args.seed_list else seed_list(n_attr)
    st = build_study(args.profile, reference, attribution=not args.no_ladder)
    main_arms, extra_arms = _select(st, args.arms)
    return StudyPlan(cfg, seeds, attr_seeds, st, main_arms, extra_arms)


def print_plan(args, p: StudyPlan, n_runs: int) -> None:
    """--plan: the arms, their seed counts and the expected time."""
    print(f"{n_runs} runs at preset {args.preset} (budget {p.cfg.max_env_steps:,} env steps per run):")
    for a in p.main_arms:
        print(f"  {a.name:48s} {a.side:5s} {len(p.seeds)} seeds (main)")
    for a in p.extra_arms:
        print(f"  {a.name:48s} {a.side:5s} {len(p.attribution_seeds)} seeds (attribution)")
    if args.preset != "paper":
        n_workers = args.workers or os.cpu_count() or 1
        print(f"expected: about {n_runs * CPU_S_PER_RUN / n_workers / 60:.0f} min with {n_workers} worker(s) on idle "
              f"cores ({CPU_S_PER_RUN:.0f} s of one core per solving run; a run censored at the budget costs about "
              f"{CPU_S_PER_RUN * p.cfg.max_env_steps / 4e6:.0f} s)")


def notes_of(args) -> list[str]:
    """What the report should say about how this invocation departs from the defaults."""
    notes = []
    if args.seeds is None and args.seed_list is None and args.attribution_seeds is None:
        notes.append(f"default seed counts ({DEFAULT_SEEDS} main, {DEFAULT_ATTRIBUTION_SEEDS} attribution) sized "
                     f"so the default study fits 30 minutes on 2 cores; more seeds: --seeds, --attribution-seeds")
    if args.arms:
        notes.append(f"arms restricted to: {args.arms}")
    if args.max_steps is not None:
        notes.append(f"budget set by --max-steps {args.max_steps:,}")
    return notes


def main(argv: list[str] | None = None, trainer=train_spec) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(argv)
    try:
        p = plan_study(args)
    except (KnobError, ValueError) as err:
        print(f"gap: {err}", file=sys.stderr)
        return 2
    specs = run_specs([(a, p.seeds) for a in p.main_arms] + [(a, p.attribution_seeds) for a in p.extra_arms], p.cfg,
                 args.device)
    if args.plan:
        print_plan(args, p, len(specs))
        return 0
    os.makedirs(args.out, exist_ok=True)
    workers = args.workers or (1 if args.device.startswith("cuda") else os.cpu_count() or 1)
    t0 = time.perf_counter()
    failed: list[str] = []
    try:
        store = RunStore(args.out)
        if not args.report_only:
            failed = run_all(specs, store, trainer, workers).failed
    except KeyboardInterrupt:
        print(f"\ninterrupted: finished runs are saved in {args.out}/runs.csv; rerun the same command to resume",
              file=sys.stderr)
        return 130
    except (RuntimeError, ValueError) as err:
        print(f"gap: {err}", file=sys.stderr)
        return 2
    info = report.StudyInfo(
        command="python -m gap " + shlex.join(argv), preset=args.preset, config=p.cfg, seeds=p.seeds,
        attribution_seeds=p.attribution_seeds, workers=workers, device=args.device, wall_s=time.perf_counter() - t0,
        failed=failed, notes=notes_of(args))
    print(f"report: {report.write(args.out, store, specs, p.study, info, n_resamples=args.resamples)}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
