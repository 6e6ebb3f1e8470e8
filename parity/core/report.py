"""The parity report: summary.md (one verdict table first, then a section per check) and tidy CSVs beside it.

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
    return "; ".join(seen.values())


def overall(results: Sequence[CheckResult]) -> str:
    return worst(r.verdict for r in results)


def summary_markdown(results: Sequence[CheckResult], info: RunInfo) -> str:
    verdict = overall(results)
    headline = {PASS: "PASS: every check is within tolerance",
                FAIL: "FAIL: the port does not compute what the reference computes",
                ERROR: "ERROR: the port broke the adapter protocol"}[verdict]
    table = markdown_table(("check", "verdict", "observed", "allowed", "likely cause"),
                           [(r.name, r.verdict, r.observed, r.allowed, likely_causes(r) or "-") for r in results])
    knobs = list(dict.fromkeys(k for r in results for k in r.knobs))
    alpha = sum(r.alpha for r in results)
    lines = [f"# Parity check: {headline}", ""]
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
    lines += [
        "## Run",
        "",
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
        "",
        f"CSV: `{ALL_ROWS}` (every row) and one `<check>.csv` per check, columns {', '.join(CSV_COLUMNS)}.",
        "",
    ]
    for r in results:
        lines += [f"## {r.name}: {r.verdict}", "", r.section, ""]
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


def result_json(results: Sequence[CheckResult], info: RunInfo, exit_code: int) -> str:
    """result.json: the verdicts, causes and exit code with the run's seed, versions and device, for scripts."""
    return json.dumps({
        "verdict": overall(results), "exit_code": exit_code,
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
        "seconds": round(info.seconds, 3),
    }, indent=2) + "\n"


def write_report(out: Path, results: Sequence[CheckResult], info: RunInfo, exit_code: int | None = None) -> list[Path]:
    """Write summary.md, result.json, parity.csv and <check>.csv into `out`; returns the paths written."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for r in results:
        path = out / f"{r.name}.csv"
        atomic_write(path, csv_text([r]))
        written.append(path)
    atomic_write(out / ALL_ROWS, csv_text(results))
    written.append(out / ALL_ROWS)
    atomic_write(out / SUMMARY, summary_markdown(results, info))
    written.append(out / SUMMARY)
    code = exit_code if exit_code is not None else {PASS: 0, FAIL: 1}.get(overall(results), 2)
    atomic_write(out / RESULT, result_json(results, info, code))
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
