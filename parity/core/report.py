"""The parity report of every task (cartpole, lm, tree, int8): summary.md (one verdict table first, the run, the
family's own sections, then a section per check), tidy CSVs beside it and result.json, of one schema on every task.

Every file is written to a temporary name in the target folder and renamed into place, so an
interrupted run leaves either the previous report or the new one, never half a file. CSVs of
checks that this run did not produce are removed, so the folder describes one run.
"""
from __future__ import annotations

import csv
import io
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

from parity.core.verdict import CSV_COLUMNS, ERROR, FAIL, PASS, CheckResult, rows_table, worst
from reporting import atomic_write, markdown_table, xla_flags_text
from spec.platform import ReferencePlatform

SUMMARY = "summary.md"
ALL_ROWS = "parity.csv"
RESULT = "result.json"
MANIFEST = ".parity-files"
REFERENCE_SIDE = "reference side"      # RunInfo.extra's key when the reference was replayed from a bundle


@dataclass(frozen=True)
class RunInfo:
    """What the report records about the run itself."""

    command: str
    port: str
    configuration: str          # profile and knobs, or the foreign port's spec
    sizes: str
    seed: int
    versions: dict[str, str]
    device: str
    started: str
    seconds: float = 0.0
    extra: dict[str, str] = field(default_factory=dict)
    platform: ReferencePlatform | None = None     # where the reference ran (a bundle's: where it was recorded)
    xla_flags: str = ""                           # XLA_FLAGS of the run ('' where unset): reporting.xla_flags


@dataclass(frozen=True)
class Family:
    """What one family adds to the one report: its title and lines above the verdict table, its run facts, its own
    Markdown sections, its own files and result.json's `details`. The defaults are the CartPole suite's."""

    task: str = "cartpole"
    title: str = ""                          # '' -> "Parity check: <headline>"
    lead: tuple[str, ...] | None = None      # None -> the replayed bundle and the reference's platform, in sentences
    run: tuple[str, ...] | None = None       # None -> the run's facts from RunInfo (the `## Run` section's bullets)
    sections: tuple[str, ...] = ()           # Markdown lines after the run, before the per-check sections
    files: tuple[tuple[str, str], ...] = ()  # (name, text) written beside summary.md (int8's pieces.csv)
    details: dict = field(default_factory=dict)   # result.json's `details`: what only this family reports


CARTPOLE = Family()
RESULT_KEYS = ("task", "verdict", "exit_code", "knobs", "checks", "command", "port", "configuration", "sizes", "seed",
               "versions", "device", "xla_flags", "started", "reference", "reference_platform", "seconds", "details")
CHECK_KEYS = ("name", "verdict", "observed", "allowed", "causes", "seconds", "repro")


def csv_text(results: Sequence[CheckResult]) -> str:
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(CSV_COLUMNS)
    for result in results:
        for row in result.rows:
            writer.writerow(row.as_csv())
    return buffer.getvalue()


def likely_causes(result: CheckResult) -> str:
    """The summary's cause cell: one sentence per knob (the first seen), then causes no knob describes."""
    seen: dict[str, str] = {}
    for c in result.causes:
        seen.setdefault(c.knob or c.text, c.text)
    return "; ".join(dict.fromkeys(seen.values()))     # a sentence naming two knobs is said once


def overall(results: Sequence[CheckResult]) -> str:
    return worst(r.verdict for r in results)


def run_lines(results: Sequence[CheckResult], info: RunInfo) -> list[str]:
    """The CartPole suite's `## Run` bullets: command, port, configuration, sizes, seed, versions, device, XLA_FLAGS,
    time, the statistical tests' budget and the extra facts."""
    alpha = sum(r.alpha for r in results)
    return [
        f"- command: `{info.command}`",
        f"- port: {info.port}",
        f"- configuration: {info.configuration}",
        f"- sizes: {info.sizes}",
        f"- seed: {info.seed} (noise keys, init, fitness vectors, environment resets and action uniforms all derive "
        "from it)",
        f"- versions: {', '.join(f'{k} {v}' for k, v in info.versions.items())}",
        f"- device: {info.device}",
        f"- XLA_FLAGS: {xla_flags_text(info.xla_flags)}",
        f"- started: {info.started}; took {info.seconds:.1f} s",
        f"- statistical tests: family-wise false-alarm rate <= {alpha:.2g} for this run (Bonferroni: the sum of the "
        "per-test levels; each check spends at most its share of 1e-3, see parity/core/tolerances.py); every other "
        "tolerance is a float32 rounding bound (no false alarms)",
        *[f"- {k}: {v}" for k, v in info.extra.items()],
    ]


def summary_markdown(results: Sequence[CheckResult], info: RunInfo, family: Family = CARTPOLE) -> str:
    """summary.md: the title, the lead, the verdict table (check, verdict, observed, allowed, likely cause), the
    knobs named, warnings, the run, the family's sections, then one section per check with its rows."""
    verdict = overall(results)
    headline = {PASS: "PASS: every check is within tolerance",
                FAIL: "FAIL: the port does not compute what the reference computes",
                ERROR: "ERROR: the port broke the adapter protocol"}[verdict]
    table = markdown_table(("check", "verdict", "observed", "allowed", "likely cause"),
                           [(r.name, r.verdict, r.observed, r.allowed, likely_causes(r) or "-") for r in results])
    knobs = list(dict.fromkeys(k for r in results for k in r.knobs))
    lines = [f"# {family.title or 'Parity check: ' + headline}", ""]
    if family.lead is not None:
        lines += [line for text in family.lead for line in (text, "")]
    else:
        if REFERENCE_SIDE in info.extra:
            lines += [f"Reference side: {info.extra[REFERENCE_SIDE]}.", ""]
        if info.platform is not None:
            lines += [info.platform.sentence(), ""]
    lines += [table, ""]
    if knobs:
        lines += [f"Likely causes (knobs of DESIGN.md's knob table): {', '.join(f'`{k}`' for k in knobs)}.", ""]
    warnings = [f"- {r.name}: {w}" for r in results for w in r.warnings]
    if warnings:
        lines += ["Warnings (not drifts; the exit code does not change):", "", *warnings, ""]
    lines += ["## Run", "", *(run_lines(results, info) if family.run is None else family.run), "",
              f"CSV: `{ALL_ROWS}` (every row) and one `<check>.csv` per check, columns {', '.join(CSV_COLUMNS)}.", ""]
    lines += list(family.sections)
    for r in results:
        lines += [f"## {r.name}: {r.verdict}", ""] + ([r.section, ""] if r.section else [])
        if r.causes:
            lines += ["Likely cause: " + likely_causes(r), ""]
        if r.repro:
            lines += [f"Repro: `{r.repro}/` holds the port call that shows this failure, alone: run `python "
                      f"{r.repro}/repro.py` (numpy and the port only; exit 1 while it still fails; the inputs in "
                      "inputs.npz, the commands in command.txt).", ""]
        elif r.repro_note:
            lines += [f"No repro: {r.repro_note}.", ""]
        if r.rows:
            lines += [rows_table(r.rows), ""]
        lines += [f"({r.seconds:.1f} s)", ""]
    return "\n".join(lines)


def result_json(results: Sequence[CheckResult], info: RunInfo, exit_code: int, family: Family = CARTPOLE) -> str:
    """result.json: the verdicts, causes and exit code with the run's seed, versions and device, for scripts; the
    same keys (RESULT_KEYS, each check's CHECK_KEYS) on every task, what only one family says under `details`."""
    return json.dumps({
        "task": family.task, "verdict": overall(results), "exit_code": exit_code,
        "knobs": list(dict.fromkeys(k for r in results for k in r.knobs)),
        "checks": [{"name": r.name, "verdict": r.verdict, "observed": r.observed, "allowed": r.allowed,
                    "causes": [{"knob": c.knob, "text": c.text} for c in r.causes], "seconds": round(r.seconds, 3),
                    "repro": r.repro or None}
                   for r in results],
        "command": info.command, "port": info.port, "configuration": info.configuration, "sizes": info.sizes,
        "seed": info.seed, "versions": info.versions, "device": info.device, "xla_flags": info.xla_flags,
        "started": info.started,
        "reference": info.extra.get(REFERENCE_SIDE, "jax_reference, live"),
        "reference_platform": None if info.platform is None else info.platform.fields(),
        "seconds": round(info.seconds, 3), "details": family.details,
    }, indent=2) + "\n"


def write_report(out: Path, results: Sequence[CheckResult], info: RunInfo, exit_code: int | None = None,
                 family: Family = CARTPOLE) -> list[Path]:
    """Write summary.md, result.json, parity.csv, <check>.csv and the family's own files into `out`; returns the
    paths written (every task's report, parity.core.report.Family saying what differs)."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for r in results:
        path = out / f"{r.name}.csv"
        atomic_write(path, csv_text([r]))
        written.append(path)
    atomic_write(out / ALL_ROWS, csv_text(results))
    written.append(out / ALL_ROWS)
    for name, text in family.files:
        atomic_write(out / name, text)
        written.append(out / name)
    atomic_write(out / SUMMARY, summary_markdown(results, info, family))
    written.append(out / SUMMARY)
    code = exit_code if exit_code is not None else {PASS: 0, FAIL: 1}.get(overall(results), 2)
    atomic_write(out / RESULT, result_json(results, info, code, family))
    written.append(out / RESULT)
    # Remove CSVs an earlier run wrote that this one did not (listed in the manifest).
    manifest = out / MANIFEST
    if manifest.exists():
        names = {p.name for p in written}
        for old in manifest.read_text().split():
            if old not in names and old.endswith((".csv", ".json")) and (out / old).exists():
                (out / old).unlink()
    atomic_write(manifest, "\n".join(p.name for p in written) + "\n")
    return written
