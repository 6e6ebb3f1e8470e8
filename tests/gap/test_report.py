"""`python -m parity gap` end to end with a fake trainer: every file of the report, usage errors, resume."""
import csv
import os

import numpy as np
import pytest

from gap import __main__ as cli

EXPECTED = ["summary.md", "runs.csv", "epochs.csv", "arms.csv", "comparisons.csv", "attribution.csv",
            "learning_curves.png", "learning_curves_attribution.png", "steps_to_solve.png", "attribution.png"]


def fake_train(spec):
    """Return climbs to 500; steps to solve ~ base x (1.6 if tanh) x seed noise; init=torch alone never solves."""
    k = spec.arm.knobs
    rng = np.random.default_rng([spec.seed, sum(map(ord, spec.arm.name))])
    per_epoch = 1_000
    target = 20_000 * (1.6 if k.activation == "tanh" else 1.0) * rng.lognormal(0, 0.08)
    history, steps, e = [], 0, 0
    while steps < spec.config.max_env_steps:
        steps += per_epoch
        stuck = spec.arm.name == "torch:jax+init=torch"
        ret = 200.0 if stuck else min(500.0, 500.0 * steps / target)
        history.append({"epoch": e, "env_steps": steps, "mean_return": ret, "max_return": 500.0,
                        "sigma": 0.2, "lr": 0.1, "grad_norm/0.weight": 1.0, "wall_s": 0.001 * e})
        e += 1
        if ret >= 475:
            return dict(solved=True, steps_to_solve=steps, epochs=e, env_steps=steps, history=history)
    return dict(solved=False, steps_to_solve=None, epochs=e, env_steps=steps, history=history)


def _run(tmp_path, *extra, seeds=("4", "3")):
    argv = ["--out", str(tmp_path), "--seeds", seeds[0], "--attribution-seeds", seeds[1], "--workers", "1",
            "--resamples", "300", "--max-steps", "60000", *extra]
    return cli.main(argv, trainer=fake_train)


def test_full_study_writes_every_file(tmp_path, capsys):
    """6 seeds per arm: enough for a Holm-adjusted Gehan p below 0.05 over 7 drifts (min p 0.004 x 7)."""
    assert _run(tmp_path, seeds=("6", "6")) == 0
    for name in EXPECTED:
        assert (tmp_path / name).stat().st_size > 0, name
    text = (tmp_path / "summary.md").read_text()
    for part in ["## Verdict", "## Arms", "beside the published numbers", "### Ladder (cumulative)",
                 "### Each drift alone", "## Method", "torch ", "numpy ", "CPU cores", "python -m gap --out"]:
        assert part in text, part
    with open(tmp_path / "attribution.csv") as f:
        attribution = list(csv.DictReader(f))
    # The fake's effects: tanh x1.6 (significant in both views) and init=torch alone never solving (the single
    # view; on the ladder the other drifts are still on); nothing else.
    significant = {(r["view"], r["knob"]) for r in attribution if float(r["holm_gehan_p"]) < 0.05}
    assert significant == {("ladder", "activation"), ("single", "activation"), ("single", "init")}, significant
    single = next(r for r in attribution if r["view"] == "single" and r["knob"] == "activation")
    assert 1.4 < float(single["ratio"]) < 1.8 and float(single["ratio_lo"]) > 1.0
    with open(tmp_path / "runs.csv") as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == 15 * 6
    with open(tmp_path / "comparisons.csv") as f:
        cmp_rows = {r["comparison"]: r for r in csv.DictReader(f)}
    assert float(cmp_rows["published: torch_eggroll vs jax_eggroll"]["ratio"]) == pytest.approx(1.1087, abs=1e-4)
    assert 1.3 < float(cmp_rows["torch:oop-port vs jax_reference"]["ratio"]) < 2.0   # the fake's 1.6 x noise
    err = capsys.readouterr().err
    assert "90 runs to do, 0 already done" in err and "ETA" in err


def test_rerun_resumes_and_report_only(tmp_path, capsys):
    assert _run(tmp_path, "--no-ladder") == 0
    capsys.readouterr()
    assert _run(tmp_path, "--no-ladder") == 0
    assert "0 runs to do, 12 already done" in capsys.readouterr().err
    assert _run(tmp_path, "--no-ladder", "--report-only") == 0
    assert not (tmp_path / "attribution.png").exists()


def test_arm_subset_and_a_censored_arm(tmp_path):
    assert _run(tmp_path, "--arms", "torch:jax,torch:jax+init=torch") == 0
    text = (tmp_path / "summary.md").read_text()
    assert "arms restricted to" in text and "(lower bound)" in text     # init alone never solves
    with open(tmp_path / "runs.csv") as f:
        rows = list(csv.DictReader(f))
    assert {r["arm"] for r in rows} == {"torch:jax", "torch:jax+init=torch"}
    assert all(r["solved"] == "False" for r in rows if r["arm"] == "torch:jax+init=torch")


def test_plan_and_usage_errors(tmp_path, capsys):
    assert cli.main(["--plan", "--seeds", "3"], trainer=fake_train) == 0
    out = capsys.readouterr().out
    assert "45 runs" in out and "torch:jax+activation=tanh" in out
    for bad in (["--profile", "nope"], ["--arms", "torch:nothing"], ["--seeds", "0"], ["--workers", "0"]):
        assert cli.main(["--out", str(tmp_path), *bad], trainer=fake_train) == 2, bad
        assert "gap:" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        cli.main(["--seed-list", "1,1"], trainer=fake_train)
    assert not os.path.exists(tmp_path / "runs.csv")


def test_same_steps_counts_identical_seeds():
    import pandas as pd
    from gap.report import same_steps
    rng = np.random.default_rng(8)
    steps = rng.integers(1_000_000, 5_000_000, 5).astype(float)
    runs = pd.DataFrame({
        "arm": ["a"] * 5 + ["b"] * 4,
        "seed": [1, 2, 3, 4, 5, 1, 2, 3, 9],
        "steps": np.r_[steps, steps[0], steps[1] + 1, steps[2], 7.0],
        "solved": [True] * 9,
    })
    assert same_steps(runs, "a", "b") == (3, 2)      # seeds 1, 2, 3 in both; seed 2 differs by one step
    assert same_steps(runs.iloc[:0], "a", "b") == (0, 0)


def test_gap_preset_is_cpu_with_a_smaller_budget():
    from spec.config import GAP_BUDGET, PRESETS
    cpu_cfg, cpu_knobs = PRESETS["cpu"]
    gap_cfg, gap_knobs = PRESETS["gap"]
    assert gap_cfg == cpu_cfg.replace(max_env_steps=GAP_BUDGET) and gap_knobs == cpu_knobs
    assert GAP_BUDGET < cpu_cfg.max_env_steps and "paper" in PRESETS


def fake_tf32_train(spec):
    """As fake_train, with TF32 matmuls (matmul_precision=high) costing 20% fewer steps on every arm."""
    out = fake_train(spec)
    if spec.arm.side != "torch" or spec.arm.knobs.matmul_precision != "high":
        return out
    rng = np.random.default_rng([spec.seed, 7])
    steps = int(20_000 * 0.8 * rng.lognormal(0, 0.08)) // 1_000 * 1_000 + 1_000
    history = [h for h in out["history"] if h["env_steps"] < steps] + [
        {**out["history"][0], "epoch": steps // 1_000 - 1, "env_steps": steps, "mean_return": 500.0}]
    return dict(solved=True, steps_to_solve=steps, epochs=len(history), env_steps=steps, history=history)


def test_the_paper_study_reports_the_tf32_arms_and_the_chance_of_the_published_gap(tmp_path):
    argv = ["--study", "paper", "--design", "none", "--out", str(tmp_path), "--seeds", "8", "--workers", "1",
            "--resamples", "2000", "--max-steps", "60000"]
    assert cli.main(argv, trainer=fake_tf32_train) == 0
    text = (tmp_path / "summary.md").read_text()
    assert ("**TF32 matmuls on the reference's math, emulated on a CPU** (`torch:jax+matmul_precision=high` / "
            "`torch:jax`)") in text
    line = next(x for x in text.splitlines() if "TF32 matmuls on the reference's math" in x)
    assert "fewer steps" in line                                    # the fake's x0.8
    assert "With TF32 on the JAX side" in text and "## How likely the published gap is as chance" in text
    assert "**What is still unexplained**" in text
    with open(tmp_path / "chance.csv") as f:
        rows = list(csv.DictReader(f))
    # Without the reference measured on a GPU, the CPU emulation is the TF32 model, labelled as such (not secondary).
    emulated, both = "faithful model plus TF32 on the JAX side, CPU emulation", "TF32 on both sides, CPU emulation"
    assert [(r["model"], r["method"], r["secondary"]) for r in rows] == [
        (m, k, "False") for m in ("faithful model", emulated, both) for k in ("one_stage", "two_stage")]
    by = {(r["model"], r["method"]): float(r["probability"]) for r in rows}
    # oop-port is the fake's tanh arm (x1.6) against a TF32 reference (x0.8): a published-size gap is near certain;
    # both sides TF32 leaves the oop-port at the TF32 speed too, so the gap vanishes.
    assert by[(emulated, "two_stage")] > 0.95
    assert by[(both, "two_stage")] < 0.05


def test_the_tf32_cost_sentence_states_seconds_and_ratio_and_needs_both_arms():
    from gap.precision_report import cost_sentence

    text = cost_sentence("torch:jax+matmul_precision=high", "torch:jax", {"torch:jax+matmul_precision=high": 227.6,
                                                                          "torch:jax": 129.1})
    assert "cost 228 s of one core" in text and "1.76x `torch:jax`'s 129 s" in text
    assert cost_sentence("a", "b", {"a": 10.0}) == "" and cost_sentence("a", "b", {"a": 10.0, "b": float("nan")}) == ""
