"""The c backend (c_rng, through torch_impl.random.native) against the definition: all 2^23 normals bit for bit,
draws and bits equal to the eager path and to jax.random at several sizes (block edges, batches, shapes), the same
at any thread count; the first-use self-check, the env switch and the build without a compiler.

Skipped, with the reason, where no C compiler is found."""
from __future__ import annotations

import ctypes
import os
import subprocess
import sys
from pathlib import Path

import jax
import numpy as np
import pytest
import torch

import c_rng
from torch_impl import random as R
from torch_impl.random import backends as B
from torch_impl.random import eager as E
from torch_impl.random import native as N

ROOT = Path(__file__).resolve().parents[3]
REASON = c_rng.unavailable_reason()
needs_c = pytest.mark.skipif(REASON is not None, reason=REASON or "")


def random_keys(seed: int, n: int) -> torch.Tensor:
    """n fresh keys (n, 2) with words anywhere in [0, 2^32)."""
    return torch.from_numpy(np.random.default_rng(seed).integers(0, 1 << 32, size=(n, 2), dtype=np.int64))


def eager_normal(keys: torch.Tensor, shape) -> torch.Tensor:
    return E._normal(keys, shape, False)


def eager_bits(keys: torch.Tensor, shape) -> torch.Tensor:
    return E._u32_to_int64(E._draw(keys, shape, torch.int32, E._xor_into))


@needs_c
def test_all_2_23_normals_equal_the_definitions_table():
    got = torch.empty(E._N_MANTISSAS, dtype=torch.float32)
    c_rng.load().jr_normal_of_mantissas(0, got.numel(), got.data_ptr(), 0)
    table = R.normal_table()
    same = got.view(torch.int32) == table.view(torch.int32)
    assert bool(same.all()), f"{int((~same).sum())} of 2^23 normals differ, first at mantissa {int((~same).nonzero()[0])}"


@needs_c
@pytest.mark.parametrize("n_keys, shape", [(3, (1,)), (5, (255,)), (4, (256,)), (7, (257, 3)), (64, (260, 4)),
                                           (2, (3, 1000))])
def test_draws_equal_the_eager_path_at_block_edges_and_shapes(n_keys, shape):
    keys = random_keys(sum(shape) + n_keys, n_keys)
    assert B.choose("normal", keys.device).name == "c"
    normal = R.normal(keys, shape)
    assert normal.shape == (n_keys, *shape) and normal.dtype == torch.float32
    assert torch.equal(normal.view(torch.int32), eager_normal(keys, shape).view(torch.int32))
    assert torch.equal(R.bits(keys, shape), eager_bits(keys, shape))


@needs_c
def test_batched_keys_and_jax_random_itself():
    keys = random_keys(11, 6).view(2, 3, 2)                                # batch dims (2, 3)
    ours = R.normal(keys, (9, 4))
    assert ours.shape == (2, 3, 9, 4)
    words = R.to_uint32(keys.reshape(-1, 2))
    ref = jax.vmap(lambda k: jax.random.normal(jax.random.wrap_key_data(k), (9, 4)))(words)
    assert np.array_equal(ours.reshape(6, 9, 4).numpy().view(np.uint32), np.asarray(ref).view(np.uint32))
    bits = jax.vmap(lambda k: jax.random.bits(jax.random.wrap_key_data(k), (9, 4)))(words)
    assert np.array_equal(R.to_uint32(R.bits(keys, (9, 4)).reshape(6, 9, 4)), np.asarray(bits))


@needs_c
@pytest.mark.parametrize("n_keys, shape", [(5, (255,)), (7, (257, 3)), (2, (3, 1000))])
def test_gpu_draws_equal_the_eager_path(n_keys, shape):
    keys = random_keys(sum(shape) + 3 * n_keys, n_keys)
    got = R.normal(keys, shape, backend="gpu")
    want = E._normal(keys, shape, False, "gpu")
    assert torch.equal(got.view(torch.int32), want.view(torch.int32))
    assert not torch.equal(got, R.normal(keys, shape))                     # 4.7% of the normals differ


@needs_c
@pytest.mark.parametrize("n_keys, n_data", [(1, 7), (5, 1), (300, 300)])
def test_fold_in_through_c_equals_the_eager_hash_and_jax_random_fold_in(n_keys, n_data):
    """torch_impl.random.fold_in (the C hash) against eager.fold_in (the torch hash) on fresh keys and data
    anywhere in [0, 2^32), broadcast one way and the other, and against jax.random.fold_in itself."""
    keys = random_keys(7 * n_keys + n_data, n_keys)
    data = torch.from_numpy(np.random.default_rng(n_data).integers(0, 1 << 32, size=n_data, dtype=np.int64))
    assert B.choose("hash", keys.device).name == "c"
    k, d = (keys, data) if n_keys == n_data else (keys[:, None], data[None, :])
    got = R.fold_in(k, d)
    assert got.shape == (*torch.broadcast_shapes(k.shape[:-1], d.shape), 2)
    assert torch.equal(got, E.fold_in(k, d))
    pairs = got.reshape(-1, 2)[:8]
    flat_k = k.expand(*got.shape).reshape(-1, 2)[:8]
    flat_d = d.expand(got.shape[:-1]).reshape(-1)[:8]
    want = [jax.random.key_data(jax.random.fold_in(jax.random.wrap_key_data(w), int(x)))
            for w, x in zip(R.to_uint32(flat_k), flat_d.tolist())]
    assert np.array_equal(R.to_uint32(pairs), np.stack([np.asarray(w) for w in want]))


@needs_c
@pytest.mark.parametrize("threads", [1, 2, 3])
def test_any_thread_count_gives_the_same_numbers(threads):
    keys = random_keys(5, 300)
    want = eager_normal(keys, (1031,))                                      # 309,300 draws: several threads' spans
    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        got = N.normal(keys, 1031)
    finally:
        torch.set_num_threads(previous)
    assert torch.equal(got.view(torch.int32), want.view(torch.int32))


def _off_by_one_first(fn):
    """jr_normal_of_mantissas with the call's first normal off by 1."""
    def wrong(start, count, out, backend):
        fn(start, count, out, backend)
        ctypes.c_float.from_address(out).value += 1.0
    return staticmethod(wrong)


def _negate_last(fn):
    """jr_normal with the sign of the call's last draw flipped."""
    def wrong(keys, n_keys, n, out, threads, backend):
        fn(keys, n_keys, n, out, threads, backend)
        ctypes.c_float.from_address(out + 4 * (n_keys * n - 1)).value *= -1.0
    return staticmethod(wrong)


def _flip_last_word(fn):
    """jr_hash_pairs with the call's last output word's low bit flipped."""
    def wrong(k0, k1, x0, x1, n, out):
        fn(k0, k1, x0, x1, n, out)
        ctypes.c_uint32.from_address(out + 4 * (2 * n - 1)).value ^= 1
    return staticmethod(wrong)


@needs_c
@pytest.mark.parametrize("broken, message", [
    ("jr_normal_of_mantissas", "the cpu normals of mantissas 0..255 differ from the eager formula"),
    ("jr_normal", "1 of 65584 sampled cpu normal draws differ from the eager formula"),
    ("jr_hash_pairs", "threefry of sampled counter pairs \\(fold_in's hash\\) differs from the eager formula"),
])
def test_a_library_that_differs_is_refused_with_a_warning(monkeypatch, broken, message):
    """A wrong normal (the first of the low mantissas), a wrong draw (the last one's sign) or a wrong hash: the
    first-use self-check warns, the formula serves, and status() says why."""
    real = c_rng.load()
    fake = type("Wrong", (), {"_name": real._name, "jr_normal": staticmethod(real.jr_normal),
                              "jr_normal_of_mantissas": staticmethod(real.jr_normal_of_mantissas),
                              "jr_hash_pairs": staticmethod(real.jr_hash_pairs),
                              "jr_bits": staticmethod(real.jr_bits)})
    wreck = {"jr_normal_of_mantissas": _off_by_one_first, "jr_normal": _negate_last,
             "jr_hash_pairs": _flip_last_word}[broken]
    setattr(fake, broken, wreck(getattr(real, broken)))
    monkeypatch.setattr(c_rng, "load", lambda *a, **k: fake())
    monkeypatch.setattr(B, "_checks", {})
    N.library.cache_clear()
    try:
        keys = random_keys(2, 3)
        kind = "hash" if broken == "jr_hash_pairs" else "normal"
        with pytest.warns(RuntimeWarning, match=f"c backend is not used for {kind}/cpu/cpu: {message}"):
            drawn = R.fold_in(keys, 5) if kind == "hash" else R.normal(keys, (7,))
        assert B.choose(kind, keys.device).name != "c"                      # the table or the formula
        assert "failed its self-check" in str(R.status()) and R.status().checks[f"c {kind}/cpu/cpu"] is not None
        assert torch.equal(R.normal(keys, (7,)), eager_normal(keys, (7,)))   # the torch paths serve the draw
        assert torch.equal(R.fold_in(keys, 5), E.fold_in(keys, 5))
        assert torch.equal(drawn, E.fold_in(keys, 5) if kind == "hash" else eager_normal(keys, (7,)))
    finally:
        N.library.cache_clear()


def test_env_formula_keeps_the_torch_paths(monkeypatch):
    monkeypatch.setenv(R.SWITCH, "formula")
    keys = random_keys(3, 4)
    assert B.choose("normal", keys.device).name == "formula" and B.choose("hash", keys.device).name == "formula"
    assert torch.equal(R.normal(keys, (33,)), eager_normal(keys, (33,)))
    assert "normal/cpu: formula; not c: TORCH_IMPL_RNG=formula" in str(R.status())
    monkeypatch.setenv(R.SWITCH, "sometimes")
    with pytest.raises(ValueError, match="allowed: auto, c, triton, table, formula"):
        R.normal(keys, (3,))


def test_no_compiler_skips_the_build_and_says_so(tmp_path):
    env = {**os.environ, "CC": "no-such-compiler-here"}
    done = subprocess.run([sys.executable, "-m", "c_rng.build", "--lib-dir", str(tmp_path)], cwd=ROOT, env=env,
                          capture_output=True, text=True)
    assert done.returncode == 0
    assert "C generator skipped" in done.stderr and "CC=no-such-compiler-here was not found" in done.stderr
    assert not list(tmp_path.glob("*.so"))
    with pytest.raises(c_rng.CUnavailable, match="skipped: no C compiler"):
        c_rng.load("no-such-compiler-here", tmp_path)


@needs_c
def test_the_build_writes_the_constants_from_spec_and_names_the_library_for_them(tmp_path):
    from c_rng import build as B
    path = B.build(lib_dir=tmp_path)
    header = (tmp_path / B.HEADER).read_text()
    assert header == B.constants_header() and "0x1BD11BDAu" in header
    assert path == B.library_path(tmp_path) and path.exists()


def test_a_build_folder_that_cannot_be_written_leaves_the_torch_paths(tmp_path):
    blocked = tmp_path / "file-not-folder"
    blocked.write_text("")
    with pytest.raises(c_rng.CUnavailable, match="C generator (not built|skipped)"):
        c_rng.load(lib_dir=blocked / "lib")
