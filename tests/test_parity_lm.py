"""The LM suite's self-tests: each tree knob is caught and named at two sizes, the faithful side never flagged,
bad input exits 2 before any work."""
from __future__ import annotations

import pytest

from parity import tree_check
from parity.__main__ import main
from spec.tree_knobs import TREE_CHOICES, TreeKnobs

DRIFTS = [(k, v[1]) for k, v in TREE_CHOICES.items() if k != "rng"]
SIZES = ("selftest", "quick")


def failed_causes(knobs: TreeKnobs, size: str, seed: int) -> list[str]:
    rows = tree_check.run(tree_check.sizes()[size], knobs, seed, log=lambda line: None)
    return [r.cause for r in rows if r.verdict == "fail"]


@pytest.mark.parametrize("size, seed", [("selftest", 5), ("quick", 11)])
def test_the_faithful_side_is_never_flagged(size, seed):
    assert failed_causes(TreeKnobs(), size, seed) == []


@pytest.mark.slow
@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("knob, value", DRIFTS)
def test_each_tree_drift_is_caught_and_named(knob, value, size):
    causes = failed_causes(TreeKnobs().replace(**{knob: value}), size, seed=3 if size == "selftest" else 7)
    assert causes, f"{knob}={value} not caught at {size}"
    assert f"(knob `{knob}`)" in causes[0], causes
    others = [k for k, _ in DRIFTS if k != knob and f"(knob `{k}`)" in " ".join(causes)]
    assert not others, f"{knob}={value} also named {others}"


def test_the_cli_exits_1_and_names_the_knob(tmp_path, capsys):
    assert main(["check", "--task", "lm", "--size", "selftest", "--torch", "group_fitness=group_var",
                 "--out", str(tmp_path), "--quiet"]) == 1
    assert "knob `group_fitness`" in capsys.readouterr().out
    assert "FAIL" in (tmp_path / "summary.md").read_text()


@pytest.mark.parametrize("argv, says", [
    (["--task", "lm", "--torch", "stack_keys=nope"], "allowed: split, shared"),
    (["--task", "lm", "--torch", "antithetic=halves"], "unknown knob 'antithetic' for --task lm"),
    (["--task", "nope"], "unknown --task"),
])
def test_bad_input_exits_2_before_any_work(tmp_path, capsys, argv, says):
    out = tmp_path / "out"
    assert main(["check", *argv, "--out", str(out)]) == 2
    assert says in capsys.readouterr().err
    assert not out.exists()
