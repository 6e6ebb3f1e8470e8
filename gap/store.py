"""The study's resumable store: `runs.csv` and `epochs.csv` in one folder, written by one process only.

- `runs.csv`: one row per finished run: its identity (arm, seed, config, knobs; `run_id` hashes them), the
  outcome (solved, steps_to_solve, epochs, env_steps), the cost (wall_s; cpu_s, the run's own CPU time) and
  where it ran (device, host, versions); for a run trained elsewhere and imported (`gap.imported`), the matmul
  precision its measurer gave and a note saying where it came from (both blank for a run the study trained).
- `epochs.csv`: one row per epoch of those runs (the trainer's history).

A run is committed by appending its epoch rows, then its run row, each as one write followed by fsync, so an
interruption leaves at worst a partial last line (cut on start) or epochs of an uncommitted run (dropped). A
run's identity is the departures of its config and knobs from their defaults, so adding a knob or a config
field later keeps every stored run recognisable; stores written before that (full JSON, fewer columns) are
converted in place on open.
"""
from __future__ import annotations

import contextlib
import csv
import hashlib
import io
import json
import os
from dataclasses import asdict
from typing import Iterable

from gap.arms import departures_json, knobs_json
from reporting import atomic_write
from spec.config import Config

RUN_COLUMNS = ("run_id", "arm", "side", "seed", "solved", "steps_to_solve", "epochs", "env_steps",
               "wall_s", "cpu_s", "device", "config", "knobs", "host", "versions", "matmul_precision", "note")
# earlier stores' columns, converted on open: before host and versions, then before imported runs' precision and note
OLD_RUN_COLUMNS = (RUN_COLUMNS[:-4], RUN_COLUMNS[:-2])
EPOCH_COLUMNS = ("run_id", "arm", "seed", "epoch", "env_steps", "mean_return", "max_return", "sigma", "lr",
                 "wall_s", "grad_norms")
Key = tuple[str, int, str, str]


def config_json(cfg: Config | dict) -> str:
    """Canonical text of a Config's departures from the defaults: part of a run's identity on disk."""
    values = asdict(cfg) if isinstance(cfg, Config) else {k: v for k, v in cfg.items() if k in Config.__dataclass_fields__}
    return departures_json(values, asdict(Config()))


def run_id(key: Key) -> str:
    """12 hex digits of the sha1 of the run's identity."""
    return hashlib.sha1(json.dumps(list(key)).encode()).hexdigest()[:12]


def canonical_key(row: dict) -> Key:
    """A stored row's identity in today's canonical form (rows written by older versions included)."""
    return (row["arm"], int(row["seed"]), config_json(json.loads(row["config"])),
            knobs_json(json.loads(row["knobs"])))


def _rows_text(rows: Iterable[dict], columns: tuple[str, ...]) -> str:
    buf = io.StringIO()
    csv.DictWriter(buf, fieldnames=columns, lineterminator="\n", extrasaction="ignore").writerows(rows)
    return buf.getvalue()


def _append(path: str, text: str) -> None:
    """One write, then fsync: the text is on disk whole before anything else happens."""
    with open(path, "a", encoding="utf-8", newline="") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())


def cut_partial_line(path: str) -> None:
    """Drop the bytes after the last newline (a row an interruption left half written)."""
    with open(path, "rb+") as f:
        data = f.read()
        if data and not data.endswith(b"\n"):
            f.truncate(data.rfind(b"\n") + 1)


def read_rows(path: str) -> list[dict]:
    """A CSV file's rows as dicts of strings."""
    with open(path, encoding="utf-8", newline="") as f:
        return list(csv.DictReader(f))


def _header(path: str) -> tuple[str, ...]:
    with open(path, encoding="utf-8") as f:
        return tuple(next(csv.reader(f), []))


def _write(path: str, header: tuple[str, ...], rows: list[dict]) -> None:
    atomic_write(path, ",".join(header) + "\n" + _rows_text(rows, header))


def canonical_rows(runs: list[dict], epochs: list[dict]) -> tuple[list[dict], list[dict]]:
    """Rows in today's identity and columns, each run once, epochs only of committed runs (renamed with them)."""
    renamed, seen, unique = {}, set(), []
    for r in runs:
        key = canonical_key(r)
        new = {**{c: r.get(c, "") for c in RUN_COLUMNS}, "config": key[2], "knobs": key[3], "run_id": run_id(key)}
        renamed[r["run_id"]] = new["run_id"]
        if new["run_id"] not in seen:                  # a run row twice (two writers) is kept once
            seen.add(new["run_id"])
            unique.append(new)
    return unique, [{**e, "run_id": renamed[e["run_id"]]} for e in epochs if e["run_id"] in renamed]


class RunStore:
    """`runs.csv` and `epochs.csv` in one folder; only the parent process writes them.

    `readonly=True` (a published study read as the source of `import_from`): nothing on disk is touched; old
    rows are converted in memory.
    """

    def __init__(self, folder: str, readonly: bool = False):
        self.folder = folder
        self.readonly = readonly
        self.runs_path = os.path.join(folder, "runs.csv")
        self.epochs_path = os.path.join(folder, "epochs.csv")
        if readonly:
            if not os.path.isfile(self.runs_path):
                raise ValueError(f"{folder} holds no study (no runs.csv)")
            return
        os.makedirs(folder, exist_ok=True)
        with self.locked():
            self.repair()

    def _check_headers(self) -> None:
        runs_headers = (RUN_COLUMNS, *OLD_RUN_COLUMNS)
        for path, headers in ((self.runs_path, runs_headers), (self.epochs_path, (EPOCH_COLUMNS,))):
            if not os.path.exists(path) or os.path.getsize(path) == 0:
                _write(path, headers[0], [])
                continue
            cut_partial_line(path)
            if _header(path) not in headers:
                raise ValueError(f"{path} has columns {_header(path)}, expected {headers[0]}: it was written by "
                                 "another tool; move it away or pick another --out")

    def repair(self) -> None:
        """Cut partial lines, convert old rows to today's identity and columns, keep each run once, drop the
        epochs of runs that never committed."""
        self._check_headers()
        runs, epochs = read_rows(self.runs_path), read_rows(self.epochs_path)
        unique, kept = canonical_rows(runs, epochs)
        if unique != runs or _header(self.runs_path) != RUN_COLUMNS:
            _write(self.runs_path, RUN_COLUMNS, unique)
        if kept != epochs:                                 # epochs of a run that never committed, or renamed
            _write(self.epochs_path, EPOCH_COLUMNS, kept)

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

    def done(self) -> set[Key]:
        """Identities of the runs already finished."""
        return {(r["arm"], int(r["seed"]), r["config"], r["knobs"]) for r in self.run_rows()}

    def run_rows(self) -> list[dict]:
        """Every committed run row (strings, as csv reads them)."""
        if self.readonly:
            return canonical_rows(read_rows(self.runs_path), [])[0]
        return read_rows(self.runs_path)

    def epoch_rows(self) -> list[dict]:
        if self.readonly:
            runs = read_rows(self.runs_path)
            return canonical_rows(runs, read_rows(self.epochs_path) if os.path.exists(self.epochs_path) else [])[1]
        return read_rows(self.epochs_path)

    def commit(self, run_row: dict, epoch_rows: list[dict]) -> None:
        """Epochs first, then the run row that marks the run done."""
        if self.readonly:
            raise PermissionError(f"{self.folder} was opened read-only")
        _append(self.epochs_path, _rows_text(epoch_rows, EPOCH_COLUMNS))
        _append(self.runs_path, _rows_text([run_row], RUN_COLUMNS))

    def import_from(self, other: "RunStore", keys: set[Key]) -> int:
        """Copy into this store the runs of `other` whose identity is in `keys` and that this one lacks (a
        published study seeds a user's folder: nothing is retrained). Returns how many were copied."""
        have = self.done()
        epochs = {}
        for e in other.epoch_rows():
            epochs.setdefault(e["run_id"], []).append(e)
        copied = 0
        for r in other.run_rows():
            key = (r["arm"], int(r["seed"]), r["config"], r["knobs"])
            if key in keys and key not in have:
                self.commit(r, epochs.get(r["run_id"], []))
                have.add(key)
                copied += 1
        return copied
