"""The LM study's plumbing with a synthetic trainer: plan, resumable store, outcomes, comparisons and report."""
from __future__ import annotations

import math

import numpy as np
import pytest

from gap import study
from gap.lm import cli as lm_cli
from gap.lm import report as lm_report
from gap.lm import study as lm_study
from spec.lm import LM_PRESETS


def fake_trainer(spec):
    """A curve that falls from 8 bits/byte; the embedding drift learns 30% slower. Seeded by the run seed."""
    rng = np.random.default_rng(spec.seed)
    slow = 1.3 if spec.arm.name == "torch:embedding=lowrank" else 1.0
    rate = 0.02 / slow * (1 + 0.05 * rng.standard_normal())
    history = [{"epoch": e, "train_bpb": 8.0, "val_bpb": 3.0 + 5.0 * math.exp(-rate * (e + 1)), "wall_s": 0.0}
               for e in range(spec.config.epochs)]
    return history, "torch x, jax y", "test-host"


def run(tmp_path, *extra):
    return lm_cli.main(["--task", "lm", "--preset", "selftest", "--epochs", "200", "--seeds", "4", "--knob-seeds", "3",
                        "--workers", "1", "--out", str(tmp_path), "--resamples", "500", *extra], trainer=fake_trainer)


def test_plan_is_seed_major_and_covers_every_learning_knob():
    specs = lm_study.plan(LM_PRESETS["selftest"], 3, 2)
    assert [s.arm.name for s in specs[:6]] == [a.name for a in lm_study.arms()]
    assert len(specs) == 2 * 3 + 4 * 2
    assert {k for a in lm_study.arms() for k, _ in a.drifts} == set(lm_study.LEARNING_KNOBS)
    with pytest.raises(ValueError, match="unknown arm"):
        lm_study.plan(LM_PRESETS["selftest"], 3, 2, ["torch:nope"])


def test_outcome_censors_a_run_that_never_reaches_the_target():
    assert study.outcome([(0, 6.0), (9, 4.0), (19, 3.0)], 4.5, 20) == (3.0, 10, True)
    assert study.outcome([(0, 6.0), (19, 5.0)], 4.5, 20) == (5.0, 20, False)


def test_study_runs_resumes_and_names_the_slow_drift(tmp_path):
    assert run(tmp_path) == 0
    runs = study.read_runs(str(tmp_path))
    assert len(runs) == 2 * 4 + 4 * 3
    before = (tmp_path / "runs.csv").read_text()
    assert run(tmp_path) == 0                                   # resumes: nothing retrained
    assert (tmp_path / "runs.csv").read_text() == before
    comp = lm_report.comparisons(lm_report.outcomes(str(tmp_path), 4.0), [a.name for a in lm_study.arms()], 500)
    slow = comp[(comp.arm == "torch:embedding=lowrank") & (comp.outcome == "epochs to target")].iloc[0]
    assert 1.2 < slow.ratio < 1.4 and slow.ratio_lo > 1.0
    same = comp[(comp.arm == "torch:stack_keys=shared") & (comp.outcome == "epochs to target")].iloc[0]
    assert same.ratio_lo <= 1.0 <= same.ratio_hi
    text = (tmp_path / "summary.md").read_text()
    assert "torch:jax / jax_reference" in text and "embedding leaves" in text
    assert (tmp_path / "curves.png").stat().st_size > 0


def test_an_interrupted_write_is_cut_and_the_run_redone(tmp_path):
    assert run(tmp_path, "--arms", "jax_reference") == 0
    path = tmp_path / "runs.csv"
    path.write_text(path.read_text()[:-7])                      # half a line
    assert run(tmp_path, "--arms", "jax_reference") == 0
    assert len(study.read_runs(str(tmp_path))) == 4
