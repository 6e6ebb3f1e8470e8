"""What the byte-corpus studies (gap.lm, gap.int8) share: a run's identity, the resumable store, the run loop, and
the report's reading of the store (each run's outcome and validation curve).

The store is `runs.csv` (one row per finished run) and `epochs.csv` (its validation curve) in the output folder,
appended and fsync'd run by run, so an interrupted study resumes where it stopped. The command line that drives
it is gap.study_cli's.
"""
from __future__ import annotations

import csv
import functools
import hashlib
import json
import os
import sys
import time
from collections import defaultdict
from dataclasses import asdict, dataclass
from typing import Any, Callable, NamedTuple

import numpy as np

from gap import store

RUN_COLUMNS = ("run_id", "arm", "side", "seed", "final_val_bpb", "epochs", "wall_s", "cpu_s", "config", "knobs", "host", "versions")
EPOCH_COLUMNS = ("run_id", "arm", "seed", "epoch", "train_bpb", "val_bpb", "wall_s")


def seed_list(n: int, first: int = 42, stride: int = 100) -> list[int]:
    """42, 142, 242, ...: the seeds of every study here."""
    return [first + stride * i for i in range(n)]


@functools.lru_cache(maxsize=8)
def corpus_digest(path: str) -> str:
    """The corpus file's content as part of a run's identity: the same text under another path is the same run."""
    with open(path, "rb") as f:
        return hashlib.sha1(f.read()).hexdigest()


@dataclass(frozen=True)
class RunSpec:
    """One run: an arm (a record with name, side and drifts), a seed, the study's config, and the corpus file (None:
    the shipped one). Its id hashes arm, seed and config, and the corpus's content when one is given."""

    arm: Any
    seed: int
    config: Any
    corpus: str | None = None

    @property
    def run_id(self) -> str:
        ident = [self.arm.name, int(self.seed), json.dumps(asdict(self.config), sort_keys=True)]
        if self.corpus is not None:           # another corpus, another run (the shipped one keeps the short id)
            ident.append(corpus_digest(self.corpus))
        return hashlib.sha1(json.dumps(ident).encode()).hexdigest()[:12]


# ---------------------------------------------------------------- outcomes of one run
class Outcome(NamedTuple):
    final_val_bpb: float
    epochs_to_target: int
    reached: bool


def outcome(curve: list[tuple[int, float]], target: float, epochs: int) -> Outcome:
    """From (epoch, val_bpb) points: the last value, and the first epoch (1-based count) at or below target."""
    points = sorted((e, v) for e, v in curve if v == v)
    if not points:
        raise ValueError("a run has no validation measurement")
    for e, v in points:
        if v <= target:
            return Outcome(points[-1][1], e + 1, True)
    return Outcome(points[-1][1], epochs, False)


# ---------------------------------------------------------------- the store
def _append(path: str, columns: tuple[str, ...], rows: list[dict]) -> None:
    new = not os.path.exists(path)
    with open(path, "a", encoding="utf-8", newline="") as f:
        w = csv.DictWriter(f, fieldnames=columns, lineterminator="\n", extrasaction="ignore")
        if new:
            w.writeheader()
        w.writerows(rows)
        f.flush()
        os.fsync(f.fileno())


def _read(folder: str, name: str) -> list[dict]:
    """The rows of folder/name, or [] before the study wrote it."""
    path = os.path.join(folder, name)
    return store.read_rows(path) if os.path.exists(path) else []


def read_runs(folder: str, run_ids: set[str] | None = None) -> list[dict]:
    """The committed runs, only those of a plan when `run_ids` is given (a folder may also hold runs of another
    --epochs or --corpus, which must not mix into the plan's arms)."""
    return [r for r in _read(folder, "runs.csv") if run_ids is None or r["run_id"] in run_ids]


def read_epochs(folder: str) -> list[dict]:
    return _read(folder, "epochs.csv")


def commit(folder: str, run_row: dict, epoch_rows: list[dict]) -> None:
    """Epoch rows first, then the run row: a run counts as done only once its curve is on disk."""
    _append(os.path.join(folder, "epochs.csv"), EPOCH_COLUMNS, epoch_rows)
    _append(os.path.join(folder, "runs.csv"), RUN_COLUMNS, [run_row])


def seed_from(folder: str, source: str) -> int:
    """Copy the finished runs of `source` (e.g. reports/gap-lm) into `folder` once; returns how many."""
    have = {r["run_id"] for r in read_runs(folder)}
    epochs = read_epochs(source)
    n = 0
    for r in read_runs(source):
        if r["run_id"] not in have:
            commit(folder, r, [e for e in epochs if e["run_id"] == r["run_id"]])
            n += 1
    return n


def curves(folder: str, run_ids: set[str] | None = None) -> dict[str, dict[int, list[tuple[int, float]]]]:
    """arm -> seed -> [(epoch, val_bpb), ...] from epochs.csv, of committed runs (of the plan, given run_ids)."""
    done = {r["run_id"] for r in read_runs(folder, run_ids)}
    out: dict[str, dict[int, list]] = defaultdict(lambda: defaultdict(list))
    for e in read_epochs(folder):
        if e["run_id"] in done:
            out[e["arm"]][int(e["seed"])].append((int(e["epoch"]), float(e["val_bpb"])))
    return out


def mean_curve(by_seed: dict[int, list[tuple[int, float]]]) -> tuple[list[int], list[float]]:
    """One arm's curve for a plot: the 1-based epochs measured and the mean validation bits/byte over seeds there."""
    by_epoch = defaultdict(list)
    for points in by_seed.values():
        for e, v in points:
            by_epoch[e].append(v)
    xs = sorted(by_epoch)
    return [x + 1 for x in xs], [float(np.mean(by_epoch[x])) for x in xs]


def plot_mean_curves(cv: dict, styles: dict[str, dict], path: str, title: str, figsize: tuple[float, float],
                     legend_size: int, target: float | None = None) -> None:
    """The report's curves.png: each arm of `styles` that has runs (in its order, with its matplotlib line style),
    mean validation bits/byte over seeds against epochs; `target`: a dashed grey line there."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=figsize)
    for arm, style in styles.items():
        if arm in cv:
            ax.plot(*mean_curve(cv[arm]), **style)
    if target is not None:
        ax.axhline(target, color="grey", lw=0.8, ls="--", label=f"target {target}")
    ax.set_xlabel("epoch")
    ax.set_ylabel("validation bits/byte (mean over seeds)")
    ax.set_title(title)
    ax.legend(fontsize=legend_size)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


# ---------------------------------------------------------------- running
class Finished(NamedTuple):
    spec: RunSpec
    run_row: dict | None
    epoch_rows: list[dict]
    error: str | None


class Task(NamedTuple):
    """Picklable: train one spec with `trainer(spec) -> (history rows, versions, host)` and build its rows."""

    trainer: Callable

    def __call__(self, spec: RunSpec) -> Finished:
        t0, c0 = time.perf_counter(), time.process_time()
        try:
            history, versions, host = self.trainer(spec)
        except Exception as exc:  # noqa: BLE001 - the parent reports it and carries on
            return Finished(spec, None, [], f"{type(exc).__name__}: {exc}")
        wall, cpu = time.perf_counter() - t0, time.process_time() - c0
        final = [float(h["val_bpb"]) for h in history if float(h["val_bpb"]) == float(h["val_bpb"])]
        if not final:
            return Finished(spec, None, [], "the run recorded no validation bits/byte")
        run_row = {"run_id": spec.run_id, "arm": spec.arm.name, "side": spec.arm.side, "seed": spec.seed,
                   "final_val_bpb": f"{final[-1]:.6f}", "epochs": spec.config.epochs, "wall_s": f"{wall:.2f}",
                   "cpu_s": f"{cpu:.2f}", "config": json.dumps(asdict(spec.config), sort_keys=True),
                   "knobs": json.dumps(dict(spec.arm.drifts), sort_keys=True), "host": host,
                   "versions": json.dumps(versions, sort_keys=True)}
        epoch_rows = [{"run_id": spec.run_id, "arm": spec.arm.name, "seed": spec.seed, "epoch": h["epoch"],
                       "train_bpb": h["train_bpb"], "val_bpb": h["val_bpb"], "wall_s": h.get("wall_s", "")}
                      for h in history if float(h["val_bpb"]) == float(h["val_bpb"])]
        return Finished(spec, run_row, epoch_rows, None)


def _clock(seconds: float) -> str:
    seconds = int(round(seconds))
    h, rest = divmod(seconds, 3600)
    return f"{h}h{rest // 60:02d}m" if h else f"{rest // 60}m{rest % 60:02d}s"


def run_all(specs: list[RunSpec], folder: str, trainer: Callable, executor, log=print) -> tuple[int, list[str]]:
    """Train every spec not yet in the store, committing each as it finishes; (finished, failures)."""
    os.makedirs(folder, exist_ok=True)
    for path in (os.path.join(folder, name) for name in ("runs.csv", "epochs.csv")):
        if os.path.exists(path):
            store.cut_partial_line(path)
    done = {r["run_id"] for r in read_runs(folder)}
    pending = [s for s in specs if s.run_id not in done]
    log(f"{len(pending)} runs to do, {len(specs) - len(pending)} already done, on {executor.describe()}")
    failed, t0, count = [], time.perf_counter(), 0
    for fin in executor.map(Task(trainer), pending):
        count += 1
        head = f"[{count}/{len(pending)}] {fin.spec.arm.name} seed={fin.spec.seed}"
        if fin.error is not None:
            failed.append(f"{fin.spec.arm.name} seed {fin.spec.seed}: {fin.error}")
            log(f"{head} FAILED: {fin.error}")
            continue
        if fin.spec.run_id not in done:
            commit(folder, fin.run_row, fin.epoch_rows)
            done.add(fin.spec.run_id)
        r = fin.run_row
        eta = _clock((time.perf_counter() - t0) / count * (len(pending) - count))
        log(f"{head} validation {float(r['final_val_bpb']):.3f} bits/byte after {r['epochs']} epochs, "
            f"{float(r['wall_s']):.1f} s "
            f"(cpu {float(r['cpu_s']):.1f} s) | ETA {eta}")
    return count - len(failed), failed


def train_folder(specs: list, folder: str, from_dir: str | None, trainer: Callable, executor,
                 report_only: bool = False) -> list[str] | None:
    """A study command's run: seed `folder` from `from_dir` (a study folder whose finished runs are taken, nothing
    retrained), then train every pending spec unless report_only. The failures, or None when interrupted (said on
    stderr: the finished runs are saved and the same command resumes)."""
    def log(line: str) -> None:
        print(line, file=sys.stderr, flush=True)

    try:
        if from_dir or not report_only:       # --report-only alone reads what is there: no folder made for nothing
            os.makedirs(folder, exist_ok=True)
        if from_dir and os.path.abspath(from_dir) != os.path.abspath(folder):
            log(f"{seed_from(folder, from_dir)} finished runs taken from {from_dir}")
        return [] if report_only else run_all(specs, folder, trainer, executor, log=log)[1]
    except KeyboardInterrupt:
        log(f"\ninterrupted: finished runs are saved in {folder}/runs.csv; rerun the same command to resume")
        return None
