"""Runs trained elsewhere, imported into a study (`python -m gap --import-runs`): a good file once (a re-import adds
nothing), each bad file refused with exit 2 before anything is written, and the report's rows for the JAX reference
measured on a GPU (TF32 on the JAX side, the CPU emulation secondary, seed-for-seed agreement at `highest`)."""
import csv
import os

import numpy as np
import pytest

from gap import __main__ as cli
from gap import stats
from gap.imported import COLUMNS, imported_arm
from gap.report import _gap_line
from gap.runs import RunSpec
from spec.config import PRESETS
from tests.gap.test_report import fake_tf32_train

BUDGET = 60_000
STUDY = ["--study", "paper", "--design", "none", "--max-steps", str(BUDGET), "--workers", "1", "--resamples", "500"]
WHERE = ["--import-host", "a lent GPU machine", "--import-device", "gpu: one NVIDIA H100 80GB HBM3",
         "--import-versions", "jax 0.11.2 (CUDA 13 plugin)", "--import-note", "two runs shared the GPU"]


def _write(path, rows, columns=COLUMNS):
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, list(columns), lineterminator="\n", extrasaction="ignore")
        w.writeheader()
        w.writerows(rows)
    return str(path)


def _read(path):
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def _row(arm, seed, steps, precision=None, solved="True"):
    return {"arm": arm, "seed": seed, "matmul_precision": precision or ("highest" if "+highest" in arm else "default"),
            "solved": solved, "steps_to_solve": steps, "epochs": steps // 1_000 + 1, "wall_s": round(steps / 997, 1)}


def _gpu_rows(seed=32, n=5):
    """Fresh random steps within the budget for both GPU arms (the highest arm one seed short, as measured)."""
    rng = np.random.default_rng(seed)
    steps = rng.integers(12_000, 50_000, size=(2, n))
    return ([_row("jax_reference@gpu", 42 + 100 * i, int(steps[0, i])) for i in range(n)]
            + [_row("jax_reference@gpu+highest", 42 + 100 * i, int(steps[1, i])) for i in range(n - 1)])


def _import(out, source, *extra):
    return cli.main(STUDY + ["--out", str(out), "--import-runs", source, *WHERE, *extra])


def test_a_good_file_is_imported_once_with_where_it_ran(tmp_path, capsys):
    rows = _gpu_rows()
    out = tmp_path / "study"
    assert _import(out, _write(tmp_path / "gpu.csv", rows)) == 0
    assert f"imported {len(rows)} run(s)" in capsys.readouterr().out
    stored = _read(out / "runs.csv")
    cfg = PRESETS["paper"][0].replace(max_env_steps=BUDGET)
    assert len(stored) == len(rows)
    for r, s in zip(rows, stored):
        assert (s["arm"], int(s["seed"]), int(s["steps_to_solve"]), int(s["env_steps"]), int(s["epochs"])) == (
            r["arm"], r["seed"], r["steps_to_solve"], r["steps_to_solve"], r["epochs"])
        assert float(s["wall_s"]) == r["wall_s"] and s["cpu_s"] == "" and s["side"] == "jax" and s["solved"] == "True"
        assert (s["host"], s["device"], s["versions"], s["matmul_precision"]) == (
            "a lent GPU machine", "gpu: one NVIDIA H100 80GB HBM3", "jax 0.11.2 (CUDA 13 plugin)", r["matmul_precision"])
        assert s["note"].startswith("imported from gpu.csv (sha256 ") and s["note"].endswith(": two runs shared the GPU")
        assert s["run_id"] == RunSpec(imported_arm(r["arm"]), r["seed"], cfg).run_id    # the study's own identity
    assert not (out / "epochs.csv").read_text().strip().count("\n")                     # no epochs: a header only
    # Again, and with one more seed: only the new run is added, the stored ones stay byte for byte.
    before = (out / "runs.csv").read_bytes()
    assert _import(out, _write(tmp_path / "gpu.csv", rows)) == 0
    assert "imported 0 run(s)" in capsys.readouterr().out and (out / "runs.csv").read_bytes() == before
    more = rows + [_row("jax_reference@gpu+highest", 442, 33_333)]
    assert _import(out, _write(tmp_path / "more.csv", more)) == 0
    assert f"imported 1 run(s) into {out / 'runs.csv'} ({len(rows)} already there)" in capsys.readouterr().out
    assert (out / "runs.csv").read_bytes().startswith(before) and len(_read(out / "runs.csv")) == len(rows) + 1


def _bad(rows, kind):
    """The good rows with one thing wrong, and the start of what the refusal must say."""
    first = dict(rows[0])
    if kind == "unknown column":
        return [{**r, "gpu_name": "H100"} for r in rows], COLUMNS + ("gpu_name",), "unknown column(s) gpu_name"
    if kind == "missing column":
        return rows, tuple(c for c in COLUMNS if c != "wall_s"), "missing column(s) wall_s"
    changes = {
        "a torch arm": ({"arm": "torch:jax@gpu"}, "arm 'torch:jax@gpu' is not a JAX-side arm"),
        "the CPU arm": ({"arm": "jax_reference"}, "is the arm this study trains on its own machines"),
        "a bad platform": ({"arm": "jax_reference@GPU!"}, "the platform after '@' is lower-case"),
        "another precision": ({"matmul_precision": "highest"}, "matmul_precision 'highest' but the arm"),
        "a duplicate with other steps": ({"steps_to_solve": first["steps_to_solve"] + 1000},
                                         "is listed twice with different outcomes"),
        "an unsolved run": ({"solved": "False"}, "did not solve; an imported run must have solved"),
        "a run beyond the budget": ({"steps_to_solve": BUDGET + 1}, "beyond the study's budget of 60,000"),
        "a negative seed": ({"seed": -1}, "seed must be an integer >= 0"),
        "a word for a number": ({"epochs": "thirty"}, "epochs must be an integer >= 1"),
    }
    change, message = changes[kind]
    bad = {**first, **change}
    return ([*rows, bad] if kind.startswith("a duplicate") else [bad, *rows[1:]]), COLUMNS, message


BAD_KINDS = ["unknown column", "missing column", "a torch arm", "the CPU arm", "a bad platform", "another precision",
             "a duplicate with other steps", "an unsolved run", "a run beyond the budget", "a negative seed",
             "a word for a number"]


@pytest.mark.parametrize("kind", BAD_KINDS)
def test_a_bad_file_is_refused_before_anything_is_written(tmp_path, capsys, kind):
    rows, columns, message = _bad(_gpu_rows(seed=len(kind)), kind)
    out = tmp_path / "study"
    assert _import(out, _write(tmp_path / "bad.csv", rows, columns)) == 2
    err = capsys.readouterr().err
    assert err.startswith("gap: --import-runs") and message in err, err
    assert not out.exists()


def test_a_stored_run_with_other_steps_and_bad_flags_are_refused(tmp_path, capsys):
    rows, out = _gpu_rows(), tmp_path / "study"
    assert _import(out, _write(tmp_path / "gpu.csv", rows)) == 0
    before = (out / "runs.csv").read_bytes()
    changed = [{**rows[2], "steps_to_solve": rows[2]["steps_to_solve"] + 1}, _row("jax_reference@gpu", 7, 20_000)]
    assert _import(out, _write(tmp_path / "changed.csv", changed)) == 2
    assert "is already in the store with another outcome" in capsys.readouterr().err
    assert (out / "runs.csv").read_bytes() == before                  # the new seed 7 is not added either
    src = str(tmp_path / "gpu.csv")
    for argv, message in (
            (STUDY + ["--out", str(tmp_path / "b"), "--import-host", "x"], "--import-runs FILE, which is missing"),
            (STUDY + ["--out", str(tmp_path / "b"), "--import-runs", src, *WHERE, "--from", str(out)], "drop --from"),
            (STUDY + ["--out", str(tmp_path / "b"), "--import-runs", src, *WHERE[2:]], "--import-host is empty"),
            (STUDY + ["--out", str(tmp_path / "b"), "--import-runs", str(tmp_path / "none.csv"), *WHERE],
             "no such file")):
        assert cli.main(argv) == 2, argv
        assert message in capsys.readouterr().err, message
    assert not (tmp_path / "b").exists()


def test_the_gap_line_says_covers_only_when_the_interval_holds_the_published_ratio():
    rng = np.random.default_rng(5)
    base = stats.compare(stats.sample(rng.uniform(14e6, 18e6, 10)), stats.sample(rng.uniform(14e6, 18e6, 10)), 200)
    published = base._replace(ratio=1.109, ratio_lo=1.028, ratio_hi=1.203)
    said = lambda lo, hi: _gap_line("a", "b", base._replace(ratio=1.0, ratio_lo=lo, ratio_hi=hi), published)[0]  # noqa
    assert "though the interval also covers the published ratio" in said(0.92, 1.12)
    assert "overlaps the published interval (not the published ratio)" in said(0.916, 1.108)
    assert "excludes the published ratio and its interval" in said(0.90, 1.02)


def untrained_gpu(spec):
    """The study's own trainer, except that an imported arm must never reach it."""
    assert "@" not in spec.arm.name, f"{spec.arm.name} was imported: no study trains it"
    return fake_tf32_train(spec)


def test_the_report_puts_the_gpu_arm_first_for_tf32_on_the_jax_side(tmp_path, capsys):
    """The fake's TF32 emulation is x0.8 and its oop-port x1.6; the GPU arm here runs at the oop-port's pace, so the
    measured model makes a published-size gap unlikely while the emulation makes it near certain. At highest the GPU
    gives the CPU's steps at 4 of 6 seeds; at its default precision at none."""
    out = tmp_path / "study"
    assert cli.main(STUDY + ["--out", str(out), "--seeds", "6"], trainer=untrained_gpu) == 0
    cpu = {int(r["seed"]): int(r["steps_to_solve"]) for r in _read(out / "runs.csv") if r["arm"] == "jax_reference"}
    seeds, rng = sorted(cpu), np.random.default_rng(11)
    rows = [_row("jax_reference@gpu", s, int(32_000 * rng.lognormal(0, 0.08)) | 1) for s in seeds]
    rows += [_row("jax_reference@gpu+highest", s, cpu[s] + (0 if i < 4 else 777)) for i, s in enumerate(seeds)]
    assert _import(out, _write(tmp_path / "gpu.csv", rows)) == 0
    capsys.readouterr()
    assert cli.main(STUDY + ["--out", str(out), "--seeds", "6"], trainer=untrained_gpu) == 0    # nothing to retrain
    assert "0 runs to do, 36 already done" in capsys.readouterr().err
    assert cli.main(STUDY + ["--out", str(out), "--seeds", "6", "--plan"]) == 0
    assert "jax   6 runs imported in" in capsys.readouterr().out
    copy = tmp_path / "copy"                                         # --from carries the imported runs along
    assert cli.main(STUDY + ["--out", str(copy), "--seeds", "6", "--from", str(out)], trainer=untrained_gpu) == 0
    text = (copy / "summary.md").read_text()
    assert "runs imported (trained elsewhere; no study retrains them): `jax_reference@gpu` 6 run(s) at matmul " \
           "precision default, `jax_reference@gpu+highest` 6 run(s) at matmul precision highest; on a lent GPU " \
           "machine, device gpu: one NVIDIA H100 80GB HBM3" in text
    assert "| `jax_reference@gpu` | jax | 6 | 6 |" in text and "n/a" in text           # no cpu_s recorded
    assert "With TF32 on the JAX side, as the published JAX run most likely computed (`jax_reference@gpu`" in text
    assert "The CPU emulation of that arm (`torch:jax+matmul_precision=high`, secondary)" in text
    assert "**TF32 matmuls on the JAX reference, measured on a GPU** (`jax_reference@gpu` / " \
           "`jax_reference@gpu+highest`" in text
    assert (f"exactly the same steps to solve at 4 of the 6 seeds run ({', '.join(map(str, seeds[:4]))}); the runs "
            f"part at seeds {seeds[4]} ({cpu[seeds[4]] + 777:,} steps on the GPU, {cpu[seeds[4]]:,} on the CPU) and "
            f"{seeds[5]}") in text
    assert "TF32) 0 of 6 seeds give the CPU's steps: TF32 alone parts the runs" in text
    by = {(r["model"], r["method"]): r for r in _read(copy / "chance.csv")}
    measured = by[("faithful model plus TF32 on the JAX side", "two_stage")]
    emulated = by[("faithful model plus TF32 on the JAX side, CPU emulation", "two_stage")]
    assert (measured["baseline"], measured["secondary"]) == ("jax_reference@gpu", "False")
    assert (emulated["baseline"], emulated["secondary"]) == ("torch:jax+matmul_precision=high", "True")
    assert float(measured["probability"]) < 0.5 < 0.95 < float(emulated["probability"])
    assert "| faithful model plus TF32 on the JAX side, CPU emulation (secondary) |" in text
    comparisons = {r["comparison"] for r in _read(copy / "comparisons.csv")}
    assert {"torch:oop-port vs jax_reference@gpu", "jax_reference@gpu vs jax_reference@gpu+highest",
            "torch:jax+matmul_precision=high vs jax_reference@gpu"} <= comparisons
    assert os.path.getsize(copy / "steps_to_solve.png") > 0
