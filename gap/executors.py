"""Where a study's runs execute: this machine's processes, or an existing Ray cluster.

An executor maps a picklable `task(spec) -> Finished` over specs and yields the results as they finish; the
parent process alone writes the store, so a run is committed once whatever executed it (a result seen twice,
e.g. from a retried task, is dropped by `gap.runs.run_all`). Each task runs with one thread for XLA, torch and
BLAS: N tasks on N cores, no oversubscription.
"""
from __future__ import annotations

import multiprocessing as mp
import os
from typing import Callable, Iterator, NamedTuple

from spec.threads import SINGLE_THREAD_ENV, XLA_SINGLE_THREAD, single_thread_env  # noqa: F401 - re-exported


def single_thread() -> None:
    """In a worker, before jax or torch start: one thread for XLA, torch and BLAS (torch's own pool through
    EGGROLL_SINGLE_THREAD, read when the trainer imports torch)."""
    os.environ.update(single_thread_env(dict(os.environ)))


class Local(NamedTuple):
    """Spawned processes on this machine (`workers` 1: in this process)."""

    workers: int

    def map(self, task: Callable, specs: list) -> Iterator:
        if self.workers <= 1 or len(specs) <= 1:
            yield from (task(s) for s in specs)
            return
        pool = mp.get_context("spawn").Pool(min(self.workers, len(specs)), initializer=single_thread)
        try:
            yield from pool.imap_unordered(task, specs)
            pool.close()
        except BaseException:
            pool.terminate()   # finished runs are on disk already; the rest resume next time
            raise
        finally:
            pool.join()

    def describe(self) -> str:
        return f"local, {self.workers} worker process(es), one thread each"


def _call(task: Callable, spec):
    """What a Ray worker runs: the task (a picklable callable, resolved from the object store) on one spec."""
    return task(spec)


class Ray(NamedTuple):
    """Tasks on an existing Ray cluster (`ray start --head` on one machine, `ray start --address` on the others).

    Every node needs this project installed in the Python that runs its Ray workers. A task whose worker dies
    is retried by Ray (`max_retries`); one that keeps failing comes back as an error and is retried by the
    next invocation of the same command.
    """

    address: str
    max_retries: int = 3

    def map(self, task: Callable, specs: list) -> Iterator:
        import ray

        ray.init(address=self.address, ignore_reinit_error=True, log_to_driver=False,
                 runtime_env={"env_vars": {**SINGLE_THREAD_ENV, "XLA_FLAGS": XLA_SINGLE_THREAD,
                                           "EGGROLL_SINGLE_THREAD": "1"}})
        remote = ray.remote(num_cpus=1, max_retries=self.max_retries)(_call)
        task_ref = ray.put(task)                  # shipped once, not once per run
        pending = {remote.remote(task_ref, s): s for s in specs}
        while pending:
            ready, _ = ray.wait(list(pending), num_returns=1)
            for ref in ready:
                spec = pending.pop(ref)
                try:
                    yield ray.get(ref)
                except Exception as err:          # the task failed after its retries (e.g. workers kept dying)
                    yield task.failed(spec, f"on Ray: {type(err).__name__}: {str(err).splitlines()[0][:200]}")

    def describe(self) -> str:
        return f"Ray cluster at {self.address}, one CPU per run"


def make(kind: str, workers: int | None = None, address: str | None = None):
    """The executor a command line asks for (`local` or `ray`)."""
    if kind == "local":
        return Local(max(1, workers or os.cpu_count() or 1))
    if kind == "ray":
        if not address:
            raise ValueError("--executor ray needs --address HOST:PORT of a running Ray head (see `ray start --head`)")
        return Ray(address)
    raise ValueError(f"--executor must be local or ray, got {kind!r}")
