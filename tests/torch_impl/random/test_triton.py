"""The triton backend (torch_impl.random.triton_kernel): threefry and JAX's normal in one launch, its steps traced from
spec.jax_rng. On a CPU it runs in Triton's interpreter (TRITON_INTERPRET=1) and must give the eager definition's bits
on a spread of mantissas (both tails, the erf_inv and log1p branch edges, random ones) and on whole draws; on a GPU
(`python -m bench.gpu_check`) all 2^23 mantissas and the routed draws are checked."""
from __future__ import annotations

import importlib.util

import pytest
import torch

from spec import jax_rng as J
from tests.marks import on_gpu
from torch_impl import random as R
from torch_impl.random import backends as B
from torch_impl.random import eager as E
from torch_impl.random import triton_kernel as T

pytestmark = pytest.mark.skipif(importlib.util.find_spec("triton") is None,
                                reason="triton is not installed (the test extra pins it: pip install -e '.[test]')")
_M = 1 << 23


@pytest.fixture
def interpreted(monkeypatch):
    """Triton's CPU interpreter for the kernels made in this test (a kernel is made at its first use)."""
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    T._kernel.cache_clear()
    T._consts.cache_clear()
    yield
    T._kernel.cache_clear()
    T._consts.cache_clear()


def _spread(seed: int) -> torch.Tensor:
    """Mantissas where the normal's branches meet: both tails (erf_inv's second polynomial), around w = 5 and around
    log1p's small-argument switch (found from the eager path's own w), and random ones."""
    gen = torch.Generator().manual_seed(seed)
    ends = torch.cat([torch.arange(0, 2048), torch.arange(_M - 2048, _M)])
    u = J.u_of_mantissa(torch.arange(0, _M, 97, dtype=torch.float64))
    w = -torch.log1p(-u * u)
    edges = torch.arange(0, _M, 97)[((w - 5.0).abs() < 0.02) | ((u * u - J.LOG1P_SMALL).abs() < 2e-3)]
    return torch.cat([ends, edges, torch.randint(0, _M, (8192,), generator=gen)]).unique()


def test_the_kernel_is_traced_from_spec_jax_rng(monkeypatch):
    source, consts = T.kernel_source("cpu")
    assert set(J.ERFINV_SMALL + J.ERFINV_LARGE + J.LOG_P + J.LOG1P_NUM) <= set(consts)
    assert f"{J.PARITY32}" in source and "x1 << 13" in source
    monkeypatch.setattr(J, "ERFINV_SMALL", (1.5,) + J.ERFINV_SMALL[1:])       # a changed step changes the kernel
    assert 1.5 in T.kernel_source("cpu")[1]


@pytest.mark.parametrize("seed", [0, 1])
def test_the_normal_of_every_spread_mantissa_equals_the_eager_definition(seed, interpreted):
    m = _spread(seed)
    got = T.launch("normal_of_words", torch.zeros(1, 2, dtype=torch.int64), 0, counters=m << 9)
    want = R.normal_from_mantissa(m)
    assert torch.equal(got.view(torch.int32), want.view(torch.int32))


def test_a_wrong_step_is_caught(interpreted, monkeypatch):
    """The comparison's power: the same kernel with its sqrt off by one part in 10^7 (the tails use it) differs."""
    real = T._ops
    m = _spread(2)
    monkeypatch.setattr(T, "_ops", lambda code: real(code)._replace(
        sqrt=lambda x: code.emit(f"tl.sqrt({x.name} * 1.0000001)")))
    got = T.launch("normal_of_words", torch.zeros(1, 2, dtype=torch.int64), 0, counters=m << 9)
    assert not torch.equal(got, R.normal_from_mantissa(m))


@pytest.mark.parametrize("n_keys,n", [(1, 1), (3, 7), (5, 4099)])
def test_bits_and_normals_of_keys_equal_the_eager_draws(n_keys, n, interpreted):
    keys = R.fold_in(R.key(n * 31 + n_keys), torch.arange(n_keys))
    words = T.launch("bits", keys, n)
    assert torch.equal(words, E._draw(keys, (n,), torch.int32, E._xor_into))
    assert torch.equal(T.launch("normal", keys, n), E._normal(keys, (n,), False))


@pytest.mark.parametrize("seed", [3, 2 ** 32 - 1])
def test_the_int8_table_entries_equal_the_eager_hash_and_look_up(seed, interpreted):
    from torch_impl.int8.noise import normal_lut, table_bits

    gen = torch.Generator().manual_seed(seed % 1000)
    counters = torch.randint(0, 1 << 30, (40, 9), generator=gen)
    lut = normal_lut()
    got = T.launch("lut_at", R.key(seed), 0, counters=counters, lut=lut)
    want = lut[(table_bits(seed, counters).to(torch.int64) & 0xFFFFFFFF) >> 9]
    assert got.dtype == torch.int8 and torch.equal(got, want)


def test_the_gpu_backend_follows_spec_when_it_states_one(interpreted):
    m = _spread(4)
    got = T.launch("normal_of_words", torch.zeros(1, 2, dtype=torch.int64), 0, backend="gpu", counters=m << 9)
    assert torch.equal(got.view(torch.int32), R.normal_from_mantissa(m, "gpu").view(torch.int32))


def test_the_switch_turns_the_kernel_off(monkeypatch):
    monkeypatch.setenv(R.SWITCH, "formula")
    assert T.unavailable_reason() is None                                  # installed here, and still not picked
    assert B._declines(B._BY_NAME["triton"], B.switch(), "normal", torch.device("cuda"), 8, 8, None, "cpu") == \
        "TORCH_IMPL_RNG=formula"


def test_cpu_keys_never_take_the_kernel():
    keys = R.fold_in(R.key(0), torch.arange(2))
    assert B.choose("normal", keys.device, 16).name != "triton"
    assert R.member_normals(keys, 0, 2, 16, "cpu") is None
    assert R.lut_at(R.key(0), torch.arange(4), torch.zeros(8, dtype=torch.int8)) is None


@on_gpu
def test_on_the_gpu_all_mantissas_and_routed_draws_equal_the_definition():
    from torch_impl.keys import _jax_draws
    from torch_impl.tree.keys import jax_member_normals
    m = torch.arange(_M)
    got = T.launch("normal_of_words", torch.zeros(1, 2, dtype=torch.int64, device="cuda"), 0,
                   counters=(m << 9).cuda()).cpu()
    assert torch.equal(got.view(torch.int32), R.normal_table().view(torch.int32))
    keys = R.fold_in(R.key(9), torch.arange(300))
    assert torch.equal(R.normal(keys.cuda(), (4, 257)).cpu(), R.normal(keys, (4, 257)))
    assert torch.equal(R.bits(keys.cuda(), (1000,)).cpu(), R.bits(keys, (1000,)))
    slices = R.fold_in(R.key(4), torch.arange(6)).view(2, 3, 2)                  # the LM's and CartPole's draws
    assert torch.equal(jax_member_normals(slices, 3, 64, (40, 4), "cuda").cpu(),
                       jax_member_normals(slices, 3, 64, (40, 4)))
    assert torch.equal(_jax_draws(slices[0, 0], 0, 1024, (516, 4), "cuda").cpu(),
                       _jax_draws(slices[0, 0], 0, 1024, (516, 4), "cpu"))
    used = {k: R.status().checks.get(f"triton {k}/cpu/cuda", "unused") for k in ("normal", "bits", "member_normal")}
    assert all(why is None for why in used.values()), used


@pytest.mark.parametrize("slices,draws,n,generation", [(1, 4, 263, 0), (6, 9, 13, 5), (2, 3, 1, 2 ** 32 - 1)])
def test_member_normals_fold_the_keys_in_the_kernel_as_the_eager_draws_do(slices, draws, n, generation, interpreted):
    keys = R.fold_in(R.key(slices * 100 + n), torch.arange(slices))
    got = T.launch("member_normal", keys, n, generation=generation, n_draws=draws)
    folded = R.fold_in(R.fold_in(keys, generation).unsqueeze(0), torch.arange(draws).unsqueeze(1))   # (P, S, 2)
    assert got.shape == (draws, slices, n) and torch.equal(got, E._normal(folded, (n,), False))


@pytest.mark.parametrize("kind,backend", [("bits", "cpu"), ("normal", "cpu"), ("normal", "gpu"), ("member_normal", "cpu")])
def test_the_backends_self_check_passes_the_kernel_and_catches_a_wrong_one(kind, backend, interpreted, monkeypatch):
    """backends._self_check on the triton row (run here on CPU tensors by the interpreter): passed as it is, and a
    kernel whose draws are one off fails it (a smaller sample than a GPU's: the interpreter is slow)."""
    monkeypatch.setattr(B, "_SAMPLE_KEYS", 3)
    monkeypatch.setattr(B, "_SAMPLE_SIZES", (1030, 2))                          # a partial block, and two values
    triton = B._BY_NAME["triton"]
    assert B._self_check(triton, kind, backend, torch.device("cpu")) is None
    wrong = triton._replace(draw=lambda *a, **k: triton.draw(*a, **k) + 1)
    assert "differ from the eager formula" in B._self_check(wrong, kind, backend, torch.device("cpu"))
