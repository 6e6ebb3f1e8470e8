"""A port as a gap-study arm: trained through its adapter's es_* methods (ports/train.py), in spawned workers,
under an identity that names it. Uses the numpy port of tests/ports (no PyPI package needed)."""
from __future__ import annotations

import csv

import numpy as np
import pytest

from gap import __main__ as gap_main
from gap.arms import PORT_PREFIX, port_arm
from gap.executors import Local
from gap.runs import ReferencePieces, RunSpec, execute, load_port_arm, run_all, train_spec
from gap.store import RunStore
from parity.mlp.adapter import CheckedPort
from parity.core.port import UsageError
from ports.train import NEEDED, load_trainable, train
from spec.config import Config
from spec.knobs import Knobs, RunSettings
from tests.ports.numpy_port import Drift, NumpyPort

SIZES = [Config(pop=16, hidden=8, max_env_steps=1200), Config(pop=32, hidden=16, layers=2, max_env_steps=2500)]
SEED = int(np.random.default_rng().integers(0, 10_000))     # fresh each run; printed by pytest on a failure


def returns_of(result) -> list[float]:
    return [h["mean_return"] for h in result.history]


@pytest.mark.parametrize("cfg", SIZES, ids=["pop16-3x8", "pop32-2x16"])
def test_a_faithful_port_trained_through_es_follows_the_reference_epoch_by_epoch(cfg):
    """The numpy port draws JAX's numbers: through ask/rollout/tell it must retrace torch_impl's faithful run (the
    reference's, DESIGN.md), every epoch; with its init, uniforms and action choice left out, the reference's
    pieces must take their place and give the same run."""
    from torch_impl.train import train as torch_train

    reference = torch_train(cfg, Knobs(), SEED, progress=False)
    pieces = ReferencePieces(cfg, RunSettings())
    port = train(CheckedPort(NumpyPort(cfg)), cfg, SEED, pieces)
    lacking = train(CheckedPort(NumpyPort(cfg, omit=("init_params", "action_uniforms", "actions"))), cfg, SEED, pieces)
    assert len(reference.history) >= 2, f"seed {SEED}: too short a run to compare epochs"
    assert returns_of(port) == returns_of(reference), f"seed {SEED}"
    assert returns_of(lacking) == returns_of(reference), f"seed {SEED}"
    assert (port.env_steps, port.solved, port.epochs) == (reference.env_steps, reference.solved, reference.epochs)


def test_a_drifted_port_learns_differently():
    cfg = SIZES[0]
    pieces = ReferencePieces(cfg, RunSettings())
    faithful = train(CheckedPort(NumpyPort(cfg)), cfg, SEED, pieces)
    halves = train(CheckedPort(NumpyPort(cfg, Drift(antithetic="halves"))), cfg, SEED, pieces)
    assert returns_of(halves) != returns_of(faithful), f"seed {SEED}"


def test_a_port_that_cannot_be_trained_is_refused_naming_what_it_lacks():
    with pytest.raises(UsageError, match="lacks forward, es_init, es_ask, es_tell, es_params"):
        load_trainable("tests.ports.numpy_port:required_only", SIZES[0])
    assert NEEDED == ("forward", "es_init", "es_ask", "es_tell", "es_params")


@pytest.mark.parametrize("port", ["tests.ports.numpy_port:required_only", "tests.ports.no_such_module:adapter",
                                  "no-colon"])
def test_gap_refuses_a_bad_port_before_any_work(port, tmp_path, capsys):
    out = tmp_path / "study"
    code = gap_main.main(["--port", port, "--arms", "jax_reference", "--out", str(out)],
                         trainer=lambda spec: pytest.fail("trained"))
    assert code == 2
    assert "--port" in capsys.readouterr().err
    assert not out.exists()


def test_a_port_arm_is_named_by_the_port_and_its_identity_differs_from_the_others():
    cfg = SIZES[0]
    arm = load_port_arm("tests.ports.numpy_port:faithful", cfg)
    assert arm == port_arm("tests.ports.numpy_port:faithful", "tests.ports.numpy_port (faithful)")
    assert (arm.name, arm.side, arm.source) == (PORT_PREFIX + "tests.ports.numpy_port (faithful)", "port",
                                                "tests.ports.numpy_port:faithful")
    other = load_port_arm("tests.ports.numpy_port:faithful_numpy_rng", cfg)
    ids = {RunSpec(a, 42, cfg).run_id for a in (arm, other)}
    assert len(ids) == 2 and RunSpec(arm, 42, cfg).run_id == RunSpec(load_port_arm(arm.source, cfg), 42, cfg).run_id
    with pytest.raises(ValueError, match="source"):
        type(arm)(arm.name, "port", arm.knobs)


def test_port_arms_train_in_spawned_workers_by_their_module_name(tmp_path):
    """Two seeds on two spawned processes: each re-imports the adapter from MODULE:ATTR and trains it."""
    cfg = Config(pop=8, hidden=4, max_env_steps=300)
    arm = load_port_arm("tests.ports.numpy_port:faithful_numpy_rng", cfg)
    specs = [RunSpec(arm, seed, cfg) for seed in (1, 2)]
    store = RunStore(str(tmp_path))
    outcome = run_all(specs, store, train_spec, executor=Local(2), log=lambda line: None)
    assert (outcome.finished, outcome.failed) == (2, [])
    rows = list(csv.DictReader(open(tmp_path / "runs.csv")))
    assert sorted(int(r["seed"]) for r in rows) == [1, 2]
    assert {r["arm"] for r in rows} == {arm.name} and {r["side"] for r in rows} == {"port"}
    assert all(int(r["env_steps"]) >= cfg.max_env_steps for r in rows)


def test_a_port_whose_name_changed_since_the_study_began_is_refused(tmp_path):
    cfg = Config(pop=8, hidden=4, max_env_steps=100)
    stale = port_arm("tests.ports.numpy_port:faithful_numpy_rng", "tests.ports.numpy_port (an older version)")
    fin = execute(train_spec, RunSpec(stale, 0, cfg))
    assert fin.run_row is None and "not the arm" in fin.error


def test_gap_with_a_port_compares_it_with_the_reference(tmp_path):
    """--port adds a main arm beside the reference, trained by the trainer the study is given, and reported."""
    seen = []

    def fake(spec):
        seen.append(spec.arm)
        steps = 4_000_000 + 100_000 * spec.seed + (300_000 if spec.arm.side == "port" else 0)
        return {"solved": True, "steps_to_solve": steps, "epochs": 3, "env_steps": steps,
                "history": [{"epoch": 0, "env_steps": steps, "mean_return": 480.0, "max_return": 500.0,
                             "sigma": float("nan"), "lr": float("nan"), "wall_s": 1.0}]}
    code = gap_main.main(["--port", "tests.ports.numpy_port:faithful", "--arms", "jax_reference", "--design", "none",
                          "--seeds", "3", "--workers", "1", "--resamples", "200", "--out", str(tmp_path)], trainer=fake)
    assert code == 0
    assert {a.side for a in seen} == {"jax", "port"}
    summary = (tmp_path / "summary.md").read_text()
    name = "port:tests.ports.numpy_port (faithful)"
    assert f"**What `{name}` costs**" in summary and f"{name} vs jax_reference" in summary
    assert "port arm from tests.ports.numpy_port:faithful" in summary
