"""JAX's normals, bits and fold_in's hash through the project's C generator (c_rng): threefry and XLA's float32
normal (as JAX's CPU or its GPU backend computes it) in one pass.

Each block of counters is hashed and turned into normals while it sits in L1, so the bits never go through
memory, and the normal's float32 steps run vectorised (c_rng/jax_normal.c). Bit-identical to torch_impl.random_eager,
the definition: all 2^23 normals of each backend are compared in tests/test_random_native.py, and every process
checks a sample of draws and the extreme mantissas of both backends against the eager formula before its first C
draw, staying on the torch paths if they differ. No compiler, a failed build or env TORCH_IMPL_RNG_NATIVE=never:
`wanted` says no and torch_impl.random keeps its torch paths (compiled, table, eager). CPU tensors only; the call
runs on torch.get_num_threads() threads.
"""
from __future__ import annotations

import functools
import os
import warnings
from typing import NamedTuple

import torch

import c_rng
from spec.jax_rng import BACKENDS, check_backend
from torch_impl import random_eager as E

__all__ = ["normal", "bits", "hash_pairs", "wanted", "native_status", "NativeStatus"]

ENV = c_rng.SWITCH                           # auto (default: use the C generator when it loads) | never
_SAMPLE_DRAWS, _EDGE = 1 << 16, 256          # the load-time check: draws from fresh keys, mantissas at each end


class NativeStatus(NamedTuple):
    """Whether draws go through the C generator, and why not when they do not."""

    active: bool
    detail: str                              # the library's file name, or the reason it is not used

    def __str__(self) -> str:
        return f"C generator ({self.detail})" if self.active else f"no C generator: {self.detail}"


def _check_sample(lib) -> str | None:
    """None when the library agrees with the eager definition, else what differs: for each backend, _SAMPLE_DRAWS
    normals drawn from fresh keys (the hash and both of erf_inv's branches) and the _EDGE lowest and highest mantissas
    (the far tails)."""
    keys = E.fold_in(E.key(0), torch.arange(16))                             # (16, 2)
    n = _SAMPLE_DRAWS // 16
    for code, backend in enumerate(BACKENDS):
        got = torch.empty(16, n, dtype=torch.float32)
        lib.jr_normal(keys.data_ptr(), 16, n, got.data_ptr(), 1, code)
        want = E._normal(keys, (n,), False, backend)
        differ = int((got.view(torch.int32) != want.view(torch.int32)).sum())
        if differ:
            return f"{differ} of {got.numel()} sampled {backend} draws differ from the eager formula"
        for start in (0, E._N_MANTISSAS - _EDGE):
            edge = torch.empty(_EDGE, dtype=torch.float32)
            lib.jr_normal_of_mantissas(start, _EDGE, edge.data_ptr(), code)
            want = E.normal_from_mantissa(torch.arange(start, start + _EDGE), backend)
            if not torch.equal(edge.view(torch.int32), want.view(torch.int32)):
                return f"the {backend} normals of mantissas {start}..{start + _EDGE - 1} differ from the eager formula"
    words = [torch.randint(-2 ** 31, 2 ** 31, (_EDGE,), dtype=torch.int32, generator=torch.Generator().manual_seed(i))
             for i in range(4)]
    if not torch.equal(_hash_pairs_with(lib, *words), E._hash_pairs(*words)):
        return "threefry of sampled counter pairs (fold_in's hash) differs from the eager formula"
    return None


@functools.lru_cache(maxsize=1)
def _library():
    """(the loaded library or None, NativeStatus), decided once per process."""
    try:
        lib = c_rng.load()
    except c_rng.CUnavailable as exc:
        return None, NativeStatus(False, str(exc))
    problem = _check_sample(lib)
    if problem is not None:
        warnings.warn(f"torch_impl.random: the C generator is not used: {problem}", RuntimeWarning, stacklevel=3)
        return None, NativeStatus(False, problem)
    return lib, NativeStatus(True, os.path.basename(lib._name))


def native_status() -> NativeStatus:
    """Whether this process's CPU draws run the C generator (loads and checks it on first call)."""
    if c_rng.switch() == "never":
        return NativeStatus(False, f"{ENV}=never")
    return _library()[1]


def wanted(keys: torch.Tensor) -> bool:
    """True when these keys' draws go through the C generator: CPU keys, the library loaded and checked."""
    return keys.device.type == "cpu" and c_rng.switch() != "never" and _library()[0] is not None


def _draw(fn_name: str, keys: torch.Tensor, n: int, dtype: torch.dtype, *extra: int) -> torch.Tensor:
    """(B, n) draws for keys (B, 2) int64 words (checked by the caller) through the library's fn_name."""
    lib = _library()[0]
    keys = keys.to(torch.int64).contiguous()
    out = torch.empty(keys.shape[0], n, dtype=dtype)
    getattr(lib, fn_name)(keys.data_ptr(), keys.shape[0], n, out.data_ptr(), torch.get_num_threads(), *extra)
    return out


def normal(keys: torch.Tensor, n: int, backend: str = "cpu") -> torch.Tensor:
    """(B, n) float32: jax.random.normal(key_b, (n,)) on JAX's `backend` ("cpu" or "gpu") for each key of (B, 2)."""
    return _draw("jr_normal", keys, n, torch.float32, BACKENDS.index(check_backend(backend)))


def _hash_pairs_with(lib, k0: torch.Tensor, k1: torch.Tensor, x0: torch.Tensor, x1: torch.Tensor) -> torch.Tensor:
    """(N, 2) int32 output words of threefry(k0, k1; x0, x1), all (N,) int32 CPU tensors, through lib."""
    k0, k1, x0, x1 = (t.to(torch.int32).contiguous() for t in (k0, k1, x0, x1))
    out = torch.empty(k0.shape[0], 2, dtype=torch.int32)
    lib.jr_hash_pairs(k0.data_ptr(), k1.data_ptr(), x0.data_ptr(), x1.data_ptr(), k0.shape[0], out.data_ptr())
    return out


def hash_pairs(k0: torch.Tensor, k1: torch.Tensor, x0: torch.Tensor, x1: torch.Tensor) -> torch.Tensor:
    """random_eager._hash_pairs through the C generator: one counter pair per key, (N, 2) int32 words. The eager
    hash is about a hundred torch ops per call, which dominate a fold_in of a few keys (each epoch's member keys)."""
    return _hash_pairs_with(_library()[0], k0, k1, x0, x1)


def bits(keys: torch.Tensor, n: int) -> torch.Tensor:
    """(B, n) int64 words in [0, 2^32): jax.random.bits(key_b, (n,)) for each of the keys (B, 2)."""
    return _draw("jr_bits", keys, n, torch.int32).to(torch.int64) & 0xFFFFFFFF
