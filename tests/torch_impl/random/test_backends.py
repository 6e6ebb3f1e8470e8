"""torch_impl.random's backends against the formula (eager.py), bit for bit: bits, uniforms and normals (both
normal backends) over shapes and key batches on every CPU backend the switch can name, jax.random itself,
sample_noise with rng=jax, the selection rule, the status, and the first-use self-check's fallback; on CUDA the
table and the formula against the CPU (the Triton backend: tests/torch_impl/random/test_triton.py; the C one over all 2^23
mantissas: tests/torch_impl/random/test_native.py)."""
from __future__ import annotations

import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch

from reporting import agreement
from spec.config import Config
from spec.knobs import Knobs
from tests.helpers import measured_gpu_table, noise_of
from tests.marks import on_gpu
from torch_impl import random as R
from torch_impl.model import init_params
from torch_impl.random import backends as B
from torch_impl.random import native

HAS_C = native.unavailable_reason() is None


def with_switch(value: str, fn, *args):
    """fn(*args) with env TORCH_IMPL_RNG set to value for the call."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(R.SWITCH, value)
        return fn(*args)


def both(rng: str, fn, *args):
    """(the switch at rng, the formula's) results of the same call; no backend's self-check may have failed."""
    got = with_switch(rng, fn, *args)
    assert not [tag for tag, why in R.status().checks.items() if why is not None], R.status()
    return got, with_switch("formula", fn, *args)


def keys_for(n_keys: int, seed: int = 11) -> torch.Tensor:
    """n_keys keys (n_keys, 2) in the noise scheme's pattern (fold_in of a split key)."""
    return R.fold_in(R.split(R.key(seed), 3)[1], torch.arange(n_keys))


# Key batches and shapes: odd sizes, one key, one value per key, empty, a 3-d batch, > 2^15 values per key.
CASES = [
    (keys_for(5), (7,)),
    (keys_for(1)[0], (1001,)),                 # one key of shape (2,)
    (keys_for(3), (2,)),
    (keys_for(33), (3, 5, 7)),
    (keys_for(6).reshape(2, 3, 2), (260, 4)),  # batch dims first in the result
    (keys_for(4), (40_001,)),
    (keys_for(1), (1 << 16,)),
    (keys_for(9), (1,)),                       # one value per key
    (keys_for(4), (0,)),
    (keys_for(0), (5,)),
]
BITS = ["auto", "c"]                           # the backends that draw bits on a CPU (and the formula, the reference)
NORMALS = ["auto", "c", "table"]               # ... and normals


@pytest.mark.parametrize("rng", BITS)
@pytest.mark.parametrize("keys,shape", CASES)
def test_bits_of_each_backend_equal_the_formula(keys, shape, rng):
    got, ref = both(rng, R.bits, keys, shape)
    assert got.dtype == ref.dtype == torch.int64 and got.shape == ref.shape
    assert torch.equal(got, ref)


@pytest.mark.parametrize("rng", NORMALS)
@pytest.mark.parametrize("keys,shape", CASES)
def test_normal_of_each_backend_equal_the_formula(keys, shape, rng):
    got, ref = both(rng, R.normal, keys, shape)
    assert got.dtype == torch.float32 and got.shape == ref.shape
    assert torch.equal(got, ref), agreement(got.numpy(), ref.numpy())


@pytest.mark.parametrize("rng", BITS)
@pytest.mark.parametrize("keys,shape", CASES[:6])
@pytest.mark.parametrize("bounds", [(0.0, 1.0), (-3.7, 11.3), (0.1, 0.30000001)])
def test_uniform_of_each_backend_equal_the_formula(keys, shape, bounds, rng):
    got, ref = both(rng, R.uniform, keys, shape, *bounds)
    assert got.dtype == torch.float32 and got.shape == ref.shape
    assert torch.equal(got, ref), agreement(got.numpy(), ref.numpy())


@pytest.mark.parametrize("rng", NORMALS)
@pytest.mark.parametrize("keys,shape", CASES[:7])
def test_normal_gpu_of_each_backend_equal_the_formula(keys, shape, rng):
    got, ref = both(rng, R.normal, keys, shape, None, "gpu")
    assert got.dtype == torch.float32 and got.shape == ref.shape
    assert torch.equal(got, ref), agreement(got.numpy(), ref.numpy())


@pytest.mark.parametrize("rng", NORMALS + ["formula"])
def test_each_backends_normal_matches_jax_random_normal(rng):
    keys = keys_for(8, seed=5)
    ours = with_switch(rng, R.normal, keys, (1040, 4))
    ref = jax.jit(jax.vmap(lambda k: jax.random.normal(k, (1040, 4))))(
        jax.random.wrap_key_data(jnp.asarray(R.to_uint32(keys))))
    assert np.array_equal(ours.numpy().view(np.uint32), np.asarray(ref).view(np.uint32))


@pytest.mark.parametrize("rng", ["c", "table"])
@pytest.mark.parametrize("antithetic", ["interleaved", "halves"])
def test_sample_noise_rng_jax_of_each_backend_equal_the_formula(antithetic, rng):
    cfg = Config(pop=64, rank=4, hidden=32, layers=3, sigma=0.2, lr=0.1)
    knobs = Knobs(antithetic=antithetic)
    from torch_impl.keys import GENERATORS
    params = init_params(cfg.sizes, knobs.init, GENERATORS["jax"], 3)
    got, ref = both(rng, noise_of, params, cfg, knobs, 3, 2, 0.2)
    for part in ("A", "B", "bias"):
        a, b = getattr(got, part), getattr(ref, part)
        assert a.keys() == b.keys()
        assert all(torch.equal(a[k], b[k]) for k in a), part


def test_the_rule_picks_the_first_backend_that_takes_the_request(monkeypatch):
    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    monkeypatch.setattr(B, "TABLE", tuple(b for b in B.TABLE if b.name != "c"))      # as without a C compiler
    monkeypatch.setattr(R.eager, "_CPU_TABLES", {})                                  # no table built yet
    monkeypatch.setenv(R.SWITCH, "auto")
    assert B.choose("normal", cpu, 1040, 8).name == "formula"                        # the parity suite's sizes
    assert B.choose("normal", cpu, 4160, 1024).name == "table"                       # pop 2048's factor draw
    assert B.choose("normal", cpu, 1040, 8, table=True).name == "table"
    assert B.choose("normal", cpu, 4160, 1024, table=False).name == "formula"
    assert B.choose("bits", cpu, 4160, 1024).name == "formula"                       # the table draws no bits
    monkeypatch.setenv(R.SWITCH, "table")
    assert B.choose("normal", cpu, 2, 2).name == "table" and B.choose("bits", cpu, 2, 2).name == "formula"
    monkeypatch.setenv(R.SWITCH, "triton")
    assert B.choose("normal", cpu, 4160, 1024).name == "formula"                     # CUDA keys only
    assert "not triton: takes cuda keys only" in str(R.status())
    monkeypatch.setenv(R.SWITCH, "formula")
    assert B.choose("normal", cuda, 4160, 1024).name == "formula"


@pytest.mark.skipif(not HAS_C, reason=native.unavailable_reason() or "")
def test_the_c_backend_draws_cpu_normals_bits_and_the_hash_when_built(monkeypatch):
    monkeypatch.setenv(R.SWITCH, "auto")
    cpu = torch.device("cpu")
    assert [B.choose(kind, cpu, 1040, 8).name for kind in ("normal", "bits", "hash")] == ["c", "c", "c"]
    assert B.choose("normal", cpu, 1 << 20, 4, table=True).name == "c"
    R.normal(keys_for(3), (9,))
    assert R.status().drew["normal/cpu"][0] == "c" and R.status().backends["c"] is None


def test_a_backend_that_fails_to_run_falls_back_to_the_formula_with_one_warning(monkeypatch):
    def broken(*args, **kwargs):
        raise RuntimeError("no C++ compiler\nmore detail")

    fake = B.TABLE[0]._replace(name="c", unavailable=lambda: None, draw=broken)
    monkeypatch.setattr(B, "TABLE", (fake,) + B.TABLE[1:])
    monkeypatch.setattr(B, "_checks", {})
    monkeypatch.setenv(R.SWITCH, "auto")
    keys = keys_for(3)
    with pytest.warns(RuntimeWarning, match="c backend is not used for normal/cpu/cpu: RuntimeError: no C.. compiler"):
        got = R.normal(keys, (9,))
    with warnings.catch_warnings():
        warnings.simplefilter("error")                                      # said once only
        again = R.normal(keys, (9,))
    status = R.status()
    assert status.checks["c normal/cpu/cpu"] == "RuntimeError: no C++ compiler"
    assert "normal/cpu: table" in str(status) or "normal/cpu: formula" in str(status)
    assert "not c: failed its self-check (RuntimeError: no C++ compiler)" in str(status)
    ref = with_switch("formula", R.normal, keys, (9,))
    assert torch.equal(got, ref) and torch.equal(again, ref)


def test_a_wrong_backend_result_is_caught_by_the_self_check(monkeypatch):
    real = B.TABLE[0].draw if HAS_C else B._formula_draw
    fake = B.TABLE[0]._replace(unavailable=lambda: None, draw=lambda *a, **k: real(*a, **k) + 1)
    monkeypatch.setattr(B, "TABLE", (fake,) + B.TABLE[1:])
    monkeypatch.setattr(B, "_checks", {})
    monkeypatch.setenv(R.SWITCH, "auto")
    with pytest.warns(RuntimeWarning, match="differ from the eager formula"):
        got = R.bits(keys_for(3), (11,))
    assert torch.equal(got, with_switch("formula", R.bits, keys_for(3), (11,)))


@on_gpu
@pytest.mark.parametrize("rng", ["table", "formula"])
def test_cuda_backends_equal_cpu_formula(rng):
    for keys, shape in CASES[:7]:
        for fn, args in [(R.bits, ()), (R.normal, ()), (R.normal, (None, "gpu")), (R.uniform, (-3.7, 11.3))]:
            got = with_switch(rng, fn, keys.cuda(), shape, *args)
            assert got.device.type == "cuda"
            assert torch.equal(got.cpu(), with_switch("formula", fn, keys, shape, *args)), (fn.__name__, shape)
    m = torch.arange(1 << 23, device="cuda")
    result = agreement(R.normal_from_mantissa(m).cpu().numpy(), R.normal_table().numpy())
    print(f"the formula on CUDA, all 2^23 mantissas vs the CPU table: {result}")
    assert result.identical_fraction == 1.0, result
    result = agreement(R.normal_table("cuda", "gpu").cpu().numpy(), measured_gpu_table(R.normal_table().numpy()))
    print(f"the GPU table on CUDA, all 2^23 mantissas vs the measured GPU table: {result}")
    assert result.identical_fraction == 1.0, result
