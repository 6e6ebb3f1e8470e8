"""JAX's default generator in numpy (threefry2x32, jax_threefry_partitionable=True): keys, uniforms and normals.

What DESIGN.md's "Float32 facts" state, without torch or JAX: key(seed) is the words (0, seed mod 2^32);
fold_in(k, d) = threefry(k; 0, d); split(k, n)[j] = threefry(k; hi32(j), lo32(j)); element j of a draw is
y0 ^ y1 of threefry(k; hi32(j), lo32(j)). A uniform is bitcast((bits >> 9) | 0x3F800000) - 1; a normal is
sqrt(2) erf_inv(2f - 1 + 2^-24) evaluated as XLA's CPU code does (Giles' polynomial with fused multiply-adds,
XLA's log and log1p), or with backend="gpu" as its CUDA code does (spec.jax_rng.normal_of_u_gpu), each float32
step emulated exactly in float64 (spec.numpy_normal, the numpy normal jax_reference shares). A replay draws the
reference's noise with it and checks each draw against the digest the bundle recorded;
tests/parity/mlp/test_numpy_reference.py checks it against jax.random bit for bit, and tests/torch_impl/random/test_gpu_normals.py
against JAX's measured GPU table.
"""
from __future__ import annotations

import math

import numpy as np

from spec import jax_rng as J
from spec.numpy_normal import normal_of_mantissa

U32 = np.uint32
PARITY = U32(J.PARITY32)                       # threefry's key-schedule constant


def threefry(k0, k1, x0, x1) -> tuple[np.ndarray, np.ndarray]:
    """threefry2x32 (20 rounds, 5 key injections) of counters (x0, x1) under keys (k0, k1), all broadcast uint32."""
    k0, k1, x0, x1 = (np.asarray(v, dtype=U32) for v in (k0, k1, x0, x1))
    shape = np.broadcast_shapes(*(np.shape(v) for v in (k0, k1, x0, x1)))
    k0, k1, x0, x1 = (np.atleast_1d(v) for v in np.broadcast_arrays(k0, k1, x0, x1))
    ks = (k0, k1, k0 ^ k1 ^ PARITY)
    with np.errstate(over="ignore"):          # uint32 arithmetic wraps mod 2^32, as threefry's does
        x0, x1 = x0 + ks[0], x1 + ks[1]
        for i in range(5):
            for r in J.ROTATIONS[i % 2]:
                x0 = x0 + x1
                x1 = ((x1 << U32(r)) | (x1 >> U32(32 - r))) ^ x0
            x0 = x0 + ks[(i + 1) % 3]
            x1 = x1 + ks[(i + 2) % 3] + U32(i + 1)
    return x0.reshape(shape), x1.reshape(shape)


def key(seed: int) -> np.ndarray:
    """(2,) uint32: the words (0, seed mod 2^32), as jax.random.key without x64."""
    return np.array([0, int(seed) & 0xFFFFFFFF], dtype=U32)


def fold_in(k: np.ndarray, data) -> np.ndarray:
    """(..., 2) keys: threefry(k; 0, uint32(data)), broadcast over a key batch and integer data."""
    k = np.asarray(k, U32)
    d = np.asarray(data, dtype=np.int64).astype(U32)
    y0, y1 = threefry(k[..., 0], k[..., 1], np.zeros_like(d), d)
    return np.stack([y0, y1], axis=-1)


def _counters(n: int) -> tuple[np.ndarray, np.ndarray]:
    j = np.arange(n, dtype=np.uint64)
    return (j >> np.uint64(32)).astype(U32), (j & np.uint64(0xFFFFFFFF)).astype(U32)


def split(k: np.ndarray, num: int) -> np.ndarray:
    """(num, 2) keys of one key: split(k, n)[j] = threefry(k; hi32(j), lo32(j))."""
    hi, lo = _counters(num)
    y0, y1 = threefry(k[0], k[1], hi, lo)
    return np.stack([y0, y1], axis=-1)


def bits(keys: np.ndarray, shape) -> np.ndarray:
    """(*batch, *shape) uint32 words, as jax.random.bits: element j is y0 ^ y1 of threefry(key; hi32(j), lo32(j))."""
    keys = np.asarray(keys, U32)
    shape = tuple(int(s) for s in np.atleast_1d(shape)) if np.ndim(shape) else ((int(shape),) if shape != () else ())
    n = math.prod(shape)
    hi, lo = _counters(n)
    batch = keys.shape[:-1]
    y0, y1 = threefry(keys[..., 0].reshape(-1, 1), keys[..., 1].reshape(-1, 1), hi[None], lo[None])
    return (y0 ^ y1).reshape(batch + shape)


def uniform(keys: np.ndarray, shape) -> np.ndarray:
    """float32 uniforms in [0, 1), as jax.random.uniform at its defaults."""
    m = (bits(keys, shape) >> U32(9)) | U32(0x3F800000)
    return m.view(np.float32) - np.float32(1)


# ------------------------------------------------------------------------------------------- normals
def normal(keys: np.ndarray, shape, backend: str = "cpu") -> np.ndarray:
    """float32 standard normals (*batch, *shape), equal to jax.random.normal on JAX's `backend` ("cpu" or "gpu")."""
    return normal_of_mantissa(bits(keys, shape) >> U32(9), backend)
