"""The integer gap study (`python -m gap --task int8`): the design, the analysis on synthetic runs with a planted
effect, resumption, and bad input refused with exit 2 before any work."""
from __future__ import annotations

import zlib

import numpy as np
import pandas as pd

from gap.int8 import report as int8_report
from gap.int8 import study as int8_study
from gap import __main__ as gap_main
from gap.study import read_runs
from spec.int8_knobs import INT8_KNOBS

PLANTED = {"vote_threshold": -0.30, "log2": +0.12}          # bits/byte added at egg.c's value (half each side)
PLANTED_PAIR = (("evolving", "out_shift"), 0.20)            # added where the two knobs agree (half each side)


def fake_trainer(spec):
    """A deterministic curve whose final value carries the planted effects plus seed noise (sd 0.03)."""
    noise = np.random.default_rng(zlib.crc32(f"{spec.arm.name}/{spec.seed}".encode())).normal(0, 0.03)
    final = 4.5 + noise + sum(effect / 2 * spec.arm.level(k) for k, effect in PLANTED.items())
    (a, b), pair = PLANTED_PAIR
    final += pair / 2 * spec.arm.level(a) * spec.arm.level(b)
    epochs = spec.config.epochs
    history = [{"epoch": e, "train_bpb": 8.0, "val_bpb": final + (epochs - 1 - e) / epochs if (e + 1) % 50 == 0
                or e == epochs - 1 else float("nan"), "wall_s": 0.0} for e in range(epochs)]
    return history, {"torch": "test"}, "test-host"


def test_design_is_the_resolution_iv_fraction_with_both_corners():
    arms = int8_study.arms()
    assert len(arms) == 16 and [a.name for a in arms[:2]] == ["nano-egg", "egg.c"]
    m = int8_study.design_matrix()
    assert m.shape == (16, 7) and (m.T @ m == 16 * np.eye(7)).all()              # orthogonal main effects
    for i in range(7):                                   # no main effect aliased with any two-factor interaction
        for j in range(7):
            for k in range(j + 1, 7):
                assert abs(int(m[:, i] @ (m[:, j] * m[:, k]))) < 16
    assert arms[1].knobs.departures() == {k: v.egg_c for k, v in INT8_KNOBS.items()}
    assert arms[0].knobs.departures() == {}
    assert len(int8_study.plan(int8_study.default_config(), 6)) == 96
    chains = int8_report.interaction_chains(m)
    assert len(chains) == 7 and all(len(c) == 3 for c in chains)               # 21 interactions in 7 chains


def test_the_analysis_recovers_the_planted_effects_and_flags_no_other(tmp_path, capsys):
    out = tmp_path / "study"
    argv = ["--task", "int8", "--epochs", "100", "--seeds", "3", "--workers", "1", "--out", str(out),
            "--resamples", "500"]
    assert gap_main.main(argv, trainer=fake_trainer) == 0
    frame = int8_report.outcomes(str(out))
    eff = {r["knob"]: r for r in int8_report.Effects(frame).rows}
    for knob in INT8_KNOBS:
        r = eff[knob]
        if knob in PLANTED:
            assert r["lo"] < PLANTED[knob] < r["hi"] and r["p_holm"] < 0.05, r
        else:
            assert r["p_holm"] >= 0.05 and abs(r["effect"]) < 0.06, r
    summary = (out / "summary.md").read_text()
    assert "**vote_threshold** -0.30" in summary or "**vote_threshold** -0.29" in summary or \
        "**vote_threshold** -0.31" in summary
    assert "egg.c learns **faster**" in summary
    assert (out / "curves.png").stat().st_size > 1000 and (out / "effects.csv").exists()
    assert (out / "curves_by_point.png").stat().st_size > 1000
    # the planted interaction lands in its alias chain, and no other chain is flagged
    chains = int8_report.Effects(frame).chain_rows
    (a, b), pair = PLANTED_PAIR
    for r in chains:
        if f"{a} x {b}" in r["chain"]:
            assert r["lo"] < pair < r["hi"] and r["p_holm"] < 0.05, r
        else:
            assert r["p_holm"] >= 0.05 and abs(r["effect"]) < 0.06, r
    assert "### Two-factor interactions" in summary and "Two-factor interactions matter too (1 of 7" in summary
    # the corners' gap splits into the main effects (interactions cancel at the corners)
    assert abs(int8_report.Effects(frame).predicted_gap() - sum(r["effect"] for r in eff.values())) < 1e-9


def test_a_rerun_resumes_and_trains_nothing_twice(tmp_path):
    out = tmp_path / "study"
    calls = []

    def counting(spec):
        calls.append(spec.run_id)
        return fake_trainer(spec)
    argv = ["--task", "int8", "--epochs", "50", "--seeds", "2", "--workers", "1", "--out", str(out),
            "--resamples", "200"]
    assert gap_main.main(argv, trainer=counting) == 0
    assert len(calls) == 32 and len(read_runs(str(out))) == 32
    assert gap_main.main(argv + ["--note", "runs imported from elsewhere"], trainer=counting) == 0
    assert len(calls) == 32 and len(read_runs(str(out))) == 32
    assert "- note: runs imported from elsewhere" in (out / "summary.md").read_text()


def test_corner_difference_curves_and_late_mean(tmp_path):
    """The BCa interval of egg.c - nano-egg covers the planted corner gap; curves.csv holds every point's mean
    curve; the late mean averages the last quarter's measurements; the catch-up reads the faster corner."""
    out = tmp_path / "study"
    argv = ["--task", "int8", "--epochs", "200", "--seeds", "4", "--workers", "1", "--out", str(out),
            "--resamples", "500"]
    assert gap_main.main(argv, trainer=fake_trainer) == 0
    frame = int8_report.outcomes(str(out))
    d = int8_report.corner_difference(frame, 500)
    gap = sum(PLANTED.values())                       # the pair's term is +1 at both corners and cancels
    assert d.lo < gap < d.hi and d.method in ("BCa", "percentile")
    curves = pd.read_csv(out / "curves.csv")
    assert set(curves.arm) == {a.name for a in int8_study.arms()}
    assert sorted(curves[curves.arm == "egg.c"].epoch) == [50, 100, 150, 200]
    assert (curves.seeds == 4).all()
    # fake curve: final + (epochs - 1 - e) / epochs; last quarter of 200 epochs measures e = 199 only
    assert int8_report.late_mean([(149, 5.0), (199, 4.0)], 200, 4.0) == 4.0
    assert int8_report.late_mean([(99, 6.0), (149, 5.0), (199, 4.0)], 200, 4.0) == 4.0
    assert int8_report.late_mean([(149, 5.0), (199, 4.0)], 160, 4.0) == 4.5
    assert abs(int8_report.late_slope([(99, 6.0), (149, 5.0), (199, 4.0), (249, 3.0)], 250) + 2.0) < 1e-9
    assert np.isnan(int8_report.late_slope([(149, 5.0), (199, 4.0)], 200))
    c = int8_report.catch_up(frame, int8_report.curves(str(out)))
    assert c.faster == "egg.c" and c.reached == 4 and len(c.epochs) == 4
    summary = (out / "summary.md").read_text()
    assert "BCa bootstrap" in summary or "percentile bootstrap" in summary
    assert "### Check: the same model on the late mean" in summary


def test_the_report_reads_only_the_planned_runs(tmp_path):
    """Runs of another --epochs in the same folder stay out of this plan's arms (and its report); a corpus given by
    file is part of a run's identity by content."""
    out = tmp_path / "study"
    base = ["--task", "int8", "--seeds", "2", "--workers", "1", "--out", str(out), "--resamples", "200"]
    assert gap_main.main(base + ["--epochs", "50"], trainer=fake_trainer) == 0
    assert gap_main.main(base + ["--epochs", "100"], trainer=fake_trainer) == 0
    assert len(read_runs(str(out))) == 64
    summary = (out / "summary.md").read_text()
    assert "epochs=100" in summary and "| nano-egg | 2 |" in summary
    corpus = tmp_path / "c.txt"
    corpus.write_text("abc " * 5000)
    cfg = int8_study.default_config()
    a, b = int8_study.plan(cfg, 2)[0], int8_study.plan(cfg, 2, str(corpus))[0]
    copy = tmp_path / "copy.txt"
    copy.write_text("abc " * 5000)
    assert a.run_id != b.run_id == int8_study.plan(cfg, 2, str(copy))[0].run_id
