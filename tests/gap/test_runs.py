"""The resumable runner with a fake trainer: resume, crash repair, failures, parallel workers."""
import csv
import math

import numpy as np
import pytest

from gap import runs
from gap.arms import jax_arm, torch_arm
from gap.executors import Local
from gap.runs import run_all, run_specs
from gap.store import RUN_COLUMNS, RunStore
from spec.config import Config
from spec.knobs import Knobs, profile

CFG = Config(pop=8, hidden=4, max_env_steps=60_000)


class FakeResult(dict):
    """What a trainer returns, as a dict (the runner reads dicts and NamedTuples alike)."""


def fake_train(spec):
    """Deterministic in (arm, seed): a few epochs of growing return; 'torch:oop-port' never solves."""
    rng = np.random.default_rng([spec.seed, len(spec.arm.name)])
    per_epoch = int(rng.integers(2_000, 6_000))
    solve_epoch = int(rng.integers(3, 8)) if spec.arm.name != "torch:oop-port" else 10 ** 9
    history, steps, e = [], 0, 0
    while steps < spec.config.max_env_steps:
        steps += per_epoch
        ret = 500.0 if e >= solve_epoch else min(400.0, 100.0 + 50 * e) + float(rng.uniform(0, 10))
        history.append({"epoch": e, "env_steps": steps, "mean_return": ret, "max_return": min(500.0, ret + 40),
                        "sigma": np.float32(0.2 * 0.999 ** e), "lr": 0.1, "grad_norm/0.weight": np.float64(1.5),
                        "grad_norm/0.bias": 0.25, "wall_s": 0.01 * (e + 1)})
        e += 1
        if ret >= 475:
            return FakeResult(solved=True, steps_to_solve=steps, epochs=e, env_steps=steps, history=history)
    return FakeResult(solved=False, steps_to_solve=None, epochs=e, env_steps=steps, history=history)


def failing_train(spec):
    if spec.seed == 1:
        raise RuntimeError("boom")
    return fake_train(spec)


def _specs(seeds=(0, 1, 2)):
    arms = [jax_arm(), torch_arm(Knobs()), torch_arm(profile("oop-port"))]
    return run_specs([(a, list(seeds)) for a in arms], CFG)


def _read(path):
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def test_plan_is_seed_major_and_keys_are_stable():
    specs = run_specs([(jax_arm(), [5, 6, 7]), (torch_arm(Knobs()), [5])], CFG)
    assert [(s.arm.name, s.seed) for s in specs] == [("jax_reference", 5), ("torch:jax", 5),
                                                     ("jax_reference", 6), ("jax_reference", 7)]
    assert specs[0].key == run_specs([(jax_arm(), [5])], CFG)[0].key
    assert specs[0].run_id != run_specs([(jax_arm(), [5])], CFG.replace(pop=16))[0].run_id


def test_rows_hold_the_history(tmp_path):
    store = RunStore(str(tmp_path))
    out = run_all(_specs((3,)), store, fake_train, executor=Local(1), log=lambda _: None)
    assert out.finished == 3 and not out.failed
    rows = {r["arm"]: r for r in _read(store.runs_path)}
    assert rows["torch:oop-port"]["solved"] == "False" and rows["torch:oop-port"]["steps_to_solve"] == ""
    assert rows["torch:jax"]["solved"] == "True"
    epochs = _read(store.epochs_path)
    assert sum(int(r["epochs"]) for r in rows.values()) == len(epochs)
    # a float32 scalar is stored as the Python float it is (within float32 rounding, 2**-24 relative, of 0.2)
    assert float(epochs[0]["sigma"]) == pytest.approx(0.2, rel=2 ** -24) and "tensor" not in epochs[0]["sigma"]
    assert epochs[0]["grad_norms"] == '{"grad_norm/0.bias":0.25,"grad_norm/0.weight":1.5}'


def test_interrupted_study_resumes_without_duplicates(tmp_path):
    specs = _specs()
    calls = []

    def stop_after_four(spec):
        if len(calls) == 4:
            raise KeyboardInterrupt
        calls.append((spec.arm.name, spec.seed))
        return fake_train(spec)

    store = RunStore(str(tmp_path))
    with pytest.raises(KeyboardInterrupt):
        run_all(specs, store, stop_after_four, executor=Local(1), log=lambda _: None)
    first = _read(store.runs_path)
    assert len(first) == 4
    epochs_before = len(_read(store.epochs_path))

    again = []
    out = run_all(specs, RunStore(str(tmp_path)), lambda s: again.append((s.arm.name, s.seed)) or fake_train(s),
                  executor=Local(1), log=lambda _: None)
    assert out.skipped == 4 and out.finished == 5
    assert not set(again) & set(calls) and len(again) == 5             # only the rest ran
    final = _read(store.runs_path)
    assert final[:4] == first and len(final) == 9                       # finished rows kept, no duplicates
    assert len({r["run_id"] for r in final}) == 9
    assert len(_read(store.epochs_path)) > epochs_before
    assert run_all(specs, RunStore(str(tmp_path)), fake_train, executor=Local(1), log=lambda _: None).finished == 0


def test_store_repairs_a_torn_write(tmp_path):
    store = RunStore(str(tmp_path))
    run_all(_specs((0,)), store, fake_train, executor=Local(1), log=lambda _: None)
    runs_before, epochs_before = _read(store.runs_path), _read(store.epochs_path)
    # A crash after the epochs of a run were written but inside its run row:
    with open(store.epochs_path, "a") as f:
        f.write("deadbeef0000,torch:jax,9,0,100,20.0,30.0,0.2,0.1,0.01,{}\n")
    with open(store.runs_path, "a") as f:
        f.write("deadbeef0000,torch:jax,torch,9,Tr")
    repaired = RunStore(str(tmp_path))
    assert _read(repaired.runs_path) == runs_before
    assert _read(repaired.epochs_path) == epochs_before
    with open(repaired.runs_path, "rb") as f:
        assert f.read().endswith(b"\n")


def test_failed_runs_are_reported_not_committed_and_retried(tmp_path):
    store = RunStore(str(tmp_path))
    lines = []
    out = run_all(_specs(), store, failing_train, executor=Local(1), log=lines.append)
    assert len(out.failed) == 3 and out.finished == 6
    assert all("boom" in f for f in out.failed) and any("FAILED" in line for line in lines)
    assert {r["seed"] for r in _read(store.runs_path)} == {"0", "2"}
    out = run_all(_specs(), store, fake_train, executor=Local(1), log=lambda _: None)
    assert out.finished == 3 and out.skipped == 6


def test_other_files_are_refused(tmp_path):
    (tmp_path / "runs.csv").write_text("a,b,c\n1,2,3\n")
    with pytest.raises(ValueError, match="columns"):
        RunStore(str(tmp_path))


def test_parallel_workers_give_the_same_rows(tmp_path):
    """Spawned workers (two at a time) commit the same runs as one process, in any order."""
    one, two = RunStore(str(tmp_path / "one")), RunStore(str(tmp_path / "two"))
    run_all(_specs((0, 1)), one, fake_train, executor=Local(1), log=lambda _: None)
    lines = []
    out = run_all(_specs((0, 1)), two, fake_train, executor=Local(2), log=lines.append)
    assert out.finished == 6 and "2 worker process(es)" in lines[0] and "ETA" in lines[-1]
    def strip(rows):   # timings differ between runs; everything else must not
        return sorted(((r["run_id"], {k: v for k, v in r.items() if k not in ("wall_s", "cpu_s")}) for r in rows),
                      key=lambda pair: pair[0])
    assert [r for _, r in strip(_read(one.runs_path))] == [r for _, r in strip(_read(two.runs_path))]
    key = lambda r: (r["run_id"], int(r["epoch"]))  # noqa: E731
    assert sorted(_read(one.epochs_path), key=key) == sorted(_read(two.epochs_path), key=key)


def test_progress_line():
    spec = _specs((0,))[1]
    fin = runs.execute(fake_train, spec)
    line = runs.progress_line(2, 8, fin, elapsed=30.0, left=6)
    assert line.startswith("[2/8] torch:jax seed=0 solved at ") and line.endswith("ETA 1m30s")
    assert math.isclose(fin.run_row["env_steps"], fin.epoch_rows[-1]["env_steps"])


def test_a_second_writer_is_refused(tmp_path):
    store = RunStore(str(tmp_path))
    with store.locked():
        with pytest.raises(RuntimeError, match="another study is writing"):
            run_all(_specs((0,)), store, fake_train, executor=Local(1), log=lambda _: None)
    assert run_all(_specs((0,)), store, fake_train, executor=Local(1), log=lambda _: None).finished == 3


def test_a_store_of_an_older_version_is_converted_and_resumes(tmp_path):
    """Rows written with full-JSON identities and without host/versions become today's rows: same runs, no rerun."""
    import json
    from dataclasses import asdict

    specs = _specs((0,))
    store = RunStore(str(tmp_path))
    run_all(specs, store, fake_train, executor=Local(1), log=lambda _: None)
    rows, epochs = _read(store.runs_path), _read(store.epochs_path)
    old_ids = {}
    for r in rows:   # rewrite as the previous version stored them
        spec = next(s for s in specs if s.run_id == r["run_id"])
        knobs = spec.arm.knobs if isinstance(spec.arm.knobs, Knobs) else Knobs.from_run(spec.arm.knobs)
        r["config"] = json.dumps(asdict(spec.config), sort_keys=True, separators=(",", ":"))
        r["knobs"] = json.dumps({k: v for k, v in asdict(knobs).items() if k != "actions"}, sort_keys=True,
                                separators=(",", ":"))
        old_ids[r["run_id"]] = r["run_id"] = "old" + r["run_id"][3:]
    for e in epochs:
        e["run_id"] = "old" + e["run_id"][3:]
    old_columns = RUN_COLUMNS[:-4]      # before host, versions, matmul_precision and note
    with open(store.runs_path, "w", newline="") as f:
        w = csv.DictWriter(f, old_columns, extrasaction="ignore", lineterminator="\n")
        w.writeheader()
        w.writerows(rows)
    with open(store.epochs_path, "w", newline="") as f:
        w = csv.DictWriter(f, list(epochs[0]), lineterminator="\n")
        w.writeheader()
        w.writerows(epochs)
    # Read-only (a published study used by --from): converted in memory, the files untouched (a clean git tree).
    before = (open(store.runs_path, "rb").read(), open(store.epochs_path, "rb").read())
    fresh = RunStore(str(tmp_path / "fresh"))
    assert fresh.import_from(RunStore(str(tmp_path), readonly=True), {s.key for s in specs}) == len(specs)
    assert (open(store.runs_path, "rb").read(), open(store.epochs_path, "rb").read()) == before
    assert {r["run_id"] for r in _read(fresh.runs_path)} == {s.run_id for s in specs}
    assert {e["run_id"] for e in _read(fresh.epochs_path)} == {s.run_id for s in specs}
    with pytest.raises(PermissionError):
        RunStore(str(tmp_path), readonly=True).commit({}, [])
    with pytest.raises(ValueError, match="holds no study"):
        RunStore(str(tmp_path / "nowhere"), readonly=True)
    converted = RunStore(str(tmp_path))
    new_rows = _read(converted.runs_path)
    assert {r["run_id"] for r in new_rows} == {s.run_id for s in specs} and list(new_rows[0]) == list(RUN_COLUMNS)
    assert {e["run_id"] for e in _read(converted.epochs_path)} == {s.run_id for s in specs}
    assert run_all(specs, converted, fake_train, executor=Local(1), log=lambda _: None).finished == 0


def test_a_published_study_seeds_a_new_folder_without_retraining(tmp_path):
    published = RunStore(str(tmp_path / "published"))
    run_all(_specs((0, 1)), published, fake_train, executor=Local(1), log=lambda _: None)
    mine = RunStore(str(tmp_path / "mine"))
    specs = _specs((0, 1, 2))
    assert mine.import_from(published, {s.key for s in specs}) == 6
    assert mine.import_from(published, {s.key for s in specs}) == 0                 # once
    trained = []
    out = run_all(specs, mine, lambda s: trained.append(s.seed) or fake_train(s), executor=Local(1),
                  log=lambda _: None)
    assert out.skipped == 6 and sorted(trained) == [2, 2, 2]
    assert len(_read(mine.epochs_path)) == len(_read(published.epochs_path)) + sum(
        int(r["epochs"]) for r in _read(mine.runs_path) if r["seed"] == "2")
