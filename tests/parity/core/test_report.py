"""The parity report: the verdict table comes first, CSVs are tidy, and writes are atomic."""
from __future__ import annotations

import csv
import os

import pytest

import reporting
from parity.core import report
from parity.core.verdict import CSV_COLUMNS, Cause, CheckResult, Recorder, summarize


def _results():
    ok = Recorder("fitness")
    ok.bound("max |port - ref| / bound", "both", "N=8", 0.25, 1.0, "float32 bound")
    bad = Recorder("noise")
    bad.equal("members whose mirror differs", "port", "pop=8", 8, 0, "exact",
              cause=Cause("antithetic", "antithetic pairing layout differs (knob `antithetic`): member 0 ..."))
    bad.info("layout", "port", "pop=8", 1.0)
    return [summarize("fitness", ok, "fitness section"), summarize("noise", bad, "noise section")]


INFO = report.RunInfo(command="python -m parity check --torch antithetic=halves", port="torch_impl (antithetic=halves)",
                      configuration="profile jax", sizes="selftest", seed=3, versions={"torch": "x", "jax": "y",
                                                                                        "numpy": "z"},
                      device="cpu", started="now", seconds=1.0)


def test_summary_opens_with_the_verdict_table_and_names_the_knob(tmp_path):
    report.write_report(tmp_path, _results(), INFO)
    lines = (tmp_path / "summary.md").read_text().splitlines()
    assert lines[0].startswith("# Parity check: FAIL")
    assert lines[2] == "| check | verdict | observed | allowed | likely cause |"
    assert lines[4].startswith("| fitness | pass |") and lines[5].startswith("| noise | fail |")
    text = "\n".join(lines)
    for needle in ("knob `antithetic`", "--torch antithetic=halves", "seed: 3", "torch x", "jax y", "numpy z",
                   "device: cpu", "false-alarm"):
        assert needle in text


def test_the_report_states_xla_flags_or_that_xla_runs_at_its_defaults(tmp_path, monkeypatch):
    """XLA_FLAGS can change how JAX compiles (and so the reference's bits): summary.md and result.json say them."""
    import dataclasses
    import json
    for flags, said in (("--xla_cpu_enable_fast_math=true", "XLA_FLAGS: `--xla_cpu_enable_fast_math=true`"),
                        ("", "XLA_FLAGS: unset (XLA's defaults)")):
        report.write_report(tmp_path, _results(), dataclasses.replace(INFO, xla_flags=flags))
        assert f"- {said}" in (tmp_path / "summary.md").read_text().splitlines()
        assert json.loads((tmp_path / "result.json").read_text())["xla_flags"] == flags
    monkeypatch.setenv("XLA_FLAGS", "  --xla_backend_optimization_level=1 ")
    assert reporting.xla_flags() == "--xla_backend_optimization_level=1"
    monkeypatch.delenv("XLA_FLAGS")
    assert reporting.xla_flags() == "" and reporting.xla_flags_text("") == "unset (XLA's defaults)"


def test_csvs_are_tidy(tmp_path):
    report.write_report(tmp_path, _results(), INFO)
    with open(tmp_path / "parity.csv", newline="") as handle:
        rows = list(csv.reader(handle))
    assert tuple(rows[0]) == CSV_COLUMNS
    assert len(rows) == 1 + 3 and {r[0] for r in rows[1:]} == {"fitness", "noise"}
    assert {r[6] for r in rows[1:]} == {"pass", "fail", "info"}
    assert (tmp_path / "noise.csv").exists() and (tmp_path / "fitness.csv").exists()


def test_stale_csvs_go_and_no_temporary_files_stay(tmp_path):
    results = _results()
    report.write_report(tmp_path, results, INFO)
    report.write_report(tmp_path, results[:1], INFO)
    assert not (tmp_path / "noise.csv").exists()
    assert not [p for p in os.listdir(tmp_path) if p.endswith(".tmp")]


def test_an_interrupted_write_leaves_the_old_file(tmp_path, monkeypatch):
    target = tmp_path / "summary.md"
    target.write_text("old report")

    def broken(src, dst):
        raise KeyboardInterrupt

    monkeypatch.setattr(reporting.os, "replace", broken)
    with pytest.raises(KeyboardInterrupt):
        reporting.atomic_write(target, "new report")
    assert target.read_text() == "old report"
    assert os.listdir(tmp_path) == ["summary.md"]


def test_overall_verdict_order():
    passed = CheckResult("a", "pass", "", "", (), (), "")
    failed = CheckResult("b", "fail", "", "", (), (), "")
    errored = CheckResult("c", "error", "", "", (), (), "")
    skipped = CheckResult("d", "skip", "", "", (), (), "")
    assert report.overall([passed, skipped]) == "pass"
    assert report.overall([passed, failed]) == "fail"
    assert report.overall([failed, errored]) == "error"
