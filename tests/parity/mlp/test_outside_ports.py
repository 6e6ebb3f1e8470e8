"""`python -m parity check --port ...` against outside ports (tests/ports, examples/).

The faithful numpy port and the hooks example pass; each drift of DESIGN.md's knob table, built
into a port that knows nothing of torch_impl, is caught (exit 1) and named in the summary, and only
that knob is named; absent optional methods are reported as skipped; a broken adapter gets a message
naming the method and what was expected, and exit 2, never a traceback.

The suite runs in-process through `parity.cli.main` (the command's own code: exit code, summary.md)
at its `selftest` size (pop 32, MLP 4-8-8-2); JAX compiles once per process, later runs take seconds.
"""
from __future__ import annotations

import contextlib
import inspect
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[3]
if str(ROOT) not in sys.path:        # tests.ports and examples import from the repository root
    sys.path.insert(0, str(ROOT))

from examples import instep_adapter  # noqa: E402
from parity import __main__ as cli  # noqa: E402
from tests.ports import broken, numpy_port  # noqa: E402

SIZE = ["--size", "selftest", "--quiet"]
FAITHFUL = [name for name, (_, knob) in numpy_port.VARIANTS.items() if knob is None]
DRIFTED = [(name, knob) for name, (_, knob) in numpy_port.VARIANTS.items() if knob is not None]


def check(spec: str, out: Path, *extra: str) -> tuple[int, str]:
    """(exit code, summary.md text or "") of `python -m parity check --port spec` run in-process."""
    code = cli.main(["--port", spec, "--out", str(out), *SIZE, *extra])
    summary = out / "summary.md"
    return code, summary.read_text() if summary.exists() else ""


def verdict_table(summary: str) -> dict[str, tuple[str, str]]:
    """check -> (verdict, likely cause) from the summary's first table."""
    rows = {}
    for line in summary.split("## ")[0].splitlines():
        cells = [c.strip() for c in re.split(r"(?<!\\)\|", line)[1:-1]]
        if len(cells) == 5 and cells[0] not in ("check", "---"):
            rows[cells[0]] = (cells[1], cells[4])
    return rows


def row(summary: str, check_name: str) -> str:
    """The verdict table's line for one check."""
    return next(line for line in summary.splitlines() if line.startswith(f"| {check_name} |"))


def named_knobs(summary: str) -> set[str]:
    """Knobs the verdict table's causes name (the diagnosis words them as knob `name`)."""
    return {k for _, cause in verdict_table(summary).values() for k in re.findall(r"knob `(\w+)`", cause)}


# ----------------------------------------------------------------------------- faithful ports pass
@pytest.mark.parametrize("name", FAITHFUL)
def test_faithful_numpy_port_passes(name, tmp_path):
    code, summary = check(f"tests.ports.numpy_port:{name}", tmp_path)
    table = verdict_table(summary)
    assert code == 0, summary
    assert set(table) == {"fitness", "products", "actions", "noise", "gradients", "updates", "init", "trajectory"}
    assert {v for v, _ in table.values()} == {"pass"}, table


def test_hooks_example_passes(tmp_path):
    """docs/ports.md's hooks example: an nn.Module + forward-hooks port, torch generator, every optional method."""
    code, summary = check("examples.hooks_adapter:adapter", tmp_path)
    assert code == 0, summary
    assert {v for v, _ in verdict_table(summary).values()} == {"pass"}
    assert "examples.hooks_port (nn.Module + forward hooks)" in summary


def test_hooks_port_trains_deterministically():
    """The example port is a real trainer too: a short CartPole run, the same numbers from the same seed."""
    from examples.hooks_port import train

    first = train(seed=3, pop=8, hidden=8, epochs=2)
    assert first == train(seed=3, pop=8, hidden=8, epochs=2)
    assert len(first) == 2 and all(8 <= r <= 500 for r in first)   # CartPole episodes last 8 to 500 steps


# ----------------------------------------------------------------------------- each drift: caught and named
@pytest.mark.parametrize("name, knob", DRIFTED, ids=[n for n, _ in DRIFTED])
def test_drifted_port_is_caught_and_named(name, knob, tmp_path):
    code, summary = check(f"tests.ports.numpy_port:{name}", tmp_path)
    table = verdict_table(summary)
    assert code == 1, summary
    failed = {c for c, (v, _) in table.items() if v == "fail"}
    assert failed, table
    assert named_knobs(summary) == {knob}, {c: table[c] for c in failed}
    assert "error" not in {v for v, _ in table.values()}


@pytest.mark.parametrize("name", sorted(numpy_port.PAIRS))
def test_two_drifts_of_an_outside_port_are_both_named(name, tmp_path):
    """The trajectory keeps going after the first parting: a second drift is named in the same run."""
    _, knobs, in_trajectory = numpy_port.PAIRS[name]
    seed = int(np.random.default_rng().integers(1000))      # fresh inputs each run
    code, summary = check(f"tests.ports.numpy_port:{name}", tmp_path, "--seed", str(seed))
    table = verdict_table(summary)
    assert code == 1, (seed, summary)
    assert named_knobs(summary) == knobs, (seed, table)
    assert set(re.findall(r"knob `(\w+)`", table["trajectory"][1])) == in_trajectory, (seed, table["trajectory"])


# ----------------------------------------------------------------------------- dense and split noise
@pytest.mark.parametrize("name", list(numpy_port.NOISE_FORM_DRIFTS))
def test_dense_noise_unlike_eggrolls_is_named_in_those_words(name, tmp_path):
    """A dense E that is full rank, scaled wrong or otherwise distributed: exit 1, the noise check says so in those
    words, and no knob is named (none describes it)."""
    _, words = numpy_port.NOISE_FORM_DRIFTS[name]
    code, summary = check(f"tests.ports.numpy_port:{name}", tmp_path)
    verdict, cause = verdict_table(summary)["noise"]
    assert code == 1 and verdict == "fail", summary
    for w in words:
        assert w in cause, cause
    assert named_knobs(summary) == set()


@pytest.mark.parametrize("seed", [1, 2, 3, 4, 5])
def test_a_faithful_dense_port_is_never_flagged(seed, tmp_path):
    """The dense statistics (rank, scale, distribution) at other seeds: no false alarm."""
    code, summary = check("tests.ports.numpy_port:dense_faithful_numpy_rng", tmp_path, "--seed", str(seed),
                          "--checks", "products,noise,gradients,trajectory")
    assert code == 0, summary


@pytest.mark.parametrize("name, forbidden", [("bias_noise_update_only", "bias_noise=off"),
                                             ("bias_noise_update_only_split", "bias_noise=off"),
                                             ("bias_noise_none", "update_only")])
def test_every_check_names_bias_noise_alike(name, forbidden, tmp_path):
    """Update-only bias noise (forward leaving it out, or given apart) and no bias noise at all: each check that
    fails says the same value of bias_noise, and a zero bias gradient is named, not "cosine 0"."""
    code, summary = check(f"tests.ports.numpy_port:{name}", tmp_path)
    causes = [cause for verdict, cause in verdict_table(summary).values() if verdict == "fail"]
    assert code == 1 and causes, summary
    said = "bias_noise=off" if forbidden == "update_only" else "bias_noise=update_only"
    for cause in causes:
        assert "knob `bias_noise`" in cause and said in cause and forbidden not in cause, cause
    assert "cosine 0" not in summary


def test_instep_example_passes_and_its_pattern_is_what_makes_it_checkable(tmp_path, monkeypatch):
    """examples/instep_adapter.py: a dense port drawing its noise inside step(). It passes; without the replaced
    noise-drawing method its step runs on its own noise, and the lockstep trajectory finds its es_tell step unlike
    the reference's step on the same gradient."""
    code, summary = check("examples.instep_adapter:adapter", tmp_path)
    table = verdict_table(summary)
    assert code == 0, summary
    assert {c for c, (v, _) in table.items() if v == "skip"} == {"actions", "updates", "init"}
    assert {v for c, (v, _) in table.items() if c not in ("actions", "updates", "init")} == {"pass"}, table
    monkeypatch.setattr(instep_adapter, "given_noise", lambda es, noise: contextlib.nullcontext())
    code, summary = check("examples.instep_adapter:adapter", tmp_path / "unpatched", "--checks", "trajectory")
    assert code == 1 and "step: max |port - expected| / bound" in row(summary, "trajectory").replace("\\|", "|")


def test_instep_port_trains():
    from examples.instep_port import train

    history = train(seed=1, pop=8, hidden=8, epochs=2)
    assert history == train(seed=1, pop=8, hidden=8, epochs=2) and all(8 <= r <= 500 for r in history)


# ----------------------------------------------------------------------------- NaN accepted: a warning
def test_a_faithful_port_that_accepts_nan_exits_0_with_the_warning_and_advice(tmp_path, capsys):
    code, summary = check("tests.ports.numpy_port:faithful_accepts_nonfinite", tmp_path)
    err = capsys.readouterr().err
    assert code == 0, summary
    assert "warning (not a drift): the port accepts NaN, +inf, -inf fitness" in err and "advice: reject" in err
    assert "Warnings (not drifts" in summary.split("## Run")[0]


def test_the_nan_row_never_heads_a_formula_drift(tmp_path):
    code, summary = check("tests.ports.numpy_port:fitness_std_accepts_nonfinite", tmp_path, "--checks", "fitness")
    line = row(summary, "fitness")
    assert code == 1 and "| fail | max \\|port - ref\\| / bound" in line and "NaN" not in line, line
    assert "knob `fitness`" in line


# ----------------------------------------------------------------------------- optional methods absent
@pytest.mark.parametrize("spec", ["tests.ports.numpy_port:required_only", "examples.minimal_adapter:adapter"])
def test_missing_optional_methods_are_skipped(spec, tmp_path):
    """Only the four required methods (the faithful numpy port stripped; the minimal adapter of docs/ports.md)."""
    code, summary = check(spec, tmp_path)
    table = verdict_table(summary)
    assert code == 0, summary
    assert {c for c, (v, _) in table.items() if v == "skip"} == {"actions", "updates", "init", "trajectory"}
    assert {c for c, (v, _) in table.items() if v == "pass"} == {"fitness", "products", "noise", "gradients"}
    for check_name, method in (("updates", "optimizer_init"), ("init", "init_params"), ("trajectory", "es_init")):
        section = summary.split(f"## {check_name}: skip")[1].split("\n## ")[0]
        assert "Skipped" in section and method in section, section
    assert "the port has no `forward` method" in summary      # the products check says what it left out


# ----------------------------------------------------------------------------- broken adapters
@pytest.mark.parametrize("spec, words", [
    ("tests.ports.broken:NoGradient", ["lacks required method(s) gradient", "gradient(noise, shaped (N,), sigma)"]),
    ("tests.ports.broken:not_an_adapter", ["lacks required method(s) noise, perturbed_linear, shape_fitness, gradient"]),
    ("tests.ports.broken:BrokenConstructor", ["calling BrokenConstructor(cfg)", "RuntimeError: this port needs a GPU"]),
    ("tests.ports.no_such_module:adapter", ["cannot import module 'tests.ports.no_such_module'"]),
    ("tests.ports.broken:no_such_attr", ["has no attribute 'no_such_attr'"]),
    ("tests.ports.broken", ["expects package.module:attr"]),
    ("tests.ports.broken:DenseWithFactorLinear", ["declares dense_noise = True",
                                                   "perturbed_linear(W (out,in), E (m,out,in), x (m,batch,in))"]),
    ("tests.ports.broken:DenseDeclaredVaguely", ["dense_noise must be True or False, got 'yes'"]),
])
def test_unloadable_port_is_a_usage_error(spec, words, tmp_path, capsys):
    code, summary = check(spec, tmp_path)
    err = capsys.readouterr().err
    assert code == 2 and summary == ""
    assert "Traceback" not in err
    for w in words:
        assert w in err, err


def test_port_flags_do_not_mix_with_torch_knobs(tmp_path, capsys):
    code, _ = check("tests.ports.numpy_port:faithful", tmp_path, "--torch", "fitness=std")
    assert code == 2 and "do not apply with --port" in capsys.readouterr().err


@pytest.mark.parametrize("spec, check_name, message", [
    ("tests.ports.broken:TransposedLinear", "products",
     "port method `perturbed_linear`: the result has shape (4, 8, 4); expected (4, 4, 8)"),
    ("tests.ports.broken:Float64Fitness", "fitness",
     "port method `shape_fitness`: the shaped fitness has dtype float64; expected float32"),
    ("tests.ports.broken:IntegerNoise", "noise",
     "port method `noise`: B of '0.weight' has dtype int64; expected float32"),
    ("tests.ports.broken:RaisingGradient", "gradients",
     "port method `gradient`: raised ZeroDivisionError: population of zero members"),
    ("tests.ports.broken:DenseTransposed", "noise",
     "port method `noise`: E of '0.weight' has shape (8192, 4, 8); expected (8192, 8, 4)"),
    ("tests.ports.broken:DenseFloat64", "noise", "port method `noise`: E of '0.weight' has dtype float64; expected float32"),
    ("tests.ports.broken:DenseUndeclared", "noise",
     "port method `noise`: '0.weight' must be a pair (A (128, 8, 4), B (128, 4, 4)), got one array of shape (128, 8, 4); "
     "a port that keeps no factors sets dense_noise = True"),
    ("tests.ports.broken:SplitMisspelt", "noise",
     "port method `noise`: returned keys ['forward', 'updates']; noise given apart is {\"forward\": noise dict"),
])
def test_protocol_breach_is_an_error_naming_the_method(spec, check_name, message, tmp_path):
    """Wrong shape, float64 or int64 where float32 is expected, an exception inside the port: verdict
    `error` on the check that called it, exit 2 (the port breaks the protocol), the rest still runs."""
    code, summary = check(spec, tmp_path, "--checks", "fitness,products,noise,gradients")
    table = verdict_table(summary)
    assert code == 2, summary
    assert table[check_name][0] == "error" and message in summary, table
    assert any(v == "pass" for v, _ in table.values())


def test_a_port_that_raises_leaves_its_traceback(tmp_path, capsys):
    """The terminal line and the check's section show where the port raised (its own frames, file:line); exit 2."""
    line = inspect.getsourcelines(broken.RaisingGradient.gradient)[1] + 1          # the raise
    code = cli.main(["--port", "tests.ports.broken:RaisingGradient", "--out", str(tmp_path), "--size", "selftest",
                     "--checks", "fitness,gradients"])
    out = capsys.readouterr().out
    summary = (tmp_path / "summary.md").read_text()
    assert code == 2
    terminal = next(t for t in out.splitlines() if t.startswith("[gradients] error"))
    assert f"broken.py:{line} in gradient]" in terminal, terminal
    section = summary.split("## gradients: error")[1]
    assert f'broken.py", line {line}, in gradient' in section and "ZeroDivisionError" in section, section
    assert "parity/mlp/adapter.py\", line" not in section         # the suite's own frames are left out


def test_a_wrong_return_value_says_where_the_method_is(tmp_path):
    line = inspect.getsourcelines(broken.TransposedLinear.perturbed_linear)[1]
    code, summary = check("tests.ports.broken:TransposedLinear", tmp_path, "--checks", "products")
    assert code == 2 and "`perturbed_linear` is defined at " in summary and f"broken.py:{line}" in summary


def test_port_module_that_fails_on_import_is_a_usage_error(tmp_path, monkeypatch, capsys):
    """A port whose module raises while importing (not an ImportError) gets a message, not a traceback."""
    (tmp_path / "port_failing_import.py").write_text("raise RuntimeError('needs a licence server')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    code, _ = check("port_failing_import:adapter", tmp_path / "out")
    err = capsys.readouterr().err
    assert code == 2 and "needs a licence server" in err and "RuntimeError" in err


# ----------------------------------------------------------------------------- the real command line
def test_command_line_imports_examples_from_the_repository_root(tmp_path):
    """`python -m parity check --port examples....` from the repository root: `-m` puts the working directory
    on sys.path, so `examples` (not an installed package) imports. A missing attribute stops the run right after
    the import (exit 2), so this costs a torch import, not a suite run (test_hooks_example_passes runs that)."""
    proc = subprocess.run([sys.executable, "-m", "parity", "check", "--port", "examples.hooks_adapter:no_such_attr",
                           "--out", str(tmp_path), *SIZE], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2, proc.stderr
    assert "module 'examples.hooks_adapter' has no attribute 'no_such_attr'" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_a_foreign_port_run_imports_neither_torch_nor_torch_impl(tmp_path):
    """docs/ports.md's promise: `--port` checks a port against the JAX reference without loading the torch side."""
    code = ("import sys; from parity import __main__ as m; "
            f"rc = m.main(['--port', 'examples.minimal_adapter:adapter', '--out', {str(tmp_path)!r}, '--quiet', "
            "'--size', 'selftest', '--checks', 'fitness,products,gradients']); "
            "print(rc, sorted(n for n in ('torch', 'torch_impl') if n in sys.modules))")
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.stdout.strip().endswith("0 []"), proc.stdout + proc.stderr
