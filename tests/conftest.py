"""What every test process shares, set before any test module imports jax or torch (`make test` runs pytest-xdist).

- JAX's persistent compilation cache, on from the first compile: the directory and thresholds that
  parity.reference_port.enable_compile_cache gives the command line (which turns it on only once a CartPole suite
  runs), so the xdist workers and every subprocess a test starts (environment variables reach them) compile each
  reference function once and load it after. A JAX_COMPILATION_CACHE_DIR of your own is kept.
- Under xdist, cores // workers OpenMP threads per worker (torch's intra-op pool, read when torch loads, and every
  subprocess a test starts), so two workers on two cores do not oversubscribe them. An OMP_NUM_THREADS of your own
  is kept; run alone (no xdist), torch keeps its default.
"""
from __future__ import annotations

import os


def _jax_compile_cache() -> dict[str, str]:
    """The environment that turns JAX's persistent compilation cache on where enable_compile_cache would put it."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    path = os.path.join(base, "eggroll-parity", "jax")
    try:
        os.makedirs(path, exist_ok=True)
    except OSError:      # read-only home: no cache, as on the command line
        return {}
    return {"JAX_COMPILATION_CACHE_DIR": path, "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0.05",
            "JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES": "0"}


def _threads_per_worker() -> int | None:
    """cores // workers under xdist, else None."""
    workers = os.environ.get("PYTEST_XDIST_WORKER_COUNT")
    if not os.environ.get("PYTEST_XDIST_WORKER") or not workers:
        return None
    return max(1, (os.cpu_count() or 1) // int(workers))


if "JAX_COMPILATION_CACHE_DIR" not in os.environ:
    os.environ.update(_jax_compile_cache())
if (_THREADS := _threads_per_worker()) is not None:
    os.environ.setdefault("OMP_NUM_THREADS", str(_THREADS))
