"""The suite tests itself: every drift knob is caught and named, the faithful profiles never flagged.

Runs the whole suite in-process at the tiny `selftest` size (parity.mlp.sizes.SELFTEST). Every drift
value of DESIGN.md's knob table (rng=torch and rng=jax-cpu excepted: they are no drift here and must pass) must make
`check` exit 1 with that knob named in the summary's table; the oop-port and functional-port
profiles must list each of their drifts; the jax profile must pass at 20 seeds, jax-torchrng too.
"""
from __future__ import annotations

import pytest

from parity import __main__ as cli
from parity.core.report import overall
from parity.mlp.sizes import SELFTEST
from parity.mlp.suite import run_suite
from parity.mlp.torch_side import TorchPort
import re
from pathlib import Path

from spec.knobs import CHOICES, NUMERIC, Knobs


def design_knob_table() -> dict[str, tuple[str, ...]]:
    """DESIGN.md's knob table: knob -> the values its second column lists in backticks (none for numeric knobs)."""
    text = (Path(__file__).resolve().parents[3] / "DESIGN.md").read_text()
    section = text.split("## Knobs", 1)[1].split("\n## ", 1)[0]
    table = {}
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) > 2 and cells[0].startswith("`"):
            table[cells[0].strip("`")] = tuple(re.findall(r"`([^`]+)`", cells[1]))
    return table


DOCUMENTED = design_knob_table()
# Values of the numeric knobs that depart from the reference (0, 1.0 and 0.999).
NUMERIC_DRIFTS = {"noise_reuse": ("1", "3", "1000"), "lr_decay": ("0.9995", "0.9"), "sigma_decay": ("0.99", "1.0")}
# Every documented value but the reference's (the first), rng=torch excepted: it is not a drift in the math.
NOT_DRIFTS = {("rng", "torch"), ("compile", "on"),    # must pass: the same math
              ("rng", "jax-cpu")}                    # JAX's CPU normals, as the reference here (on the CPU) draws them
DRIFTS = [(k, v) for k, values in DOCUMENTED.items() for v in values[1:] if (k, v) not in NOT_DRIFTS]
DRIFTS += [(k, v) for k, values in NUMERIC_DRIFTS.items() for v in values]
# What each published port departs in (DESIGN.md's profile table, REFERENCE's ports), rng aside.
PROFILE_EXPECTED = {
    "oop-port": {"activation", "init", "bias_noise", "bias_grad", "fitness", "lr_decay"},
    "functional-port": {"antithetic", "fitness", "bias_noise", "noise_reuse", "activation", "init", "lr_decay",
                        "actions"},
}

pytestmark = pytest.mark.slow


def _check(tmp_path, *argv: str) -> tuple[int, str, str]:
    """Run `check` at the selftest size; returns (exit code, the summary's table part, the whole summary)."""
    rc = cli.main([*argv, "--size", "selftest", "--out", str(tmp_path), "--quiet"])
    summary = (tmp_path / "summary.md").read_text()
    return rc, summary.split("## Run")[0], summary


def test_the_documented_knob_table_is_the_code_s():
    """DESIGN.md's table lists exactly the code's knobs and values, so DRIFTS (built from the page) is every drift."""
    assert set(DOCUMENTED) == set(CHOICES) | set(NUMERIC)
    for knob, values in CHOICES.items():
        assert DOCUMENTED[knob] == values, knob
    reference = Knobs()
    for knob, value in DRIFTS:
        assert str(getattr(reference, knob)) != value


@pytest.mark.parametrize("knob,value", DRIFTS, ids=[f"{k}={v}" for k, v in DRIFTS])
def test_a_drift_exits_1_and_names_its_knob(knob, value, tmp_path):
    rc, table, summary = _check(tmp_path, "--torch", f"{knob}={value}")
    assert rc == 1, summary[:3000]
    assert f"knob `{knob}`" in table, table


@pytest.mark.parametrize("name", ["oop-port", "functional-port"])
def test_published_port_profiles_list_each_of_their_drifts(name, tmp_path):
    rc, table, summary = _check(tmp_path, "--profile", name)
    assert rc == 1
    for knob in PROFILE_EXPECTED[name]:
        assert f"knob `{knob}`" in table, (knob, table)


# Two drifts in one run (docs/ports.md's examples): the run names both, and so does the trajectory where it can see the
# drift at all (fitness=std is ~1e-8 relative from the reference's shaping on CartPole returns: the fitness check's).
COMBINED = {("bias_noise=off", "sigma_decay=0.99"): {"bias_noise", "sigma_decay"},
            ("activation=tanh", "lr_decay=0.9995"): {"activation", "lr_decay"},
            ("fitness=std", "sigma_decay=0.99"): {"sigma_decay"}}


@pytest.mark.parametrize("first,second", list(COMBINED), ids=[f"{a}+{b}" for a, b in COMBINED])
def test_two_drifts_in_one_run_are_both_named(first, second, tmp_path):
    rc, table, summary = _check(tmp_path, "--torch", first, "--torch", second)
    assert rc == 1, summary[:3000]
    knobs = {first.split("=")[0], second.split("=")[0]}
    assert all(f"knob `{k}`" in table for k in knobs), table
    trajectory = next(line for line in table.splitlines() if line.startswith("| trajectory |"))
    assert set(re.findall(r"knob `(\w+)`", trajectory)) == COMBINED[(first, second)], trajectory


@pytest.mark.parametrize("seed", range(1, 21))
def test_the_faithful_port_is_never_flagged(seed, tmp_path):
    rc, table, summary = _check(tmp_path, "--seed", str(seed))
    assert rc == 0, table


@pytest.mark.parametrize("seed", [0, 7])
def test_torch_generator_is_not_a_drift(seed, tmp_path):
    rc, table, summary = _check(tmp_path, "--profile", "jax-torchrng", "--seed", str(seed))
    assert rc == 0, table


def test_a_port_that_claims_jax_draws_but_has_others_is_an_rng_drift():
    port = TorchPort(SELFTEST.cfg, Knobs(rng="torch"))
    port.jax_compatible_rng = True      # a false claim: its draws are torch's
    results = run_suite(port, SELFTEST, 0)
    assert overall(results) == "fail"
    assert "rng" in {k for r in results for k in r.knobs}


def test_a_compiled_forward_passes_the_suite(tmp_path):
    """compile=on is a speed-up, not a drift: torch.compile'd forwards must stay within every float32 bound. The
    suite's calls take three graphs (the products check's one layer; the whole net with noise and without); with
    dynamo's duck sizing two more were compiled where sizes that met on a first call (4 and 4) later parted
    (torch_impl.model._compiled)."""
    from torch._dynamo.utils import counters

    before = counters["stats"]["unique_graphs"]
    rc, table, summary = _check(tmp_path, "--torch", "compile=on")
    assert rc == 0, summary[:3000]
    assert counters["stats"]["unique_graphs"] - before <= 3
