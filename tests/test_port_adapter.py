"""`python -m parity check --port ...` against outside ports (tests/ports, examples/).

The faithful numpy port and the hooks example pass; each drift of DESIGN.md's knob table, built
into a port that knows nothing of torch_impl, is caught (exit 1) and named in the summary, and only
that knob is named; absent optional methods are reported as skipped; a broken adapter gets a message
naming the method and what was expected, and exit 2, never a traceback.

The suite runs in-process through `parity.cli.main` (the command's own code: exit code, summary.md)
at its `selftest` size (pop 32, MLP 4-8-8-2); JAX compiles once per process, later runs take seconds.
"""
from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:        # tests.ports and examples import from the repository root
    sys.path.insert(0, str(ROOT))

from parity import __main__ as cli  # noqa: E402
from tests.ports import numpy_port  # noqa: E402

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
    """The README's example: an nn.Module + forward-hooks port, torch generator, every optional method."""
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


# ----------------------------------------------------------------------------- optional methods absent
@pytest.mark.parametrize("spec", ["tests.ports.numpy_port:required_only", "examples.minimal_adapter:adapter"])
def test_missing_optional_methods_are_skipped(spec, tmp_path):
    """Only the four required methods (the faithful numpy port stripped; the README's minimal adapter)."""
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
])
def test_protocol_breach_is_an_error_naming_the_method(spec, check_name, message, tmp_path):
    """Wrong shape, float64 or int64 where float32 is expected, an exception inside the port: verdict
    `error` on the check that called it, exit 2 (the port breaks the protocol), the rest still runs."""
    code, summary = check(spec, tmp_path, "--checks", "fitness,products,noise,gradients")
    table = verdict_table(summary)
    assert code == 2, summary
    assert table[check_name][0] == "error" and message in summary, table
    assert any(v == "pass" for v, _ in table.values())


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
    """README's promise: `--port` checks a port against the JAX reference without loading the torch side."""
    code = ("import sys; from parity import __main__ as m; "
            f"rc = m.main(['--port', 'examples.minimal_adapter:adapter', '--out', {str(tmp_path)!r}, '--quiet', "
            "'--size', 'selftest', '--checks', 'fitness,products,gradients']); "
            "print(rc, sorted(n for n in ('torch', 'torch_impl') if n in sys.modules))")
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.stdout.strip().endswith("0 []"), proc.stdout + proc.stderr
