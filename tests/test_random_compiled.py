"""torch_impl.random_compiled against the eager path, bit for bit: bits, uniforms and normals (both backends) over
shapes and key batches, the normal's finish over all 2^23 mantissas (the GPU's against the table measured on an
H100), sample_noise with rng=jax, the size policy and the fallback. Compiling costs tens of seconds on the first
run on a 2-core machine (inductor caches it on disk after), so the module compiles each stage once
(TORCH_IMPL_RNG_COMPILE=always for the whole module) and the eager reference runs with the mode switched to "never".
"""
from __future__ import annotations

import os
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch

from torch_impl import random as R
from torch_impl import random_eager as E
from torch_impl import random_compiled as C
from spec.config import Config
from spec.knobs import Knobs
from tests.helpers import measured_gpu_table, noise_of
from tests.marks import on_gpu
from reporting import agreement
from torch_impl.model import init_params

ENV = "TORCH_IMPL_RNG_COMPILE"


@pytest.fixture(scope="module", autouse=True)
def compiled_always():
    """Every draw of two or more values per key takes the compiled path in this module (the C generator, which
    random.py would try first on the CPU, is switched off: tests/test_random_native.py tests it)."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(ENV, "always")
        mp.setenv("TORCH_IMPL_RNG_NATIVE", "never")
        yield


def with_mode(mode: str, fn, *args):
    """fn(*args) with TORCH_IMPL_RNG_COMPILE set to mode for the call."""
    old = os.environ.get(ENV)
    os.environ[ENV] = mode
    try:
        return fn(*args)
    finally:
        os.environ[ENV] = old if old is not None else "auto"


def both(fn, *args):
    """(compiled, eager) results of the same call; the compiled one must not have fallen back."""
    got = with_mode("always", fn, *args)
    assert not C.compiled_status().failed, C.compiled_status()
    return got, with_mode("never", fn, *args)


def keys_for(n_keys: int, seed: int = 11) -> torch.Tensor:
    """n_keys keys (n_keys, 2) in the noise scheme's pattern (fold_in of a split key)."""
    return R.fold_in(R.split(R.key(seed), 3)[1], torch.arange(n_keys))


# Key batches and shapes: odd sizes, one key, one value per key, empty, a 3-d batch, > 2^15 values per key.
CASES = [
    (keys_for(5), (7,)),
    (keys_for(1)[0], (1001,)),                 # one key of shape (2,): spread over two rows
    (keys_for(3), (2,)),
    (keys_for(33), (3, 5, 7)),
    (keys_for(6).reshape(2, 3, 2), (260, 4)),  # batch dims first in the result
    (keys_for(4), (40_001,)),
    (keys_for(1), (1 << 16,)),
    (keys_for(9), (1,)),                       # one value per key: eager by design
    (keys_for(4), (0,)),
    (keys_for(0), (5,)),
]


@pytest.mark.parametrize("keys,shape", CASES)
def test_bits_compiled_equal_eager(keys, shape):
    got, ref = both(R.bits, keys, shape)
    assert got.dtype == ref.dtype == torch.int64 and got.shape == ref.shape
    assert torch.equal(got, ref)


@pytest.mark.parametrize("keys,shape", CASES)
def test_normal_compiled_equal_eager(keys, shape):
    got, ref = both(R.normal, keys, shape)
    assert got.dtype == torch.float32 and got.shape == ref.shape
    assert torch.equal(got, ref), agreement(got.numpy(), ref.numpy())


@pytest.mark.parametrize("keys,shape", CASES[:6])
@pytest.mark.parametrize("bounds", [(0.0, 1.0), (-3.7, 11.3), (0.1, 0.30000001)])
def test_uniform_compiled_equal_eager(keys, shape, bounds):
    got, ref = both(R.uniform, keys, shape, *bounds)
    assert got.dtype == torch.float32 and got.shape == ref.shape
    assert torch.equal(got, ref), agreement(got.numpy(), ref.numpy())


def test_normal_finish_exhaustive_over_all_2_23_mantissas():
    # The compiled finish (mantissa -> normal) for every word JAX's normal can depend on, against the eager
    # normal_from_mantissa (the table holds it for all 2^23 inputs; tests/test_random.py checks it against JAX).
    words = torch.arange(1 << 23, dtype=torch.int32) << 9
    got = C._compiled("normal")(words)
    result = agreement(got.numpy(), R.normal_table().numpy())
    print(f"compiled finish, all 2^23 mantissas vs eager: {result}")
    assert result.draws == 1 << 23 and result.identical_fraction == 1.0, result


def test_normal_gpu_finish_exhaustive_over_all_2_23_mantissas():
    # JAX's GPU normals (backend="gpu") through the compiled finish, against the table measured on an H100.
    words = torch.arange(1 << 23, dtype=torch.int32) << 9
    got = C._compiled("normal_gpu")(words, E._gpu_sqrt_offsets("cpu"))
    result = agreement(got.numpy(), measured_gpu_table(R.normal_table().numpy()))
    print(f"compiled GPU finish, all 2^23 mantissas vs the measured GPU table: {result}")
    assert result.draws == 1 << 23 and result.identical_fraction == 1.0, result


@pytest.mark.parametrize("keys,shape", CASES[:7])
def test_normal_gpu_compiled_equal_eager(keys, shape):
    got, ref = both(R.normal, keys, shape, None, "gpu")
    assert got.dtype == torch.float32 and got.shape == ref.shape
    assert torch.equal(got, ref), agreement(got.numpy(), ref.numpy())


def test_compiled_normal_matches_jax_random_normal():
    keys = keys_for(8, seed=5)
    ours = with_mode("always", R.normal, keys, (1040, 4))
    ref = jax.jit(jax.vmap(lambda k: jax.random.normal(k, (1040, 4))))(
        jax.random.wrap_key_data(jnp.asarray(R.to_uint32(keys))))
    assert np.array_equal(ours.numpy().view(np.uint32), np.asarray(ref).view(np.uint32))


@pytest.mark.parametrize("antithetic", ["interleaved", "halves"])
def test_sample_noise_rng_jax_compiled_equal_eager(antithetic):
    cfg = Config(pop=64, rank=4, hidden=32, layers=3, sigma=0.2, lr=0.1)
    knobs = Knobs(antithetic=antithetic)
    from torch_impl.keys import GENERATORS
    params = init_params(cfg.sizes, knobs.init, GENERATORS["jax"], 3)
    got, ref = both(noise_of, params, cfg, knobs, 3, 2, 0.2)
    for part in ("A", "B", "bias"):
        a, b = getattr(got, part), getattr(ref, part)
        assert a.keys() == b.keys()
        assert all(torch.equal(a[k], b[k]) for k in a), part


def test_policy_small_draws_stay_eager_in_auto_mode():
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(ENV, "auto")
        assert not C.wanted(8, 1040, torch.device("cpu"))                     # the parity suite's sizes
        assert C.wanted(1024, 4160, torch.device("cpu"))                      # pop 2048's factor draw
        assert not C.wanted(1 << 20, 1, torch.device("cpu"))                  # one value per key
        mp.setenv(ENV, "never")
        assert not C.wanted(1024, 4160, torch.device("cpu"))
        mp.setenv(ENV, "always")
        assert C.wanted(2, 2, torch.device("cpu")) and not C.wanted(2, 2, torch.device("meta"))
    assert "mode always" in str(C.compiled_status())


def test_compile_failure_falls_back_to_eager_with_one_warning(monkeypatch):
    def broken(kind):
        raise RuntimeError("no C++ compiler\nmore detail")

    monkeypatch.setattr(C, "_compiled", broken)
    monkeypatch.setattr(C, "_first_call_seconds", {})
    monkeypatch.setattr(C, "_failures", {})
    keys = keys_for(3)
    with pytest.warns(RuntimeWarning, match="eager path .RuntimeError: no C.. compiler"):
        got = R.normal(keys, (9,))
    with warnings.catch_warnings():
        warnings.simplefilter("error")                                      # said once only
        again = R.normal(keys, (9,))
    ref = with_mode("never", R.normal, keys, (9,))
    assert torch.equal(got, ref) and torch.equal(again, ref)
    status = C.compiled_status()
    assert status.failed == {"normal/cpu": "RuntimeError: no C++ compiler"} and not status.compiled
    assert "eager fallback" in str(status)


def test_a_wrong_compiled_result_is_caught_by_the_self_check(monkeypatch):
    monkeypatch.setattr(C, "_first_call_seconds", {})
    monkeypatch.setattr(C, "_failures", {})
    real = C._run
    monkeypatch.setattr(C, "_run", lambda kind, keys, n, extra: real(kind, keys, n, extra) + 1)
    with pytest.warns(RuntimeWarning, match="differs from the eager path"):
        got = R.bits(keys_for(3), (11,))
    assert torch.equal(got, with_mode("never", R.bits, keys_for(3), (11,)))


@on_gpu
def test_cuda_compiled_equal_cpu_eager(monkeypatch):
    monkeypatch.setenv("TORCH_IMPL_RNG_TRITON", "never")            # the compiled path, not the fused Triton kernel
    for keys, shape in CASES[:7]:
        for fn, args in [(R.bits, ()), (R.normal, ()), (R.normal, (None, "gpu")), (R.uniform, (-3.7, 11.3))]:
            got = with_mode("always", fn, keys.cuda(), shape, *args)
            assert got.device.type == "cuda"
            assert torch.equal(got.cpu(), with_mode("never", fn, keys, shape, *args)), (fn.__name__, shape)
    assert not C.compiled_status().failed, C.compiled_status()
    words = torch.arange(1 << 23, dtype=torch.int32, device="cuda") << 9
    result = agreement(C._compiled("normal")(words).cpu().numpy(), R.normal_table().numpy())
    print(f"compiled finish on CUDA, all 2^23 mantissas vs CPU eager: {result}")
    assert result.identical_fraction == 1.0, result
    got = C._compiled("normal_gpu")(words, E._gpu_sqrt_offsets(str(words.device)))
    result = agreement(got.cpu().numpy(), measured_gpu_table(R.normal_table().numpy()))
    print(f"compiled GPU finish on CUDA, all 2^23 mantissas vs the measured GPU table: {result}")
    assert result.identical_fraction == 1.0, result
