"""The benchmark's bookkeeping: CSV columns, ratio tables, summary page, skipped cases (no timing asserted)."""
from __future__ import annotations

import numpy as np
import pytest

from bench import __main__ as cli
from bench import names as M
from bench import report
from bench.ceilings import Ceilings
from bench.measure import (Skipped, Summary, Timing, median_ci, paired_ratio, rate_summary,
                                  time_round_robin)
from bench.report import Measurement


def rows_fixture() -> list[Measurement]:
    r = []
    for pop, base in ((256, 1000.0), (2048, 4000.0)):
        r.append(Measurement("torch_impl", "cartpole", pop, "forward_evals_per_s", base, 0.9 * base, 1.1 * base, "evals/s", "cpu"))
        r.append(Measurement("hooks", "cartpole", pop, "forward_evals_per_s", base / 2, base / 2.5, base / 1.5, "evals/s", "cpu"))
        r.append(Measurement("machine", "cartpole", pop, "floor_ms", 1.0, 1.0, 1.0, "ms", "cpu"))
        r.append(Measurement("torch_impl", "cartpole", pop, "forward_ms", 2.0, 1.5, 2.5, "ms", "cpu"))
        r.append(Measurement("torch_impl", "cartpole", pop, "floor_fraction", 0.5, 0.4, 0.6, "fraction", "cpu"))
    r.append(Measurement("torch_impl", "cartpole", 2048, "forward_members_evals_per_s", 3000.0, 2700.0, 3300.0, "evals/s", "cpu"))
    r.append(Measurement("hooks", "cartpole", 256, "forward_ratio", 1.8, 1.5, 2.2, "x", "cpu"))   # round by round
    r.append(Measurement("hooks", "cartpole", 2048, "forward_ratio", 1.9, 0.9, 2.5, "x", "cpu"))
    r.append(Measurement("hooks", "cartpole", 2048, "forward_ratio_ci95_low", 0.95, 0.95, 0.95, "x", "cpu"))
    r.append(Measurement("hooks", "cartpole", 2048, "forward_ratio_ci95_high", 2.1, 2.1, 2.1, "x", "cpu"))
    r.append(Measurement("torch_impl", "cartpole", 2048, "step_per_s", 20.0, 18.0, 22.0, "steps/s", "cpu"))
    r.append(Measurement("torch_impl", "cartpole", 2048, "step_noise_ms", 30.0, 28.0, 33.0, "ms", "cpu"))
    r.append(Measurement("torch_impl", "cartpole", 2048, "noise_share", 0.6, 0.6, 0.6, "fraction", "cpu"))
    return r


def test_csv_has_exactly_the_columns_and_round_trips(tmp_path):
    rows = rows_fixture()
    path = tmp_path / "bench.csv"
    report.write_csv(rows, path)
    assert path.read_text().splitlines()[0] == "impl,model,pop,measure,median,p10,p90,unit,device"
    back = report.read_csv(path)
    assert [(r.impl, r.model, r.pop, r.measure) for r in back] == [(r.impl, r.model, r.pop, r.measure) for r in rows]
    for a, b in zip(back, rows):
        assert a.median == pytest.approx(b.median, rel=1e-5)   # written with 6 significant digits


def test_ratio_table_divides_torch_impl_by_each_other():
    lines = report.ratio_table(rows_fixture(), "cartpole", "forward_evals_per_s", report.IMPLS)
    assert lines[0] == "| pop | torch_impl (median) | / hooks |"
    # 4000 / 2000 = 2; spread 3600 / (4000 / 1.5) = 1.35 and 4400 / 1600 = 2.75
    assert lines[3] == "| 2048 | 4,000 | 1.90 (0.90-2.50) |"
    assert lines[2] == "| 256 | 1,000 | 1.80 (1.50-2.20) |"     # the round-by-round row where there is one


def _ctx(**changes):
    ctx = report.BenchInfo(
        command="python -m bench", device="cpu", jax_device="cpu", threads=2, cpu="test cpu",
        versions={"torch": "t", "jax": "j", "numpy": "n"}, load_before="0", load_after="0", wall_s=1.0,
        quick=False, models=(cli.CARTPOLE,),
        ceilings=[("start", Ceilings(Summary(100.0, 90.0, 110.0), Summary(20.0, 18.0, 22.0)))],
        notes=["wide pop 16384: skipped"], agreement=None, profile=["op table"],
    )
    return ctx._replace(**changes)


def test_speed_verdict_follows_the_interval_of_the_median_ratio():
    rows = rows_fixture()
    base = report.lookup(rows, "torch_impl", "cartpole", 2048, M.FORWARD)
    hooks = report.lookup(rows, "hooks", "cartpole", 2048, M.FORWARD)
    v = report.speed(rows, base, hooks, "hooks")
    assert v == report.Speed("on par", 1.9, 0.9, 2.5, True, (0.95, 2.1))     # the interval holds 1
    faster = [r._replace(median=1.05) if r.measure == M.FORWARD_RATIO + M.CI_LOW else r for r in rows]
    assert report.speed(faster, base, hooks, "hooks").verdict == "faster"
    slower = [r._replace(median=0.97) if r.measure == M.FORWARD_RATIO + M.CI_HIGH else r for r in rows]
    assert report.speed(slower, base, hooks, "hooks").verdict == "slower"
    # without a round-by-round ratio: the medians' ratio 4000 / 2000 and the pessimistic/optimistic spreads
    unpaired = [r for r in rows if not r.measure.startswith(M.FORWARD_RATIO)]
    v = report.speed(unpaired, base, hooks, "hooks")
    assert (v.verdict, v.paired, v.ci) == ("faster", False, None)
    assert (v.ratio, v.lo, v.hi) == pytest.approx((2.0, 3600 / (4000 / 1.5), 4400 / 1600))


def test_layout_table_separates_the_noise_layout_from_the_style():
    lines = report.layout_table(rows_fixture(), "cartpole")
    # grouped 4000 / per-member 3000 = 1.33 (spread 3600/3300 - 4400/2700); per-member 3000 / hooks 2000 = 1.5
    assert lines[2] == "| 2048 | 4,000 | 3,000 | 1.33 (1.09-1.63) | 1.50 (1.01-2.06) |"


def test_summary_page_has_every_section_and_the_environment():
    text = report.summary_markdown(rows_fixture(), _ctx())
    for header in ("# Throughput benchmark", "## Machine ceilings", "## Goal check: `cartpole` at pop 2048",
                   "## Forward throughput, noise given (evaluations/s): `cartpole`", "## Floors and fraction achieved",
                   "## One ES step", "## How it was measured", "## Notes and skipped measurements"):
        assert header in text, header
    assert "torch threads (torch.get_num_threads()): 2" in text and "torch t, jax j, numpy n" in text
    assert "| 2048 | 4,000 | 1.90 (0.90-2.50) |" in text and "wide pop 16384: skipped" in text
    assert "otherwise idle" in text
    busy = report.summary_markdown(rows_fixture(), _ctx(load_before="9.5, 3.0, 1.0"))
    assert "Provisional numbers" in busy and "otherwise idle" not in busy


def test_round_robin_skips_failing_cases_and_keeps_the_others():
    calls = []

    def ok():
        calls.append(1)
        return 1

    def boom():
        raise RuntimeError("out of memory\nmore")

    timings, first = time_round_robin({"ok": (ok, lambda o: o), "boom": (boom, lambda o: o)},
                                      warmup=1, repeats=3, budget_s=10.0, min_repeats=3)
    assert isinstance(timings["boom"], Skipped) and "out of memory" in timings["boom"].reason
    assert isinstance(timings["ok"], Timing) and len(timings["ok"].seconds) == 3
    assert len(calls) == 4   # one warm-up, three timed


def test_round_robin_rotates_the_order_and_rewarms_fast_cases():
    seq = []
    cases = {name: ((lambda n=name: seq.append(n)), lambda o: o) for name in "abc"}
    time_round_robin(cases, warmup=1, repeats=3, budget_s=10.0, min_repeats=3)
    assert "".join(seq[3:]) == "abc" + "bca" + "cab"          # after one warm-up call each
    seq.clear()
    time_round_robin(cases, warmup=1, repeats=2, budget_s=10.0, min_repeats=2, rewarm_below_s=60.0)
    assert "".join(seq[3:]) == "aabbcc" + "bbccaa"            # an untimed call before each timed one


def test_paired_ratio_is_taken_round_by_round():
    # torch_impl 1, 2, 4 s; other 2, 2, 2 s: ratios 2, 1, 0.5 (the medians' ratio would say 1 as well,
    # but the rounds' spread is what the report shows).
    s = paired_ratio(Timing((1.0, 2.0, 4.0)), Timing((2.0, 2.0, 2.0)))
    assert s.median == 1.0 and s.p10 == pytest.approx(0.6) and s.p90 == pytest.approx(1.8)
    with pytest.raises(ValueError, match="same rounds"):
        paired_ratio(Timing((1.0,)), Timing((1.0, 2.0)))


def test_median_ci_uses_binomial_order_statistics():
    # n = 60: P(Binomial(60, 1/2) <= 21) = 0.0137 <= 0.025 < P(<= 22) = 0.0259, so ranks 22 and 39.
    values = [float(v) for v in range(1, 61)]
    assert median_ci(values) == (22.0, 39.0)
    assert median_ci([3.0, 1.0, 2.0]) == (1.0, 3.0)        # too few values for 95%: the full range
    # Coverage: over 2000 samples of 60 normals the interval holds the true median about 95% of the time.
    import numpy as np
    rng = np.random.default_rng(0)
    hits = sum(lo <= 0.0 <= hi for lo, hi in (median_ci(rng.standard_normal(60)) for _ in range(2000)))
    assert 0.95 <= hits / 2000 <= 0.99     # exact coverage 1 - 2 P(B <= 21) = 0.9727; binomial sd 0.0036


def test_rate_summary_is_work_over_each_call():
    s = rate_summary(Timing((0.5, 1.0, 2.0)), work=8.0)
    assert s.median == 8.0 and s.p10 == pytest.approx(4.8) and s.p90 == pytest.approx(14.4)


def test_bad_device_is_a_usage_error(capsys):
    assert cli.main(["--device", "tpu"]) == 2
    assert "cpu or cuda" in capsys.readouterr().err


def test_torch_impl_sets_a_passive_openmp_wait_policy_before_torch_loads():
    """The busy-machine fix: importing torch_impl (or bench) first makes torch's OpenMP threads sleep, not spin;
    a value the user set is kept."""
    import os
    import subprocess
    import sys

    code = "import bench, os, torch; print(os.environ['OMP_WAIT_POLICY'])"
    env = {k: v for k, v in os.environ.items() if k != "OMP_WAIT_POLICY"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True).stdout
    assert out.strip() == "PASSIVE"
    out = subprocess.run([sys.executable, "-c", code], env={**env, "OMP_WAIT_POLICY": "ACTIVE"}, capture_output=True,
                         text=True, check=True).stdout
    assert out.strip() == "ACTIVE"


def test_busy_section_reports_kept_fraction_and_the_jax_ratio():
    rows = [report.Measurement(impl, "cartpole", 2048, m, ms, ms, ms, "ms", "cpu")
            for impl, alone, busy in (("torch_impl", 5.0, 12.0), ("torch_impl_spinning", 5.5, 300.0),
                                      ("jax_reference", 13.0, 60.0))
            for m, ms in ((M.ALONE_MS, alone), (M.BUSY_MS, busy))]
    text = "\n".join(report._busy_section(rows))
    assert "| torch_impl | 409,600 | 170,667 | 42% |" in text
    assert "| torch_impl_spinning | 372,364 | 6,827 | 2% |" in text
    assert "torch_impl runs 5.00x JAX's speed (aim: ahead, > 1): met" in text
    assert "keeps 42% of its speed alone (aim: at least 25%" in text and ": met" in text
    assert report._busy_section([]) == []


def test_goal_check_adds_the_floor_fraction_of_the_fresh_process_probe():
    """The busy section's alone probe (no JAX in its process) gets its own floor fraction beside the main run's."""
    rng = np.random.default_rng()
    floor, alone = float(rng.uniform(1, 3)), float(rng.uniform(4, 8))
    rows = [report.Measurement("machine", "cartpole", 2048, M.FLOOR_MS, floor, floor, floor, "ms", "cpu"),
            report.Measurement("torch_impl", "cartpole", 2048, M.ALONE_MS, alone, alone, alone, "ms", "cpu")]
    (line,) = report._alone_floor_line(rows, "cartpole", 2048)
    assert f"without JAX (the busy section's 'alone' probe): {floor / alone:.0%} of the floor" in line
    assert report._alone_floor_line(rows[:1], "cartpole", 2048) == []
    assert report._alone_floor_line(rows, "cartpole", 4096) == []


def test_the_generators_aims_are_stated_met_or_not_with_the_figure():
    rng = np.random.default_rng()
    ref = float(rng.uniform(5e3, 1e4))

    def row(rate):
        return report.Measurement("x", "cartpole", 2048, M.FORWARD_NOISE, rate, rate, rate, "evals/s", "cpu")

    met = report._rng_aim_lines(row(1.2 * ref * 2), row(2 * ref), row(ref))
    assert "within 1.5x of rng=torch: 1.20x, met" in met[0] and "2.00x, met" in met[1]
    missed = report._rng_aim_lines(row(2.4 * ref * 0.9), row(0.9 * ref), row(ref))
    assert "2.40x, not met (each JAX normal" in missed[0] and "0.90x, not met" in missed[1]
    assert report._rng_aim_lines(None, row(ref), row(ref)) == []


def _solve_rows(cpu: float, steps: float, phases: bool = True) -> list[Measurement]:
    """Synthetic time-to-solve rows of a paper run (torch_impl with its phases, and jax_reference)."""
    row = lambda impl, measure, v, unit="s": Measurement(impl, "solve:paper", 2048, measure, v, v, v, unit, "cpu")  # noqa: E731
    rows = [row("torch_impl", M.SOLVE_S, cpu + 2.0), row("torch_impl", M.SOLVE_CPU_S, cpu),
            row("torch_impl", M.SOLVE_STEPS, steps, "steps"), row("jax_reference", M.SOLVE_S, 80.0),
            row("jax_reference", M.SOLVE_CPU_S, 90.0), row("jax_reference", M.SOLVE_STEPS, steps, "steps")]
    split = {"ask": 1.0, "forward": cpu - 6.0, "rollout": 4.0, "tell": 0.5, "other": 0.5}
    if phases:
        rows += [row("torch_impl", M.SOLVE_PHASE_S + p, v + 0.25) for p, v in split.items()]
        rows += [row("torch_impl", M.SOLVE_PHASE_CPU_S + p, v) for p, v in split.items()]
    return rows


def test_solve_section_breaks_the_torch_run_into_phases_and_states_the_paper_aim():
    text = "\n".join(report._solve_section(_solve_rows(50.0, 16_293_911)))
    assert "| forward (the population forward, every env step of the rollout) | 44.0 | 44.2 | 88% |" in text
    assert "| rest of the rollout (env physics, compaction, numpy <-> torch, action choice) | 4.0 | 4.2 | 8% |" in text
    aim = next(line for line in text.splitlines() if line.startswith("- aim:"))
    assert aim.startswith("- aim: torch_impl's paper-preset time to solve under 60 s of one core at 16,293,911 steps: "
                          "50.0 s cpu (wall 52.0 s; cpu s by phase: ask 1.0, forward 44.0, rollout 4.0, tell 0.5, "
                          "other 0.5), met by 10.0 s; cut ")
    missed = "\n".join(report._solve_section(_solve_rows(72.5, 16_293_911, phases=False)))
    assert "by phase" not in missed and "72.5 s cpu (wall 74.5 s), missed by 12.5 s" in missed


def test_paper_aim_is_missed_when_the_steps_changed():
    text = "\n".join(report._solve_section(_solve_rows(40.0, 16_000_000)))
    assert "40.0 s cpu at 16,000,000 steps: missed (the numbers changed" in text
    unsolved = "\n".join(report._solve_section(_solve_rows(40.0, float("nan"))))
    assert "at not solved: missed" in unsolved


def test_solve_breakdown_makes_the_phases_exclusive():
    from bench.solve import PHASES, PhaseClock, breakdown

    clock = PhaseClock()
    assert clock("double", lambda x: 2 * x)(21) == 42 and clock.totals["double"][0] >= 0.0
    totals = {"ask": [1.0, 0.9], "rollout": [10.0, 9.0], "forward": [7.0, 6.5], "tell": [0.5, 0.5]}
    got = breakdown(totals, wall_s=12.0, cpu_s=11.0)
    assert tuple(p.phase for p in got) == PHASES
    assert [v for p in got for v in (p.wall_s, p.cpu_s)] == pytest.approx([1.0, 0.9, 7.0, 6.5, 3.0, 2.5, 0.5, 0.5,
                                                                           0.5, 0.6])
    rows = cli.solve_rows([cli.solve.SolveTime("paper", "torch_impl", 42, True, 16_293_911, 12.0, 11.0,
                                               breakdown(totals, 12.0, 11.0))], "cpu")
    assert {r.measure: r.median for r in rows}[M.SOLVE_PHASE_CPU_S + "rollout"] == pytest.approx(2.5)


def test_a_missed_floor_aim_points_to_what_was_tried_and_a_met_one_does_not():
    rows = [m for m in rows_fixture() if m.measure != M.FLOOR_FRACTION]
    for fraction, pointer in ((0.31, True), (0.55, False)):
        frac = Measurement("torch_impl", "cartpole", 2048, M.FLOOR_FRACTION, fraction, fraction - 0.05,
                           fraction + 0.05, "fraction", "cpu")
        (line,) = [x for x in report._goal_section(rows + [frac]) if "torch_impl forward reaches" in x]
        assert f"{fraction:.0%} of the machine's floor" in line
        assert (report.FLOOR_TRIED in line) == pointer, line
