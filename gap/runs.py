"""The resumable runner: train every (arm, seed) once, in parallel workers, and never lose a finished run.

On disk (the output folder):
- `runs.csv`: one row per finished run (arm, side, seed, solved, steps_to_solve, epochs,
  env_steps, wall_s, cpu_s (this process's CPU time: the load-free cost), device, config, knobs, run_id);
- `epochs.csv`: one row per epoch of those runs (run_id, arm, seed, the trainer's history).
A run is committed by appending its epoch rows, then its run row, each as one write
followed by fsync. On start the store repairs what an interruption can leave: a partial
last line is cut, and epoch rows whose run row never arrived are dropped. A run whose
(arm, seed, config, knobs) is already in `runs.csv` is skipped, so rerunning the same
command resumes the study.
"""
from __future__ import annotations

import contextlib
import csv
import hashlib
import io
import json
import multiprocessing as mp
import os
import sys
import time
from dataclasses import asdict, dataclass
from typing import Any, Callable, Iterable, NamedTuple

from gap.arms import Arm, knobs_json
from reporting import atomic_write
from spec.config import Config

RUN_COLUMNS = ("run_id", "arm", "side", "seed", "solved", "steps_to_solve", "epochs", "env_steps",
               "wall_s", "cpu_s", "device", "config", "knobs")
EPOCH_COLUMNS = ("run_id", "arm", "seed", "epoch", "env_steps", "mean_return", "max_return", "sigma", "lr",
                 "wall_s", "grad_norms")
# One thread per worker: N workers on N cores, no oversubscription by XLA's or torch's pools.
XLA_SINGLE_THREAD = "--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1"
_SINGLE_THREAD = False   # set in worker processes by _init_worker


def config_json(cfg: Config) -> str:
    """Canonical text of a Config: part of a run's identity on disk."""
    return json.dumps(asdict(cfg), sort_keys=True, separators=(",", ":"))


@dataclass(frozen=True)
class RunSpec:
    """One training run to do."""

    arm: Arm
    seed: int
    config: Config
    device: str = "cpu"

    @property
    def key(self) -> tuple[str, int, str, str]:
        """What makes two runs the same run (the device is recorded, not part of the identity)."""
        return (self.arm.name, int(self.seed), config_json(self.config), knobs_json(self.arm.knobs))

    @property
    def run_id(self) -> str:
        return hashlib.sha1(json.dumps(self.key).encode()).hexdigest()[:12]


class Finished(NamedTuple):
    """What a worker sends back: plain rows, or the error that stopped the run."""

    spec: RunSpec
    run_row: dict | None
    epoch_rows: list[dict]
    error: str | None


# ---------------------------------------------------------------- trainers
def train_spec(spec: RunSpec):
    """The real trainers, by side; imported here so the parent and tests never load jax or torch for nothing."""
    if spec.arm.side == "jax":
        from jax_reference.train import train
        return train(spec.config, spec.arm.knobs, spec.seed, progress=False)
    if _SINGLE_THREAD:
        import torch
        torch.set_num_threads(1)
    from torch_impl.train import train
    return train(spec.config, spec.arm.knobs, spec.seed, device=spec.device, progress=False)


def _field(result: Any, name: str) -> Any:
    return result[name] if isinstance(result, dict) else getattr(result, name)


def _plain(value: Any) -> Any:
    """numpy / torch / jax scalars as Python numbers (so the CSV holds `0.2`, not `tensor(0.2000)`)."""
    return value.item() if hasattr(value, "item") else value


def rows_of(spec: RunSpec, result: Any, wall_s: float, cpu_s: float = float("nan")) -> tuple[dict, list[dict]]:
    """A TrainResult as one run row and its epoch rows (grad_norm/<leaf> entries go to a JSON column)."""
    solved = bool(_field(result, "solved"))
    steps = _field(result, "steps_to_solve")
    if solved and steps is None:
        raise ValueError(f"{spec.arm.name} seed {spec.seed}: solved but steps_to_solve is None")
    run_row = {
        "run_id": spec.run_id, "arm": spec.arm.name, "side": spec.arm.side, "seed": int(spec.seed),
        "solved": solved, "steps_to_solve": int(steps) if solved else "",
        "epochs": int(_field(result, "epochs")), "env_steps": int(_field(result, "env_steps")),
        "wall_s": round(float(wall_s), 3), "cpu_s": round(float(cpu_s), 3), "device": spec.device,
        "config": spec.key[2], "knobs": spec.key[3],
    }
    epoch_rows = []
    for h in _field(result, "history"):
        grads = {k: float(_plain(v)) for k, v in h.items() if k.startswith("grad_norm/")}
        epoch_rows.append({
            "run_id": spec.run_id, "arm": spec.arm.name, "seed": int(spec.seed),
            **{k: _plain(h.get(k, "")) for k in EPOCH_COLUMNS[3:-1]},
            "grad_norms": json.dumps(grads, sort_keys=True, separators=(",", ":")),
        })
    return run_row, epoch_rows


def execute(trainer: Callable[[RunSpec], Any], spec: RunSpec) -> Finished:
    """Train one run and turn it into rows; an exception becomes an error message, not a dead pool."""
    t0, c0 = time.perf_counter(), time.process_time()
    try:
        result = trainer(spec)
        run_row, epoch_rows = rows_of(spec, result, time.perf_counter() - t0, time.process_time() - c0)
    except Exception as exc:  # noqa: BLE001 - the parent reports it and carries on
        return Finished(spec, None, [], f"{type(exc).__name__}: {exc}")
    return Finished(spec, run_row, epoch_rows, None)


def _init_worker() -> None:
    """Runs first in each spawned worker: one thread for XLA, torch and BLAS."""
    global _SINGLE_THREAD
    _SINGLE_THREAD = True
    flags = os.environ.get("XLA_FLAGS", "")
    if "xla_cpu_multi_thread_eigen" not in flags:
        os.environ["XLA_FLAGS"] = (flags + " " + XLA_SINGLE_THREAD).strip()
    for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
        os.environ[var] = "1"


# ---------------------------------------------------------------- the store
def _rows_text(rows: Iterable[dict], columns: tuple[str, ...]) -> str:
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=columns, lineterminator="\n")
    writer.writerows(rows)
    return buf.getvalue()


def _append(path: str, text: str) -> None:
    """One write, then fsync: the text is on disk whole before anything else happens."""
    with open(path, "a", encoding="utf-8", newline="") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())


def _cut_partial_line(path: str) -> None:
    """Drop the bytes after the last newline (a row an interruption left half written)."""
    with open(path, "rb+") as f:
        data = f.read()
        if data and not data.endswith(b"\n"):
            f.truncate(data.rfind(b"\n") + 1)


def _read_rows(path: str) -> list[dict]:
    with open(path, encoding="utf-8", newline="") as f:
        return list(csv.DictReader(f))


def _write_atomic(path: str, header: tuple[str, ...], rows: list[dict]) -> None:
    atomic_write(path, ",".join(header) + "\n" + _rows_text(rows, header))


class RunStore:
    """`runs.csv` and `epochs.csv` in one folder; only the parent process writes them."""

    def __init__(self, folder: str):
        self.folder = folder
        self.runs_path = os.path.join(folder, "runs.csv")
        self.epochs_path = os.path.join(folder, "epochs.csv")
        os.makedirs(folder, exist_ok=True)
        with self.locked():
            self._repair()

    def _repair(self) -> None:
        for path, header in ((self.runs_path, RUN_COLUMNS), (self.epochs_path, EPOCH_COLUMNS)):
            if not os.path.exists(path) or os.path.getsize(path) == 0:
                _write_atomic(path, header, [])
                continue
            _cut_partial_line(path)
            with open(path, encoding="utf-8") as f:
                found = tuple(next(csv.reader(f), []))
            if found != header:
                raise ValueError(f"{path} has columns {found}, expected {header}: "
                                 f"it was written by another tool or version; move it away or pick another --out")
        runs = _read_rows(self.runs_path)
        seen, unique = set(), []
        for r in runs:                      # a run row twice (two writers) is kept once
            if r["run_id"] not in seen:
                seen.add(r["run_id"])
                unique.append(r)
        if len(unique) != len(runs):
            _write_atomic(self.runs_path, RUN_COLUMNS, unique)
        epochs = _read_rows(self.epochs_path)
        kept = [e for e in epochs if e["run_id"] in seen]
        if len(kept) != len(epochs):        # epochs of a run that never committed
            _write_atomic(self.epochs_path, EPOCH_COLUMNS, kept)

    @contextlib.contextmanager
    def locked(self):
        """Only one study writes a folder at a time (a second one is told so, not allowed to interleave rows)."""
        try:
            import fcntl
        except ImportError:   # not POSIX: no lock
            yield
            return
        scratch = os.path.join(self.folder, "runs")   # reports/*/runs/ is git-ignored: the lock is not committed
        os.makedirs(scratch, exist_ok=True)
        with open(os.path.join(scratch, ".lock"), "w") as f:
            try:
                fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                raise RuntimeError(f"another study is writing to {self.folder}; "
                                   f"wait for it or pick another --out") from None
            try:
                yield
            finally:
                fcntl.flock(f, fcntl.LOCK_UN)

    def done(self) -> set[tuple[str, int, str, str]]:
        """Keys of the runs already finished."""
        return {(r["arm"], int(r["seed"]), r["config"], r["knobs"]) for r in self.run_rows()}

    def run_rows(self) -> list[dict]:
        """Every committed run row (strings, as csv reads them)."""
        return _read_rows(self.runs_path)

    def epoch_rows(self) -> list[dict]:
        return _read_rows(self.epochs_path)

    def commit(self, run_row: dict, epoch_rows: list[dict]) -> None:
        """Epochs first, then the run row that marks the run done."""
        _append(self.epochs_path, _rows_text(epoch_rows, EPOCH_COLUMNS))
        _append(self.runs_path, _rows_text([run_row], RUN_COLUMNS))


# ---------------------------------------------------------------- progress
def _clock(seconds: float) -> str:
    seconds = int(round(seconds))
    h, rest = divmod(seconds, 3600)
    return f"{h}h{rest // 60:02d}m" if h else f"{rest // 60}m{rest % 60:02d}s"


def progress_line(done: int, total: int, fin: Finished, elapsed: float, left: int) -> str:
    """`[3/40] torch:jax seed=42 solved at 1,234,567 steps (210 epochs) 18.2 s, 67,833 steps/s | ETA 4m10s`."""
    head = f"[{done}/{total}] {fin.spec.arm.name} seed={fin.spec.seed}"
    if fin.error is not None:
        return f"{head} FAILED: {fin.error}"
    r = fin.run_row
    what = f"solved at {r['steps_to_solve']:,} steps" if r["solved"] else f"not solved in {r['env_steps']:,} steps"
    rate = r["env_steps"] / r["wall_s"] if r["wall_s"] > 0 else float("nan")
    eta = _clock(elapsed / done * left) if done else "?"
    return (f"{head} {what} ({r['epochs']} epochs) {r['wall_s']:.1f} s (cpu {r['cpu_s']:.1f} s), "
            f"{rate:,.0f} steps/s | ETA {eta}")


# ---------------------------------------------------------------- the study loop
class Outcome(NamedTuple):
    planned: int
    skipped: int        # already in runs.csv
    finished: int       # this call
    failed: list[str]   # "arm seed: error"


def run_all(specs: list[RunSpec], store: RunStore, trainer: Callable[[RunSpec], Any] = train_spec,
            workers: int | None = None, log=None) -> Outcome:
    """Train every spec not yet in the store, `workers` at a time (spawned processes; 1 = in this process)."""
    log = log or (lambda line: print(line, file=sys.stderr, flush=True))
    with store.locked():
        store._repair()   # again, under the lock this run holds
        return _run_locked(specs, store, trainer, workers, log)


def _run_locked(specs, store, trainer, workers, log) -> Outcome:
    done = store.done()
    seen, pending = set(), []
    for s in specs:
        if s.key not in done and s.key not in seen:
            seen.add(s.key)
            pending.append(s)
    skipped = len({s.key for s in specs}) - len(pending)
    workers = max(1, min(workers or os.cpu_count() or 1, len(pending) or 1))
    log(f"{len(pending)} runs to do, {skipped} already done, {workers} worker(s)")
    failed: list[str] = []
    t0 = time.perf_counter()
    count = 0

    def handle(fin: Finished) -> None:
        nonlocal count
        count += 1
        if fin.error is None:
            store.commit(fin.run_row, fin.epoch_rows)
        else:
            failed.append(f"{fin.spec.arm.name} seed {fin.spec.seed}: {fin.error}")
        log(progress_line(count, len(pending), fin, time.perf_counter() - t0, len(pending) - count))

    if workers == 1:
        for s in pending:
            handle(execute(trainer, s))
    else:
        pool = mp.get_context("spawn").Pool(workers, initializer=_init_worker)
        try:
            for fin in pool.imap_unordered(_Call(trainer), pending):
                handle(fin)
            pool.close()
        except BaseException:
            pool.terminate()   # finished runs are on disk already; the rest resume next time
            raise
        finally:
            pool.join()
    return Outcome(len(specs), skipped, count - len(failed), failed)


class _Call:
    """Picklable `execute(trainer, spec)` for the pool."""

    def __init__(self, trainer):
        self.trainer = trainer

    def __call__(self, spec: RunSpec) -> Finished:
        return execute(self.trainer, spec)


def run_specs(arms_seeds: Iterable[tuple[Arm, list[int]]], cfg: Config, device: str = "cpu") -> list[RunSpec]:
    """Seed-major order (every arm's first seed before any arm's second), so early results span the arms."""
    arms_seeds = list(arms_seeds)
    longest = max((len(s) for _, s in arms_seeds), default=0)
    return [RunSpec(arm, seeds[i], cfg, device)
            for i in range(longest) for arm, seeds in arms_seeds if i < len(seeds)]
