"""JAX-compatible random numbers in torch, the public API: keys, bits, uniforms and normals equal to jax.random's,
bit for bit.

A key is an int64 tensor of shape (2,) holding the two uint32 words of `jax.random.key_data(jax.random.key(seed))`;
every function also takes a batch of keys (..., 2) and puts the batch dims first in its result. The definition is
random_eager's plain torch (its docstring states the conventions and what was checked against JAX). Here each draw
goes to the fastest path that takes it, every one bit-identical to the definition: on the CPU the project's C
generator when it is built (random_native, tests/test_random_native.py), on CUDA one fused Triton kernel when Triton
is installed (triton_rng, tests/test_triton_rng.py); otherwise random_compiled runs the same arithmetic
torch.compile'd for large draws (tests/test_random_compiled.py) and falls back to the eager code when it cannot
compile. No jax import anywhere.
"""
from __future__ import annotations

import math

import torch

from spec import jax_rng as J
from torch_impl import random_compiled, random_native, triton_rng
from torch_impl import random_eager as E
from torch_impl.random_eager import as_key, key, normal_from_mantissa, normal_table, split, to_uint32

__all__ = ["key", "fold_in", "split", "bits", "uniform", "normal", "as_key", "to_uint32", "normal_from_mantissa",
           "normal_table"]


def _native_draw(kind: str, keys: torch.Tensor, shape, *extra) -> torch.Tensor | None:
    """The project's own kernels' draws (*batch, *shape): the C generator for CPU keys (random_native, library loaded),
    the fused Triton kernel for CUDA keys (triton_rng); None when neither takes these keys. extra: the normal's
    backend."""
    k0, _ = E._key_words(keys)
    if keys.device.type == "cuda":
        return _triton_draw(kind, keys, shape, *extra)
    if not random_native.wanted(keys):
        return None
    shape = E._shape_tuple(shape)
    out = getattr(random_native, kind)(keys.reshape(-1, 2), math.prod(shape), *extra)     # (B, n)
    return out.reshape(tuple(k0.shape) + shape)


def _triton_draw(kind: str, keys: torch.Tensor, shape, *extra) -> torch.Tensor | None:
    """The fused Triton kernel's draws (*batch, *shape) for CUDA keys (torch_impl.triton_rng), else None; extra: the
    normal's backend."""
    k0, _ = E._key_words(keys)
    shape = E._shape_tuple(shape)
    out = triton_rng.draw(kind, keys.reshape(-1, 2), math.prod(shape), *extra)  # (B, n) or None
    return None if out is None else out.reshape(tuple(k0.shape) + shape)


def _compiled_draw(kind: str, keys: torch.Tensor, shape, extra: tuple = (),
                   backend: str = "cpu") -> torch.Tensor | None:
    """The compiled kernel's draws (*batch, *shape) when random_compiled takes this request, else None (backend: the
    normal's)."""
    k0, _ = E._key_words(keys)
    shape = E._shape_tuple(shape)
    n = math.prod(shape)
    if not random_compiled.wanted(k0.numel(), n, keys.device):
        return None
    out = random_compiled.draw(kind, keys, n, extra, backend)             # (B, n) or None
    return None if out is None else out.reshape(tuple(k0.shape) + shape)


def fold_in(keys: torch.Tensor, data) -> torch.Tensor:
    """random_eager.fold_in (jax.random.fold_in), its hash through the C generator for CPU keys when it is built."""
    if isinstance(keys, torch.Tensor) and random_native.wanted(keys):          # E.fold_in refuses any other keys
        return E.fold_in(keys, data, random_native.hash_pairs)
    return E.fold_in(keys, data)


def bits(keys: torch.Tensor, shape=()) -> torch.Tensor:
    """Random 32-bit words (*batch, *shape) as int64 holding uint32 values, as jax.random.bits (uint32).

    Element j (row-major) is y0 ^ y1 of threefry(key; hi32(j), lo32(j)). Compare with numpy via to_uint32.
    CPU keys go through the C generator when it is built (random_native); otherwise large requests run the
    compiled kernel (random_compiled). Every path gives the same words.
    """
    drawn = _native_draw("bits", keys, shape)
    if drawn is None:
        drawn = _compiled_draw("bits", keys, shape)
    return drawn if drawn is not None else E.bits(keys, shape)


def uniform(keys: torch.Tensor, shape=(), minval: float = 0.0, maxval: float = 1.0) -> torch.Tensor:
    """float32 uniforms in [minval, maxval) (*batch, *shape), as jax.random.uniform:
    max(lo, fma(f, hi - lo, lo)) with f = bitcast((bits >> 9) | 0x3F800000) - 1 and lo, hi in float32."""
    lo, span = E.float32_bounds(minval, maxval)
    drawn = _compiled_draw("uniform", keys, shape, (lo, span))
    return drawn if drawn is not None else E._uniform_eager(keys, shape, lo, span)


def normal(keys: torch.Tensor, shape=(), table: bool | None = None, backend: str = "cpu") -> torch.Tensor:
    """Standard normals (*batch, *shape) float32, equal to jax.random.normal(key, shape) on JAX's `backend`: "cpu"
    (XLA's CPU code) or "gpu" (XLA's CUDA code on an NVIDIA GPU: the same draws, 4.7% of the normals 1-3 ULP apart).

    CPU keys go through the project's C generator when it is built (random_native: the hash and this formula in
    one vectorised pass). Otherwise requests of random_compiled.MIN_DRAWS values or more run compiled (threefry,
    then this formula, as two torch.compile'd kernels); otherwise large requests (or any, once the table exists) read
    the table of all 2^23 values (built once, 32 MB per device) and small ones evaluate the formula directly. All
    paths give identical bits. table=True reads the table whatever the request's size (a caller that draws every
    epoch, such as the tree ES, pays its one-off build once and saves the formula's cost on every later call); None
    decides by size as above.
    """
    backend = J.check_backend(backend)
    drawn = _native_draw("normal", keys, shape, backend)
    if drawn is None:
        drawn = _compiled_draw("normal", keys, shape, (), backend)
    return drawn if drawn is not None else E.normal(keys, shape, table, backend)
