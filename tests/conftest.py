"""What every test process shares, set before any test module imports jax or torch (`make test` runs pytest-xdist).

- JAX's persistent compilation cache, on from the first compile: the directory and thresholds of
  spec.platform.compile_cache_settings, which the command line sets through jax.config once a live reference is made
  (parity.core.platform.enable_compile_cache), so the xdist workers and every subprocess a test starts
  (environment variables reach them) compile each reference function once and load it after. A
  JAX_COMPILATION_CACHE_DIR of your own is kept.
- Under xdist, cores // workers OpenMP threads per worker (torch's intra-op pool, read when torch loads, and every
  subprocess a test starts), so two workers on two cores do not oversubscribe them. An OMP_NUM_THREADS of your own
  is kept; run alone (no xdist), torch keeps its default.
- XLA's CPU backend at optimization level 1 and with its older fusion emitters (_xla_flags): compiled faster, the
  same bits for every elementwise function, the noise and integer arithmetic; some float32 dot products are summed
  in another order (test_conftest bounds them).
- glibc's allocator keeps blocks under 64 MiB in its heap (MALLOC_TUNABLES): fewer page faults, the same values.
- Each lowered JAX operation carries its innermost frame, not the whole stack, as its location (TRACEBACK_SETTING):
  less to lower and compile, the same values.
- Under xdist the files go out in _file_order's order (make test passes --no-loadscope-reorder, so xdist keeps it).
- At the end, a test process skips JAX's clean-up of what its exit frees anyway (pytest_sessionfinish).
"""
from __future__ import annotations

import os
from collections import Counter
from importlib import metadata

from spec.platform import compile_cache_settings


def _threads_per_worker() -> int | None:
    """cores // workers under xdist, else None."""
    workers = os.environ.get("PYTEST_XDIST_WORKER_COUNT")
    if not os.environ.get("PYTEST_XDIST_WORKER") or not workers:
        return None
    return max(1, (os.cpu_count() or 1) // int(workers))


# XLA compiles the tests' programs faster with two settings of its CPU backend (measured on two cores, empty caches):
# - LLVM at optimization level 1 (its default is 2; level 0 failed 23 tests of three files): make test 645 -> 558 s,
#   user CPU 19m29s -> 16m32s.
# - The older fusion emitters (XLA's default is the newer MLIR ones): tests/jax_reference/test_lm.py 62-66 -> 50 s (XLA's compile
#   47-50 -> 36 s of it); the whole suite's XLA compile time 342 -> 267 s; make test from a fresh clone 557 s the
#   same morning, 430 and 436 s after (this machine varies by up to a minute from run to run).
# What they keep and what they do not (tests/test_conftest.py checks both against a process at XLA's defaults): every
# elementwise function (exp, log, tanh, erf_inv, ...), the normals and integer arithmetic, bit for bit; but some float32
# dot products are summed in another order (XLA picks its matrix-vector loops by optimization level). Recorded at the
# quick size, the CartPole bundle's forward outputs differ in 495 of 496 arrays (at most 7.2e-7, a few float32 ulps)
# and 27 of its 246 gradients by one ulp; the LM bundle is identical. That is within what any two summation orders may
# differ by (2 gamma_n sum|a||b|), and the suite's float32 bounds allow any summation order. `make parity`, the
# committed reports and CI's parity gate run at XLA's defaults (JAX's compile cache keys on XLA_FLAGS, so nothing
# compiled here reaches them). Not set where a flag of the same name is already given, or where JAX has a PJRT
# plugin, as its GPU backends are (unmeasured there).
XLA_TEST_FLAGS = ("--xla_backend_optimization_level=1", "--xla_cpu_use_fusion_emitters=false")


def _has_jax_plugin() -> bool:
    """Whether JAX has a PJRT plugin to load (its CUDA and ROCm backends are plugins), found as JAX finds them: a
    module under the `jax_plugins` namespace package, or an entry point of that group (0.04 s, where reading every
    installed distribution's name took 0.19 s of each test process's start)."""
    from importlib.util import find_spec

    return find_spec("jax_plugins") is not None or bool(metadata.entry_points(group="jax_plugins"))


def _xla_flags(flags: str, plugin: bool) -> str:
    """XLA_FLAGS `flags` with each of XLA_TEST_FLAGS added whose name it does not give, unless JAX has a plugin."""
    if plugin:
        return flags
    given = {flag.split("=")[0] for flag in flags.split()}
    return " ".join([*flags.split(), *(flag for flag in XLA_TEST_FLAGS if flag.split("=")[0] not in given)])


if _FLAGS := _xla_flags(os.environ.get("XLA_FLAGS", ""), _has_jax_plugin()):
    os.environ["XLA_FLAGS"] = _FLAGS
if "JAX_COMPILATION_CACHE_DIR" not in os.environ:
    os.environ.update({name.upper(): str(value) for name, value in compile_cache_settings().items()})
if (_THREADS := _threads_per_worker()) is not None:
    os.environ.setdefault("OMP_NUM_THREADS", str(_THREADS))

# glibc's allocator for the processes a test run starts (the xdist workers, which start after this file loads in the
# main process, and their subprocesses): blocks under 64 MiB come from the heap, and up to 256 MiB of freed heap is kept.
# By default glibc maps every block over its dynamic threshold (at most 32 MiB) afresh and returns it on free, so the
# tests' many 8-32 MiB arrays (2^23-entry tables, populations) fault in zeroed pages on each allocation. Measured on
# tests/jax_reference/test_int8.py alone: minor page faults 643k -> 396k, sys CPU 7.2 -> 3.3 s, user 53.2 -> 49.8 s, peak
# memory 1.41 -> 1.51 GB. Allocation leaves every value as it was. Not set where GLIBC_TUNABLES is already given.
MALLOC_TUNABLES = "glibc.malloc.mmap_threshold=67108864:glibc.malloc.trim_threshold=268435456"
os.environ.setdefault("GLIBC_TUNABLES", MALLOC_TUNABLES)

# JAX gives each lowered operation the source location of the Python line that made it. By default that location is
# the whole call stack, up to 100 frames, which is kept in the MLIR module and in the HLO metadata XLA compiles. Here
# each operation keeps only its innermost user frame. Locations are metadata: they never change a compiled value. The
# persistent cache's key leaves them out, too. Measured on two cores, empty caches, one process:
# - tests/parity/mlp/test_seed_rank_scale.py: 54.6, 57.5, 61.1 s with whole stacks; 51.0, 53.3, 55.3 s without.
# - test_platform, test_parity_tree, test_compaction and test_port_adapter together: 192 -> 186 s (user 208 -> 203 s).
# - test_jax_lm with test_c_int8: 108 s either way.
# Not set where JAX_INCLUDE_FULL_TRACEBACKS_IN_LOCATIONS is already given.
TRACEBACK_SETTING = ("JAX_INCLUDE_FULL_TRACEBACKS_IN_LOCATIONS", "0")
os.environ.setdefault(*TRACEBACK_SETTING)


# Files whose time is mostly waiting on other processes: handed out first under xdist, so the wait overlaps the
# other worker's files instead of ending the run on one core (test_gap_ray: ~23 s, most of it Ray's start-up and its
# runs' sleeps; last, it left the other core idle for 16 s of a 12-minute run).
WAIT_FIRST = ("tests/gap/test_ray.py",)


def _file_order(files: Counter) -> dict[str, int]:
    """{test file: rank}: WAIT_FIRST, then the files with the most tests first (xdist's own loadscope order)."""
    ranked = sorted(files, key=lambda f: (f not in WAIT_FIRST, -files[f], f))
    return {f: i for i, f in enumerate(ranked)}


def pytest_collection_modifyitems(config, items):
    """Under xdist, the items sorted by _file_order, each file's own order kept (every worker sorts alike)."""
    if not os.environ.get("PYTEST_XDIST_WORKER"):
        return
    order = _file_order(Counter(item.nodeid.split("::")[0] for item in items))
    items.sort(key=lambda item: order[item.nodeid.split("::")[0]])


def pytest_sessionfinish(session):
    """At a test process's end, JAX's atexit clean-up is skipped: it clears the backend and every cached executable,
    memory the exit frees anyway. With thousands of executables it took about 7 s of CPU at the end of each make test
    worker (py-spy, 25 Hz); a process with few saves nothing measurable. (Freezing the heap against pytest's closing
    collections saved 1.5 s more per process, but left Triton's objects for nanobind to report as leaked at exit.)"""
    import atexit
    import sys

    api = sys.modules.get("jax._src.api")
    if api is not None and callable(getattr(api, "clean_up", None)):
        atexit.unregister(api.clean_up)
