"""torch_impl.random against jax.random itself: keys, fold_in, split, bits and uniforms bit for bit, normals
bit for bit over sampled draws and over all 2^23 possible inputs, batched keys equal to one key at a time.

Compiling JAX programs dominates this file's run time (on this machine, for a batch of keys, about 0.5 s
of CPU for a 1-d draw, 1.2 s for 2-d, 3.5 s for 3-d), so every JAX reference is one jit(vmap(...)) over a
batch of keys, cached per signature and shared between tests, and only `bits` is compiled for multi-d
shapes: those tests pin down JAX's layout (a value depends only on its row-major flat index), and uniforms
and normals are elementwise functions of the bits, so their multi-d references are JAX's flat draws reshaped.
"""
from __future__ import annotations

import functools
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from jax import lax

from bench.runners import normal_agreement
from reporting import Agreement, agreement, ulp_distance
from torch_impl import random as R
from torch_impl.random import eager as E
from tests.marks import on_gpu

U32 = np.uint32


class AgreementReport(UserWarning):
    """Carries the measured agreement into pytest's warnings summary (visible without -s)."""


def report(what: str, result: Agreement) -> None:
    print(f"{what}: {result}")
    warnings.warn(AgreementReport(f"{what}: {result}"), stacklevel=2)


# ------------------------------------------------------------------------------------------- JAX side
def jkeys(words) -> jax.Array:
    """Typed JAX keys from key words (..., 2) uint32."""
    return jax.random.wrap_key_data(jnp.asarray(np.asarray(words, dtype=U32)))


def jwords(jax_keys) -> np.ndarray:
    return np.asarray(jax.random.key_data(jax_keys))


def random_words(rng: np.random.Generator, n: int) -> np.ndarray:
    """n random keys (n, 2) uint32, all 64 bits random."""
    return rng.integers(0, 1 << 32, size=(n, 2), dtype=np.uint64).astype(U32)


def same_bits(a, b) -> bool:
    a, b = np.asarray(a), np.asarray(b)
    return a.shape == b.shape and a.dtype.itemsize == b.dtype.itemsize and bool(
        (a.view(f"u{a.dtype.itemsize}") == b.view(f"u{b.dtype.itemsize}")).all())


@functools.lru_cache(maxsize=None)
def jax_draw(name: str, shape: tuple[int, ...]):
    """jit(vmap(jax.random.<name>(key, shape))) over a batch of keys, compiled once per (name, shape)."""
    fn = getattr(jax.random, name)
    return jax.jit(jax.vmap(lambda k: fn(k, shape)))


def jax_ref(name: str, words, shape) -> np.ndarray:
    """JAX's draws (K, *shape) for keys (K, 2); multi-d uniforms and normals from the flat draw (module doc)."""
    shape = tuple(shape)
    if len(shape) >= 2 and name != "bits":
        flat = np.asarray(jax_draw(name, (int(np.prod(shape)),))(jkeys(words)))
        return flat.reshape(len(words), *shape)
    if len(shape) >= 3:                      # one key at a time compiles a rank-3 program, not rank 4
        return np.stack([np.asarray(getattr(jax.random, name)(jkeys(w), shape)) for w in words])
    return np.asarray(jax_draw(name, shape)(jkeys(words)))


@functools.lru_cache(maxsize=None)
def jax_uniform_between(shape: tuple[int, ...]):
    """jax.random.uniform(key, shape, minval=lo, maxval=hi) over a batch of keys, bounds as arguments."""
    return jax.jit(jax.vmap(lambda k, lo, hi: jax.random.uniform(k, shape, minval=lo, maxval=hi),
                            in_axes=(0, None, None)))


@functools.lru_cache(maxsize=None)
def jax_fold_in_grid():
    """fold_in of every key (K,) with every datum (D,) -> (K, D) keys, one compiled program."""
    return jax.jit(jax.vmap(jax.vmap(jax.random.fold_in, in_axes=(None, 0)), in_axes=(0, None)))


def jax_normal_from_bits(bits: jax.Array) -> jax.Array:
    """jax.random.normal's float32 path applied to given 32-bit words: _uniform's bit trick on
    [nextafter(-1, 0), 1), then sqrt(2) * erf_inv, the same lax ops in the same order."""
    lo = np.nextafter(np.float32(-1.0), np.float32(0.0), dtype=np.float32)
    hi = np.float32(1.0)
    mant = lax.shift_right_logical(bits, jnp.uint32(9)) | jnp.uint32(0x3F800000)
    floats = lax.bitcast_convert_type(mant, jnp.float32) - jnp.float32(1.0)
    u = lax.max(jnp.float32(lo), floats * (hi - lo) + lo)
    return lax.mul(np.float32(np.sqrt(2)), lax.erf_inv(u))


# Shapes shared by the draw tests: 0-d, 1-d, odd counts, a 3-d shape and the paper's factor shape (a + b, r).
SHAPE_3D = (3, 5, 7)
FACTOR = (260, 4)


# ------------------------------------------------------------------------------------------- keys
SEEDS = [0, 1, 42, 2**31 - 1, 2**31, 2**32 - 1, 2**32 + 7, 2**40 + 5, -1, -42, -2**31, 2**63 - 1, -2**63]


def test_key_matches_jax_for_edge_and_random_seeds():
    rng = np.random.default_rng(11)
    seeds = SEEDS + [int(s) for s in rng.integers(-2**63, 2**63 - 1, size=20)]
    for seed in seeds:
        ours = R.to_uint32(R.key(seed))
        assert ours.shape == (2,)
        assert same_bits(ours, jwords(jax.random.key(seed))), seed
    for seed in [np.int64(2**33 + 7), np.int32(-5), np.uint32(2**32 - 1), torch.tensor(-9)]:
        ref = jax.random.key(seed.item() if isinstance(seed, torch.Tensor) else seed)
        assert same_bits(R.to_uint32(R.key(seed)), jwords(ref)), seed


@pytest.mark.parametrize("bad", [2**63, -2**63 - 1, 1.5, True, "3", torch.tensor([1, 2]), torch.tensor(1.0)])
def test_key_rejects_what_is_not_an_int64_seed(bad):
    with pytest.raises((TypeError, ValueError)):
        R.key(bad)


def test_as_key_and_to_uint32_round_trip_jax_key_data():
    words = jwords(jax.random.split(jax.random.key(5), 6))                   # (6, 2) uint32
    keys = R.as_key(words)
    assert keys.dtype == torch.int64 and keys.shape == (6, 2)
    assert same_bits(R.to_uint32(keys), words)
    with pytest.raises(ValueError):
        R.as_key(np.zeros((3, 3), dtype=U32))


# ------------------------------------------------------------------------------------------- fold_in
def test_fold_in_matches_jax_for_edge_data_and_keys_from_split():
    rng = np.random.default_rng(3)
    datas = [0, 1, 7, 12345, 2**31 - 1, 2**31, 2**32 - 1] + [int(d) for d in rng.integers(0, 2**32, size=8)]
    key_words = np.concatenate([jwords(jax.random.split(jax.random.key(s), 3)) for s in (0, 42, -7)]
                               + [random_words(rng, 4)])                       # (13, 2)
    ref = jwords(jax_fold_in_grid()(jkeys(key_words), jnp.asarray(np.array(datas, dtype=U32))))  # (13, D, 2)
    for i, words in enumerate(key_words):
        for j, d in enumerate(datas):
            assert same_bits(R.to_uint32(R.fold_in(R.as_key(words), d)), ref[i, j]), (words, d)
    grid = R.fold_in(R.as_key(key_words)[:, None], torch.tensor(datas))       # keys (13, 1, 2) x data (D,)
    assert same_bits(R.to_uint32(grid), ref)


def test_fold_in_batches_keys_and_data():
    rng = np.random.default_rng(4)
    words = random_words(rng, 9)                                              # (9, 2)
    data = rng.integers(0, 2**32, size=9, dtype=np.uint64).astype(U32)
    grid = jwords(jax_fold_in_grid()(jkeys(words), jnp.asarray(data)))        # (9, 9, 2): key i, datum j
    keys = R.as_key(words)
    # keys (P, 2) with data (P,): elementwise
    paired = R.fold_in(keys, torch.as_tensor(data.astype(np.int64)))
    assert same_bits(R.to_uint32(paired), grid[np.arange(9), np.arange(9)])
    # one key with data (P,): P keys from one key, the population pattern
    fanned = R.fold_in(keys[0], torch.as_tensor(data.astype(np.int64)))
    assert fanned.shape == (9, 2) and same_bits(R.to_uint32(fanned), grid[0])
    # keys (P, 2) with one int; a 3-d key batch against broadcast data
    assert same_bits(R.to_uint32(R.fold_in(keys, int(data[4]))), grid[:, 4])
    cube = R.fold_in(keys.reshape(3, 3, 1, 2), torch.arange(4))              # (3, 3, 4, 2)
    assert cube.shape == (3, 3, 4, 2)
    for i in range(9):
        for d in range(4):
            assert torch.equal(cube.reshape(9, 4, 2)[i, d], R.fold_in(keys[i], d))


def test_fold_in_array_data_wraps_mod_2_32_like_jax_arrays():
    words = jwords(jax.random.key(8))
    for d in [np.int32(-3), np.int64(2**33 + 5), np.int64(-2**31 - 1)]:
        ours = R.to_uint32(R.fold_in(R.as_key(words), torch.tensor(int(d))))
        assert same_bits(ours, jwords(jax.random.fold_in(jkeys(words), d))), d
        assert same_bits(R.to_uint32(R.fold_in(R.as_key(words), d)), ours)


@pytest.mark.parametrize("bad", [-1, 2**32, 1.5, True, torch.tensor([0.5])])
def test_fold_in_rejects_bad_data(bad):
    with pytest.raises((TypeError, ValueError)):
        R.fold_in(R.key(0), bad)


@pytest.mark.parametrize("bad_keys", [torch.zeros(3, dtype=torch.int64), torch.zeros((), dtype=torch.int64),
                                      torch.tensor([0, 2**32]), torch.tensor([-1, 0]), torch.zeros(2),
                                      [0, 1]])
def test_functions_reject_malformed_keys(bad_keys):
    for fn in (lambda k: R.fold_in(k, 1), lambda k: R.split(k), lambda k: R.bits(k, (3,)),
               lambda k: R.uniform(k, (3,)), lambda k: R.normal(k, (3,))):
        with pytest.raises((TypeError, ValueError)):
            fn(bad_keys)


def test_draws_reject_bad_shapes():
    for bad in [(-1,), (2.5,), (True, 3)]:
        with pytest.raises(ValueError):
            R.normal(R.key(0), bad)


# ------------------------------------------------------------------------------------------- split
@pytest.mark.parametrize("num", [1, 7, (2, 3)])
def test_split_matches_jax(num):
    rng = np.random.default_rng(5)
    words = np.concatenate([jwords(jax.random.key(s))[None] for s in (0, 1, 2**31 - 1)] + [random_words(rng, 2)])
    ref = jwords(jax.vmap(lambda k: jax.random.split(k, num))(jkeys(words)))      # (5, *num, 2)
    batched = R.split(R.as_key(words), num)
    assert same_bits(R.to_uint32(batched), ref)
    for i, w in enumerate(words):
        assert torch.equal(R.split(R.as_key(w), num), batched[i])


def test_split_is_fold_in_of_the_index_and_batches():
    rng = np.random.default_rng(6)
    keys = R.as_key(random_words(rng, 6)).reshape(2, 3, 2)
    parts = R.split(keys, 5)                                                  # (2, 3, 5, 2)
    assert parts.shape == (2, 3, 5, 2)
    for i in range(2):
        for j in range(3):
            assert torch.equal(parts[i, j], R.split(keys[i, j], 5))
            assert torch.equal(parts[i, j], R.fold_in(keys[i, j], torch.arange(5)))
    assert R.split(keys[0, 0], 0).shape == (0, 2)


# ------------------------------------------------------------------------------------------- bits
@pytest.mark.parametrize("shape", [(), (1,), (7,), SHAPE_3D, FACTOR, (2, 0, 3)])
def test_bits_match_jax(shape):
    rng = np.random.default_rng(len(shape) * 10 + sum(shape))
    words = np.concatenate([jwords(jax.random.split(jax.random.key(42), 2)), random_words(rng, 2),
                            jwords(jax.random.key(-1))[None]])                # (5, 2), keys from split too
    ours = R.bits(R.as_key(words), shape)
    assert ours.dtype == torch.int64 and tuple(ours.shape) == (5, *shape)
    assert same_bits(R.to_uint32(ours), jax_ref("bits", words, shape))
    for i, w in enumerate(words):                                             # one key at a time, too
        assert torch.equal(R.bits(R.as_key(w), shape), ours[i])


# ------------------------------------------------------------------------------------------- uniform
def test_uniform_matches_jax_for_several_ranges():
    rng = np.random.default_rng(21)
    words = np.concatenate([random_words(rng, 3), jwords(jax.random.key(0))[None]])
    shape = (18537,)
    for lo, hi in [(0.0, 1.0), (-3.7, 11.3), (0.1, 0.30000001), (-1e-3, 5e4)]:
        ref = np.asarray(jax_uniform_between(shape)(jkeys(words), np.float32(lo), np.float32(hi)))
        ours = R.uniform(R.as_key(words), shape, lo, hi)
        assert ours.dtype == torch.float32 and tuple(ours.shape) == (4, *shape)
        assert same_bits(ours.numpy(), ref), (lo, hi, agreement(ours, ref))
        assert float(ours.min()) >= np.float32(lo) and float(ours.max()) < np.float32(hi)


@pytest.mark.parametrize("shape", [(), (1,), SHAPE_3D])
def test_uniform_small_shapes_and_batched_keys(shape):
    rng = np.random.default_rng(9)
    words = random_words(rng, 6)
    batched = R.uniform(R.as_key(words).reshape(2, 3, 2), shape)
    assert tuple(batched.shape) == (2, 3, *shape)
    assert same_bits(batched.reshape(6, *shape).numpy(), jax_ref("uniform", words, shape))
    for i, w in enumerate(words):
        assert torch.equal(R.uniform(R.as_key(w), shape), batched.reshape(6, *shape)[i])


# ------------------------------------------------------------------------------------------- normal
def test_jax_replica_of_normal_from_bits_is_what_jax_random_normal_does():
    words = random_words(np.random.default_rng(1), 8)
    replica = jax.jit(jax_normal_from_bits)(jnp.asarray(jax_ref("bits", words, FACTOR).reshape(-1)))
    direct = np.stack([np.asarray(jax.random.normal(jkeys(w), FACTOR)) for w in words])   # (8, 260, 4)
    assert same_bits(np.asarray(replica), direct.reshape(-1))


def test_normal_exhaustive_over_all_2_23_inputs():
    # Every float32 normal JAX can draw comes from one of 2^23 mantissas m = bits >> 9: compare them all.
    m = np.arange(1 << 23, dtype=U32)
    ref = np.asarray(jax.jit(jax_normal_from_bits)(jnp.asarray(m << U32(9))))
    result = agreement(R.normal_table(), ref)
    report("normal, all 2^23 inputs vs jax", result)
    assert result.draws == 1 << 23
    assert result.identical_fraction == 1.0, f"not bit-identical: {result}"


def test_normal_sampled_million_draws_within_one_ulp_of_jax():
    result = normal_agreement(1 << 20, reference=lambda words, shape: jax_ref("normal", words, shape), seed=31)
    report("normal, sampled draws vs jax.random.normal", result)
    assert result.draws >= 1 << 20
    assert result.max_ulp <= 1, f"a draw is more than 1 ULP from JAX: {result}"


@pytest.mark.parametrize("use_table", [False, True])
def test_normal_both_paths_match_jax_for_small_shapes(use_table):
    rng = np.random.default_rng(12)
    words = np.concatenate([random_words(rng, 2), jwords(jax.random.split(jax.random.key(7), 2))])
    for shape in [(), (7,), SHAPE_3D, FACTOR]:
        ours = E._normal(R.as_key(words), shape, use_table)
        ref = jax_ref("normal", words, shape)
        assert ours.dtype == torch.float32 and tuple(ours.shape) == (4, *shape)
        assert same_bits(ours.numpy(), ref), (shape, agreement(ours, ref))


@pytest.mark.parametrize("table", [False, True, None])
def test_normal_table_argument_chooses_a_path_with_the_same_bits(table):
    rng = np.random.default_rng(13)
    words = random_words(rng, 3)
    for shape in [(5,), (11, 4)]:
        ours = R.normal(R.as_key(words), shape, table=table)
        assert same_bits(ours.numpy(), jax_ref("normal", words, shape)), (table, shape)


def test_normal_population_batch_equals_one_key_at_a_time():
    base = R.split(R.key(2024), 3)[1]
    keys = R.fold_in(R.fold_in(base, 0), torch.arange(6))                     # (6, 2), the noise key scheme
    batched = R.normal(keys, FACTOR)                                          # (6, a + b, r)
    assert batched.shape == (6, *FACTOR)
    pair_keys = jax.vmap(lambda p: jax.random.fold_in(jax.random.fold_in(
        jax.random.split(jax.random.key(2024), 3)[1], 0), p))(jnp.arange(6))
    assert same_bits(batched.numpy(), jax_ref("normal", jwords(pair_keys), FACTOR))
    for p in range(6):
        assert torch.equal(batched[p], R.normal(keys[p], FACTOR))


# ------------------------------------------------------------------------------------------- helpers
def test_ulp_distance_counts_float32_steps_across_zero():
    x = np.float32(1.5)
    up = np.nextafter(x, np.float32(2), dtype=np.float32)
    tiny = np.float32(np.finfo(np.float32).smallest_subnormal)
    d = ulp_distance(np.array([x, x, 0.0, -tiny, -0.0], np.float32),
                       np.array([x, up, -0.0, tiny, 0.0], np.float32))
    assert d.tolist() == [0, 1, 0, 2, 0]
    with pytest.raises(ValueError):
        ulp_distance(np.zeros(3, np.float32), np.zeros(4, np.float32))


@on_gpu
def test_cuda_keys_give_the_cpu_results_on_the_device():
    keys = R.fold_in(R.key(1), torch.arange(33))
    for fn, args in [(R.bits, ((5, 7),)), (R.uniform, ((5, 7),)), (R.normal, ((5, 7),)), (R.split, (3,))]:
        got = fn(keys.cuda(), *args)
        assert got.device.type == "cuda"
        assert torch.equal(got.cpu(), fn(keys, *args))
    assert torch.equal(E._normal(keys.cuda(), (9,), False).cpu(), E._normal(keys, (9,), True))
    assert torch.equal(R.fold_in(keys.cuda(), 5).cpu(), R.fold_in(keys, 5))
