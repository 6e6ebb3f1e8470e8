"""JAX's default generator in C (jax_normal.c): threefry2x32 bits and jax.random.normal's float32 normals (as JAX's
CPU or its GPU backend computes them).

The project's own C11 code, built by `make setup` (`python -m c_rng.build`) with the system C compiler into
build/c_rng/; `load()` builds it on first use when the library is missing or stale and raises CUnavailable (with
the reason) when there is no compiler or the build fails, so torch_impl.random keeps its torch paths. The calls
take raw addresses (ctypes), so this package needs neither numpy nor torch: torch_impl.random.native wraps them,
and torch_impl.random.backends (env TORCH_IMPL_RNG) decides which draws use them.
"""
from __future__ import annotations

import ctypes

import cbuild

__all__ = ["CUnavailable", "load", "unavailable_reason"]

_P, _I64, _INT = ctypes.c_void_p, ctypes.c_int64, ctypes.c_int
# name -> (restype, argtypes)
_SIGNATURES = {
    "jr_normal": (None, [_P, _I64, _I64, _P, _INT, _INT]),  # keys (B, 2) int64, B, n, out (B, n) float32, threads,
                                                            # backend (0: JAX's CPU normals, 1: its GPU normals)
    "jr_bits": (None, [_P, _I64, _I64, _P, _INT]),          # keys (B, 2) int64, B, n, out (B, n) uint32, threads
    "jr_normal_of_mantissas": (None, [_I64, _I64, _P, _INT]),   # start, count, out (count,) float32, backend
    "jr_hash_pairs": (None, [_P, _P, _P, _P, _I64, _P]),     # k0, k1, x0, x1 (n,) uint32, n, out (n, 2) uint32
}


class CUnavailable(RuntimeError):
    """The C generator cannot be had here (no compiler, or the build failed): the message says why."""


# load(cc=None, lib_dir=None): the library (built first if missing or stale), CUnavailable with the reason if it
# cannot be had; unavailable_reason(cc=None, lib_dir=None): None when it loads, else why not (a skip message)
load, unavailable_reason = cbuild.loader("c_rng.build", _SIGNATURES, "C generator", CUnavailable)
