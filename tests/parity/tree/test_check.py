"""The tree suite on a port's own declared tree (`check --task tree`, issue 33): the worked GPT example passes every
check at two sizes and is never flagged; each tree knob and each drift made by overriding one protocol method is
caught and named on the GPT's tree, draw by draw and in distribution; the LM is one such tree; bad trees exit 2
before any work; vectors (`record --task tree`, `--against`) and parity.testing work for any tree."""
from __future__ import annotations

import csv
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from examples.gpt_adapter import GPTAdapter
from examples.gpt_port import GPTConfig
from parity.tree import check as tree_check
from parity.__main__ import main
from parity.tree.adapter import CheckedTreePort, PortSide, declared_run
from spec.tree_knobs import TREE_CHOICES, TreeKnobs
import tests.ports.gpt_ports as ports
from tests.helpers import NO_JAX

ROOT = Path(__file__).resolve().parents[3]

# Two sizes: a narrower GPT of three blocks at population 8, and the worked example's own at population 16.
SIZES = {"small": dict(model=GPTConfig(vocab=32, block_size=6, n_layer=3, n_head=2, n_embd=8), pop=8),
         "example": dict(pop=16)}
ALL_CHECKS = set(tree_check.CHECKS)
TREE_DRIFTS = [(k, v[1]) for k, v in TREE_CHOICES.items() if k != "rng"]


def rows_of(port, seed: int = 0, size: str = "quick"):
    run, _ = declared_run(port, tree_check.TREE_SIZES[size])
    return tree_check.run(run, TreeKnobs(), seed, lambda line: None, side=PortSide(CheckedTreePort(port, run), run))


def knobs_named(rows) -> set[str]:
    return {k for r in rows if r.verdict == "fail" for k in re.findall(r"knob `(\w+)`", r.cause)}


def judged(rows) -> set[str]:
    return {r.check for r in rows if r.verdict != "skip"}


@pytest.mark.parametrize("size, seed", [("small", 3), ("example", 0)])
def test_the_worked_example_passes_every_check(size, seed):
    rows = rows_of(GPTAdapter(**SIZES[size]), seed)
    assert [(r.check, r.cause) for r in rows if r.verdict == "fail"] == []
    assert judged(rows) == ALL_CHECKS
    forward = [r for r in rows if r.check == "forward"]
    assert sum("member" in r.quantity for r in forward) >= 8 and all(r.verdict == "pass" for r in forward)
    products = [r.quantity for r in rows if r.check == "products"]
    leaves = [leaf for leaf in GPTAdapter(**SIZES[size]).tree.leaves if leaf.cls in ("mm", "tmm")]
    assert all(any(q.startswith(leaf.path) for q in products) for leaf in leaves)       # every mm and tmm leaf
    assert any("[1]" in q for q in products) and all("x 2 x 3 rows" in q for q in products)   # slices; (batch, seq)


def test_full_rank_noise_passes_too():
    """freeze_nonlora off: the layer norms' full-rank noise is drawn, compared bit for bit and updated."""
    rows = rows_of(GPTAdapter(freeze_nonlora=False, **SIZES["small"]), 5)
    assert [(r.check, r.cause) for r in rows if r.verdict == "fail"] == []
    assert any(r.check == "noise" and "blocks.ln_1.weight (param)" in r.quantity and "port - ref" in r.quantity
               for r in rows)


@pytest.mark.slow
@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("knob, value", TREE_DRIFTS)
def test_each_tree_knob_is_caught_and_named_on_the_gpt(knob, value, size):
    rows = rows_of(GPTAdapter(TreeKnobs().replace(**{knob: value}), **SIZES[size]), seed=7)
    causes = [r.cause for r in rows if r.verdict == "fail"]
    assert causes and f"(knob `{knob}`)" in causes[0], causes
    assert knobs_named(rows) == {knob}, causes


# (the port overriding one method, the check that fails first, what its cause says)
METHOD_DRIFTS = [
    ("FitnessStd", "fitness", "(knob `fitness`): the port's shaped fitness is (f - mean) / std"),
    ("GradientTimesTwo", "gradients", "gradient scale differs: 'blocks.attn.k (mm)' gradient is 2x the reference's, "
                                      "a factor 2 (same direction)"),
    ("ProductWithoutLowRank", "products", "the mm product leaves out the low-rank term A B^T"),
    ("HalvesPairing", "noise", "(knob `antithetic`): member 0 is the mirror of member"),
    ("NoiseNotOverSqrtRank", "noise", "noise scaling differs: blocks.attn.k's noise is 1.41421 x the reference's (= "
                                      "sqrt(r)"),
    ("AdamStep", "updates", "(knob `optimizer`): the port's parameter updates match optax adam"),
    ("LrDecay", "trajectory", "(knob `lr_decay`): the port's update size relative to the reference's is epoch 1: 0.9"),
    ("SigmaDecay", "trajectory", "(knob `sigma_decay`): at epoch 1 the port's noise is 0.900000x"),
    ("IgnoresNoiseReuse", "trajectory", "(knob `noise_reuse`): es_ask's noise of blocks.attn.k at epoch 1 is the "
                                        "reference's generation 1"),
]


@pytest.mark.slow
@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("attr, check, says", METHOD_DRIFTS, ids=[d[0] for d in METHOD_DRIFTS])
def test_a_drift_made_by_overriding_one_method_is_caught_and_named(attr, check, says, size):
    rows = rows_of(getattr(ports, attr)(**SIZES[size]), seed=2)
    fails = [r for r in rows if r.verdict == "fail"]
    assert fails and fails[0].check == check and says in fails[0].cause, [(r.check, r.cause) for r in fails[:3]]
    assert knobs_named(rows) <= set(re.findall(r"knob `(\w+)`", says)), knobs_named(rows)    # no other knob named


def test_the_cli_names_a_drift_and_says_what_it_did_not_check(tmp_path, capsys):
    assert main(["check", "--task", "tree", "--port", "tests.ports.gpt_ports:FitnessStdSmall", "--out", str(tmp_path),
                 "--quiet"]) == 1
    assert "knob `fitness`" in capsys.readouterr().out
    summary = (tmp_path / "summary.md").read_text()
    assert "# Parity check, the port's declared tree: FAIL" in summary
    assert "- forward: the model's forward is the port's own, so it is checked against the port's own plain" in summary
    assert "- settings: pop 8, rank 2, sigma 0.05, lr 0.02, group_size 4, noise_reuse 2, freeze_nonlora True" in summary
    repro = tmp_path / "repro" / "fitness" / "repro.py"      # the failing call, replayed by the port alone
    done = subprocess.run([sys.executable, str(repro)], cwd=tmp_path, capture_output=True, text=True, timeout=120,
                          env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})
    assert done.returncode == 1 and "FAIL: the port still differs" in done.stdout, done.stdout + done.stderr


def test_the_cli_writes_result_json_and_json_prints_it_alone(tmp_path, capsys):
    """result.json beside summary.md with the CartPole suite's fields (per check its verdict and causes, the knob
    each names); --json prints it alone on stdout, the progress and verdict lines on stderr."""
    assert main(["check", "--task", "tree", "--port", "tests.ports.gpt_ports:FitnessStdSmall", "--seed", "5",
                 "--out", str(tmp_path), "--json"]) == 1
    out, err = capsys.readouterr()
    result = json.loads(out)
    assert result == json.loads((tmp_path / "result.json").read_text())
    assert "FAIL: report in" in err and "fitness    FAIL" in err and "FAIL" not in out.replace('"fail"', "")
    assert (result["verdict"], result["exit_code"], result["seed"], result["knobs"]) == ("fail", 1, 5, ["fitness"])
    checks = {c["name"]: c for c in result["checks"]}
    assert list(checks) == list(tree_check.CHECKS) and checks["forward"]["verdict"] == "pass"
    assert checks["fitness"]["verdict"] == "fail" and checks["fitness"]["repro"].endswith("repro/fitness")
    assert {c["knob"] for c in checks["fitness"]["causes"]} == {"fitness"} and checks["init"]["causes"] == []
    assert result["command"].startswith("python -m parity check --task tree --port") and result["reference_platform"]
    assert {"jax", "numpy", "torch"} <= set(result["versions"]) and "xla_flags" in result and result["device"]


def test_a_gradient_scale_is_named_in_sigma_n_and_r():
    """A gradient N times the reference's is named a factor N (parity.core.optscale's vocabulary), not only '8x'."""
    fails = [r for r in rows_of(ports.GradientTimesN(pop=8), seed=4) if r.verdict == "fail"]
    assert fails and fails[0].check == "gradients", [(r.check, r.cause) for r in fails]
    assert "'blocks.attn.k (mm)' gradient is 8x the reference's, a factor N at N=8 (same direction)" in fails[0].cause


def test_an_update_that_differs_gets_a_repro_of_its_update_call(tmp_path, capsys):
    """The updates check witnesses each leaf's comparison: its repro calls update(params, noise, shaped, sigma, lr)
    alone, from another folder, and fails while the step is 1/N of the reference's (named so)."""
    assert main(["check", "--task", "tree", "--port", "tests.ports.gpt_ports:UpdateOverNSmall", "--out",
                 str(tmp_path / "out"), "--quiet"]) == 1
    assert "on a gradient 1/N times the reference's" in capsys.readouterr().out
    folder = tmp_path / "out" / "repro" / "updates"
    assert json.loads((folder / "call.json").read_text())["method"] == "update"
    done = subprocess.run([sys.executable, str(folder / "repro.py")], cwd=tmp_path, capture_output=True, text=True,
                          timeout=120, env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})
    assert done.returncode == 1 and "port update()" in done.stdout and "FAIL: the port still differs" in done.stdout, \
        done.stdout + done.stderr


def test_one_cause_of_many_leaves_is_one_line_listing_them(tmp_path, capsys):
    """A step 1/N of the reference's fails `updates` at every updated leaf with one cause: the terminal and a test's
    message say it once, listing the leaves; the CSV keeps a row per leaf."""
    from parity.testing import assert_port_parity
    assert main(["check", "--task", "tree", "--port", "tests.ports.gpt_ports:UpdateOverNSmall", "--seed", "6",
                 "--out", str(tmp_path)]) == 1
    lines = [line for line in capsys.readouterr().out.splitlines() if "the step differs" in line]
    leaves = [leaf.path for leaf in ports.UpdateOverNSmall().tree.of_class("mm", "tmm")]
    assert len(lines) == 2 and lines[0].startswith("updates    FAIL"), lines          # the check's line, the verdict's
    assert all(line.endswith(f"(leaves {', '.join(leaves)})") for line in lines), lines
    assert all(line.count("the step differs") == 1 for line in lines)
    with open(tmp_path / "parity.csv", newline="") as handle:
        causes = [row["cause"] for row in csv.DictReader(handle)]
    assert all(any(c.startswith(f"{leaf}: the step differs") for c in causes) for leaf in leaves)
    with pytest.raises(AssertionError) as failed:
        assert_port_parity(ports.UpdateOverNSmall, task="tree", seed=6)
    message = str(failed.value)
    assert message.count("  cause:    the step differs") == 1 and f"(leaves {', '.join(leaves)})" in message, message


def test_merged_causes_join_only_what_differs_in_the_leaf_alone():
    from parity.tree.base import merged_causes
    paths = ["blocks.attn.k", "blocks.attn.kv", "lm_head"]
    texts = ["blocks.attn.k: the step differs", "lm_head: the step differs", "blocks.attn.k: the step differs",
             "gradient scale differs: 'blocks.attn.k (mm)' gradient is 2x", "gradient scale differs: 'lm_head (mm)' "
             "gradient is 2x", "noise scaling differs: blocks.attn.kv's noise is 1.4 x", "blocks.attn.k is perturbed "
             "(max 0.3)", "lm_head is perturbed (max 0.4)", "blocks.attn.k and lm_head differ", "fitness differs"]
    assert merged_causes(texts, paths) == [
        "the step differs (leaves blocks.attn.k, lm_head)",
        "gradient scale differs: each leaf's gradient is 2x (leaves blocks.attn.k (mm), lm_head (mm))",
        "noise scaling differs: blocks.attn.kv's noise is 1.4 x", "blocks.attn.k is perturbed (max 0.3)",
        "lm_head is perturbed (max 0.4)", "blocks.attn.k and lm_head differ", "fitness differs"]


# ----------------------------------------------------------------------------- in distribution
def test_the_worked_example_on_torchs_generator_passes_in_distribution():
    rows = rows_of(ports.TorchRng(), seed=4)
    assert [(r.check, r.cause) for r in rows if r.verdict == "fail"] == []
    assert judged(rows) == ALL_CHECKS
    assert any("KS distance" in r.quantity for r in rows if r.check == "noise")


@pytest.mark.slow
@pytest.mark.parametrize("knob, value", [("stack_keys", "shared"), ("frozen_leaves", "perturbed"),
                                         ("embedding", "lowrank"), ("group_fitness", "group_var")])
def test_each_visible_tree_knob_is_named_in_distribution_on_the_gpt(knob, value):
    rows = rows_of(GPTAdapter(TreeKnobs(rng="torch").replace(**{knob: value}), pop=8), seed=6)
    causes = [r.cause for r in rows if r.verdict == "fail"]
    assert causes and f"(knob `{knob}`)" in causes[0], causes


@pytest.mark.parametrize("attr, says", [("TorchRngSigmaDecay", "(knob `sigma_decay`)")])
def test_the_loops_schedules_are_named_in_distribution(attr, says):
    fails = [r for r in rows_of(getattr(ports, attr)(), seed=1) if r.verdict == "fail"]
    assert fails and fails[0].check == "trajectory" and says in fails[0].cause, [(r.check, r.cause) for r in fails]


# ----------------------------------------------------------------------------- the LM is one such tree
def test_the_lm_runs_as_a_declared_tree():
    """examples.lm_adapter's port of the project's LM through --task tree's checks: its tree declared, its settings
    the tree sizes' defaults (the LM selftest preset's), and a drifted one named there too."""
    from examples.lm_adapter import LMAdapter
    from spec.lm import LM_PRESETS
    cfg = LM_PRESETS["selftest"]
    rows = rows_of(LMAdapter(cfg), 1, "selftest")
    assert [(r.check, r.cause) for r in rows if r.verdict == "fail"] == []
    assert judged(rows) == ALL_CHECKS - {"init", "forward"}    # the LM adapter: no init laws, no population_forward
    assert "population_forward/plain_forward/batch" in next(r.cause for r in rows if r.check == "forward")
    assert knobs_named(rows_of(LMAdapter(cfg, TreeKnobs(stack_keys="shared")), 1, "selftest")) == {"stack_keys"}


# ----------------------------------------------------------------------------- the product methods a tree needs
def test_a_tree_without_tmm_leaves_needs_no_perturbed_tmm():
    """Each product method is required only where the tree has a leaf of its class, and the products check runs the
    classes present: no perturbed_tmm, no tmm leaf, every check passes."""
    from parity.tree.adapter import built_tree_port
    rows = rows_of(built_tree_port(lambda: ports.WithoutTmm(pop=8), None, "WithoutTmm"), seed=1)
    assert [(r.check, r.cause) for r in rows if r.verdict == "fail"] == []
    products = [r.quantity for r in rows if r.check == "products"]
    assert products and all("(mm " in q for q in products) and any(q.startswith("blocks.mlp.c_fc") for q in products)


def test_a_tree_with_tmm_leaves_and_no_perturbed_tmm_exits_2_with_the_signature(tmp_path, capsys):
    out = tmp_path / "out"
    assert main(["check", "--task", "tree", "--port", "tests.ports.gpt_ports:NoTmmMethod", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert "lacks required method(s) perturbed_tmm (its tree has tmm leaves blocks.mlp.c_fc)" in err, err
    assert "perturbed_tmm(W (a, b), A (m, a, r), B (m, b, r), x (m, batch, a)) -> (m, batch, b)" in err, err
    assert "perturbed_mm" not in err, err
    assert not out.exists()


# ----------------------------------------------------------------------------- bad trees
BAD_TREES = [
    ("ParamNotInTree", "no leaf class for blocks.attn.bias"),
    ("LeafNotInParams", "do not match the declared tree: missing lm_head"),
    ("UnknownClass", "unknown leaf class(es) blocks.attn.q: 'lora'; known: mm, tmm, param, embedding, excluded"),
    ("ScanAxisOutOfRange", "scan axis 3 is out of range for shape (2, 16, 16) (axes 0..2)"),
    ("ScanAxisNotLeading", "scan axes must be a leaf's leading axes in order ((0,), (0, 1), ...)"),
    ("NotAMatrix", "a mm slice must be a matrix, got slice shape (2, 16, 16)"),
    ("EmptyTree", "the tree has no leaves; declare at least one"),
    ("OddPopulation", "pop 7 is odd but members pair antithetically (2k, 2k+1); use an even population such as 8"),
]
LEAF_TYPOS = [                 # a leaf's name mistyped: the message names the leaf it may mean
    ("ClassTypo", "names leaves the parameters do not hold: blocks.attn.qq (did you mean 'blocks.attn.q'?) in "
                  "`leaf_classes`"),
    ("ScanTypo", "blocks.attn.qq (did you mean 'blocks.attn.q'?) in `scan_axes`"),
    ("LawTypo", "init law of 'blocks.attn.qq': no leaf 'blocks.attn.qq' in the tree (did you mean 'blocks.attn.q'?)"),
    ("TreeLeafTypo", "missing blocks.attn.qq (did you mean 'blocks.attn.q'?); not in the tree blocks.attn.q"),
]


@pytest.mark.parametrize("attr, says", BAD_TREES + LEAF_TYPOS)
def test_a_tree_that_cannot_be_right_exits_2_before_any_work(tmp_path, capsys, attr, says):
    out = tmp_path / "out"
    assert main(["check", "--task", "tree", "--port", f"tests.ports.gpt_ports:{attr}", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert says in err, err
    assert not out.exists()


def test_a_tree_that_cannot_fit_in_memory_exits_2_with_the_estimate(tmp_path, capsys, monkeypatch):
    import spec.limits
    monkeypatch.setattr(spec.limits, "available_bytes", lambda: 2 ** 30)
    out = tmp_path / "out"
    assert main(["check", "--task", "tree", "--port", "tests.ports.gpt_ports:TooBig", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert "pop 16 needs at least 1.7 GiB" in err and "has 1.0 GiB available" in err, err
    assert "use a population of at most about 4" in err, err          # (1 GiB - 0.7 GiB fixed) / 64 MiB a member
    assert not out.exists()


@pytest.mark.parametrize("argv, says", [
    (["--task", "tree"], "--task tree checks a port on its own declared tree: give --port"),
    (["--task", "tree", "--port", "examples.gpt_adapter:Nope"], "has no attribute 'Nope'"),
    (["--task", "tree", "--port", "examples.gpt_adapter:GPTAdapter", "--torch", "stack_keys=shared"],
     "--torch and --profile configure torch_impl"),
])
def test_bad_usage_exits_2_before_any_work(tmp_path, capsys, argv, says):
    out = tmp_path / "out"
    assert main(["check", *argv, "--out", str(out)]) == 2
    assert says in capsys.readouterr().err
    assert not out.exists()


def test_a_port_that_breaks_the_protocol_mid_run_exits_2_naming_the_method(tmp_path, capsys):
    assert main(["check", "--task", "tree", "--port", "tests.ports.gpt_ports:GradientOfOneLeaf", "--out",
                 str(tmp_path / "out"), "--quiet"]) == 2
    assert "port method `gradient`: returned paths ['lm_head']" in capsys.readouterr().err


# ----------------------------------------------------------------------------- the pytest plugin's assert
def test_assert_port_parity_takes_a_declared_tree():
    from parity.core.port import UsageError
    from parity.testing import SuiteCache, assert_port_parity
    runs = SuiteCache()           # one suite run per port, as the plugin shares them
    outcomes = assert_port_parity(ports.Small, task="tree", seed=3, cache=runs)
    assert {o.name: o.verdict for o in outcomes}["forward"] == "pass"
    with pytest.raises(AssertionError, match="knob `fitness`"):
        assert_port_parity(ports.FitnessStdSmall, task="tree", seed=3, cache=runs)
    assert_port_parity(ports.FitnessStdSmall, task="tree", seed=3, expect={"fitness": "std"}, cache=runs)
    assert len(runs) == 2
    with pytest.raises(UsageError, match="unknown knob 'activation' for task 'tree'"):
        assert_port_parity(ports.Small, task="tree", expect={"activation": "relu"})


# ----------------------------------------------------------------------------- vectors for any tree
SMALL_PORT = "tests.ports.gpt_ports:Small"


@pytest.fixture(scope="module")
def tree_bundle(tmp_path_factory) -> Path:
    """`python -m parity record --task tree --port tests.ports.gpt_ports:Small --size selftest --seed 4`."""
    out = tmp_path_factory.mktemp("vectors") / "gpt-selftest"
    assert main(["record", "--task", "tree", "--port", SMALL_PORT, "--size", "selftest", "--seed", "4", "--out",
                 str(out), "--quiet"]) == 0
    return out


def test_the_tree_bundle_says_what_it_holds(tree_bundle):
    from parity.tree.vectors import open_tree_bundle
    m = open_tree_bundle(tree_bundle, None, None).manifest
    assert (m["task"], m["size"], m["seed"], m["port"]) == ("tree", "selftest", 4, SMALL_PORT)
    assert m["run"]["pop"] == 8 and len(m["run"]["tree"]["leaves"]) == 15 and m["versions"]["jax"] != "not installed"
    assert {c["method"] for c in m["calls"]} == {"draws"}


@pytest.mark.parametrize("attr, code, says", [("Small", 0, "PASS"), ("FitnessStd", 1, "knob `fitness`"),
                                              ("HalvesPairing", 1, "knob `antithetic`"),
                                              ("IgnoresNoiseReuse", 1, "knob `noise_reuse`")])
def test_check_against_a_tree_bundle_gives_the_live_verdicts(tree_bundle, tmp_path, capsys, attr, code, says):
    """The replayed reference (JAX's recorded draws, numpy for the rest) reaches the live check's verdict and names
    the same knob; no check is skipped for want of a recorded draw."""
    port = f"tests.ports.gpt_ports:{attr}"
    if attr != "Small":
        port = f"tests.ports.gpt_ports:{attr}Small"
    assert main(["check", "--task", "tree", "--port", port, "--against", str(tree_bundle), "--out", str(tmp_path),
                 "--quiet"]) == code
    assert says in capsys.readouterr().out
    summary = (tmp_path / "summary.md").read_text()
    assert f"- reference: the bundle {tree_bundle}" in summary and "the bundle cannot answer" not in summary


def test_against_a_tree_bundle_runs_where_import_jax_fails(tree_bundle, tmp_path):
    done = subprocess.run([sys.executable, "-c", NO_JAX, "check", "--task", "tree", "--port", SMALL_PORT, "--against",
                           str(tree_bundle), "--out", str(tmp_path / "out"), "--quiet"],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert "PASS" in done.stdout


@pytest.mark.parametrize("argv, says", [
    (["--port", "examples.gpt_adapter:GPTAdapter"], "was recorded for another tree or other settings (pop differ"),
    (["--port", SMALL_PORT, "--seed", "5"], "holds seed 4, not 5"),
    (["--task", "lm"], "holds task 'tree', not lm"),
])
def test_a_tree_bundle_that_does_not_fit_the_port_exits_2(tree_bundle, tmp_path, capsys, argv, says):
    out = tmp_path / "out"
    argv = (["--task", "tree"] if "--task" not in argv else []) + argv
    assert main(["check", *argv, "--against", str(tree_bundle), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert says in err and "python -m parity record" in err, err
    assert not out.exists()


def test_record_refuses_a_tree_task_without_its_port(tmp_path, capsys):
    assert main(["record", "--task", "tree", "--out", str(tmp_path / "b")]) == 2
    assert "--port goes with --task tree" in capsys.readouterr().err
    assert main(["record", "--task", "tree", "--port", "tests.ports.gpt_ports:OddPopulation", "--out",
                 str(tmp_path / "b")]) == 2
    assert "pop 7 is odd" in capsys.readouterr().err
    assert not (tmp_path / "b").exists()


def test_assert_port_parity_takes_a_tree_bundle(tree_bundle):
    from parity.testing import assert_port_parity
    assert_port_parity(ports.Small, task="tree", against=tree_bundle, seed=4)
    with pytest.raises(AssertionError, match="knob `antithetic`"):
        assert_port_parity(ports.HalvesPairingSmall, task="tree", against=tree_bundle, seed=4)


# ----------------------------------------------------------------------------- the reference on any stack
def test_the_reference_draws_a_two_axis_stack_as_torch_impl_and_its_numpy_replay_do():
    """A declared tree with a stack on two leading axes (experts per layer): JAX's noise (recursive_scan_split per
    axis), torch_impl's (rng=jax) and the numpy replay's on JAX's draws agree within the noise check's bound, full-rank
    leaves bit for bit, and the numpy gradient is within the gradients check's bound of JAX's."""
    import numpy as np
    import torch
    from parity.tree import reference as R
    from parity.core.tolerances import gamma
    from parity.tree.numpy_reference import NumpyTreeReference
    from spec.tree import Leaf, TreeRun, make_tree
    from torch_impl.tree.noise import dense, make_plan, sample
    tree = make_tree([Leaf("experts.w", (2, 3, 5, 4), "mm", (0, 1)), Leaf("experts.b", (2, 3, 5), "param", (0, 1)),
                      Leaf("out", (4, 6), "tmm")])
    run = TreeRun(tree, pop=8, rank=2, sigma=0.1, freeze_nonlora=False)
    plan = make_plan(tree, TreeKnobs(), run.pop, run.rank, run.noise_reuse, run.freeze_nonlora)
    with torch.inference_mode():
        noise = sample(plan, plan.generator.sources(tree, 3, "sorted", "split"), 1, run.sigma)
        torch_side = {leaf.path: dense(noise, leaf).numpy() for leaf in tree.leaves}
    NR = NumpyTreeReference(R.draws)
    for leaf in tree.leaves:
        ref = R.dense_noise(run, 3, 1, leaf)
        bound = 0.0 if leaf.cls == "param" else 2 * gamma(run.rank) * R.factors_abs_product(run, 3, 1, leaf)
        for got in (NR.dense_noise(run, 3, 1, leaf), torch_side[leaf.path]):
            assert got.shape == ref.shape == (run.pop, *leaf.shape)
            assert np.all(np.abs(got.astype(float) - ref) <= bound), leaf.path
    assert not np.array_equal(torch_side["experts.w"][:, 0, 1], torch_side["experts.w"][:, 1, 0])   # a key per slice
    shaped = R.shape(run, np.random.default_rng(5).standard_normal(run.pop).astype(np.float32))
    ref_g, got_g = R.grads(run, 3, 1, shaped), NR.grads(run, 3, 1, shaped)
    w = np.abs(shaped).astype(float)
    for leaf in tree.leaves:
        mag, n = ((R.factors_abs_product(run, 3, 1, leaf), run.pop * run.rank + 3) if leaf.cls != "param" else
                  (np.abs(R.dense_noise(run, 3, 1, leaf)), run.pop + 2))
        bound = 2 * gamma(n) * np.tensordot(w, mag, axes=1) / run.pop
        assert np.all(np.abs(got_g[leaf.path].astype(float) - ref_g[leaf.path]) <= bound), leaf.path


def test_the_settings_and_the_memory_estimate():
    from spec.limits import check_fits, estimate_tree_check_bytes
    from spec.tree import Leaf, TreeError, TreeRun, make_tree
    tree = GPTAdapter().tree
    for bad, says in [(dict(pop=6, group_size=4), "does not divide the population 6"),
                      (dict(noise_reuse=-1), "noise_reuse must be an integer >= 0"),
                      (dict(freeze_nonlora="yes"), "freeze_nonlora must be True or False"),
                      (dict(init_laws=(("wte", "uniform", 1.0),)), "give 'zeros', 'ones' or ('normal', std)"),
                      (dict(init_laws=(("nope", "zeros", 0.0),)), "no leaf 'nope' in the tree")]:
        with pytest.raises((ValueError, TreeError), match=re.escape(says)):
            TreeRun(tree, **bad)
    small, big = estimate_tree_check_bytes(tree, 8, 2, 2 ** 24), estimate_tree_check_bytes(tree, 80, 2, 2 ** 24)
    assert big.fixed == small.fixed > 0 and len(small.parts) == 3      # the parameters' copies: not the population's
    assert big.total - big.fixed == 10 * (small.total - small.fixed)   # the noise and (uncapped) blocks grow with it
    assert check_fits(estimate=small, pop=8, available=1 << 30).total < 1 << 20      # the example: well under 1 MiB
    with pytest.raises(ValueError, match="not even a population of 2 fits"):
        check_fits(estimate=small, pop=8, available=small.fixed)
    head = make_tree([Leaf("lm_head", (50257, 768), "mm")])           # GPT-2's head: its blocks are capped
    capped = [estimate_tree_check_bytes(head, pop, 2, 2 ** 24) for pop in (16, 64)]
    dense = "dense perturbations of the largest leaf in blocks (float64, 4 arrays)"
    assert capped[0].parts[dense] == capped[1].parts[dense] == 4 * 2 ** 24 * 8
    assert capped[0].total < 1.5 * 2 ** 30 < 4 * 16 * 50257 * 768 * 8     # not the 18.4 GiB of four dense copies


def _op_by_op(run, seed, epoch, leaf, variant, what):
    """The reference's noise as upstream draws it, member by member (jax.random.normal of the slice's own shape under
    vmap, op by op): the oracle parity.tree.reference's bucketed, kept draws must equal bit for bit."""
    import jax
    import jax.numpy as jnp
    import numpy as np
    from parity.tree import reference as R
    keys = R.slice_keys(run, seed, leaf, variant)
    g = epoch // run.noise_reuse if run.noise_reuse else 0
    shape = (sum(leaf.slice_shape), run.rank) if leaf.cls in ("mm", "tmm") else leaf.slice_shape
    m = jnp.arange(run.pop)
    sign = jnp.where(m % 2 == 0, 1.0, -1.0).astype(jnp.float32)
    s_low = jnp.float32(run.sigma) / jnp.sqrt(run.rank)

    def one(key, i, sg):
        z = jax.random.normal(jax.random.fold_in(jax.random.fold_in(key, g), i // 2), shape)
        if what == "draws" or what == "abs":
            return z
        if leaf.cls == "param":
            return z * (sg * jnp.float32(run.sigma))
        a, b = leaf.slice_shape
        if variant == "tmm_transposed":
            return jnp.matmul(z[:a], (z[a:] * (sg * s_low)).T, precision=jax.lax.Precision.HIGHEST)
        return jnp.matmul(z[b:] * (sg * s_low), z[:b].T, precision=jax.lax.Precision.HIGHEST)
    members = m[::2] if what == "draws" else m
    out = np.asarray(R._per_slices(jax.vmap(one, in_axes=(None, 0, 0)), keys, leaf, members, sign[:members.size]))
    if what != "abs":
        return out
    z, b = out.astype(np.float64), leaf.slice_shape[1]
    return np.abs(z[..., b:, :] * float(s_low)) @ np.abs(np.swapaxes(z[..., :b, :], -1, -2))


@pytest.mark.parametrize("pop, rank, epoch", [(8, 2, 3), (20, 3, 1)])
def test_the_kept_bucketed_draws_are_upstreams_draws_bit_for_bit(pop, rank, epoch):
    """draws, dense_noise and factors_abs_product come from one compiled draw of a bucketed length, slice count and
    pair count, kept per inputs: each equals the member-by-member draw of the slice's own shape bit for bit, on plain,
    transposed and two-axis stacked leaves, for every key variant, at two sizes (fresh seeds)."""
    import numpy as np
    from parity.tree import reference as R
    from spec.tree import Leaf, TreeRun, make_tree
    tree = make_tree([Leaf("experts.w", (2, 3, 5, 4), "mm", (0, 1)), Leaf("experts.b", (2, 3, 5), "param", (0, 1)),
                      Leaf("out", (4, 6), "tmm"), Leaf("emb", (7, 3), "param")])
    run = TreeRun(tree, pop=pop, rank=rank, sigma=0.1, freeze_nonlora=False, noise_reuse=2)
    seed = int(np.random.SeedSequence().entropy % 2**31)
    for leaf in tree.leaves:
        for variant in ("faithful", "shared", "insertion") + (("tmm_transposed",) if leaf.cls == "tmm" else ()):
            got = R.draws(run, seed, epoch, leaf, variant)
            assert got.dtype == np.float32 and not got.flags.writeable
            assert np.array_equal(got.view(np.uint32), _op_by_op(run, seed, epoch, leaf, variant, "draws").view(
                np.uint32)), (seed, leaf.path, variant)
            dense = R.dense_noise(run, seed, epoch, leaf, variant)
            assert dense.shape == (pop, *leaf.shape) and np.array_equal(
                dense.view(np.uint32), _op_by_op(run, seed, epoch, leaf, variant, "dense").view(np.uint32)), (
                seed, leaf.path, variant)
        if leaf.cls != "param":
            assert np.array_equal(R.factors_abs_product(run, seed, epoch, leaf),
                                  _op_by_op(run, seed, epoch, leaf, "faithful", "abs")), (seed, leaf.path)
    other = R.draws(run, seed + 1, epoch, tree.leaves[0])
    assert not np.array_equal(other, R.draws(run, seed, epoch, tree.leaves[0]))   # kept per seed, not shared
