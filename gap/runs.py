"""Train every (arm, seed) of a study once, on an executor, and commit each finished run to the store.

Rerunning the same command resumes: a run whose identity (arm, seed, config, knobs) is already in the store is
skipped, and a result that comes back twice (a task retried after its worker died) is committed once.
"""
from __future__ import annotations

import json
import os
import socket
import sys
import time
from dataclasses import dataclass
from typing import Any, Callable, Iterable, NamedTuple

from gap.arms import PORT_PREFIX, Arm, knobs_json, port_arm
from gap.executors import Local
from gap.store import RunStore, config_json, run_id
from reporting import cpu_name, versions
from spec.config import Config


@dataclass(frozen=True)
class RunSpec:
    """One training run to do."""

    arm: Arm
    seed: int
    config: Config
    device: str = "cpu"

    @property
    def key(self) -> tuple[str, int, str, str]:
        """What makes two runs the same run (where it runs is recorded, not part of the identity)."""
        return (self.arm.name, int(self.seed), config_json(self.config), knobs_json(self.arm.knobs))

    @property
    def run_id(self) -> str:
        return run_id(self.key)


class Finished(NamedTuple):
    """What a worker sends back: plain rows, or the error that stopped the run."""

    spec: RunSpec
    run_row: dict | None
    epoch_rows: list[dict]
    error: str | None


class Outcome(NamedTuple):
    planned: int
    skipped: int        # already in runs.csv
    finished: int       # this call
    failed: list[str]   # "arm seed: error"


# ---------------------------------------------------------------- one run
def train_spec(spec: RunSpec):
    """The real trainers, by side; imported here so the parent and tests never load jax or torch for nothing."""
    if spec.arm.side == "port":
        return train_port(spec)
    if spec.arm.side == "jax":
        from jax_reference.train import train
        return train(spec.config, spec.arm.knobs, spec.seed, progress=False)
    from torch_impl.train import train
    threads = 1 if os.environ.get("EGGROLL_SINGLE_THREAD") else None   # a worker: one thread (no oversubscription)
    return train(spec.config, spec.arm.knobs, spec.seed, device=spec.device, progress=False,
                 **({"threads": threads} if threads else {}))


class ReferencePieces:
    """What a port arm takes from the reference when the port has none of its own: the initial parameters and
    the action uniforms of a run seed (DESIGN.md's key scheme), from jax_reference."""

    def __init__(self, cfg: Config, run):
        self.cfg, self.run = cfg, run

    def init_params(self, shapes: dict, seed: int) -> dict:
        from jax_reference.population import params_to_flat
        from jax_reference.train import init_model, run_keys
        return params_to_flat(init_model(self.cfg, self.run, run_keys(seed).model).params)

    def action_uniforms(self, seed: int, epoch: int, pop: int):
        from jax_reference.train import action_uniforms, run_keys
        return action_uniforms(run_keys(seed).action, epoch, pop)


def load_port_arm(source: str, cfg: Config, reference=None) -> Arm:
    """The arm of the adapter at MODULE:ATTR, loaded and checked to be trainable (its name is the arm's)."""
    from ports.train import load_trainable
    return port_arm(source, load_trainable(source, cfg).name, reference)


def train_port(spec: RunSpec):
    """A port arm: the adapter re-imported by MODULE:ATTR in this process and trained through its es_* methods
    (refused when it no longer carries the arm's name, e.g. its package was upgraded since the study began)."""
    from ports.train import load_trainable, train
    if os.environ.get("EGGROLL_SINGLE_THREAD"):   # a worker: one torch thread, as for the torch side
        import torch
        torch.set_num_threads(1)
    port = load_trainable(spec.arm.source, spec.config)
    if PORT_PREFIX + port.name != spec.arm.name:
        raise ValueError(f"{spec.arm.source} is now {port.name!r}, not the arm {spec.arm.name!r}")
    return train(port, spec.config, spec.seed, ReferencePieces(spec.config, spec.arm.knobs))


def _field(result: Any, name: str) -> Any:
    return result[name] if isinstance(result, dict) else getattr(result, name)


def _plain(value: Any) -> Any:
    """numpy / torch / jax scalars as Python numbers (so the CSV holds `0.2`, not `tensor(0.2000)`)."""
    return value.item() if hasattr(value, "item") else value


def where() -> tuple[str, str]:
    """(host, versions) of the process running a run: recorded with it, since runs may come from many machines."""
    v = versions(("torch", "jax"))
    return f"{socket.gethostname()} ({cpu_name()})", f"torch {v['torch']}, jax {v['jax']}"


def rows_of(spec: RunSpec, result: Any, wall_s: float, cpu_s: float = float("nan")) -> tuple[dict, list[dict]]:
    """A TrainResult as one run row and its epoch rows (grad_norm/<leaf> entries go to a JSON column)."""
    solved = bool(_field(result, "solved"))
    steps = _field(result, "steps_to_solve")
    if solved and steps is None:
        raise ValueError(f"{spec.arm.name} seed {spec.seed}: solved but steps_to_solve is None")
    host, vers = where()
    run_row = {
        "run_id": spec.run_id, "arm": spec.arm.name, "side": spec.arm.side, "seed": int(spec.seed),
        "solved": solved, "steps_to_solve": int(steps) if solved else "",
        "epochs": int(_field(result, "epochs")), "env_steps": int(_field(result, "env_steps")),
        "wall_s": round(float(wall_s), 3), "cpu_s": round(float(cpu_s), 3), "device": spec.device,
        "config": spec.key[2], "knobs": spec.key[3], "host": host, "versions": vers,
    }
    epoch_rows = []
    for h in _field(result, "history"):
        grads = {k: float(_plain(v)) for k, v in h.items() if k.startswith("grad_norm/")}
        epoch_rows.append({
            "run_id": spec.run_id, "arm": spec.arm.name, "seed": int(spec.seed),
            **{k: _plain(h.get(k, "")) for k in ("epoch", "env_steps", "mean_return", "max_return", "sigma", "lr",
                                                  "wall_s")},
            "grad_norms": json.dumps(grads, sort_keys=True, separators=(",", ":")),
        })
    return run_row, epoch_rows


class Task:
    """Picklable `trainer(spec)` turned into rows; an exception becomes an error message, not a dead pool."""

    def __init__(self, trainer: Callable[[RunSpec], Any]):
        self.trainer = trainer

    def __call__(self, spec: RunSpec) -> Finished:
        t0, c0 = time.perf_counter(), time.process_time()
        try:
            result = self.trainer(spec)
            run_row, epoch_rows = rows_of(spec, result, time.perf_counter() - t0, time.process_time() - c0)
        except Exception as exc:  # noqa: BLE001 - the parent reports it and carries on
            return self.failed(spec, f"{type(exc).__name__}: {exc}")
        return Finished(spec, run_row, epoch_rows, None)

    @staticmethod
    def failed(spec: RunSpec, error: str) -> Finished:
        return Finished(spec, None, [], error)


def execute(trainer: Callable[[RunSpec], Any], spec: RunSpec) -> Finished:
    """Train one run in this process and turn it into rows."""
    return Task(trainer)(spec)


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
def pending_specs(specs: list[RunSpec], store: RunStore) -> tuple[list[RunSpec], int]:
    """(the runs still to do, each once, in order; how many of the planned ones the store already holds)."""
    done, seen, pending = store.done(), set(), []
    for s in specs:
        if s.key not in done and s.key not in seen:
            seen.add(s.key)
            pending.append(s)
    return pending, len({s.key for s in specs}) - len(pending)


def run_all(specs: list[RunSpec], store: RunStore, trainer: Callable[[RunSpec], Any] = train_spec,
            executor=None, log=None) -> Outcome:
    """Train every spec not yet in the store on `executor` (default: this machine's cores), committing each."""
    log = log or (lambda line: print(line, file=sys.stderr, flush=True))
    executor = executor or Local(os.cpu_count() or 1)
    with store.locked():
        store.repair()   # again, under the lock this run holds
        pending, skipped = pending_specs(specs, store)
        log(f"{len(pending)} runs to do, {skipped} already done, on {executor.describe()}")
        committed, failed, t0, count = store.done(), [], time.perf_counter(), 0
        for fin in executor.map(Task(trainer), pending):
            count += 1
            if fin.error is not None:
                failed.append(f"{fin.spec.arm.name} seed {fin.spec.seed}: {fin.error}")
            elif fin.spec.key not in committed:          # a result seen twice is committed once
                store.commit(fin.run_row, fin.epoch_rows)
                committed.add(fin.spec.key)
            log(progress_line(count, len(pending), fin, time.perf_counter() - t0, len(pending) - count))
    return Outcome(len(specs), skipped, count - len(failed), failed)


def run_specs(arms_seeds: Iterable[tuple[Arm, list[int]]], cfg: Config, device: str = "cpu") -> list[RunSpec]:
    """Seed-major order (every arm's first seed before any arm's second), so early results span the arms; each
    arm trains with the configuration it carries (e.g. functional-port's two layers)."""
    arms_seeds = list(arms_seeds)
    longest = max((len(s) for _, s in arms_seeds), default=0)
    return [RunSpec(arm, seeds[i], cfg.replace(**dict(arm.config)), device)
            for i in range(longest) for arm, seeds in arms_seeds if i < len(seeds)]


def train_lm_spec(spec):
    """One run of the LM study (`gap.study.RunSpec` of `gap.lm.study`): (history rows, versions, host), trainers loaded lazily.

    A worker trains with one thread (EGGROLL_SINGLE_THREAD): N runs on N cores, no oversubscription.
    """
    if os.environ.get("EGGROLL_SINGLE_THREAD"):
        import torch
        torch.set_num_threads(1)
    from rollout.corpus import load_corpus
    corpus = load_corpus(spec.corpus, seq_len=spec.config.seq_len)
    if spec.arm.side == "jax":
        from jax_reference.lm.train import train_lm
        result = train_lm(spec.config, spec.seed, corpus=corpus, progress=False)
    else:
        from torch_impl.tree.train import train_lm
        result = train_lm(spec.config, spec.seed, knobs=spec.arm.knobs, corpus=corpus, progress=False, threads=1)
    host, vers = where()
    history = [{k: _plain(v) for k, v in dict(row).items()} for row in _field(result, "history")]
    return history, vers, host


def train_int8_spec(spec):
    """One run of the integer study (`gap.study.RunSpec` of `gap.int8.study`) on the torch int8 port: (history rows, versions,
    host). A worker trains with one thread (EGGROLL_SINGLE_THREAD)."""
    from rollout.corpus import load_corpus
    from torch_impl.int8.train import train_int8
    corpus = load_corpus(spec.corpus, seq_len=spec.config.tokens_per_update)
    result = train_int8(spec.config, spec.seed, corpus, progress=False, threads=1, knobs=spec.arm.knobs)
    host, vers = where()
    history = [{k: _plain(v) for k, v in dict(row).items()} for row in _field(result, "history")]
    return history, vers, host
