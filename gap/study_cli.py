"""The command line every byte-corpus study shares (`python -m gap --task lm|int8`): the common flags, the inputs
refused before any work, and one main: plan, --plan's listing, the resumable run (gap.study), then the report.

A study is a `Study` record: its own flags, checks, plan, listing, run lines and report writer. Exit status: 0
complete, 1 some runs failed (rerun to retry them), 2 bad usage or input (nothing written), 130 interrupted.
"""
from __future__ import annotations

import argparse
import os
import shlex
import sys
import time
from dataclasses import dataclass
from typing import Callable

from gap import executors
from gap.study import train_folder
from reporting import cpu_name


@dataclass(frozen=True)
class Study:
    """One study's own parts; main does the rest. Every callable takes the parsed args first."""

    task: str                   # the --task value
    doc: str                    # the command module's docstring (its first line is --help's description)
    published: str              # the committed study folder (--out's default is runs/gap-<task>)
    plan_help: str              # what --plan prints
    add_flags: Callable         # (parser) -> None: the study's own flags
    check: Callable             # (args) -> None, ValueError with what would be right
    plan: Callable              # (args) -> (config, specs)
    show_plan: Callable         # (args, config, specs, workers) -> None: prints --plan's listing
    run_lines: Callable         # (args, config) -> {"preset": ..., "seeds": ...}: the run section's own lines
    write: Callable             # (args, run section, specs) -> summary text; ValueError when nothing to report
    trainer: Callable           # () -> trainer(spec): the real one, imported on use
    provenance: Callable | None = None   # (args) -> lines after the executor's (e.g. the runs' versions)


def build_parser(study: Study) -> argparse.ArgumentParser:
    """The common flags, with the study's own after --knob-like ones (the order --help shows)."""
    out = f"runs/gap-{study.task}"
    p = argparse.ArgumentParser(prog=f"python -m gap --task {study.task}", description=study.doc.splitlines()[0])
    p.add_argument("--task", choices=(study.task,), default=study.task)
    study.add_flags(p)
    p.add_argument("--corpus", default=None, help="the corpus file (default: the shipped rollout/data/corpus.txt)")
    p.add_argument("--workers", type=int, default=None, help="parallel runs, one thread each (default: CPU count)")
    p.add_argument("--out", default=out, help=f"output folder, reused to resume (default {out})")
    p.add_argument("--from", dest="from_dir", default=None,
                   help=f"a study folder whose finished runs seed --out (nothing is retrained), e.g. {study.published}")
    p.add_argument("--resamples", type=int, default=10_000, help="bootstrap resamples (default 10000)")
    p.add_argument("--plan", action="store_true", help=f"print {study.plan_help} and run count, train nothing")
    p.add_argument("--report-only", action="store_true", help="write the report from the runs on disk")
    p.add_argument("--note", action="append", default=[],
                   help="a line for the report's run section, e.g. where imported runs were trained (repeatable)")
    return p


def check_inputs(args, study: Study) -> None:
    """The study's own checks, then what every study refuses before any work (ValueError with what would be
    right): epochs, workers, the corpus, a --from folder without runs.csv, an unwritable --out."""
    from spec.limits import check_out_dir

    study.check(args)
    if args.epochs is not None and args.epochs < 1:
        raise ValueError(f"--epochs must be >= 1, got {args.epochs}")
    if args.workers is not None and args.workers < 1:
        raise ValueError(f"--workers must be >= 1, got {args.workers}")
    if args.corpus is not None and (not os.path.isfile(args.corpus) or os.path.getsize(args.corpus) == 0):
        raise ValueError(f"--corpus {args.corpus}: missing or empty; give a non-empty text file, or leave it out "
                         f"for the shipped corpus")
    if args.from_dir is not None and not os.path.isfile(os.path.join(args.from_dir, "runs.csv")):
        raise ValueError(f"--from {args.from_dir}: no runs.csv there; give a study folder such as {study.published}")
    check_out_dir(args.out)


def main(study: Study, argv: list[str] | None = None, trainer=None) -> int:
    """Parse and check (exit 2 before any work), --plan's listing, the resumable run, then the report."""
    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser(study).parse_args(argv)
    try:
        check_inputs(args, study)
        cfg, specs = study.plan(args)
    except ValueError as err:
        print(f"gap: {err}", file=sys.stderr)
        return 2
    workers = args.workers or os.cpu_count() or 1
    if args.plan:
        study.show_plan(args, cfg, specs, workers)
        return 0
    executor = executors.Local(workers)
    t0 = time.perf_counter()
    failed = train_folder(specs, args.out, args.from_dir, trainer or study.trainer(), executor, args.report_only)
    if failed is None:
        return 130
    run = {"command": "python -m gap " + shlex.join(argv), **study.run_lines(args, cfg),
           "executor": f"{executor.describe()} on {cpu_name()}", **(study.provenance(args) if study.provenance else {}),
           "this invocation": f"{time.perf_counter() - t0:.0f} s, {len(failed)} failed"}
    run.update({f"note {i}" if len(args.note) > 1 else "note": n for i, n in enumerate(args.note, 1)})
    try:
        study.write(args, run, specs)
    except ValueError as err:
        print(f"gap: {err}", file=sys.stderr)
        return 2
    print(f"report: {os.path.join(args.out, 'summary.md')}")
    return 1 if failed else 0
