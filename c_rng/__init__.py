"""JAX's default generator in C (jax_normal.c): threefry2x32 bits and jax.random.normal's float32 normals.

The project's own C11 code, built by `make setup` (`python -m c_rng.build`) with the system C compiler into
build/c_rng/; `load()` builds it on first use when the library is missing or stale and raises CUnavailable (with
the reason) when there is no compiler or the build fails, so torch_impl.random keeps its torch paths. The calls
take raw addresses (ctypes), so this package needs neither numpy nor torch: torch_impl.random_native wraps them.
"""
from __future__ import annotations

import ctypes
from pathlib import Path

__all__ = ["CUnavailable", "load", "unavailable_reason"]

_P, _I64, _INT = ctypes.c_void_p, ctypes.c_int64, ctypes.c_int
# name -> (restype, argtypes)
_SIGNATURES = {
    "jr_normal": (None, [_P, _I64, _I64, _P, _INT]),        # keys (B, 2) int64, B, n, out (B, n) float32, threads
    "jr_bits": (None, [_P, _I64, _I64, _P, _INT]),          # keys (B, 2) int64, B, n, out (B, n) uint32, threads
    "jr_normal_of_mantissas": (None, [_I64, _I64, _P]),     # start, count, out (count,) float32
}
_LIB: dict[str, ctypes.CDLL] = {}


class CUnavailable(RuntimeError):
    """The C generator cannot be had here (no compiler, or the build failed): the message says why."""


def load(cc: str | None = None, lib_dir: Path | None = None) -> ctypes.CDLL:
    """The C library (built first if missing or stale); CUnavailable with the reason if it cannot be had."""
    # imported here so that `python -m c_rng.build` runs a module the package has not imported yet
    from c_rng.build import LIB_DIR, BuildError, NoCompiler, build
    lib_dir = LIB_DIR if lib_dir is None else Path(lib_dir)
    key = str(lib_dir)
    if key in _LIB:
        return _LIB[key]
    try:
        path = build(cc, lib_dir=lib_dir)
    except NoCompiler as exc:
        raise CUnavailable(f"C generator skipped: {exc}") from exc
    except BuildError as exc:
        raise CUnavailable(f"C generator not built: {exc}") from exc
    lib = ctypes.CDLL(str(path))
    for name, (restype, argtypes) in _SIGNATURES.items():
        fn = getattr(lib, name)
        fn.restype, fn.argtypes = restype, argtypes
    _LIB[key] = lib
    return lib


def unavailable_reason(cc: str | None = None, lib_dir: Path | None = None) -> str | None:
    """None when the C generator loads, else why not (for a skip message)."""
    try:
        load(cc, lib_dir)
    except CUnavailable as exc:
        return str(exc)
    return None
