"""One thread per process for XLA, torch and BLAS: the recipe a study worker and a timed one-core run share."""
from __future__ import annotations

XLA_SINGLE_THREAD = "--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1"
SINGLE_THREAD_ENV = {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1"}


def single_thread_env(environ: dict[str, str]) -> dict[str, str]:
    """`environ` with one thread for XLA, torch (EGGROLL_SINGLE_THREAD, read by the trainers) and BLAS."""
    env = dict(environ, **SINGLE_THREAD_ENV, EGGROLL_SINGLE_THREAD="1")
    flags = env.get("XLA_FLAGS", "")
    if "xla_cpu_multi_thread_eigen" not in flags:
        env["XLA_FLAGS"] = (flags + " " + XLA_SINGLE_THREAD).strip()
    return env
