"""The LM suite's self-tests: each tree knob is caught and named at two sizes, the faithful side never flagged,
bad input exits 2 before any work; in distribution (rng=torch, parity/tree/dist.py) the same for every knob it can
see, the two it cannot (tmm_layout, leaf_order) reported as unobservable, and each of its tests shown able to fail."""
from __future__ import annotations

import pytest

from parity.tree import check as tree_check
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


def test_the_cli_writes_result_json_and_json_prints_it_alone(tmp_path, capsys):
    import json
    assert main(["check", "--task", "lm", "--size", "selftest", "--torch", "group_fitness=group_var",
                 "--out", str(tmp_path), "--json", "--quiet"]) == 1
    out, err = capsys.readouterr()
    result = json.loads(out)
    assert result == json.loads((tmp_path / "result.json").read_text()) and "FAIL: report in" in err
    assert (result["verdict"], result["exit_code"], result["knobs"]) == ("fail", 1, ["group_fitness"])
    assert [c["name"] for c in result["checks"]] == list(tree_check.CHECKS)
    assert "knobs" in result["configuration"] and result["reference_platform"]["precision"]


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


# ----------------------------------------------------------------------------- ports through the tree protocol
from examples.lm_adapter import LMAdapter                      # noqa: E402
from parity.tree.adapter import CheckedTreePort, PortSide      # noqa: E402


def port_causes(knobs: TreeKnobs, size: str, seed: int) -> list[str]:
    cfg = tree_check.sizes()[size]
    side = PortSide(CheckedTreePort(LMAdapter(cfg, knobs), cfg), cfg)
    rows = tree_check.run(cfg, knobs, seed, log=lambda line: None, side=side)
    assert {r.check for r in rows} >= {"init", "noise", "products", "fitness", "gradients", "updates", "forward",
                                       "trajectory"}
    return [r.cause for r in rows if r.verdict == "fail"]


def test_the_worked_example_port_passes_every_check():
    assert port_causes(TreeKnobs(), "selftest", 4) == []


@pytest.mark.slow
@pytest.mark.parametrize("knob, value", DRIFTS)
def test_each_tree_drift_is_named_through_the_protocol(knob, value):
    causes = port_causes(TreeKnobs().replace(**{knob: value}), "selftest", 9)
    assert causes and f"(knob `{knob}`)" in causes[0], causes
    assert not [k for k, _ in DRIFTS if k != knob and f"(knob `{k}`)" in " ".join(causes)], causes


def test_a_drifted_port_exits_1_and_names_the_knob(tmp_path, capsys):
    assert main(["check", "--task", "lm", "--size", "selftest", "--port", "tests.ports.lm_ports:SharedStackKeys",
                 "--out", str(tmp_path), "--quiet"]) == 1
    assert "knob `stack_keys`" in capsys.readouterr().out


@pytest.mark.parametrize("attr, says", [
    ("TreeNotParams", "do not match the declared tree: shapes differ: head"),
    ("UnknownClass", "unknown leaf class(es) blocks.up: 'lora'"),
    ("ScanAxisOutOfRange", "scan axis 3 is out of range for shape"),
    ("NoTree", "declares no tree: give `tree`"),
    ("OtherModel", "is not the byte-level LM's at this size (spec.lm.lm_tree(cfg), cfg d_model 8, layers 2, "
                   "d_hidden 16): shapes differ: blocks.bz (3, 8) (tree: (2, 8))"),
])
def test_a_tree_that_cannot_be_right_exits_2_before_any_work(tmp_path, capsys, attr, says):
    out = tmp_path / "out"
    assert main(["check", "--task", "lm", "--size", "selftest", "--port", f"tests.ports.lm_ports:{attr}",
                 "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert says in err, err
    assert not out.exists()


def test_a_port_that_breaks_the_protocol_exits_2_naming_the_method(tmp_path, capsys):
    assert main(["check", "--task", "lm", "--size", "selftest", "--port", "tests.ports.lm_ports:ScoresPerToken",
                 "--out", str(tmp_path / "out"), "--quiet"]) == 2
    assert "port method `forward`" in capsys.readouterr().err


def test_a_tree_given_as_classes_is_read_with_init_params():
    from spec.lm import LM_PRESETS, lm_tree
    from parity.tree.adapter import port_tree
    from tests.ports.lm_ports import ByClasses
    cfg = LM_PRESETS["selftest"]
    tree, notes = port_tree(ByClasses(cfg), cfg)
    assert (tree.leaves, notes) == (lm_tree(cfg).leaves, [])


def test_the_lockstep_trajectory_sees_a_training_loop_that_steps_otherwise():
    from tests.ports.lm_ports import TrainsAtTwiceTheRate
    cfg = tree_check.sizes()["selftest"]
    side = PortSide(CheckedTreePort(TrainsAtTwiceTheRate(cfg), cfg), cfg)
    rows = tree_check.run(cfg, TreeKnobs(), 2, log=lambda line: None, side=side)
    failed = {r.check for r in rows if r.verdict == "fail"}
    assert failed == {"trajectory"}, failed
    assert any("params after a training epoch differs" in r.cause for r in rows)


# ----------------------------------------------------------------------------- in distribution (rng=torch)
from parity.tree.dist import INVISIBLE            # noqa: E402

TORCH_RNG = TreeKnobs(rng="torch")
VISIBLE = [(k, v) for k, v in DRIFTS if k not in INVISIBLE]
ALL_CHECKS = {"init", "noise", "products", "fitness", "gradients", "updates", "forward", "trajectory"}


def torch_rng_rows(knobs: TreeKnobs, size: str, seed: int):
    return tree_check.run(tree_check.sizes()[size], knobs.replace(rng="torch"), seed, log=lambda line: None)


def ran(rows) -> set[str]:
    """The checks that judged something (not skipped whole)."""
    return {r.check for r in rows if r.verdict != "skip"}


@pytest.mark.parametrize("size, seed", [("selftest", 0), ("selftest", 5), ("quick", 1), ("quick", 11)])
def test_the_faithful_torch_rng_side_is_never_flagged_and_every_check_runs(size, seed):
    """The statistical rows' false-alarm budget is 6.5e-4 per run (parity/tree/dist.py); these seeds pass."""
    rows = torch_rng_rows(TreeKnobs(), size, seed)
    assert [r.cause for r in rows if r.verdict == "fail"] == []
    assert ran(rows) == ALL_CHECKS
    assert not any("no in-distribution mode" in r.cause for r in rows)


@pytest.mark.slow
@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("knob, value", VISIBLE)
def test_each_visible_tree_drift_is_caught_and_named_in_distribution(knob, value, size):
    rows = torch_rng_rows(TreeKnobs().replace(**{knob: value}), size, seed=2 if size == "selftest" else 8)
    causes = [r.cause for r in rows if r.verdict == "fail"]
    assert causes, f"{knob}={value} not caught at {size} with rng=torch"
    assert f"(knob `{knob}`)" in causes[0], causes
    others = [k for k, _ in DRIFTS if k != knob and f"(knob `{k}`)" in " ".join(causes)]
    assert not others, f"{knob}={value} also named {others}"


@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("knob, value", [(k, v) for k, v in DRIFTS if k in INVISIBLE])
def test_knobs_that_only_relabel_draws_are_reported_unobservable_not_detected(knob, value, size):
    rows = torch_rng_rows(TreeKnobs().replace(**{knob: value}), size, seed=6)
    assert [r.cause for r in rows if r.verdict == "fail"] == []
    said = [r for r in rows if r.quantity == f"knob `{knob}`"]
    assert len(said) == 1 and said[0].verdict == "skip" and "not observable in distribution" in said[0].cause


def test_the_exact_mode_keeps_comparing_draws_element_by_element():
    rows = tree_check.run(tree_check.sizes()["selftest"], TreeKnobs(), 1, log=lambda line: None)
    assert not any("not observable in distribution" in r.cause for r in rows)
    assert any(r.check == "noise" and "max (|port - ref| - bound)" in r.quantity for r in rows)


def test_the_worked_example_on_torchs_generator_passes_through_the_cli(tmp_path, capsys):
    assert main(["check", "--task", "lm", "--size", "selftest", "--seed", "3", "--port",
                 "examples.lm_adapter:TorchRngLMAdapter", "--out", str(tmp_path), "--quiet"]) == 0
    summary = (tmp_path / "summary.md").read_text()
    assert "PASS" in summary
    for knob in INVISIBLE:                              # what this mode cannot see, said in the report's header
        assert f"in distribution (the side does not draw JAX's numbers), knob `{knob}`: not observable" in summary


@pytest.mark.parametrize("size, seed", [("selftest", 7), ("quick", 2)])
def test_a_torch_rng_port_passes_every_check_through_the_protocol(size, seed):
    from tests.ports.lm_ports import TorchRng
    cfg = tree_check.sizes()[size]
    rows = tree_check.run(cfg, TreeKnobs(), seed, log=lambda line: None,
                          side=PortSide(CheckedTreePort(TorchRng(cfg), cfg), cfg))
    assert [r.cause for r in rows if r.verdict == "fail"] == []
    assert ran(rows) == ALL_CHECKS


@pytest.mark.slow
@pytest.mark.parametrize("knob, value", VISIBLE)
def test_each_visible_tree_drift_is_named_through_the_protocol_in_distribution(knob, value):
    from tests.ports.lm_ports import TorchRng
    cfg = tree_check.sizes()["selftest"]
    side = PortSide(CheckedTreePort(TorchRng(cfg, TreeKnobs().replace(**{knob: value})), cfg), cfg)
    causes = [r.cause for r in tree_check.run(cfg, TreeKnobs(), 4, log=lambda line: None, side=side)
              if r.verdict == "fail"]
    assert causes and f"(knob `{knob}`)" in causes[0], causes


@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("attr, check, says", [
    ("NoiseAtTwiceSigma", "noise", "x the reference's variance (sigma^2 = "),
    ("NoPairs", "noise", "member 2k+1 is not the negation of member 2k"),
    ("SameNoiseEveryEpoch", "noise", "the noise at epochs 0 and 1 is the same"),
    ("InitTooWide", "init", "init differs"),
    ("ForwardIgnoresHeadNoise", "forward", "the forward first departs at head"),
    ("AskAtTwiceSigma", "trajectory", "the noise of every low-rank leaf of the training loop (es_ask) has "),
    ("GradientTwiceAsLarge", "gradients", "gradient is 2x the reference's, a factor 2 (same direction)"),
])
def test_each_in_distribution_test_can_fail(attr, check, says, size):
    """A port drifting only where one in-distribution test looks is caught by that test (first failing check)."""
    import tests.ports.lm_ports as ports
    cfg = tree_check.sizes()[size]
    side = PortSide(CheckedTreePort(getattr(ports, attr)(cfg), cfg), cfg)
    fails = [r for r in tree_check.run(cfg, TreeKnobs(), 13, log=lambda line: None, side=side) if r.verdict == "fail"]
    assert fails and fails[0].check == check and says in fails[0].cause, [(r.check, r.cause) for r in fails]


@pytest.mark.parametrize("size", SIZES)
def test_the_statistical_rows_spend_exactly_the_stated_budget(size):
    """Init's, noise's and the trajectory's statistical rows split their check_alpha evenly: as many rows as the split
    assumes, so a faithful run fails by chance at most FALSE_ALARM (<= the suite's FAMILY_ALPHA)."""
    from parity.core.tolerances import FAMILY_ALPHA
    from parity.tree.dist import FALSE_ALARM, asked_tests, noise_tests
    from spec.lm import init_plan
    cfg = tree_check.sizes()[size]
    rows = torch_rng_rows(TreeKnobs(), size, 0)
    drawn = sum(rule.kind in ("normal", "h0") for rule in init_plan(cfg).values())
    assert sum("alpha=" in r.allowed for r in rows if r.check == "init") == 2 * drawn
    assert sum("alpha=" in r.allowed for r in rows if r.check == "noise") == noise_tests(cfg)
    assert sum("alpha=" in r.allowed for r in rows if r.check == "trajectory") == asked_tests(cfg)
    assert sum("alpha=" in r.allowed for r in rows) == 2 * drawn + noise_tests(cfg) + asked_tests(cfg)
    assert FALSE_ALARM <= FAMILY_ALPHA
