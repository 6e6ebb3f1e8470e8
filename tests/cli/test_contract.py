"""One suite contract on every task (issue 51 items 1 and 2): `python -m parity check --task T ... --json` prints one
result.json of the same schema on cartpole, lm, tree and int8, the tidy CSV has the same header, and a flag a task
cannot honour exits 2 with a sentence before any work, writing nothing."""
from __future__ import annotations

import csv
import json

import pytest

from parity import __main__ as cli
from parity.core.report import CHECK_KEYS, RESULT_KEYS
from parity.core.verdict import CSV_COLUMNS
from parity.int8.pieces import GROUPS
from parity.mlp.suite import CHECKS as CARTPOLE_CHECKS
from parity.tree.check import CHECKS as TREE_CHECKS

SMALLEST = {   # task: (its smallest run, the checks its result.json lists)
    "cartpole": (["--size", "selftest"], CARTPOLE_CHECKS),
    "lm": (["--size", "selftest"], TREE_CHECKS),
    "tree": (["--port", "examples.gpt_adapter:GPTAdapter", "--size", "selftest"], TREE_CHECKS),
    "int8": (["--size", "selftest", "--epochs", "1"], GROUPS),
}


@pytest.mark.slow
@pytest.mark.parametrize("task", SMALLEST)
def test_every_task_prints_one_result_json_of_one_schema(task, tmp_path, capsys):
    """The same top-level keys in the same order, the same keys per check, the CSV's header, on every task."""
    argv, checks = SMALLEST[task]
    code = cli.main(["check", "--task", task, *argv, "--out", str(tmp_path), "--json", "--quiet"])
    out, err = capsys.readouterr()
    assert code == 0, err
    result = json.loads(out)
    assert result == json.loads((tmp_path / "result.json").read_text())
    assert tuple(result) == RESULT_KEYS and result["task"] == task
    assert (result["verdict"], result["exit_code"]) == ("pass", 0) and isinstance(result["details"], dict)
    assert [c["name"] for c in result["checks"]] == list(checks)
    assert all(tuple(c) == CHECK_KEYS for c in result["checks"]), result["checks"][0]
    assert result["reference_platform"]["precision"] and result["device"] and result["command"].startswith(
        "python -m parity ")
    with open(tmp_path / "parity.csv", newline="") as handle:
        rows = list(csv.reader(handle))
    assert tuple(rows[0]) == CSV_COLUMNS and len(rows) > len(checks)
    assert {r[0] for r in rows[1:]} == set(checks)
    assert all(tuple(next(csv.reader(open(tmp_path / f"{c}.csv")))) == CSV_COLUMNS for c in checks)
    summary = (tmp_path / "summary.md").read_text()
    assert "| check | verdict | observed | allowed | likely cause |" in summary and "\n## Run\n" in summary


@pytest.mark.parametrize("task", SMALLEST)
def test_out_into_a_file_exits_2_on_every_task(task, tmp_path, capsys):
    (tmp_path / "afile").write_text("not a folder")
    argv, _ = SMALLEST[task]
    assert cli.main(["check", "--task", task, *argv, "--out", str(tmp_path / "afile" / "report")]) == 2
    assert "which is a file; give a folder" in capsys.readouterr().err
    assert (tmp_path / "afile").read_text() == "not a folder"


def test_every_task_takes_the_common_flags():
    """One builder (parity.core.flags) gives every task's parser each common flag, so a task's refusal is a sentence,
    not argparse's 'unrecognized arguments'."""
    from parity.core.flags import COMMON_FLAGS
    from parity.int8 import cli as int8_cli
    from parity.tree import cli as tree_cli
    for parser in (cli.build_parser(), tree_cli.build_parser(), int8_cli.build_parser()):
        assert set(COMMON_FLAGS) <= set(parser._option_string_actions), parser.prog


@pytest.mark.slow
def test_an_int8_drift_is_a_failed_check_naming_its_knob(tmp_path, capsys):
    """int8's pieces as the one report's checks: the group where the torch side first parts fails with the C side's
    naming as its cause, under the knob, in result.json and in summary.md's verdict table; pieces.csv stays."""
    code = cli.main(["check", "--task", "int8", "--size", "selftest", "--epochs", "1", "--torch", "log2=mitchell",
                     "--out", str(tmp_path), "--json", "--quiet"])
    result = json.loads(capsys.readouterr().out)
    assert code == 1 and (result["verdict"], result["exit_code"], result["knobs"]) == ("fail", 1, ["log2"])
    parted = next(c for c in result["checks"] if c["verdict"] == "fail")
    assert parted["observed"].startswith("torch (torch_impl int8 port) with log2=mitchell parts at trace.")
    assert [c["knob"] for c in parted["causes"]] == ["log2"] and "Mitchell" in parted["causes"][0]["text"]
    assert f"| {parted['name']} | fail | {parted['observed']} |" in (tmp_path / "summary.md").read_text()
    assert (tmp_path / "pieces.csv").read_text().startswith("side,piece,shape,equal,differing,first_element")


SUBSETS = [   # (argv after `check`, the checks asked for, the exit code, a knob the report must name or None)
    (["--task", "lm", "--size", "selftest"], "fitness,noise", 0, None),
    (["--task", "lm", "--size", "selftest", "--torch", "stack_keys=shared"], "noise", 1, "stack_keys"),
    (["--task", "tree", "--port", "examples.gpt_adapter:GPTAdapter", "--size", "selftest"], "products,updates", 0, None),
]


@pytest.mark.slow
@pytest.mark.parametrize("argv, chosen, code, knob", SUBSETS, ids=[" ".join(a[:2]) + " " + c for a, c, _, _ in SUBSETS])
def test_checks_runs_the_subset_on_lm_and_tree_and_says_the_others_were_not_selected(argv, chosen, code, knob,
                                                                                      tmp_path, capsys):
    """--checks on the tree family: the checks named run and are judged (a drift they see is still caught and named);
    every other check is one skip row saying it was not selected, so the report still lists every check."""
    assert cli.main([*argv, "--checks", chosen, "--out", str(tmp_path), "--quiet", "--json"]) == code
    result = json.loads(capsys.readouterr().out)
    verdicts = {c["name"]: c["verdict"] for c in result["checks"]}
    assert set(verdicts) == set(TREE_CHECKS)
    assert all(verdicts[c] in ("pass", "fail") for c in chosen.split(","))
    assert all(v == "skip" for c, v in verdicts.items() if c not in chosen.split(",")), verdicts
    with open(tmp_path / "parity.csv", newline="") as handle:
        skipped = [r for r in csv.DictReader(handle) if r["check"] not in chosen.split(",")]
    assert skipped and all(r["cause"] == "not selected (--checks)" for r in skipped), skipped[:2]
    if knob is not None:
        assert knob in result["knobs"], result["knobs"]
