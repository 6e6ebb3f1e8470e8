"""tests/conftest.py's settings for make test's workers: the files' order under xdist, the threads per worker, and
XLA's CPU settings and glibc's allocator (which must leave JAX's bits as they are by default, but for the order of
some float32 sums)."""
from __future__ import annotations

import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from parity.core import tolerances
from tests import conftest

ROOT = Path(__file__).resolve().parents[1]


def python_output(program: str, env: dict | None = None, *args: str) -> str:
    """What `program` prints, run with args by this Python in a fresh process from the repository root (its stderr if it
    fails)."""
    run = subprocess.run([sys.executable, "-c", program, *args], capture_output=True, text=True, cwd=ROOT, env=env)
    assert run.returncode == 0, run.stderr[-2000:]
    return run.stdout


def test_waiting_files_go_first_then_the_files_with_the_most_tests():
    files = Counter({"tests/test_b.py": 3, "tests/test_a.py": 3, "tests/test_big.py": 40, "tests/gap/test_ray.py": 1})
    order = conftest._file_order(files)
    assert sorted(order, key=order.get) == ["tests/gap/test_ray.py", "tests/test_big.py", "tests/test_a.py",
                                            "tests/test_b.py"]
    assert all((ROOT / f).is_file() for f in conftest.WAIT_FIRST)   # a renamed file would silently lose its place


def test_under_xdist_the_items_go_by_file_order_each_files_own_order_kept(monkeypatch):
    class Item:
        def __init__(self, nodeid):
            self.nodeid = nodeid

    ids = ["tests/test_a.py::x", "tests/gap/test_ray.py::only", "tests/test_a.py::y", "tests/test_c.py::p[2]",
           "tests/test_c.py::p[1]", "tests/test_c.py::q"]
    items = [Item(i) for i in ids]
    monkeypatch.delenv("PYTEST_XDIST_WORKER", raising=False)
    conftest.pytest_collection_modifyitems(None, items)
    assert [i.nodeid for i in items] == ids                   # alone, pytest's order is untouched
    monkeypatch.setenv("PYTEST_XDIST_WORKER", "gw0")
    conftest.pytest_collection_modifyitems(None, items)
    assert [i.nodeid for i in items] == ["tests/gap/test_ray.py::only", "tests/test_c.py::p[2]",
                                         "tests/test_c.py::p[1]", "tests/test_c.py::q", "tests/test_a.py::x",
                                         "tests/test_a.py::y"]


def test_threads_per_worker_split_the_cores_between_the_workers(monkeypatch):
    monkeypatch.delenv("PYTEST_XDIST_WORKER", raising=False)
    assert conftest._threads_per_worker() is None
    monkeypatch.setenv("PYTEST_XDIST_WORKER", "gw1")
    monkeypatch.setenv("PYTEST_XDIST_WORKER_COUNT", "2")
    monkeypatch.setattr("os.cpu_count", lambda: 16)
    assert conftest._threads_per_worker() == 8
    monkeypatch.setattr("os.cpu_count", lambda: 1)
    assert conftest._threads_per_worker() == 1


def test_the_xla_flags_are_added_unless_given_or_jax_has_a_plugin():
    level, emitters = conftest.XLA_TEST_FLAGS
    assert conftest._xla_flags("", False).split() == [level, emitters]
    assert conftest._xla_flags("--xla_cpu_multi_thread_eigen=false", False).split() == [
        "--xla_cpu_multi_thread_eigen=false", level, emitters]
    assert conftest._xla_flags("--xla_backend_optimization_level=3", False).split() == [
        "--xla_backend_optimization_level=3", emitters]
    assert conftest._xla_flags("--xla_cpu_use_fusion_emitters=true", False).split() == [
        "--xla_cpu_use_fusion_emitters=true", level]
    assert conftest._xla_flags("--xla_cpu_multi_thread_eigen=false", True) == "--xla_cpu_multi_thread_eigen=false"


# Fresh inputs across their ranges, saved to the .npz the program is given:
# - "exact": JAX's float32 functions whose XLA lowerings are polynomials (where a contracted multiply-add would show),
#   its normals (log and erf_inv), its bits and an integer matrix product: bit for bit under the tests' settings.
# - "dot*": float32 products (a, b, a @ b) of the shapes the suite's references take, the matrix-vector ones
#   where XLA's optimization level changes the order of the sum among them (a (1, 4) row times a (4, 4) matrix, each
#   of a population's rows times its own (64, 4) factor), and a gradient's fitness-weighted sum over 256 members:
#   within Higham's bound for two orders of the same sum.
BITS_PROGRAM = """
import sys, jax, jax.numpy as jnp, jax.scipy.special, numpy as np
k = jax.random.split(jax.random.key(20261129), 9)
x = jax.random.uniform(k[0], (1 << 16,), jnp.float32, -30.0, 30.0)
u = jax.random.uniform(k[1], (1 << 16,), jnp.float32)
i8 = jax.random.randint(k[2], (64, 96), -128, 128, jnp.int32)
exact = [jnp.exp(x), jnp.log(jnp.abs(x)), jnp.log1p(u), jnp.tanh(x), jax.nn.sigmoid(x), jax.scipy.special.erf(x / 10),
         jax.lax.erf_inv(2 * u - 1), jnp.sqrt(jnp.abs(x)), jax.random.normal(k[3], (3, 1 << 16), jnp.float32),
         jax.nn.gelu(x), jnp.cos(x), jnp.sin(x), jax.random.bits(k[4], (4, 5000)), i8 @ i8.T]
out = {"exact": np.concatenate([np.asarray(o).view(np.uint32).ravel() for o in exact])}
shapes = [((1, 4), (4, 4)), ((256, 1, 64), (256, 64, 4)), ((1, 4), (4, 64)), ((256,), (256, 256)),
          ((96, 257), (257, 33))]
for i, (sa, sb) in enumerate(shapes):
    a, b = jax.random.normal(jax.random.fold_in(k[5], i), sa), jax.random.normal(jax.random.fold_in(k[6], i), sb)
    out.update({f"dot{i}_a": a, f"dot{i}_b": b, f"dot{i}_ab": jax.jit(jnp.matmul)(a, b)})
np.savez(sys.argv[1], **{name: np.asarray(v) for name, v in out.items()})
"""


def run_bits_program(path: Path, env: dict | None = None) -> dict:
    """BITS_PROGRAM's arrays, run in a fresh process with env (this process's when None)."""
    python_output(BITS_PROGRAM, env, str(path))
    with np.load(path) as saved:
        return dict(saved)


def test_the_tests_settings_give_the_bits_of_the_defaults_but_for_the_order_of_float32_sums(tmp_path):
    """What XLA_TEST_FLAGS, MALLOC_TUNABLES and TRACEBACK_SETTING may change: JAX's elementwise functions, noise and
    integer arithmetic are those of a process at XLA's defaults, glibc's default allocator and JAX's whole-stack
    locations, bit for bit; a float32 product a @ b may be summed in another order, so each entry is within
    2 gamma_n sum_j |a_ij||b_jk| of the default's (n the inner dimension: each order is within gamma_n of the exact sum,
    parity.core.tolerances)."""
    flags = os.environ.get("XLA_FLAGS", "")
    ours = [flag for flag in conftest.XLA_TEST_FLAGS if flag in flags.split()]
    tuned = os.environ.get("GLIBC_TUNABLES") == conftest.MALLOC_TUNABLES
    name, value = conftest.TRACEBACK_SETTING
    short_locations = os.environ.get(name) == value
    if not (ours or tuned or short_locations):
        pytest.skip(f"the tests run at XLA_FLAGS={flags!r}, glibc's own allocator settings and JAX's own locations: "
                    "nothing to compare")
    dropped = {"GLIBC_TUNABLES"} if tuned else set()
    dropped |= {name} if short_locations else set()
    default = {k: v for k, v in os.environ.items() if k not in dropped}
    default["XLA_FLAGS"] = " ".join(f for f in flags.split() if f not in ours)
    got, want = run_bits_program(tmp_path / "tests.npz"), run_bits_program(tmp_path / "default.npz", default)
    settings = f"XLA {' '.join(ours)}, GLIBC_TUNABLES={conftest.MALLOC_TUNABLES} or {name}={value}"
    assert not (problems := bits_problems(got, want)), f"{settings}: {problems}; drop it from tests/conftest.py"


def bits_problems(got: dict, want: dict) -> list[str]:
    """Where BITS_PROGRAM's arrays under the tests' settings (got) part from the default's (want): the exact words
    not bit for bit, a product a @ b (the same a and b) past 2 gamma_n sum_j |a_ij||b_jk| of the default's."""
    problems = [] if np.array_equal(got["exact"], want["exact"]) else [
        f"{int(np.sum(got['exact'] != want['exact']))} words of JAX's float32 functions, normals or integers differ"]
    for i in range(sum(key.endswith("_ab") for key in want)):
        a, b = (want[f"dot{i}_{part}"].astype(np.float64) for part in "ab")
        if not all(np.array_equal(got[f"dot{i}_{part}"], want[f"dot{i}_{part}"]) for part in "ab"):
            problems.append(f"the normals of product {i}'s inputs differ")
            continue
        bound = 2 * tolerances.gamma(a.shape[-1]) * (np.abs(a) @ np.abs(b))
        diff = np.abs(got[f"dot{i}_ab"].astype(np.float64) - want[f"dot{i}_ab"])
        if not (diff <= bound).all():
            problems.append(f"a float32 product of shapes {a.shape} @ {b.shape} is past two summation orders' bound: "
                            f"{diff.max()} > {bound.flat[diff.argmax()]}")
    return problems


def test_bits_problems_allow_another_summation_order_and_nothing_else():
    """The comparison above on its own: a product summed backwards passes, one bit of an exact word or a product
    scaled by 1 + 1e-3 (past 2 gamma_64 = 7.6e-6 of sum|a||b|) does not."""
    r = np.random.default_rng()
    a, b = r.standard_normal((3, 1, 64)).astype(np.float32), r.standard_normal((3, 64, 4)).astype(np.float32)
    terms = a.swapaxes(1, 2) * b                                                  # (3, 64, 4): a_ij b_jk
    forward, backward = (np.add.reduce(t, axis=1, dtype=np.float32)[:, None] for t in (terms, terms[:, ::-1]))
    want = {"exact": r.integers(0, 2 ** 32, 1000, dtype=np.uint32), "dot0_a": a, "dot0_b": b, "dot0_ab": forward}
    assert not np.array_equal(forward, backward) and not bits_problems({**want, "dot0_ab": backward}, want)
    flipped = want["exact"].copy()
    flipped[r.integers(1000)] ^= np.uint32(1)
    assert bits_problems({**want, "exact": flipped}, want) == ["1 words of JAX's float32 functions, normals or "
                                                                "integers differ"]
    scaled = bits_problems({**want, "dot0_ab": forward * np.float32(1.001)}, want)
    assert len(scaled) == 1 and "(3, 1, 64) @ (3, 64, 4) is past" in scaled[0]


@pytest.mark.parametrize("hook, says", [(True, ["done"]), (False, ["done", "cleared"])])
def test_a_test_process_end_drops_jaxs_exit_clean_up(hook, says):
    """With the hook JAX's exit clean-up (seen through the clear_backends it calls) never runs; without it, it does."""
    program = ("import sys, jax.numpy as jnp\n"
               "from tests import conftest\n"
               "jnp.ones(3).block_until_ready()\n"
               "api = sys.modules['jax._src.api']\n"
               "api.clear_backends = lambda **kw: print('cleared')\n"
               f"if {hook}: conftest.pytest_sessionfinish(None)\n"
               "print('done')\n")
    assert python_output(program).split() == says


def test_a_jax_plugin_is_found_where_jax_finds_one(tmp_path, monkeypatch):
    import importlib

    if conftest._has_jax_plugin():
        pytest.skip("JAX already has a plugin here: nothing to tell apart")
    (tmp_path / "jax_plugins" / "xla_fake").mkdir(parents=True)
    (tmp_path / "jax_plugins" / "xla_fake" / "__init__.py").write_text("")
    monkeypatch.syspath_prepend(str(tmp_path))
    importlib.invalidate_caches()
    assert conftest._has_jax_plugin()


FAULTS_PROGRAM = """
import ctypes, resource
libc = ctypes.CDLL(None)
libc.malloc.restype = ctypes.c_void_p
libc.free.argtypes = [ctypes.c_void_p]
libc.memset.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_size_t]
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(40):                       # a 48 MiB block allocated, written and freed 40 times
    block = libc.malloc(48 << 20)
    libc.memset(block, 1, 48 << 20)
    libc.free(block)
print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""


def test_the_allocator_setting_reaches_the_tests_processes_and_keeps_freed_blocks():
    """GLIBC_TUNABLES is set for the processes the run starts; with it a freed 48 MiB block is reused, not mapped and
    faulted in again (glibc's default maps any block over 32 MiB afresh: 12,288 page faults each). JAX's bits with it:
    test_the_tests_settings_give_the_bits_of_the_defaults."""
    if sys.platform != "linux":
        pytest.skip("glibc's tunables apply on Linux only")
    assert "GLIBC_TUNABLES" in os.environ
    if os.environ.get("PYTEST_XDIST_WORKER"):      # an xdist worker started with it (the main process set it first)
        assert b"GLIBC_TUNABLES=" in Path("/proc/self/environ").read_bytes()
    bare = {k: v for k, v in os.environ.items() if k != "GLIBC_TUNABLES"}
    tuned = {**bare, "GLIBC_TUNABLES": conftest.MALLOC_TUNABLES}
    kept, default = int(python_output(FAULTS_PROGRAM, tuned)), int(python_output(FAULTS_PROGRAM, bare))
    assert kept * 10 < default, (kept, default)
