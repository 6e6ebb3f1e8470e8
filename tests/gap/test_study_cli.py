"""The studies' shared command line (gap.study_cli): every bad input of `--task lm` and `--task int8` exits 2
before any work, saying what was wrong, and writes nothing."""
from __future__ import annotations

import pytest

from gap import __main__ as gap_main


def no_training(spec):
    raise AssertionError(f"a bad input trained {spec.arm.name}")


@pytest.mark.parametrize("task, args, says", [
    ("lm", ["--seeds", "1"], "--seeds and --knob-seeds must be >= 2"),
    ("lm", ["--epochs", "0"], "--epochs must be >= 1"),
    ("lm", ["--corpus", "/nonexistent/corpus.txt"], "missing or empty"),
    ("lm", ["--from", "/nonexistent"], "no runs.csv there"),
    ("lm", ["--arms", "torch:nope"], "unknown arm"),
    ("int8", ["--seeds", "1"], "--seeds must be >= 2"),
    ("int8", ["--epochs", "0"], "--epochs must be >= 1"),
    ("int8", ["--workers", "0"], "--workers must be >= 1"),
    ("int8", ["--resamples", "50"], "--resamples must be >= 100"),
    ("int8", ["--corpus", "/no/such/corpus.txt"], "--corpus /no/such/corpus.txt: missing or empty"),
    ("int8", ["--from", "/no/such/study"], "no runs.csv there"),
])
def test_bad_input_exits_2_before_any_work(tmp_path, capsys, task, args, says):
    out = tmp_path / "out"
    assert gap_main.main(["--task", task, "--out", str(out), *args], trainer=no_training) == 2
    assert says in capsys.readouterr().err
    assert not out.exists()


@pytest.mark.parametrize("task", ["lm", "int8"])
def test_an_unknown_flag_exits_2_and_names_it(tmp_path, capsys, task):
    out = tmp_path / "out"
    with pytest.raises(SystemExit) as exc:
        gap_main.main(["--task", task, "--out", str(out), "--bogus"], trainer=no_training)
    assert exc.value.code == 2 and "unrecognized arguments: --bogus" in capsys.readouterr().err
    assert not out.exists()


@pytest.mark.parametrize("task, says", [("lm", "holds no finished runs; train some first"),
                                        ("int8", "holds no finished runs of this plan")])
def test_report_only_on_a_folder_without_runs_exits_2_and_makes_nothing(tmp_path, capsys, task, says):
    out = tmp_path / "out"
    assert gap_main.main(["--task", task, "--out", str(out), "--report-only"], trainer=no_training) == 2
    assert says in capsys.readouterr().err
    assert not out.exists()
