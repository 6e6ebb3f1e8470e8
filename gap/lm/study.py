"""The LM gap study: does the torch port learn the byte-level LM as fast as the JAX reference, and which tree
drift slows it by how much?

Arms: `jax_reference` and `torch:jax` (the faithful port, rng=jax), then one `torch:KNOB=VALUE` arm per tree knob
whose drift changes learning. Two knobs do not: `tmm_layout=transposed` and `leaf_order=insertion` only give
each leaf (or each factor) other i.i.d. normal draws, so the noise has the same distribution and learning is
unchanged in distribution; the suite catches them element by element with rng=jax, the study has nothing to
measure for them.

Outcomes per run (`spec.lm` cpu preset): validation bits/byte after the run's epochs (noise off, lower is
better), and epochs to reach TARGET_BPB on validation (measured every eval_every epochs; a run that never
reaches it is censored at its last epoch). Both are compared with `gap.stats.compare` (ratio of means with a
bootstrap interval, Welch, Mann-Whitney, Gehan for the censored outcome, P(improvement), power at 10%),
Holm-adjusted across the knob arms.

The store is `runs.csv` (one row per finished run) and `epochs.csv` (its validation curve) in the output folder,
appended and fsync'd run by run, so an interrupted study resumes where it stopped.
"""
from __future__ import annotations

import csv
import hashlib
import json
import os
import sys
import time
from dataclasses import asdict, dataclass
from typing import Callable, Iterable, NamedTuple

from gap import store
from spec.lm import LM_PRESETS, LMConfig
from spec.tree_knobs import TREE_CHOICES, TREE_DESCRIPTIONS, TREE_MEANINGS, TreeKnobs

PRESET = "cpu"
MAIN_SEEDS, KNOB_SEEDS = 10, 6
# Knobs whose drift changes what the ES does in distribution (see the module docstring for the other two).
LEARNING_KNOBS: dict[str, str] = {
    "stack_keys": "shared",
    "frozen_leaves": "perturbed",
    "group_fitness": "group_var",
    "embedding": "lowrank",
}
NOT_LEARNING = {"tmm_layout": "transposed", "leaf_order": "insertion"}
# The validation bits/byte a run must reach for the second outcome (computed from epochs.csv at report time,
# so it can be restated without retraining). At the cpu preset a faithful JAX run reaches 4.0 around epoch
# 500-650 (and ends near 3.8 at 1000), so 4.0 separates arms where the curve still falls.
TARGET_BPB = 4.0
RUN_COLUMNS = ("run_id", "arm", "side", "seed", "final_val_bpb", "epochs", "wall_s", "cpu_s", "config", "knobs", "host", "versions")
EPOCH_COLUMNS = ("run_id", "arm", "seed", "epoch", "train_bpb", "val_bpb", "wall_s")


@dataclass(frozen=True)
class LmArm:
    """One arm: the side that trains (`jax` or `torch`) and, for torch, its tree knobs' departures."""

    name: str
    side: str
    drifts: tuple[tuple[str, str], ...] = ()

    @property
    def knobs(self) -> TreeKnobs:
        return TreeKnobs().replace(**dict(self.drifts))


def arms() -> list[LmArm]:
    """jax_reference, torch:jax, then one torch arm per learning knob (in TREE_CHOICES order)."""
    out = [LmArm("jax_reference", "jax"), LmArm("torch:jax", "torch")]
    out += [LmArm(f"torch:{k}={v}", "torch", ((k, v),)) for k, v in LEARNING_KNOBS.items()]
    return out


def seed_list(n: int, first: int = 42, stride: int = 100) -> list[int]:
    """42, 142, 242, ...: the seeds of every study here."""
    return [first + stride * i for i in range(n)]


@dataclass(frozen=True)
class LmRunSpec:
    arm: LmArm
    seed: int
    config: LMConfig
    corpus: str | None = None

    @property
    def run_id(self) -> str:
        ident = [self.arm.name, int(self.seed), json.dumps(asdict(self.config), sort_keys=True)]
        return hashlib.sha1(json.dumps(ident).encode()).hexdigest()[:12]


def plan(cfg: LMConfig, main_seeds: int = MAIN_SEEDS, knob_seeds: int = KNOB_SEEDS,
         names: Iterable[str] | None = None) -> list[LmRunSpec]:
    """Seed-major order (every arm's first seed before any arm's second), so early results span the arms."""
    chosen = arms()
    if names is not None:
        wanted = list(names)
        known = {a.name for a in chosen}
        unknown = [n for n in wanted if n not in known]
        if unknown:
            raise ValueError(f"unknown arm(s) {', '.join(unknown)}; planned arms: {', '.join(sorted(known))}")
        chosen = [a for a in chosen if a.name in wanted]
    per_arm = [(a, seed_list(main_seeds if not a.drifts else knob_seeds)) for a in chosen]
    longest = max((len(s) for _, s in per_arm), default=0)
    return [LmRunSpec(a, seeds[i], cfg) for i in range(longest) for a, seeds in per_arm if i < len(seeds)]


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


def read_runs(folder: str) -> list[dict]:
    return _read(folder, "runs.csv")


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


# ---------------------------------------------------------------- running
class Finished(NamedTuple):
    spec: LmRunSpec
    run_row: dict | None
    epoch_rows: list[dict]
    error: str | None


class Task(NamedTuple):
    """Picklable: train one spec with `trainer(spec) -> (history rows, versions, host)` and build its rows."""

    trainer: Callable

    def __call__(self, spec: LmRunSpec) -> Finished:
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


def run_all(specs: list[LmRunSpec], folder: str, trainer: Callable, executor, log=print) -> tuple[int, list[str]]:
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


def check_run_inputs(args, published: str) -> None:
    """What the LM and int8 study commands refuse alike before any work (ValueError with what would be right): epochs,
    workers, the corpus, a --from folder without runs.csv (`published`: the example to name), an unwritable --out."""
    from spec.limits import check_out_dir

    if args.epochs is not None and args.epochs < 1:
        raise ValueError(f"--epochs must be >= 1, got {args.epochs}")
    if args.workers is not None and args.workers < 1:
        raise ValueError(f"--workers must be >= 1, got {args.workers}")
    if args.corpus is not None and (not os.path.isfile(args.corpus) or os.path.getsize(args.corpus) == 0):
        raise ValueError(f"--corpus {args.corpus}: missing or empty; give a non-empty text file, or leave it out "
                         f"for the shipped corpus")
    if args.from_dir is not None and not os.path.isfile(os.path.join(args.from_dir, "runs.csv")):
        raise ValueError(f"--from {args.from_dir}: no runs.csv there; give a study folder such as {published}")
    check_out_dir(args.out)


def train_folder(specs: list, folder: str, from_dir: str | None, trainer: Callable, executor,
                 report_only: bool = False) -> list[str] | None:
    """A study command's run: seed `folder` from `from_dir` (a study folder whose finished runs are taken, nothing
    retrained), then train every pending spec unless report_only. The failures, or None when interrupted (said on
    stderr: the finished runs are saved and the same command resumes)."""
    log = lambda line: print(line, file=sys.stderr, flush=True)
    try:
        os.makedirs(folder, exist_ok=True)
        if from_dir and os.path.abspath(from_dir) != os.path.abspath(folder):
            log(f"{seed_from(folder, from_dir)} finished runs taken from {from_dir}")
        return [] if report_only else run_all(specs, folder, trainer, executor, log=log)[1]
    except KeyboardInterrupt:
        log(f"\ninterrupted: finished runs are saved in {folder}/runs.csv; rerun the same command to resume")
        return None


def describe_arm(name: str) -> str:
    """An arm's drift in the knob table's words."""
    if not name.startswith("torch:") or "=" not in name:
        return {"jax_reference": "the JAX reference", "torch:jax": "the faithful torch port (rng=jax)"}.get(name, name)
    knob, value = name[len("torch:"):].split("=", 1)
    return f"{TREE_DESCRIPTIONS[knob].split(' (')[0]}: {TREE_MEANINGS[knob][value]}"


def default_config() -> LMConfig:
    return LM_PRESETS[PRESET]


assert set(LEARNING_KNOBS) | set(NOT_LEARNING) == set(TREE_CHOICES) - {"rng"}
