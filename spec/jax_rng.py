"""The constants of JAX's default generator as XLA computes it on its CPU and on its CUDA backend, for every side
that redraws it.

threefry2x32's key-schedule constant and rotations, and the float32 constants and steps that turn a draw's 23
mantissa bits into a normal: XLA's CPU code (its log, log1p and Giles' erf_inv with fused multiply-adds) and XLA's
CUDA code (libdevice's log1pf, the same erf_inv unfused, sqrt.approx.f32: `normal_of_u_gpu`). Pure data and steps:
torch_impl.random (and its compiled kernels), c_rng and parity.core.numpy_random each evaluate them in their own array
library; DESIGN.md's float32 facts say how. The CPU steps are checked bit for bit against jax.random
(tests/torch_impl/random/test_random.py, tests/parity/mlp/test_numpy_reference.py), the GPU steps against JAX's GPU table measured on an H100
(tests/data/jax-gpu-normal/, tests/torch_impl/random/test_gpu_normals.py).
"""
from __future__ import annotations

import functools
import math
import struct
from pathlib import Path
from typing import Callable, NamedTuple


def float32_of_bits(word: int) -> float:
    """The float32 with IEEE bit pattern `word`, as a Python float (exact)."""
    return struct.unpack("<f", struct.pack("<I", word))[0]


def to_float32(x: float) -> float:
    """x rounded to the nearest float32, as a Python float."""
    return struct.unpack("<f", struct.pack("<f", x))[0]


PARITY32 = 0x1BD11BDA                        # threefry's key-schedule constant
ROTATIONS = ((13, 15, 26, 6), (17, 29, 16, 24))

# XLA's log1p: a rational approximation for |x| < sqrt(2) - 1, else log(1 + x).
LOG1P_SMALL = float32_of_bits(0x3ED413CD)
LOG1P_NUM = tuple(to_float32(c) for c in (
    4.5270000862445199635215e-5, 4.9854102823193375972212e-1, 6.5787325942061044846969e0,
    2.9911919328553073277375e1, 6.0949667980987787057556e1, 5.7112963590585538103336e1,
    2.0039553499201281259648e1))
LOG1P_DEN = tuple(to_float32(c) for c in (
    1.0, 1.5062909083469192043167e1, 8.3047565967967209469434e1, 2.2176239823732856465394e2,
    3.0909872225312059774938e2, 2.1642788614495947685003e2, 6.0118660497603843919306e1))
# XLA's CPU log (Cephes style): mantissa split at sqrt(1/2), degree-8 polynomial, ln 2 in two parts.
LOG_SQRTHF = float32_of_bits(0x3F3504F3)
LOG_P = tuple(float32_of_bits(w) for w in (0x3D9021BB, 0xBDEBD1B8, 0x3DEF251A, 0xBDFE5D4F, 0x3E11E9BF, 0xBE2AAE50,
                                           0x3E4CCEAC, 0xBE7FFFFC, 0x3EAAAAAA))
LOG_Q1 = float32_of_bits(0xB95E8083)         # -2.12194440e-4
LOG_Q2 = float32_of_bits(0x3F318000)         # 0.693359375
# Giles' single-precision erf_inv: coefficients for w < 5 (z = w - 2.5) and w >= 5 (z = sqrt(w) - 3).
ERFINV_SMALL = tuple(float32_of_bits(w) for w in (0x32F16588, 0x34B84B36, 0xB66C7357, 0xB6935AC1, 0x396532DB,
                                                  0xBAA45408, 0xBB88E4EF, 0x3E7C8F63, 0x3FC02E2F))
ERFINV_LARGE = tuple(float32_of_bits(w) for w in (0xB951F09B, 0x38D3B56B, 0x3AB0DC72, 0xBB70BDE7, 0x3BBC127B,
                                                  0xBBF9C5D7, 0x3C1AA57E, 0x3F8036DB, 0x40354F7E))
SQRT2 = float32_of_bits(0x3FB504F3)          # float32(sqrt 2), the normal's last factor


# ----------------------------------------------------------------------------- the normal's float32 steps
class Float32Ops(NamedTuple):
    """How an array library carries float32 steps in float64: `round` to the nearest float32 (kept in float64),
    `where(mask, a, b)` (a, b arrays or constants), a correctly rounded float64 `sqrt`. Every step below is then
    exact float64 arithmetic rounded once, as XLA's float32 code computes it."""

    round: Callable
    where: Callable
    sqrt: Callable


def fma(ops: Float32Ops, a, b, c):
    """float32 fused multiply-add: the product of two float32 values is exact in float64, the sum rounded once."""
    return ops.round(a * b + c)


def log_of_parts(ops: Float32Ops, t, e):
    """XLA CPU's float32 log (Cephes style) from y = m 2^e's parts: t = m - 1, or 2m - 1 with e lowered by one where
    m < sqrt(1/2) (exact; each side finds m and e its own way)."""
    t2 = ops.round(t * t)
    t3 = ops.round(t2 * t)
    p0 = fma(ops, fma(ops, LOG_P[0], t, LOG_P[1]), t, LOG_P[2])
    p1 = fma(ops, fma(ops, LOG_P[3], t, LOG_P[4]), t, LOG_P[5])
    p2 = fma(ops, fma(ops, LOG_P[6], t, LOG_P[7]), t, LOG_P[8])
    y = fma(ops, fma(ops, fma(ops, p0, t3, p1), t3, p2), t3, ops.round(e * LOG_Q1))
    return fma(ops, e, LOG_Q2, ops.round(ops.round(t - 0.5 * t2) + y))


def log1p(ops: Float32Ops, x, log: Callable):
    """XLA's float32 log1p for x in (-1, 0]: a rational approximation near 0, else log(1 + x) (`log`: the side's
    float32 log)."""
    x2 = ops.round(x * x)
    num = fma(ops, x, LOG1P_NUM[0], LOG1P_NUM[1])
    for c in LOG1P_NUM[2:]:
        num = fma(ops, num, x, c)
    den = ops.round(x + LOG1P_DEN[1])
    for c in LOG1P_DEN[2:]:
        den = fma(ops, den, x, c)
    small = ops.round(x + ops.round(-0.5 * x2 + ops.round(ops.round(x * x2) * ops.round(num / den))))
    return ops.where(abs(x) < LOG1P_SMALL, small, log(ops.round(x + 1.0)))


def normal_of_u(ops: Float32Ops, u, log: Callable):
    """float32(sqrt 2) * erf_inv(u) (Giles' polynomial, XLA's steps) in the float64 carrier, for u = 2f - 1 + 2^-24
    (exact); the caller casts it to float32. `log`: the side's float32 log."""
    w = -log1p(ops, ops.round(u * -u), log)
    central = w < 5.0
    z = ops.where(central, ops.round(w - 2.5), ops.round(ops.round(ops.sqrt(w)) - 3.0))
    p = ops.where(central, ERFINV_SMALL[0], ERFINV_LARGE[0])
    for a, b in zip(ERFINV_SMALL[1:], ERFINV_LARGE[1:]):
        p = fma(ops, p, z, ops.where(central, a, b))
    return ops.round(u * p) * SQRT2


def u_of_mantissa(m):
    """u = 2f - 1 + 2^-24 for a float64 carrier of mantissa bits m (f = m 2^-23): exact."""
    return (m * 4.0 - (2.0 ** 24 - 1.0)) * 2.0 ** -24


# ----------------------------------------------------------------------------- XLA's CUDA normal
BACKENDS = ("cpu", "gpu")                    # whose float32 normal: XLA's CPU code or its CUDA code
# libdevice's log1pf (__nv_log1pf, the non-ftz branch): 1 + x = 2^k (1 + r) with (1 + x) 2^-k in [0.75, 1.5), so r in
# [-0.25, 0.5); log1p(r) = r + r^2 q(r), q by Horner in FMAs (its last coefficient -0.5); + k ln 2 (float32 ln 2).
NV_LOG1P = tuple(float32_of_bits(w) for w in (0xBD39BF78, 0x3DD80012, 0xBE0778E0, 0x3E146475, 0xBE2A68DD, 0x3E4CAF9E,
                                              0xBE800042, 0x3EAAAAE6, 0xBF000000))
NV_LN2 = float32_of_bits(0x3F317218)
ERFINV_TAIL = 5.0                            # Giles' erf_inv takes its second polynomial from w = 5 on
N_MANTISSAS = 1 << 23
# The GPU's tail (w >= 5, where sqrt runs) is mantissas m < GPU_TAIL and m >= 2^23 - GPU_TAIL + 1 (u near -1, +1).
GPU_TAIL = 14155
GPU_SQRT_FILE = Path(__file__).with_name("data") / "jax_gpu_sqrt.txt"


def size_bucket(n: int) -> int:
    """n rounded up to a power of two, at least 8: the sizes a few compiled draws serve (a flat length, a count of keys
    or pairs). Threefry's bits go by an entry's flat index (JAX's jax_threefry_partitionable, on since 0.5), so the
    first n values of a flat draw of size_bucket(n) are the draw of any shape of n values."""
    return max(8, 1 << (int(n) - 1).bit_length())


def check_backend(backend: str) -> str:
    """backend itself when it is one of BACKENDS, else a ValueError naming them."""
    if backend not in BACKENDS:
        raise ValueError(f"backend {backend!r}: JAX's normals are known for {', '.join(map(repr, BACKENDS))}")
    return backend


def nv_log1p_of_parts(ops: Float32Ops, x, k, scale):
    """libdevice's float32 log1pf for x in (-1, 0], from its range reduction: k with (1 + x) 2^-k in [0.75, 1.5) and
    scale = 2^-k (integer-valued floats; each side finds them its own way). libdevice reads k off the bits of 1 + x
    rounded toward zero, which lies on the same side of every 0.75 2^j as the exact sum, so k is the exact sum's."""
    r = ops.round(x * scale + (scale - 1.0))           # float(bits(x) - k 2^23) + fma(0.25, 4 2^-k, -1): one rounding
    q = NV_LOG1P[0]
    for c in NV_LOG1P[1:]:
        q = fma(ops, q, r, c)
    q = fma(ops, ops.round(q * r), r, r)
    return fma(ops, k, NV_LN2, q)


def normal_of_u_gpu(ops: Float32Ops, u, parts: Callable, sqrt_approx: Callable):
    """float32(sqrt 2) * erf_inv(u) as XLA's CUDA code computes it, in the float64 carrier (the caller casts it to
    float32): x = u * -u, w = -log1pf(x) (libdevice, `nv_log1p_of_parts`; `parts(x)` -> (k, 2^-k), the side's),
    Giles' polynomial with each multiply and add rounded (no FMA), `sqrt_approx(w)`: the side's sqrt.approx.f32 for
    w >= 5 (the correctly rounded sqrt moved by `gpu_sqrt_offsets`)."""
    x = ops.round(u * -u)
    k, scale = parts(x)
    w = -nv_log1p_of_parts(ops, x, k, scale)
    central = w < ERFINV_TAIL
    z = ops.where(central, ops.round(w - 2.5), ops.round(sqrt_approx(w) - 3.0))
    p = ops.where(central, ERFINV_SMALL[0], ERFINV_LARGE[0])
    for a, b in zip(ERFINV_SMALL[1:], ERFINV_LARGE[1:]):
        p = ops.round(ops.round(p * z) + ops.where(central, a, b))
    return ops.round(u * p) * SQRT2


@functools.lru_cache(maxsize=1)
def gpu_sqrt_fixes() -> tuple[tuple[int, int, int], ...]:
    """(m, w, s): the tail mantissas where sqrt.approx.f32(w) is not the correctly rounded sqrt(w) and the GPU's normal
    shows it, with w and s as float32 bit patterns (data: spec/data/jax_gpu_sqrt.txt says where it was measured)."""
    rows = []
    for line in GPU_SQRT_FILE.read_text().splitlines():
        if line and not line.startswith("#"):
            m, w, s = line.split()
            rows.append((int(m), int(w, 16), int(s, 16)))
    return tuple(rows)


@functools.lru_cache(maxsize=1)
def gpu_sqrt_offsets() -> tuple[int, ...]:
    """sqrt.approx.f32(w) - sqrt(w) correctly rounded, in float32 steps (-1, 0, +1), for the tail: entry i is
    mantissa i for i < GPU_TAIL, else mantissa i + 2^23 - 2 GPU_TAIL; 0 where no fix is listed."""
    offsets = [0] * (2 * GPU_TAIL)
    for m, w, s in gpu_sqrt_fixes():
        rounded = struct.unpack("<I", struct.pack("<f", math.sqrt(float32_of_bits(w))))[0]
        offsets[m if m < GPU_TAIL else m - (N_MANTISSAS - 2 * GPU_TAIL)] = s - rounded
    return tuple(offsets)
