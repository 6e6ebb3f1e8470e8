"""XLA's float32 normal in numpy, the one numpy copy: spec.jax_rng's steps on float64 arrays (each float32 step rounded
exactly), as JAX's CPU ("cpu") or its CUDA code ("gpu") takes them.

The only module of spec that imports a third party (numpy, tests/test_layering.py's EXCEPTIONS): jax_reference
(its table of another backend's normals, jax_reference/normals.py) and parity (its numpy generator for replays,
parity/core/numpy_random.py) both draw through it and may import spec, not each other.
"""
from __future__ import annotations

from typing import Callable

import numpy as np

from spec import jax_rng as J

__all__ = ["round32", "OPS", "xla_log", "nv_parts", "gpu_sqrt", "normal_of_mantissa"]


def round32(x: np.ndarray) -> np.ndarray:
    """Round float64 values to float32, kept in float64 (the carrier of the float32 steps)."""
    return np.asarray(x, np.float64).astype(np.float32).astype(np.float64)


OPS = J.Float32Ops(round32, np.where, np.sqrt)      # XLA's float32 steps (spec.jax_rng) on float64 arrays


def xla_log(y: np.ndarray) -> np.ndarray:
    """XLA CPU's float32 log of positive normal y (Cephes style: split at sqrt(1/2), degree-8 polynomial;
    spec.jax_rng.log_of_parts), frexp in numpy."""
    m, e = np.frexp(y)
    below = (m < J.LOG_SQRTHF).astype(np.float64)
    return J.log_of_parts(OPS, (m - 1.0) + m * below, e.astype(np.float64) - below)


def nv_parts(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """libdevice log1pf's reduction of 1 + x: k with (1 + x) 2^-k in [0.75, 1.5), and 2^-k."""
    mant, ex = np.frexp(1.0 + x)
    k = ex - (mant < 0.75)
    return k.astype(np.float64), np.ldexp(1.0, -k)


def gpu_sqrt(m: np.ndarray) -> Callable[[np.ndarray], np.ndarray]:
    """The GPU's sqrt.approx.f32 for the mantissas m: the correctly rounded sqrt moved by spec.jax_rng's offsets."""
    offsets = np.array(J.gpu_sqrt_offsets(), np.int32)
    moved = offsets[np.where(m < J.GPU_TAIL, m, np.maximum(m - (J.N_MANTISSAS - 2 * J.GPU_TAIL), 0))]

    def sqrt_approx(w: np.ndarray) -> np.ndarray:
        return (np.sqrt(w).astype(np.float32).view(np.int32) + moved).view(np.float32).astype(np.float64)
    return sqrt_approx


def normal_of_mantissa(m: np.ndarray, backend: str = "cpu") -> np.ndarray:
    """The float32 normal JAX draws on `backend` ("cpu" or "gpu") for mantissa bits m = bits >> 9:
    float32(sqrt 2) * erf_inv(2f - 1 + 2^-24)."""
    m = np.asarray(m, np.int64)
    u = J.u_of_mantissa(m.astype(np.float64))
    if J.check_backend(backend) == "gpu":
        return J.normal_of_u_gpu(OPS, u, nv_parts, gpu_sqrt(m)).astype(np.float32)
    return J.normal_of_u(OPS, u, xla_log).astype(np.float32)
