"""`python -m gap`: train every arm over seeds (resumable), then write the report.

Exit status: 0 the study and its report are complete, 1 some runs failed (rerun to retry
them), 2 bad usage or input, 130 interrupted (rerun the same command to resume).
`--import-runs FILE` instead brings runs trained elsewhere (the JAX reference on a GPU) into --out's store and
exits (gap/imported.py); the report then includes them and no study ever retrains them.
"""
from __future__ import annotations

import argparse
import os
import shlex
import sys
import time
from typing import NamedTuple

from gap import executors, imported, report, stats
from gap.arms import Arm, dedupe, profile_arm
from gap.attribution import DESIGNS
from gap.attribution import study as build_study
from gap.runs import load_port_arm, run_all, run_specs, train_spec
from gap.store import RunStore
from spec.config import PRESETS
from spec.knobs import PROFILES, KnobError
from spec.limits import check_out_dir, check_seed, device_arg

class StudyDefaults(NamedTuple):
    """What `--study NAME` means when no other flag says otherwise."""

    preset: str
    budget: int | None          # env steps per run (None: the preset's)
    design: str                 # ladder | factorial | none
    seeds: int                  # per main arm: 42, 142, ...
    attribution_seeds: int      # per attribution-only arm
    others: tuple[str, ...]     # further profiles (with +KNOB=VALUE departures) compared with the reference
    published: str              # where the committed study lives (--from seeds a folder with its runs)
    about: str


STUDIES = {
    # 30 minutes on 2 idle cores: 3 main arms x 8 seeds + 12 ladder arms x 3 seeds.
    "gap": StudyDefaults("gap", None, "ladder", 8, 3, (), "reports/gap",
                         "the CPU-sized study: pop 256, 3 x 64, 10 M-step budget, ladder attribution"),
    # The published question at its own preset. A faithful run solves in 13-19 M env steps (CV about 10%): a
    # 30 M budget censors it almost never. 4 main arms x 10 seeds + 14 further factorial points x 6 seeds = 124
    # runs: a 10% main effect at about 80% power (residual log-scale sigma 0.19, measured at 3 seeds).
    # The two TF32 arms (issue 24): the reference's math and the oop-port's with TF32 matmuls, what a published arm on
    # an Ampere-or-newer GPU computed (JAX's default precision there); on a CPU the knob rounds the operands.
    "paper": StudyDefaults("paper", 30_000_000, "factorial", 10, 6,
                           ("functional-port", "jax+matmul_precision=high", "oop-port+matmul_precision=high"),
                           "reports/gap-paper",
                           "the published CartPole benchmark's preset (pop 2048, rank 4, 3 x 256), 30 M-step "
                           "budget, a resolution-IV fraction over the oop-port's drifts"),
}
CPU_S_PER_RUN = {"gap": 45.0, "paper": 150.0}   # measured one-thread cost of a solving run


def seed_list(n: int, first: int = 42, stride: int = 100) -> list[int]:
    """42, 142, 242, ...: the published benchmark's seeds."""
    if n < 1:
        raise ValueError(f"need at least 1 seed, got {n}")
    return [first + stride * i for i in range(n)]


def _parse_seeds(text: str) -> list[int]:
    try:
        seeds = [int(s) for s in text.replace(" ", "").split(",") if s]
    except ValueError:
        raise argparse.ArgumentTypeError(f"--seed-list takes comma-separated integers in [0, 4,294,967,295], "
                                         f"got {text!r}") from None
    if not seeds or len(set(seeds)) != len(seeds):
        raise argparse.ArgumentTypeError(f"--seed-list needs distinct seeds, got {text!r}")
    try:
        return [check_seed(s, "each seed of --seed-list") for s in seeds]
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from None


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m gap", description=__doc__.splitlines()[0])
    p.add_argument("--study", choices=sorted(STUDIES), default="gap",
                   help="; ".join(f"{k}: {v.about}" for k, v in STUDIES.items()) + " (default gap)")
    p.add_argument("--preset", choices=sorted(PRESETS), default=None, help="hyper-parameters (default: the study's)")
    p.add_argument("--design", choices=DESIGNS, default=None,
                   help="attribution: ladder (and single drifts), factorial (a resolution-IV fraction with an "
                        "AFT model), none (default: the study's)")
    p.add_argument("--seeds", type=int, default=None, help="seeds per main arm (default: the study's): 42, 142, ...")
    p.add_argument("--seed-list", type=_parse_seeds, default=None, help="explicit seeds, e.g. 0,1,2 (all arms)")
    p.add_argument("--attribution-seeds", type=int, default=None,
                   help="seeds per attribution-only arm, the first of the main seeds (default: the study's)")
    p.add_argument("--profile", default="oop-port", help="the drifted profile to attribute (default oop-port)")
    p.add_argument("--arms", default=None,
                   help="comma-separated subset of the planned arms (see --plan), or jax_reference / torch:<profile>")
    p.add_argument("--port", action="append", default=[], metavar="MODULE:ATTR",
                   help="also train this port through its adapter's es_* methods (parity/mlp/adapter.py) as a main arm, "
                        "compared with the reference like the profiles (repeatable)")
    p.add_argument("--no-ladder", action="store_true", help="the same as --design none")
    p.add_argument("--executor", choices=("local", "ray"), default="local",
                   help="where runs execute: local processes, or an existing Ray cluster (--address)")
    p.add_argument("--address", default=None, help="--executor ray: the Ray head, HOST:PORT")
    p.add_argument("--workers", type=int, default=None,
                   help="local parallel runs, one thread each (default: the CPU count; 1 with a cuda device)")
    p.add_argument("--out", default=None, help="output folder, reused to resume (default runs/<study>, which git "
                                               "ignores; the committed studies live in reports/)")
    p.add_argument("--from", dest="from_dir", default=None,
                   help="a study folder whose finished runs seed --out (nothing is retrained), e.g. reports/gap-paper")
    p.add_argument("--max-steps", type=int, default=None, help="env-step budget per run (default: the study's)")
    p.add_argument("--device", type=device_arg, default="cpu",
                   help="torch device for the torch side: cpu, cuda or cuda:N (default cpu)")
    p.add_argument("--resamples", type=int, default=stats.N_RESAMPLES, help="bootstrap resamples (default 10000)")
    p.add_argument("--note", action="append", default=[],
                   help="a line for the report's header, e.g. where imported runs came from (repeatable)")
    p.add_argument("--plan", action="store_true", help="print the arms and run count, train nothing")
    p.add_argument("--report-only", action="store_true", help="write the report from the runs on disk, train nothing")
    g = p.add_argument_group("importing runs trained elsewhere (the JAX reference on a GPU); trains nothing, "
                             "writes no report")
    g.add_argument("--import-runs", metavar="FILE", default=None,
                   help=f"a CSV with columns {', '.join(imported.COLUMNS)}; arms {imported.EXAMPLE}; its runs go "
                        "into --out's store once (a run already there with the same outcome is skipped)")
    g.add_argument("--import-host", default="", help="where they ran, e.g. 'a lent GPU machine'")
    g.add_argument("--import-device", default="", help="the device they ran on, e.g. 'gpu: one NVIDIA H100 80GB HBM3'")
    g.add_argument("--import-versions", default="", help="e.g. 'jax 0.11.2 (CUDA 13 plugin), torch 2.11.0+cu130'")
    g.add_argument("--import-note", default="", help="the measurer's note, stored with each run")
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


def _check_import_args(args) -> None:
    given = [f"--import-{k}" for k in ("host", "device", "versions", "note") if getattr(args, f"import_{k}")]
    if args.import_runs is None:
        if given:
            raise ValueError(f"{', '.join(given)} describe(s) the runs of --import-runs FILE, which is missing")
        return
    clash = [flag for flag, on in (("--from", args.from_dir), ("--plan", args.plan), ("--report-only",
                                   args.report_only), ("--arms", args.arms), ("--port", args.port)) if on]
    if clash:
        raise ValueError(f"--import-runs only imports (it trains nothing and writes no report); drop "
                         f"{', '.join(clash)}, then write the report with --report-only")


def plan_study(args) -> StudyPlan:
    """The study the arguments describe; raises ValueError / KnobError for bad input."""
    _check_import_args(args)
    for flag, value, least in (("--max-steps", args.max_steps, 1), ("--workers", args.workers, 1),
                               ("--seeds", args.seeds, 1), ("--attribution-seeds", args.attribution_seeds, 1),
                               ("--resamples", args.resamples, 100)):
        if value is not None and value < least:
            raise ValueError(f"{flag} must be >= {least}, got {value}")
    if args.executor == "ray" and not args.address:
        raise ValueError("--executor ray needs --address HOST:PORT of a running Ray head (`ray start --head`)")
    if args.device.startswith("cuda"):
        import torch

        if not torch.cuda.is_available():
            raise ValueError(f"--device {args.device}: torch sees no CUDA device on this machine; use --device cpu")
    check_out_dir(args.out or f"runs/{args.study}")
    if args.from_dir and not os.path.isfile(os.path.join(args.from_dir, "runs.csv")):
        raise ValueError(f"--from {args.from_dir}: no study there (no runs.csv); give a study folder such as "
                         f"{STUDIES[args.study].published}")
    d = STUDIES[args.study]
    cfg, reference = PRESETS[args.preset or d.preset]
    budget = args.max_steps or (d.budget if args.preset in (None, d.preset) else None)
    if budget is not None:
        cfg = cfg.replace(max_env_steps=budget)
    seeds = args.seed_list or seed_list(args.seeds or d.seeds)
    n_attr = args.attribution_seeds or min(len(seeds), d.attribution_seeds)
    if args.seed_list and n_attr > len(seeds):
        raise ValueError(f"--attribution-seeds {n_attr} is more than the {len(seeds)} seeds of --seed-list")
    attr_seeds = seeds[:n_attr] if args.seed_list else seed_list(n_attr)
    design = "none" if args.no_ladder else (args.design or d.design)
    st = build_study(args.profile, reference, design, tuple(o for o in d.others if o != args.profile))
    port_arms = tuple(load_port_arm(source, cfg, reference) for source in args.port)   # bad port: exit 2, now
    st = st._replace(others=st.others + port_arms)
    main_arms, extra_arms = _select(st, args.arms)
    return StudyPlan(cfg, seeds, attr_seeds, st, dedupe(main_arms + list(port_arms)), extra_arms)


def print_plan(args, p: StudyPlan, n_runs: int) -> None:
    """--plan: the arms, their seed counts and the expected time."""
    print(f"{n_runs} runs at preset {args.preset or STUDIES[args.study].preset} (budget {p.cfg.max_env_steps:,} env steps per run):")
    for a in p.main_arms:
        print(f"  {a.name:48s} {a.side:5s} {len(p.seeds)} seeds (main)")
    for a in p.extra_arms:
        print(f"  {a.name:48s} {a.side:5s} {len(p.attribution_seeds)} seeds (attribution)")
    per_run = CPU_S_PER_RUN.get(args.preset or STUDIES[args.study].preset)
    if per_run:
        n_workers = args.workers or os.cpu_count() or 1
        print(f"expected: about {n_runs * per_run / n_workers / 60:.0f} min with {n_workers} worker(s) on idle "
              f"cores ({per_run:.0f} s of one core per solving run; a run censored at the budget costs more)")


def print_imported(args, p: StudyPlan) -> None:
    """--plan: the imported arms the report will include (from --from or --out), which no study trains."""
    for folder in dict.fromkeys(f for f in (args.from_dir, args.out) if f):
        if os.path.isfile(os.path.join(folder, "runs.csv")):
            counts: dict[str, int] = {}
            for s in imported_specs(args, p, RunStore(folder, readonly=True)):
                counts[s.arm.name] = counts.get(s.arm.name, 0) + 1
            for name, n in counts.items():
                print(f"  {name:48s} jax   {n} runs imported in {folder} (trained elsewhere, never here)")


def notes_of(args) -> list[str]:
    """What the report should say about how this invocation departs from the defaults."""
    notes = []
    d = STUDIES[args.study]
    if args.seeds is None and args.seed_list is None and args.attribution_seeds is None:
        notes.append(f"the {args.study} study's seed counts ({d.seeds} main, {d.attribution_seeds} attribution); "
                     "more seeds: --seeds, --attribution-seeds")
    if args.arms:
        notes.append(f"arms restricted to: {args.arms}")
    for source in args.port:
        notes.append(f"port arm from {source}, trained through its adapter's es_* methods (ports/train.py); what "
                     "the port lacks (init, action uniforms, action choice) is the reference's")
    if args.max_steps is not None:
        notes.append(f"budget set by --max-steps {args.max_steps:,}")
    if args.from_dir:
        notes.append(f"finished runs taken from {args.from_dir} (not retrained)")
    return notes + list(args.note)


def imported_specs(args, p: StudyPlan, store: RunStore) -> list:
    """The runs trained elsewhere that `store` holds for this study (none when --arms picks a subset)."""
    return [] if args.arms else imported.specs_in(store, p.cfg, p.study.reference.knobs)


def import_into(args, p: StudyPlan, out: str) -> int:
    """--import-runs: check the whole file, then commit the runs --out's store lacks; 2 (nothing written) if bad."""
    where = imported.Provenance(args.import_host, args.import_device, args.import_versions, args.import_note)
    try:
        rows = imported.read_runs(args.import_runs, p.cfg, where, p.study.reference.knobs)
        added, already = imported.import_runs(out, rows)
    except (RuntimeError, ValueError) as err:
        print(f"gap: {err}", file=sys.stderr)
        return 2
    print(f"imported {added} run(s) into {os.path.join(out, 'runs.csv')} ({already} already there); the report: "
          f"python -m gap --study {args.study} --out {out} --report-only")
    return 0


def _task_of(argv: list[str]) -> str:
    """The value of --task (cartpole when absent), read before the study's own parser."""
    for i, a in enumerate(argv):
        if a.startswith("--task="):
            return a.split("=", 1)[1]
        if a == "--task":
            return argv[i + 1] if i + 1 < len(argv) else ""
    return "cartpole"


def main(argv: list[str] | None = None, trainer=train_spec) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    task = _task_of(argv)
    if task == "lm":
        from gap.lm import cli as lm_cli
        return lm_cli.main(argv, None if trainer is train_spec else trainer)
    if task == "int8":
        from gap.int8 import cli as int8_cli
        return int8_cli.main(argv, None if trainer is train_spec else trainer)
    if task != "cartpole":
        print(f"gap: unknown --task {task!r}; known tasks: cartpole, lm, int8", file=sys.stderr)
        return 2
    argv = [a for i, a in enumerate(argv) if not (a == "--task" or a.startswith("--task=")
                                                  or (i and argv[i - 1] == "--task"))]
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
        print_imported(args, p)
        return 0
    out = args.out or f"runs/{args.study}"
    if args.import_runs:
        return import_into(args, p, out)
    workers = args.workers or (1 if args.device.startswith("cuda") else os.cpu_count() or 1)
    t0 = time.perf_counter()
    failed: list[str] = []
    try:
        executor = executors.make(args.executor, workers, args.address)
        store = RunStore(out)
        if args.from_dir and os.path.abspath(args.from_dir) != os.path.abspath(out):
            source = RunStore(args.from_dir, readonly=True)
            copied = store.import_from(source, {s.key for s in specs + imported_specs(args, p, source)})
            print(f"{copied} finished runs taken from {args.from_dir}", file=sys.stderr)
        if not args.report_only:
            failed = run_all(specs, store, trainer, executor).failed
    except KeyboardInterrupt:
        print(f"\ninterrupted: finished runs are saved in {out}/runs.csv; rerun the same command to resume",
              file=sys.stderr)
        return 130
    except (RuntimeError, ValueError) as err:
        print(f"gap: {err}", file=sys.stderr)
        return 2
    info = report.StudyInfo(
        command="python -m gap " + shlex.join(argv), preset=args.preset or STUDIES[args.study].preset, config=p.cfg,
        seeds=p.seeds, attribution_seeds=p.attribution_seeds, workers=workers, device=args.device,
        wall_s=time.perf_counter() - t0, failed=failed, notes=notes_of(args), executor=executor.describe())
    shown = imported_specs(args, p, store)
    st = p.study._replace(imported=tuple(dedupe(s.arm for s in shown)))
    print(f"report: {report.write(out, store, specs + shown, st, info, n_resamples=args.resamples)}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
