"""The c backend: JAX's normals, bits and fold_in's hash through the project's C generator (c_rng), threefry and XLA's
float32 normal (as JAX's CPU or its GPU backend computes it) in one pass.

Each block of counters is hashed and turned into normals while it sits in L1, so the bits never go through memory,
and the normal's float32 steps run vectorised (c_rng/jax_normal.c). Bit-identical to the formula (eager.py): all
2^23 normals of each backend are compared in tests/torch_impl/random/test_native.py, and backends.py checks a sample against
the formula before the first C draw of each kind. CPU tensors only; a call runs on torch.get_num_threads() threads.
"""
from __future__ import annotations

import functools
import os

import torch

import c_rng
from spec.jax_rng import BACKENDS, check_backend

__all__ = ["library", "unavailable_reason", "normal", "bits", "hash_pairs", "normal_of_mantissas"]


@functools.lru_cache(maxsize=1)
def library():
    """(the loaded library or None, its file name or why it cannot be had), decided once per process."""
    try:
        lib = c_rng.load()
    except c_rng.CUnavailable as exc:
        return None, str(exc)
    return lib, os.path.basename(lib._name)


def unavailable_reason() -> str | None:
    """None when the C generator is loaded in this process, else why not (no compiler, a failed build)."""
    lib, detail = library()
    return None if lib is not None else detail


def _draw(fn_name: str, keys: torch.Tensor, n: int, dtype: torch.dtype, *extra: int) -> torch.Tensor:
    """(B, n) draws for keys (B, 2) int64 words (checked by the caller) through the library's fn_name."""
    keys = keys.to(torch.int64).contiguous()
    out = torch.empty(keys.shape[0], n, dtype=dtype)
    getattr(library()[0], fn_name)(keys.data_ptr(), keys.shape[0], n, out.data_ptr(), torch.get_num_threads(), *extra)
    return out


def normal(keys: torch.Tensor, n: int, backend: str = "cpu") -> torch.Tensor:
    """(B, n) float32: jax.random.normal(key_b, (n,)) on JAX's `backend` ("cpu" or "gpu") for each key of (B, 2)."""
    return _draw("jr_normal", keys, n, torch.float32, BACKENDS.index(check_backend(backend)))


def bits(keys: torch.Tensor, n: int) -> torch.Tensor:
    """(B, n) int64 words in [0, 2^32): jax.random.bits(key_b, (n,)) for each of the keys (B, 2)."""
    return _draw("jr_bits", keys, n, torch.int32).to(torch.int64) & 0xFFFFFFFF


def normal_of_mantissas(m: torch.Tensor, backend: str = "cpu") -> torch.Tensor:
    """The float32 normals of the consecutive mantissas m (int, ascending by one) as JAX's `backend` draws them."""
    out = torch.empty(m.numel(), dtype=torch.float32)
    library()[0].jr_normal_of_mantissas(int(m[0]) if m.numel() else 0, m.numel(), out.data_ptr(),
                                        BACKENDS.index(check_backend(backend)))
    return out


def hash_pairs(k0: torch.Tensor, k1: torch.Tensor, x0: torch.Tensor, x1: torch.Tensor) -> torch.Tensor:
    """eager._hash_pairs through the C generator: threefry(k0, k1; x0, x1), one counter pair per key, all (N,) int32
    -> (N, 2) int32 words. The eager hash is about a hundred torch ops per call, which dominate a fold_in of a few
    keys (each epoch's member keys)."""
    k0, k1, x0, x1 = (t.to(torch.int32).contiguous() for t in (k0, k1, x0, x1))
    out = torch.empty(k0.shape[0], 2, dtype=torch.int32)
    library()[0].jr_hash_pairs(k0.data_ptr(), k1.data_ptr(), x0.data_ptr(), x1.data_ptr(), k0.shape[0], out.data_ptr())
    return out
