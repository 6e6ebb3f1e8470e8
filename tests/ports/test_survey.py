"""The survey (`python -m ports`): its rows, the readings set against the suite's verdicts, what it says it could
not check, its files; the pins it installs. Runs on the numpy port of tests/ports, so no PyPI package is needed;
the survey of the installed ports runs when they are there."""
from __future__ import annotations

import csv
import re
import tomllib
from pathlib import Path

import numpy as np
import pytest

from tests.ports_installed import needs as needs_package

from parity.mlp.adapter import CheckedPort, load_port
from parity.mlp.sizes import SELFTEST
from ports import __main__ as cli
from ports import registry
from ports.probes import KURTOSIS_Z, kurtosis_z, leaf_probes, numerical_rank, seed_probe
from ports.readings import Reading, agreement
from ports.report import SurveyInfo, agreement_cell, write
from ports.survey import survey_entry, unchecked
from spec.knobs import CHOICES, KNOB_NAMES

ROOT = Path(__file__).resolve().parents[2]


def numpy_entry(spec: str, readings: tuple, key: str = "numpy") -> registry.Entry:
    return registry.Entry(key, spec, "numpy", np.__version__, "numpy", "a test subject", readings)


def test_readings_agree_or_disagree_with_the_knobs_named():
    halves = Reading("antithetic", "halves", "pairs i, i + N/2", "x.py:1")
    same = Reading("bias_grad", "jax", "as the reference", "x.py:2")
    decay = Reading("sigma_decay", 1.0, "constant sigma", "x.py:3", note="the trajectory stops early")
    ran = {"noise", "gradients", "trajectory"}
    assert agreement(halves, {"antithetic"}, ran).agrees is True
    assert agreement(halves, set(), ran).agrees is False
    assert agreement(same, {"bias_grad"}, ran).agrees is False
    assert agreement(same, set(), ran).agrees is True
    missed = agreement(decay, set(), ran)
    assert (missed.agrees, missed.note, agreement_cell(missed)) == (False, "the trajectory stops early", "MISSED")
    assert agreement_cell(agreement(same, {"bias_grad"}, ran)) == "FALSE ALARM"
    assert agreement(halves, {"antithetic"}, {"fitness"}).agrees is None        # its checks did not run
    assert Reading("rng", "torch", "", "", named=False).drift is False


def test_the_survey_of_a_port_sets_the_suites_verdicts_beside_the_readings(tmp_path):
    """The numpy port with halves pairing at the selftest size: the suite names `antithetic`, as the reading says;
    a reading that claims a drift the port does not have is reported as missed; absent methods are listed."""
    readings = (Reading("antithetic", "halves", "pairs i and i + N/2", "numpy_port.py:_layout"),
                Reading("fitness", "jax", "the reference's shaping", "numpy_port.py:shape_fitness"),
                Reading("noise_reuse", 1, "a wrong reading, on purpose", "nowhere", note="planted"),
                Reading(None, "a fact", "outside the knobs", "numpy_port.py:1"))
    entry = numpy_entry("tests.ports.numpy_port:antithetic_halves", readings, "halves")
    result = survey_entry(entry, SELFTEST, 0, tmp_path, "cpu")
    assert result.status == "checked" and result.verdict == "fail"
    assert "antithetic" in result.knobs
    cells = {a.knob: agreement_cell(a) for a in result.agreements}
    assert cells == {"antithetic": "agrees (named)", "fitness": "agrees", "noise_reuse": "MISSED"}
    assert ("a fact", "outside the knobs (numpy_port.py:1); outside the knobs") in result.unchecked
    assert (tmp_path / "halves" / "summary.md").exists()
    bare = numpy_entry("tests.ports.numpy_port:required_only", ())
    lacking = [what for what, _ in unchecked(bare, CheckedPort(load_port(bare.spec, SELFTEST.cfg)))]
    assert lacking == ["no forward in the package", "no init_params in the package",
                       "no optimizer_init/optimizer_step in the package",
                       "no es_init/es_ask/es_tell/es_params in the package", "no action_uniforms in the package",
                       "no actions in the package"]
    path = write(tmp_path, [result], SurveyInfo("python -m ports (test)", "selftest", 0, {"python": "3"}, "cpu",
                                                "now", 1.0))
    text = path.read_text()
    assert "| `halves` |" in text and "MISSED" in text and "planted" in text
    rows = list(csv.DictReader(open(tmp_path / "ports.csv")))
    assert [(r["port"], r["status"], r["noise"]) for r in rows] == [("halves", "checked", "fail")]
    readings_csv = list(csv.DictReader(open(tmp_path / "readings.csv")))
    assert {(r["knob"], r["agrees"]) for r in readings_csv} == {("antithetic", "True"), ("fitness", "True"),
                                                                ("noise_reuse", "False")}


def test_a_port_that_is_not_installed_is_a_row_that_says_so(tmp_path):
    entry = registry.Entry("ghost", "ports.ghost:adapter", "ghost-es", "9.9", "ghost_es_not_here", "-", ())
    result = survey_entry(entry, SELFTEST, 0, tmp_path, "cpu")
    assert (result.status, result.installed, result.results) == ("not installed", "not installed", ())
    assert "pip install ghost-es==9.9" in result.error


def test_probes_tell_low_rank_noise_from_dense_and_seeded_from_fixed():
    """Unseeded: faithful noise passes every probe. The kurtosis band's false-alarm rate is derived (ports.probes,
    KURTOSIS_Z): 0 in 20,000 seeded draws at this shape; the clipped case sits at z >= 12 against a band of 6."""
    r = np.random.default_rng()
    sigma, rank, m, (o, i) = 0.2, 4, 512, (16, 12)
    A = r.standard_normal((m, o, rank)) * sigma / np.sqrt(rank)
    B = r.standard_normal((m, i, rank))
    eggroll = {p.probe: p for p in leaf_probes("w", np.einsum("mor,mir->moi", A, B), sigma, rank, A)}
    assert all(p.consistent for p in eggroll.values()), eggroll
    clipped = A.copy()
    clipped[..., 2:] = 0
    flagged = {p.probe: p for p in leaf_probes("w", np.einsum("mor,mir->moi", clipped * np.sqrt(2), B), sigma, rank,
                                               clipped)}
    assert flagged["columns of A that are zero for every member"].value == 2
    assert not flagged["kurtosis of the entries"].consistent
    dense = r.standard_normal((m, o, i)) * sigma
    assert numerical_rank(dense[0]) == min(o, i)
    full = {p.probe: p for p in leaf_probes("w", dense, sigma, rank)}
    assert not full["largest numerical rank of A_i B_i^T"].consistent
    assert seed_probe(lambda seed: {"b": np.ones(3)}).consistent is False
    assert seed_probe(lambda seed: {"b": np.full(3, seed)}).consistent is True


def eggroll_dense(r: np.random.Generator, m: int, o: int, i: int, rank: int, used: int | None = None) -> np.ndarray:
    """m members of E = A B^T, A ~ N(0, 1/r), B ~ N(0, 1); `used` keeps A's first columns (scaled to variance 1)."""
    A = r.standard_normal((m, o, rank)) / np.sqrt(rank)
    if used is not None:
        A[..., used:] = 0
        A *= np.sqrt(rank / used)
    return A @ r.standard_normal((m, i, rank)).swapaxes(1, 2)


def test_the_kurtosis_probe_is_calibrated():
    """400 seeded null draws at 8x6, 128 members: none flagged and z is standard normal within 4 standard errors
    (mean +- 4/sqrt(400); sd +- 4 sqrt((kurt_z - 1) / (4 * 400)) = 0.16 at kurt_z <= 3.5). The former 16-group SE
    fails it (sd 1.36, 7 draws past 4). An antithetic pair E, -E adds no information; rank 2 of 4 is always caught."""
    r = np.random.default_rng(7)
    z = np.array([kurtosis_z(eggroll_dense(r, 128, 8, 6, 4), 4)[2] for _ in range(400)])
    assert np.all(np.abs(z) <= KURTOSIS_Z), z[np.abs(z) > KURTOSIS_Z]
    assert abs(z.mean()) < 4 / np.sqrt(len(z)) and abs(z.std(ddof=1) - 1) < 0.16, (z.mean(), z.std(ddof=1))
    E = eggroll_dense(r, 64, 8, 6, 4)
    assert kurtosis_z(np.concatenate([E, -E]), 4) == pytest.approx(kurtosis_z(E, 4), rel=1e-9)
    clipped = [kurtosis_z(eggroll_dense(r, 512, 16, 12, 4, used=2), 4)[2] for _ in range(50)]
    assert min(clipped) > KURTOSIS_Z, clipped


def test_cli_refuses_bad_usage_before_any_work(tmp_path, capsys):
    assert cli.main(["--only", "nope", "--out", str(tmp_path / "x")]) == 2
    assert "unknown port(s) nope" in capsys.readouterr().err
    assert cli.main(["--size", "huge"]) == 2
    assert not (tmp_path / "x").exists()
    assert cli.main(["--list"]) == 0
    assert "torcheggroll" in capsys.readouterr().out
    for seed in ("-1", str(2 ** 32)):
        assert cli.main(["--seed", seed, "--out", str(tmp_path / "x")]) == 2
        assert "[0, 4,294,967,295]" in capsys.readouterr().err
    (tmp_path / "file").write_text("")
    assert cli.main(["--out", str(tmp_path / "file" / "survey")]) == 2
    assert "which is a file" in capsys.readouterr().err
    assert not (tmp_path / "x").exists()


def test_the_registry_pins_what_pyproject_and_the_makefile_install():
    extra = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]["ports"]
    pins = {m.group(1): m.group(2) for m in (re.match(r"([\w-]+)==([\d.]+)", req) for req in extra)}
    entries = registry.entries()
    assert {e.dist: e.pinned for e in entries} == pins
    alone = re.search(r"^PORTS_ALONE := ([\w-]+)==([\d.]+)", (ROOT / "Makefile").read_text(), re.M)
    assert pins[alone.group(1)] == alone.group(2)
    for e in entries:
        module, attr = e.spec.split(":")
        assert (ROOT / (module.replace(".", "/") + ".py")).exists() and attr
        for reading in e.readings:
            assert reading.knob is None or reading.knob in KNOB_NAMES, reading
            if reading.knob in CHOICES and not isinstance(reading.value, str):
                pytest.fail(f"{e.key}: {reading}")


@needs_package("torcheggroll", "eggroll")
def test_the_survey_of_the_installed_ports(tmp_path):
    code = cli.main(["--size", "selftest", "--only", "torcheggroll,eggroll-es", "--out", str(tmp_path), "--quiet"])
    assert code == 0
    rows = {r["port"]: r for r in csv.DictReader(open(tmp_path / "ports.csv"))}
    assert rows["torcheggroll"]["status"] == "checked" and "antithetic" in rows["torcheggroll"]["knobs_named"]
    assert rows["eggroll-es"]["noise"] == "not run" and "full rank" in rows["eggroll-es"]["could_not_check"] + \
        open(tmp_path / "unchecked.csv").read()
    probes = list(csv.DictReader(open(tmp_path / "probes.csv")))
    assert any(p["port"] == "torcheggroll" and p["probe"].startswith("noise identical") and p["value"] == "1"
               for p in probes)
