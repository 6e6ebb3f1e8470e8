"""The suite tests itself: every drift knob is caught and named, the faithful profiles never flagged.

Runs the whole suite in-process at the tiny `selftest` size (parity.suite.SELFTEST). Every drift
value of PARITY_SPEC.md's knob table (rng=torch excepted: it is not a drift and must pass) must make
`check` exit 1 with that knob named in the summary's table; the oop-port and functional-port
profiles must list each of their drifts; the jax profile must pass at 20 seeds, jax-torchrng too.
"""
from __future__ import annotations

import pytest

from parity import __main__ as cli
from parity.report import overall
from parity.suite import SELFTEST, run_suite
from parity.torch_adapter import TorchPort
from spec.knobs import CHOICES, NUMERIC, PROFILE_DRIFTS, Knobs, drifts, profile

# Values of the numeric knobs that depart from the reference (0, 1.0 and 0.999).
NUMERIC_DRIFTS = {"noise_reuse": ("1", "3", "1000"), "lr_decay": ("0.9995", "0.9"), "sigma_decay": ("0.99", "1.0")}
DRIFTS = [(k, v) for k, values in CHOICES.items() for v in values[1:] if (k, v) != ("rng", "torch")]
DRIFTS += [(k, v) for k, values in NUMERIC_DRIFTS.items() for v in values]

pytestmark = pytest.mark.slow


def _check(tmp_path, *argv: str) -> tuple[int, str, str]:
    """Run `check` at the selftest size; returns (exit code, the summary's table part, the whole summary)."""
    rc = cli.main([*argv, "--size", "selftest", "--out", str(tmp_path), "--quiet"])
    summary = (tmp_path / "summary.md").read_text()
    return rc, summary.split("## Run")[0], summary


def test_every_departing_knob_value_is_covered():
    covered = {k for k, _ in DRIFTS}
    assert covered == (set(CHOICES) - {"rng"}) | set(NUMERIC)
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
    expected = set(drifts(profile(name))) - {"rng"}
    assert expected == set(PROFILE_DRIFTS[name]) - {"rng"}
    for knob in expected:
        assert f"knob `{knob}`" in table, (knob, table)


@pytest.mark.parametrize("seed", range(1, 21))
def test_the_faithful_port_is_never_flagged(seed, tmp_path):
    rc, table, summary = _check(tmp_path, "--seed", str(seed))
    assert rc == 0, table


@pytest.mark.parametrize("seed", [0, 7])
def test_torch_generator_is_not_a_drift(seed, tmp_path):
    rc, table, summary = _check(tmp_path, "--profile", "jax-torchrng", "--seed", str(seed))
    assert rc == 0, table


def test_a_port_that_claims_jax_draws_but_has_others_is_an_rng_drift():
    class Claims(TorchPort):
        jax_compatible_rng = True

    port = Claims(SELFTEST.cfg, Knobs(rng="torch"))
    port.jax_compatible_rng = True
    results = run_suite(port, SELFTEST, 0)
    assert overall(results) == "fail"
    assert "rng" in {k for r in results for k in r.knobs}
