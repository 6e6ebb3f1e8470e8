"""Runs trained elsewhere, brought into a study's store: the JAX reference on a platform the study's machines may
lack (a GPU), as arms on the JAX side that the study reports and never trains.

An imported arm is `jax_reference@PLATFORM` (JAX's default float32 matmul precision there: TF32 on an NVIDIA GPU of
compute capability 8.0 or above) or `jax_reference@PLATFORM+highest` (float32 products). The file gives one
finished run per row (COLUMNS); where the runs ran (host, device, versions) and the measurer's note come with the
import and are stored in every row, with the file's name and SHA-256. The whole file, and each run against the
store, is checked before anything is written.
"""
from __future__ import annotations

import csv
import hashlib
import math
import os
import re
from typing import NamedTuple

from gap.arms import JAX_ARM, Arm, jax_arm
from gap.runs import RunSpec
from gap.store import RunStore, config_json
from spec.config import Config
from spec.knobs import RunSettings
from spec.limits import check_seed

COLUMNS = ("arm", "seed", "matmul_precision", "solved", "steps_to_solve", "epochs", "wall_s")
HIGHEST = "+highest"
_PLATFORM = re.compile(r"^[a-z][a-z0-9-]*$")
EXAMPLE = f"{JAX_ARM}@gpu (JAX's default matmul precision there) or {JAX_ARM}@gpu{HIGHEST}"


class Provenance(NamedTuple):
    """Where the imported runs ran and what their measurer said, stored with each of them."""

    host: str
    device: str
    versions: str
    note: str = ""


def parse_arm(name: str) -> tuple[str, str]:
    """(platform, matmul precision) of an imported arm's name; ValueError for any other name."""
    prefix = JAX_ARM + "@"
    if not name.startswith(prefix):
        what = ("is the arm this study trains on its own machines" if name == JAX_ARM else "is not a JAX-side arm")
        raise ValueError(f"arm {name!r} {what}; an imported arm is {EXAMPLE}")
    platform, precision = name[len(prefix):], "default"
    if platform.endswith(HIGHEST):
        platform, precision = platform[:-len(HIGHEST)], "highest"
    if not _PLATFORM.match(platform):
        raise ValueError(f"arm {name!r}: the platform after '@' is lower-case letters, digits and '-' (e.g. gpu), "
                         f"optionally followed by {HIGHEST}; an imported arm is {EXAMPLE}")
    return platform, precision


def is_imported(name: str) -> bool:
    return name.startswith(JAX_ARM + "@")


def imported_arm(name: str, reference: RunSettings | None = None) -> Arm:
    """The JAX-side arm of an imported name, under the study's reference run settings."""
    parse_arm(name)
    return Arm(name, "jax", jax_arm(reference).knobs)


def find(names, platform: str = "gpu", precision: str = "default") -> str | None:
    """The first of `names` that is an imported arm on `platform` at `precision`."""
    return next((n for n in names if is_imported(n) and parse_arm(n) == (platform, precision)), None)


# ---------------------------------------------------------------- reading and checking a file
def _int(text: str, what: str, least: int) -> int:
    try:
        value = int(text)
    except ValueError:
        raise ValueError(f"{what} must be an integer >= {least}, got {text!r}") from None
    if value < least:
        raise ValueError(f"{what} must be an integer >= {least}, got {value}")
    return value


def _solved(text: str, what: str) -> bool:
    if text not in ("True", "False"):
        raise ValueError(f"{what} must be True or False, got {text!r}")
    return text == "True"


def _wall(text: str, what: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value >= 0):
        raise ValueError(f"{what} must be a number of seconds >= 0, got {text!r}")
    return value


def _header(path: str) -> list[dict]:
    """The file's rows, after its columns are checked: exactly COLUMNS, in any order."""
    if not os.path.isfile(path):
        raise ValueError(f"--import-runs {path}: no such file; give a CSV with columns {', '.join(COLUMNS)}")
    with open(path, encoding="utf-8", newline="") as f:
        reader = csv.DictReader(f)
        columns = list(reader.fieldnames or [])
        rows = list(reader)
    unknown, missing = [c for c in columns if c not in COLUMNS], [c for c in COLUMNS if c not in columns]
    if unknown or missing:
        raise ValueError(f"--import-runs {path}: " + "; ".join(
            part for part in (f"unknown column(s) {', '.join(unknown)}" if unknown else "",
                              f"missing column(s) {', '.join(missing)}" if missing else "") if part)
            + f"; the columns are {', '.join(COLUMNS)}")
    if not rows:
        raise ValueError(f"--import-runs {path}: no runs in it (a header only)")
    return rows


def _store_row(r: dict, what: str, cfg: Config, reference: RunSettings | None, where: Provenance,
               source: str) -> dict:
    """One checked file row as a store row under the study's identity (config, reference knobs)."""
    try:
        arm = imported_arm(r["arm"], reference)
    except ValueError as err:
        raise ValueError(f"{what}: {err}") from None
    precision = parse_arm(arm.name)[1]
    if r["matmul_precision"] != precision:
        raise ValueError(f"{what}: matmul_precision {r['matmul_precision']!r} but the arm {arm.name!r} is at "
                         f"{precision!r} (a name without {HIGHEST} is JAX's default precision)")
    seed = check_seed(_int(r["seed"], f"{what}: seed", 0), f"{what}: seed")
    if not _solved(r["solved"], f"{what}: solved"):
        raise ValueError(f"{what}: seed {seed} did not solve; an imported run must have solved within the study's "
                         f"budget ({cfg.max_env_steps:,} env steps): a run censored on another budget does not "
                         "stand for one of this study's")
    steps = _int(r["steps_to_solve"], f"{what}: steps_to_solve", 1)
    if steps > cfg.max_env_steps:
        raise ValueError(f"{what}: seed {seed} solved at {steps:,} env steps, beyond the study's budget of "
                         f"{cfg.max_env_steps:,}: in this study it would not have solved")
    spec = RunSpec(arm, seed, cfg)
    return {"run_id": spec.run_id, "arm": arm.name, "side": arm.side, "seed": seed, "solved": True,
            "steps_to_solve": steps, "epochs": _int(r["epochs"], f"{what}: epochs", 1), "env_steps": steps,
            "wall_s": _wall(r["wall_s"], f"{what}: wall_s"), "cpu_s": "", "device": where.device,
            "config": spec.key[2], "knobs": spec.key[3], "host": where.host, "versions": where.versions,
            "matmul_precision": precision, "note": f"imported from {source}" + (f": {where.note}" if where.note
                                                                                 else "")}


OUTCOME = ("solved", "steps_to_solve", "epochs")


def _same(a: dict, b: dict) -> bool:
    return all(str(a[k]) == str(b[k]) for k in OUTCOME)


def read_runs(path: str, cfg: Config, where: Provenance, reference: RunSettings | None = None) -> list[dict]:
    """Every run of the file as a store row, each once; ValueError (naming the row) for anything wrong."""
    for field in ("host", "device", "versions"):
        if not getattr(where, field).strip():
            raise ValueError(f"--import-{field} is empty; say where the imported runs ran")
    rows = _header(path)
    with open(path, "rb") as f:
        source = f"{os.path.basename(path)} (sha256 {hashlib.sha256(f.read()).hexdigest()[:16]})"
    out: dict[str, dict] = {}
    for i, r in enumerate(rows, start=2):
        row = _store_row(r, f"--import-runs {path} line {i}", cfg, reference, where, source)
        first = out.setdefault(row["run_id"], row)
        if not _same(first, row):
            raise ValueError(f"--import-runs {path} line {i}: {row['arm']} seed {row['seed']} is listed twice with "
                             f"different outcomes ({first['steps_to_solve']:,} and {row['steps_to_solve']:,} steps, "
                             f"{first['epochs']} and {row['epochs']} epochs)")
    return list(out.values())


def _n(value) -> str:
    """A stored count with thousands separators ('unsolved' for a blank)."""
    return f"{int(value):,}" if str(value).strip() else "unsolved"


def new_runs(rows: list[dict], stored: list[dict]) -> list[dict]:
    """The rows the store lacks; ValueError when the store holds one of these runs with another outcome."""
    have = {r["run_id"]: r for r in stored}
    for r in rows:
        old = have.get(r["run_id"])
        if old is not None and not _same(old, r):
            raise ValueError(f"{r['arm']} seed {r['seed']} is already in the store with another outcome "
                             f"({_n(old['steps_to_solve'])} steps in {old['epochs']} epochs there, "
                             f"{_n(r['steps_to_solve'])} in {r['epochs']} in the file); a run is imported once: fix "
                             "the file, or import into another --out")
    return [r for r in rows if r["run_id"] not in have]


def import_runs(folder: str, rows: list[dict]) -> tuple[int, int]:
    """Commit the rows `folder`'s store lacks (checked first, against a read-only view): (added, already there)."""
    stored = RunStore(folder, readonly=True).run_rows() if os.path.isfile(os.path.join(folder, "runs.csv")) else []
    fresh = new_runs(rows, stored)
    store = RunStore(folder)
    with store.locked():
        fresh = new_runs(rows, store.run_rows())   # again, under the lock
        for r in fresh:
            store.commit(r, [])
    return len(fresh), len(rows) - len(fresh)


# ---------------------------------------------------------------- what a study reports
def specs_in(store: RunStore, cfg: Config, reference: RunSettings | None = None) -> list[RunSpec]:
    """The imported runs the store holds for this study's configuration, as specs (in the store's order)."""
    want = config_json(cfg)
    out = []
    for r in store.run_rows():
        if is_imported(r["arm"]) and r["config"] == want:
            spec = RunSpec(imported_arm(r["arm"], reference), int(r["seed"]), cfg)
            if spec.key[3] == r["knobs"]:
                out.append(spec)
    return out
