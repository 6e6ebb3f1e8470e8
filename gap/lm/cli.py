"""`python -m gap --task lm`: the LM study (gap.lm.study), resumable, then its report (gap.lm.report).

Exit status: 0 complete, 1 some runs failed (rerun to retry them), 2 bad usage or input, 130 interrupted.
"""
from __future__ import annotations

from gap import study_cli
from gap.lm import report as lm_report
from gap.lm import study as lm_study
from gap.study import seed_list
from spec.lm import LM_PRESETS


def add_flags(p) -> None:
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


def check(args) -> None:
    if args.seeds < 2 or args.knob_seeds < 2:
        raise ValueError(f"--seeds and --knob-seeds must be >= 2 (a comparison needs a spread), got "
                         f"{args.seeds} and {args.knob_seeds}")
    if not args.target > 0:
        raise ValueError(f"--target must be a positive bits/byte value, got {args.target}")


def plan(args):
    cfg = LM_PRESETS[args.preset]
    cfg = cfg if args.epochs is None else cfg.replace(epochs=args.epochs)
    names = None if args.arms is None else [n.strip() for n in args.arms.split(",") if n.strip()]
    return cfg, lm_study.plan(cfg, args.seeds, args.knob_seeds, names, args.corpus)


def show_plan(args, cfg, specs, workers) -> None:
    for arm in (a.name for a in lm_study.arms()):
        n = sum(s.arm.name == arm for s in specs)
        if n:
            print(f"{arm}: {n} seeds ({lm_study.describe_arm(arm)})")
    print(f"{len(specs)} runs at preset {args.preset} ({cfg.epochs} epochs each)")


def run_lines(args, cfg) -> dict:
    return {"preset": f"{args.preset}: {cfg}",
            "seeds": f"{seed_list(args.seeds)} (main arms), {seed_list(args.knob_seeds)} (drift arms)"}


def provenance(args) -> dict:
    """After the executor's line: the versions the runs recorded (read once they are trained)."""
    return {"versions": lm_report.versions_of(args.out)}


def write(args, run: dict, specs) -> str:
    return lm_report.write(args.out, run, [a.name for a in lm_study.arms()], args.resamples, args.target)


def trainer():
    from gap.runs import train_lm_spec
    return train_lm_spec


STUDY = study_cli.Study(
    task="lm", doc=__doc__, published="reports/gap-lm", plan_help="the arms", add_flags=add_flags, check=check,
    plan=plan, show_plan=show_plan, run_lines=run_lines, write=write, trainer=trainer, provenance=provenance)


def main(argv: list[str] | None = None, trainer=None) -> int:
    return study_cli.main(STUDY, argv, trainer)
