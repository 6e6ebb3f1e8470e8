"""A numerical failure is a drift, not a protocol break, on every suite (parity/core/nonfinite.py).

A port returning NaN or inf where the reference's answer to the same call is finite fails the check that made the call
(exit 1), with the input, where the NaN / inf lie, the likely cause and a repro folder holding the call; a wrong shape,
a wrong dtype or a raise stays a protocol break (exit 2), and so does a NaN the reference gives on the same call.
The ports are faithful example adapters with one method overridden (tests/ports/nonfinite.py); the CartPole checks
run in-process through the command's own code, alone (--checks), at two sizes; the LM suite's checks through
parity.tree.check.run with its plan cut to the check under test.
"""
from __future__ import annotations

import json
import subprocess
from pathlib import Path

import numpy as np
import pytest

from parity.core import diagnose
from parity.tree import check as tree_check
from parity.__main__ import main
from parity.mlp.adapter import CheckedPort
from parity.core.port import NonFinite, SplitNoise, nonfinite_arrays
from parity.mlp.reference import ReferencePort
from parity.mlp.sizes import SELFTEST
from parity.mlp.suite import Context, run_check
from tests import fresh_process
from tests.parity.mlp.test_outside_ports import verdict_table

pytest_plugins = ["pytester"]          # the plugin's scenario runs a port author's file (tests/parity/test_pytest_plugin.py)
ROOT = Path(__file__).resolve().parents[3]
PORTS = "tests.ports.nonfinite"
BUNDLE = str(ROOT / "vectors" / "cartpole-quick")
ZERO_SPREAD = "the port divides by a zero spread: on constant N="


def check(out: Path, port: str, checks: str, *extra: str) -> tuple[int, str, dict]:
    """(exit code, summary.md, result.json) of `python -m parity check --port PORTS:port --checks checks`."""
    code = main(["--port", f"{PORTS}:{port}", "--checks", checks, "--out", str(out), "--quiet", *extra])
    summary = (out / "summary.md").read_text() if (out / "summary.md").exists() else ""
    result = json.loads((out / "result.json").read_text()) if (out / "result.json").exists() else {}
    return code, summary, result


def run_repro(folder: Path) -> subprocess.CompletedProcess:
    """`python repro.py` in a process of its own, forked from tests/fresh_process's server (torch's import saved)."""
    return fresh_process.run([str(folder / "repro.py")], ROOT, {"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"},
                             timeout=120)


# ----------------------------------------------------------------------------- the commonest shaping, no epsilon
@pytest.mark.parametrize("extra", [("--size", "selftest"), ("--size", "quick"), ("--against", BUNDLE)],
                         ids=["live-selftest", "live-quick", "against-cartpole-quick"])
def test_a_std_shaping_without_epsilon_is_the_fitness_drift_it_is(extra, tmp_path):
    """(f - f.mean()) / f.std(): NaN on the constant vector. Exit 1, fitness=std named, the zero spread said; its
    repro holds the constant vector and still fails alone."""
    code, summary, result = check(tmp_path, "no_epsilon_std", "fitness", *extra)
    verdict, cause = verdict_table(summary)["fitness"]
    assert (code, verdict) == (1, "fail"), summary
    assert "knob `fitness`" in cause and "(as fitness=std)" in cause and ZERO_SPREAD in cause, cause
    assert "every value is 37: spread 0" in cause and "it returns NaN (0/0, no epsilon)" in cause, cause
    assert result["knobs"] == ["fitness"] and "protocol" not in summary.split("## Run")[0]
    repro = tmp_path / "repro" / "fitness"
    inputs = np.load(repro / "inputs.npz")
    assert any(a.ndim == 1 and a.size > 1 and np.all(a == 37) for a in map(inputs.get, inputs.files))
    assert run_repro(repro).returncode == 1


def test_a_guarded_std_shaping_is_still_named_without_the_zero_spread_sentence(tmp_path):
    """The numpy port's fitness=std returns zeros on a zero spread: the same knob, no NaN, no zero-spread sentence."""
    code = main(["--port", "tests.ports.numpy_port:fitness_std", "--checks", "fitness", "--size", "selftest",
                 "--out", str(tmp_path), "--quiet"])
    _, cause = verdict_table((tmp_path / "summary.md").read_text())["fitness"]
    assert code == 1 and "(as fitness=std)" in cause and "zero spread" not in cause, cause


# ----------------------------------------------------------------------------- NaN or inf in other methods
INJECTED = [("nan_product", "products", "perturbed_linear", "NaN at 1 of"),
            ("inf_noise", "noise", "noise", "+inf at 1 of"),
            ("nan_gradient", "gradients", "gradient", "values of '1.weight'"),
            ("NaNForward", "products", "forward", "NaN at 2 of"),
            ("NaNStep", "updates", "optimizer_step", "values of '0.bias'")]


@pytest.mark.parametrize("size", ["selftest", "quick"])
@pytest.mark.parametrize("port, check_name, method, where", INJECTED, ids=[i[0] for i in INJECTED])
def test_nan_or_inf_from_a_method_fails_the_check_that_calls_it(port, check_name, method, where, size, tmp_path):
    code, summary, result = check(tmp_path, port, check_name, "--size", size)
    verdict, cause = verdict_table(summary)[check_name]
    assert (code, verdict, result["exit_code"]) == (1, "fail", 1), summary
    assert f"numerical failure: the port's `{method}` returns NaN or inf on finite input" in cause, cause
    assert where in cause and "likely " + diagnose.NONFINITE_HINTS[method][:20] in cause, cause
    section = summary.split(f"## {check_name}: fail")[1]
    assert f"- the call: {method}(" in section and "not a protocol break" in section, section
    repro = tmp_path / "repro" / check_name
    assert (repro / "inputs.npz").is_file() and run_repro(repro).returncode == 1


def test_a_nan_product_fails_against_the_bundle_too(tmp_path):
    code, summary, _ = check(tmp_path, "nan_product", "products", "--against", BUNDLE)
    assert code == 1 and verdict_table(summary)["products"][0] == "fail", summary
    assert "the reference's answer to the same call: finite" in summary


# ----------------------------------------------------------------------------- what stays a protocol break
@pytest.mark.parametrize("spec, check_name, says", [
    ("tests.ports.broken:TransposedLinear", "products", "the result has shape (4, 8, 4); expected (4, 4, 8)"),
    ("tests.ports.broken:Float64Fitness", "fitness", "the shaped fitness has dtype float64; expected float32"),
    ("tests.ports.broken:RaisingGradient", "gradients", "raised ZeroDivisionError"),
])
def test_a_wrong_shape_dtype_or_a_raise_still_exits_2(spec, check_name, says, tmp_path):
    code = main(["--port", spec, "--checks", check_name, "--size", "selftest", "--out", str(tmp_path), "--quiet"])
    summary = (tmp_path / "summary.md").read_text()
    assert code == 2 and verdict_table(summary)[check_name][0] == "error" and says in summary, summary


class NaNReferenceProduct(ReferencePort):
    """The reference returning NaN from perturbed_linear: as the port, and as the reference."""

    def perturbed_linear(self, W, A, B, x):
        out = np.array(super().perturbed_linear(W, A, B, x))
        out[0, 0, 0] = np.nan
        return out


def test_a_nan_the_reference_gives_on_the_same_call_stays_a_protocol_error():
    reference = NaNReferenceProduct(SELFTEST.cfg)
    ctx = Context(CheckedPort(NaNReferenceProduct(SELFTEST.cfg)), CheckedPort(reference), reference, SELFTEST, 0)
    result = run_check("products", ctx)
    assert result.verdict == "error" and "perturbed_linear" in result.observed, result.observed


# ----------------------------------------------------------------------------- the pieces
def test_nonfinite_arrays_names_each_array_by_its_path():
    finite, bad = np.zeros(3, np.float32), np.array([0, np.inf], np.float32)
    noise = SplitNoise({"0.weight": (finite, bad)}, {"0.weight": (finite, finite), "0.bias": bad})
    assert [p for p, _ in nonfinite_arrays(noise)] == [("forward", "0.weight", 1), ("update", "0.bias")]
    assert nonfinite_arrays(({"a": finite}, object())) == [] and nonfinite_arrays(np.array([1, 2])) == []
    assert diagnose.path_words(("update", "0.weight", 1)) == "'update' '0.weight' B"
    assert diagnose.path_words((0, "0.bias")) == "'0.bias'" and diagnose.path_words(()) == "the result"


def test_the_std_candidate_is_undefined_at_a_zero_spread_and_matches_nan_or_a_guard():
    f = np.full(8, 3.0)
    cand = diagnose.FITNESS_CANDIDATES["std"][1](f, 0)
    allowed = np.full(8, 1e-6)
    assert np.all(np.isnan(cand))
    assert diagnose.matches_candidate(np.full(8, np.nan), cand, allowed)
    assert diagnose.matches_candidate(np.zeros(8), cand, allowed)
    assert not diagnose.matches_candidate(np.ones(8), cand, allowed)
    assert diagnose.zero_spread(np.array([1.0, 2.0, 5.0, 5.0]), 2).startswith("group 1 (of size 2) holds 5 only")
    assert diagnose.zero_spread(np.array([1.0, 2.0])) == ""


def test_the_cause_reads_the_input_first():
    """An all-equal fitness input names the zero spread whatever the method; otherwise the method's suspects."""
    where = [((), np.full(4, np.nan, np.float32))]
    flat = diagnose.nonfinite_cause("shape_fitness", [("f", np.full(4, 2.0, np.float32)), ("group_size", 0)], where,
                                    "finite")
    assert "divides by a zero spread" in flat.text and "every value is 2" in flat.text and flat.knob is None
    plain = diagnose.nonfinite_cause("gradient", [("shaped", np.arange(4.0))], where, "finite")
    assert plain.text.endswith(diagnose.NONFINITE_HINTS["gradient"]) and "every value" in plain.text


# ----------------------------------------------------------------------------- parity.testing and the plugin
def test_assert_port_parity_fails_on_the_std_shaping_unless_declared():
    from parity.testing import ParityWarning, assert_port_parity
    from tests.ports.nonfinite import no_epsilon_std

    with pytest.raises(AssertionError) as err, pytest.warns(ParityWarning, match="accepts NaN"):
        assert_port_parity(no_epsilon_std)
    assert "check `fitness` fail" in str(err.value) and ZERO_SPREAD in str(err.value)
    assert "check `products` fail" not in str(err.value)
    with pytest.warns(ParityWarning, match="accepts NaN"):      # NaN fitness accepted, as upstream: advice only
        assert_port_parity(no_epsilon_std, expect={"fitness": "std"})


PLUGIN_FILE = """
    import pytest
    from tests.ports.nonfinite import nan_product, no_epsilon_std

    @pytest.mark.eggroll_parity(no_epsilon_std)
    def test_std(eggroll_parity):
        eggroll_parity.check()

    @pytest.mark.eggroll_parity(nan_product)
    def test_product(eggroll_parity):
        eggroll_parity.check()
"""


def test_the_plugin_fails_the_item_of_the_check_with_the_cause(pytester, monkeypatch):
    from tests.parity.test_pytest_plugin import outcomes_by_id, run_file

    result = run_file(pytester, monkeypatch, PLUGIN_FILE)
    failed = sorted(k for k, v in outcomes_by_id(result).items() if v == "FAILED")
    assert failed == ["test_product[products]", "test_std[fitness]"], result.stdout.str()
    result.stdout.fnmatch_lines(["*cause:    fitness shaping differs (knob `fitness`)*as fitness=std*zero spread*",
                                 "*cause:    numerical failure: the port's `perturbed_linear` returns NaN*"])
    assert "error" not in {v.lower() for v in outcomes_by_id(result).values()}


# ----------------------------------------------------------------------------- the LM suite's tree protocol
def only(monkeypatch, *names: str) -> None:
    """Cut the LM suite's plan to the checks named (each check runs as in the full suite)."""
    plan = tree_check._plan
    monkeypatch.setattr(tree_check, "_plan", lambda *a, **k: [p for p in plan(*a, **k) if p[0] in names])


LM_INJECTED = [("LMNaNProduct", "products", "perturbed_mm"), ("LMInfNoise", "noise", "noise"),
               ("LMNaNGradient", "gradients", "gradient"), ("LMNaNForward", "forward", "forward")]


@pytest.mark.parametrize("size", ["selftest", "quick"])
@pytest.mark.parametrize("port, check_name, method", LM_INJECTED, ids=[i[0] for i in LM_INJECTED])
def test_nan_or_inf_from_a_tree_method_fails_the_lm_check_that_calls_it(port, check_name, method, size, monkeypatch):
    from parity.tree.adapter import CheckedTreePort, PortSide
    from spec.tree_knobs import TreeKnobs
    from tests.ports import nonfinite

    cfg = tree_check.sizes()[size]
    only(monkeypatch, check_name)
    side = PortSide(CheckedTreePort(getattr(nonfinite, port)(cfg), cfg), cfg)
    rows = tree_check.run(cfg, TreeKnobs(), 3, log=lambda line: None, side=side)
    failed = [r for r in rows if r.verdict == "fail"]
    assert failed and {r.check for r in failed} == {check_name}, rows
    assert f"numerical failure: the port's `{method}` returns NaN or inf on finite input" in failed[0].cause
    assert f"the call: {method}(" in failed[0].cause


def test_the_lm_cli_exits_1_on_a_nan_live_and_against_with_its_repro_and_2_on_a_raise(monkeypatch, tmp_path, capsys):
    only(monkeypatch, "products")
    base = ["check", "--task", "lm", "--size", "selftest", "--quiet"]
    assert main([*base, "--port", f"{PORTS}:LMNaNProduct", "--out", str(tmp_path / "nan")]) == 1
    assert "numerical failure: the port's `perturbed_mm`" in capsys.readouterr().out
    assert run_repro(tmp_path / "nan" / "repro" / "products").returncode == 1
    assert main([*base, "--port", f"{PORTS}:LMRaisingProduct", "--out", str(tmp_path / "raise")]) == 2
    assert "port method `perturbed_mm`: raised FloatingPointError" in capsys.readouterr().err
    assert main(["check", "--task", "lm", "--quiet", "--against", str(ROOT / "vectors" / "lm-quick"), "--port",
                 f"{PORTS}:LMNaNProduct", "--out", str(tmp_path / "against")]) == 1
    assert "numerical failure: the port's `perturbed_mm`" in capsys.readouterr().out


def test_the_faithful_lm_port_is_never_flagged_by_the_finite_outputs(monkeypatch):
    """Every output of the worked example passes finite_outputs (the products and fitness checks, two sizes)."""
    from examples.lm_adapter import LMAdapter
    from parity.tree.adapter import CheckedTreePort, PortSide
    from spec.tree_knobs import TreeKnobs

    only(monkeypatch, "products", "fitness")
    for size in ("selftest", "quick"):
        cfg = tree_check.sizes()[size]
        rows = tree_check.run(cfg, TreeKnobs(), 5, log=lambda line: None,
                              side=PortSide(CheckedTreePort(LMAdapter(cfg), cfg), cfg))
        assert rows and all(r.verdict == "pass" for r in rows), rows



def test_a_tree_port_s_nan_the_lm_reference_gives_too_is_not_judged_here():
    """nonfinite.tree_rows: rows where the LM reference's product on the same call is finite, None (the caller raises
    the protocol error) where it is NaN too."""
    from parity.core import nonfinite
    from parity.tree.adapter import CheckedTreePort
    from tests.ports.nonfinite import LMNaNProduct

    cfg = tree_check.sizes()["selftest"]
    rng = np.random.default_rng(7)
    W, A, B, x = (rng.standard_normal(s).astype(np.float32) for s in ((4, 6), (2, 4, 2), (2, 6, 2), (2, 3, 6)))
    with pytest.raises(NonFinite) as err:
        CheckedTreePort(LMNaNProduct(cfg), cfg).perturbed_mm(W, A, B, x)

    class Reference:
        def __init__(self, value):
            self.value = value

        def product(self, W, A, B, x, form):
            return np.full((2, 3, 4), self.value, np.float32)

    rows = nonfinite.tree_rows("products", err.value, Reference(1.0), cfg, None, tree_check.Row)
    assert [r.verdict for r in rows] == ["fail"] and "the reference's answer to the same call: finite" in rows[0].cause
    assert nonfinite.tree_rows("products", err.value, Reference(np.nan), cfg, None, tree_check.Row) is None
