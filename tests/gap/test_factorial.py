"""The factorial attribution: the design's resolution, the AFT fit against known effects (with censoring), and
the paper study's report end to end with a fake trainer."""
import csv
import itertools
import math

import numpy as np
import pandas as pd
import pytest

from gap import __main__ as cli
from gap import factorial
from tests.gap.test_report import fake_train


@pytest.fixture(scope="module")
def oop():
    return factorial.design("oop-port")


def test_design_is_a_resolution_iv_fraction_with_both_ends(oop):
    m = oop.matrix
    k = len(oop.factors)
    assert [f.knob for f in oop.factors] == ["rng", "activation", "init", "bias_noise", "bias_grad", "fitness",
                                             "lr_decay"]
    assert m.shape == (16, 7) and set(np.unique(m)) == {-1, 1}
    assert (m.sum(axis=0) == 0).all()                        # balanced: each level at half the points
    # Resolution IV: every main-effect column orthogonal to every two-factor interaction column (and to the others).
    for i in range(k):
        for a, b in itertools.combinations(range(k), 2):
            assert m[:, i] @ (m[:, a] * m[:, b]) == 0, (i, a, b)
        for j in range(i + 1, k):
            assert m[:, i] @ m[:, j] == 0
    rows = {tuple(r) for r in m}
    assert (1,) * k in rows and (-1,) * k in rows            # the profile itself and torch:jax are design points
    names = [a.name for a in oop.arms]
    assert len(set(names)) == 16 and "torch:oop-port" in names and "torch:jax" in names
    # The 21 two-factor interactions fall into 7 chains of 3, each chain's columns equal up to sign.
    assert sorted(len(c) for c in oop.chains) == [3] * 7
    for chain in oop.chains:
        cols = [m[:, [f.knob for f in oop.factors].index(a)] * m[:, [f.knob for f in oop.factors].index(b)]
                for a, b in chain]
        assert all(abs(int(cols[0] @ c)) == 16 for c in cols)
    assert factorial.resolution_of(m) == 4
    assert factorial.resolution_of(np.c_[m[:, :2], m[:, 0] * m[:, 1]]) == 3   # a III fraction is told apart


def _synthetic(d, effects: dict[str, float], seeds: int, sigma: float, budget: float, rng) -> pd.DataFrame:
    """Runs at every design point: log steps = log 15M + sum_i log(ratio_i)/2 z_i + N(0, sigma), censored at budget."""
    knobs = [f.knob for f in d.factors]
    rows = []
    for arm, z in zip(d.arms, d.matrix):
        mu = math.log(15e6) + sum(math.log(effects.get(kn, 1.0)) / 2 * zi for kn, zi in zip(knobs, z))
        for s in range(seeds):
            t = math.exp(mu + sigma * rng.standard_normal())
            rows.append({"arm": arm.name, "seed": s, "steps": min(t, budget), "solved": t < budget})
    return pd.DataFrame(rows)


def test_fit_recovers_known_effects_with_censoring(oop):
    truth = {"activation": 1.30, "bias_grad": 1.6}
    runs = _synthetic(oop, truth, seeds=4, sigma=0.12, budget=21e6, rng=np.random.default_rng(5))
    assert 0 < (~runs["solved"]).sum() < len(runs) // 4          # some runs censored, as at the paper preset
    fit = factorial.fit(runs, oop)
    assert fit.n_runs == 64 and fit.n_censored == int((~runs["solved"]).sum())
    by = {e.term: e for e in fit.effects}
    for knob, ratio in truth.items():
        assert by[knob].lo < ratio < by[knob].hi and by[knob].holm_p < 0.05, by[knob]
    for knob in set(by) - set(truth):
        assert by[knob].holm_p > 0.05, by[knob]
    assert fit.predicted_lo < 1.30 * 1.6 < fit.predicted_hi
    assert 0.08 < fit.sigma < 0.18                               # the residual scale is recovered
    assert all(e.holm_p > 0.05 for e in fit.interactions)        # none was simulated
    # Treating the censored runs as solved at the budget would understate bias_grad's effect: the model does not.
    naive = runs.assign(solved=True)
    assert factorial.fit(naive, oop).effects[4].ratio < by["bias_grad"].ratio


def test_fit_waits_for_every_point_and_a_solved_run(oop):
    runs = _synthetic(oop, {}, seeds=2, sigma=0.1, budget=30e6, rng=np.random.default_rng(1))
    assert factorial.fit(runs[runs["arm"] != oop.arms[3].name], oop) is None
    assert factorial.fit(runs.assign(solved=False), oop) is None
    assert factorial.fit(runs, oop) is not None


def test_power_grows_with_runs():
    p_small, need = factorial._power(0.1, 20)
    p_big, _ = factorial._power(0.1, 200)
    assert 0 < p_small < p_big <= 1 and need > 20


def _paper(tmp_path, trainer=fake_train, *extra):
    argv = ["--study", "paper", "--out", str(tmp_path), "--seeds", "4", "--attribution-seeds", "3", "--workers", "1",
            "--resamples", "300", "--max-steps", "60000", *extra]
    return cli.main(argv, trainer=trainer)


def test_paper_study_report_answers_the_four_questions(tmp_path):
    """The fake trainer's only effect is tanh x1.6: the factorial must name the activation and nothing else."""
    assert _paper(tmp_path) == 0
    for name in ("summary.md", "factorial.csv", "factorial.png", "comparisons.csv", "steps_to_solve.png"):
        assert (tmp_path / name).stat().st_size > 0, name
    text = (tmp_path / "summary.md").read_text()
    for part in ("## Factorial attribution of the `oop-port` drifts", "### Main effects", "alias chains",
                 "**Predicted beside observed**", "**What is left to noise**", "**Power**",
                 "**What `torch:functional-port` costs**", "runs trained on:", "published"):
        assert part in text, part
    with open(tmp_path / "factorial.csv") as f:
        rows = list(csv.DictReader(f))
    mains = {r["term"]: r for r in rows if r["kind"] == "main"}
    assert {k for k, r in mains.items() if r["verdict"] == "matters"} == {"activation"}
    assert 1.4 < float(mains["activation"]["ratio"]) < 1.8
    assert "Reproduced" in text or "A gap of another size" in text       # tanh's 1.6 is a gap


def never_solves(spec):
    history = [{"epoch": e, "env_steps": 1000 * (e + 1), "mean_return": 100.0, "max_return": 200.0, "sigma": 0.2,
                "lr": 0.1, "wall_s": 0.0} for e in range(60)]
    return dict(solved=False, steps_to_solve=None, epochs=60, env_steps=60_000, history=history)


def test_a_study_where_nothing_solved_gives_no_gap_verdict(tmp_path):
    assert _paper(tmp_path, never_solves, "--design", "none") == 0
    text = (tmp_path / "summary.md").read_text()
    assert "**Nothing solved**" in text
    for verdict in ("Reproduced", "Not reproduced", "No gap between", "account for", "costs**"):
        assert verdict not in text, verdict
