"""What every test process shares, set before any test module imports jax or torch (`make test` runs pytest-xdist).

- JAX's persistent compilation cache, on from the first compile: the directory and thresholds of
  spec.platform.compile_cache_settings, which the command line sets through jax.config once a CartPole suite runs
  (parity.mlp.reference_port.enable_compile_cache), so the xdist workers and every subprocess a test starts
  (environment variables reach them) compile each reference function once and load it after. A
  JAX_COMPILATION_CACHE_DIR of your own is kept.
- Under xdist, cores // workers OpenMP threads per worker (torch's intra-op pool, read when torch loads, and every
  subprocess a test starts), so two workers on two cores do not oversubscribe them. An OMP_NUM_THREADS of your own
  is kept; run alone (no xdist), torch keeps its default.
"""
from __future__ import annotations

import os

from spec.platform import compile_cache_settings


def _threads_per_worker() -> int | None:
    """cores // workers under xdist, else None."""
    workers = os.environ.get("PYTEST_XDIST_WORKER_COUNT")
    if not os.environ.get("PYTEST_XDIST_WORKER") or not workers:
        return None
    return max(1, (os.cpu_count() or 1) // int(workers))


if "JAX_COMPILATION_CACHE_DIR" not in os.environ:
    os.environ.update({name.upper(): str(value) for name, value in compile_cache_settings().items()})
if (_THREADS := _threads_per_worker()) is not None:
    os.environ.setdefault("OMP_NUM_THREADS", str(_THREADS))
