"""JAX-compatible random numbers in torch, the definition: keys, bits, uniforms and normals equal to jax.random's, bit
for bit, in plain eager torch.

Mirrors jax 0.10.x defaults (threefry2x32, `jax_threefry_partitionable=True`). A key is an int64 tensor of
shape (2,) holding the two uint32 words of `jax.random.key_data(jax.random.key(seed))`; every function also
takes a batch of keys (..., 2) and puts the batch dims first in its result. Words travel as int64 (values in
[0, 2^32)); the hash itself runs in int32 wrap-around arithmetic, which is exact mod 2^32 and several times
faster than masked int64. Normals reproduce XLA's CPU float32 code for `sqrt(2) * erf_inv(u)` (Giles'
approximation, XLA's log1p, its fused multiply-adds) and were checked against JAX for all 2^23 inputs; with
backend="gpu" they reproduce XLA's CUDA code instead (libdevice's log1pf, unfused steps, the GPU's approximate
sqrt; spec.jax_rng.normal_of_u_gpu), checked against JAX's GPU table measured on an H100 (tests/torch_impl/random/test_gpu_normals.py).
No jax import anywhere: tests/torch_impl/random/test_random.py and the benchmark measure the agreement with JAX.
This module is the formula and table backends (backends.py) and the definition the others (native.py, the C
generator; triton_kernel.py) check themselves against; callers draw through torch_impl.random, which picks one.
"""
from __future__ import annotations

import functools
import math
import numbers
from typing import Callable, Sequence

import numpy as np
import torch

from spec import jax_rng as J

__all__ = ["key", "fold_in", "split", "bits", "uniform", "normal", "as_key", "to_uint32", "normal_from_mantissa",
           "normal_table"]

_MASK32 = 0xFFFFFFFF
# CPU work goes in blocks of fewer than 2^15 elements: torch runs such elementwise ops on one thread (below
# its parallel grain size), which keeps a block in cache and avoids thread wake-ups on a busy machine.
_CPU_BLOCK = (1 << 15) - 1
_N_MANTISSAS = 1 << 23                       # a float32 normal depends only on bits >> 9


# ------------------------------------------------------------------------------------------- keys
def key(seed: int, device: str | torch.device | None = None) -> torch.Tensor:
    """The key of an integer seed, (2,) int64 = (0, seed mod 2^32), as `jax.random.key` without x64 gives."""
    if isinstance(seed, torch.Tensor):
        if seed.ndim != 0 or seed.dtype.is_floating_point or seed.dtype == torch.bool:
            raise TypeError(f"seed must be an integer scalar, got a {seed.dtype} tensor of shape {tuple(seed.shape)}")
        seed = int(seed.item())
    elif isinstance(seed, (bool, np.bool_)) or not isinstance(seed, numbers.Integral):
        raise TypeError(f"seed must be an integer, got {type(seed).__name__} {seed!r}")
    seed = int(seed)
    if not -(1 << 63) <= seed < (1 << 63):
        raise ValueError(f"seed {seed} does not fit in int64 (JAX rejects it too); use a seed in [-2^63, 2^63)")
    return torch.tensor([0, seed & _MASK32], dtype=torch.int64, device=device)


def as_key(data, device: str | torch.device | None = None) -> torch.Tensor:
    """Keys (..., 2) int64 from key words given as numpy/JAX uint32 data or any integer array."""
    arr = np.asarray(data)
    if arr.ndim == 0 or arr.shape[-1] != 2 or not np.issubdtype(arr.dtype, np.integer):
        raise ValueError(f"key data must be integers of shape (..., 2), got {arr.dtype} {arr.shape}")
    return torch.as_tensor(arr.astype(np.int64) & _MASK32, device=device)


def to_uint32(words: torch.Tensor) -> np.ndarray:
    """Keys or bits (int64 holding uint32 values) as a numpy uint32 array, e.g. to compare with JAX."""
    return (words.detach().to("cpu", torch.int64) & _MASK32).numpy().astype(np.uint32)


def _key_words(keys: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Checks a key batch (..., 2) and returns its words as int32 bit patterns, each of shape (...)."""
    if not isinstance(keys, torch.Tensor):
        raise TypeError(f"keys must be a torch tensor of shape (..., 2), got {type(keys).__name__}")
    if keys.ndim == 0 or keys.shape[-1] != 2:
        raise ValueError(f"keys must have shape (..., 2) (two uint32 words per key), got {tuple(keys.shape)}")
    if keys.dtype not in (torch.int64, torch.int32):
        raise TypeError(f"keys must be int64 words in [0, 2^32) (as key() makes them), got dtype {keys.dtype}")
    if keys.dtype == torch.int64 and keys.numel() and bool(((keys < 0) | (keys > _MASK32)).any()):
        raise ValueError("key words must lie in [0, 2^32); these keys were not made by key/split/fold_in")
    words = keys.to(torch.int32)             # int64 -> int32 keeps the low 32 bits (two's complement)
    return words[..., 0], words[..., 1]


def _u32_to_int64(x: torch.Tensor) -> torch.Tensor:
    """int32 bit patterns -> int64 tensor of the same words as unsigned values."""
    return x.to(torch.int64) & _MASK32


def _shape_tuple(shape) -> tuple[int, ...]:
    shape = (shape,) if isinstance(shape, numbers.Integral) else tuple(shape)
    if any(not isinstance(d, numbers.Integral) or isinstance(d, bool) or d < 0 for d in shape):
        raise ValueError(f"shape must be non-negative integers, got {shape}")
    return tuple(int(d) for d in shape)


# ------------------------------------------------------------------------------------------- threefry
def _rounds_(x0: torch.Tensor, x1: torch.Tensor, k0, k1) -> None:
    """threefry2x32 (20 rounds, 5 key injections) on int32 counters in place; k0, k1 broadcast to them."""
    k2 = k0 ^ k1 ^ J.PARITY32
    ks = (k0, k1, k2)
    x0.add_(k0)
    x1.add_(k1)
    tmp = torch.empty_like(x1)
    for i in range(5):
        for r in J.ROTATIONS[i % 2]:
            x0.add_(x1)
            torch.bitwise_left_shift(x1, r, out=tmp)                 # rotate left by r:
            x1.bitwise_right_shift_(32 - r).bitwise_and_((1 << r) - 1).bitwise_or_(tmp)   # logical >> via mask
            x1.bitwise_xor_(x0)
        x0.add_(ks[(i + 1) % 3])
        x1.add_(ks[(i + 2) % 3] + (i + 1))


def _block_plan(rows: int, cols: int, device: torch.device) -> tuple[int, int]:
    """(rows, cols) per block: whole rows when they fit, CPU blocks under _CPU_BLOCK elements, GPU one block."""
    if device.type != "cpu":
        return max(rows, 1), max(cols, 1)
    block_cols = max(1, min(cols, _CPU_BLOCK))
    return max(1, _CPU_BLOCK // block_cols), block_cols


def _counter_words(start: int, stop: int, device: torch.device) -> tuple[torch.Tensor | None, torch.Tensor]:
    """(hi, lo) int32 words of the flat indices start..stop-1; hi is None while it is zero."""
    if stop <= (1 << 31):
        return None, torch.arange(start, stop, dtype=torch.int32, device=device)
    j = torch.arange(start, stop, dtype=torch.int64, device=device)
    return (j >> 32).to(torch.int32), (j & _MASK32).to(torch.int32)


def _stream(k0: torch.Tensor, k1: torch.Tensor, n: int, out: torch.Tensor,
            finish: Callable[[torch.Tensor, torch.Tensor, torch.Tensor], None]) -> torch.Tensor:
    """Hashes counters 0..n-1 under each key and lets finish(y0, y1, out_block) write each block.

    k0, k1: (B,) int32 key words; out: (B, n, ...) preallocated; blocks are out[r0:r1, c0:c1].
    """
    n_keys = k0.shape[0]
    if n_keys == 0 or n == 0:
        return out
    block_rows, block_cols = _block_plan(n_keys, n, out.device)
    for r0 in range(0, n_keys, block_rows):
        r1 = min(n_keys, r0 + block_rows)
        a0, a1 = k0[r0:r1, None], k1[r0:r1, None]                            # (R, 1)
        for c0 in range(0, n, block_cols):
            c1 = min(n, c0 + block_cols)
            hi, lo = _counter_words(c0, c1, out.device)
            x1 = lo.expand(r1 - r0, c1 - c0).clone()                         # (R, C)
            x0 = torch.zeros_like(x1) if hi is None else hi.expand(r1 - r0, c1 - c0).clone()
            _rounds_(x0, x1, a0, a1)
            finish(x0, x1, out[r0:r1, c0:c1])
    return out


def _hash_pairs(k0: torch.Tensor, k1: torch.Tensor, x0: torch.Tensor, x1: torch.Tensor) -> torch.Tensor:
    """threefry2x32 of one counter pair per key, all (N,) int32 -> (N, 2) int32 output words."""
    out = torch.empty(k0.shape[0], 2, dtype=torch.int32, device=k0.device)
    step = _CPU_BLOCK if k0.device.type == "cpu" else max(1, k0.shape[0])
    for s in range(0, k0.shape[0], step):
        e = s + step
        y0, y1 = x0[s:e].clone(), x1[s:e].clone()
        _rounds_(y0, y1, k0[s:e], k1[s:e])
        out[s:e, 0], out[s:e, 1] = y0, y1
    return out


# ------------------------------------------------------------------------------------------- key ops
def _data_words(data, device: torch.device) -> torch.Tensor:
    """fold_in data as int32 bit patterns: a Python int must be a uint32 (as in JAX); arrays wrap mod 2^32."""
    if isinstance(data, (bool, np.bool_)):
        raise TypeError("fold_in data must be an integer, got a bool")
    if isinstance(data, int):
        if not 0 <= data <= _MASK32:
            raise ValueError(f"fold_in data {data} is out of the uint32 range [0, 2^32) (JAX rejects it too)")
        return torch.tensor(data, dtype=torch.int64, device=device).to(torch.int32)
    if isinstance(data, torch.Tensor):
        t = data
    else:
        arr = np.asarray(data)
        if not np.issubdtype(arr.dtype, np.integer):
            raise TypeError(f"fold_in data must be integers, got {arr.dtype}")
        t = torch.as_tensor(arr.astype(np.int64))
    if t.dtype.is_floating_point or t.dtype.is_complex or t.dtype == torch.bool:
        raise TypeError(f"fold_in data must be an integer tensor, got {t.dtype}")
    return (t.to(device=device, dtype=torch.int64) & _MASK32).to(torch.int32)


def fold_in(keys: torch.Tensor, data, hash_pairs: Callable = _hash_pairs) -> torch.Tensor:
    """New keys (*broadcast(batch, data.shape), 2) = threefry(key; 0, uint32(data)), as jax.random.fold_in.

    `data` is an int in [0, 2^32) or an integer tensor/array broadcastable against the key batch, e.g.
    fold_in(k, torch.arange(P)) gives P keys from one key. `hash_pairs` is _hash_pairs's hash (torch_impl.random
    hands in the C generator's, the same words).
    """
    k0, k1 = _key_words(keys)
    d = _data_words(data, keys.device)
    batch = torch.broadcast_shapes(k0.shape, d.shape)
    k0, k1, d = (t.expand(batch).reshape(-1) for t in (k0, k1, d))
    out = hash_pairs(k0, k1, torch.zeros_like(d), d)
    return _u32_to_int64(out).reshape(*batch, 2)


def split(keys: torch.Tensor, num: int | Sequence[int] = 2) -> torch.Tensor:
    """(..., *num, 2) keys; split(k, n)[j] = threefry(k; hi32(j), lo32(j)) = fold_in(k, j), as jax.random.split."""
    k0, k1 = _key_words(keys)
    shape = _shape_tuple(num)
    n = math.prod(shape)
    batch = k0.shape
    out = torch.empty(math.prod(batch), n, 2, dtype=torch.int32, device=keys.device)

    def both_words(y0, y1, dst):
        dst[..., 0] = y0
        dst[..., 1] = y1

    _stream(k0.reshape(-1), k1.reshape(-1), n, out, both_words)
    return _u32_to_int64(out).reshape(tuple(batch) + shape + (2,))


# ------------------------------------------------------------------------------------------- draws
def _draw(keys: torch.Tensor, shape, dtype: torch.dtype, finish) -> torch.Tensor:
    """Runs the per-element hash for a key batch and a draw shape; the result is (*batch, *shape)."""
    k0, k1 = _key_words(keys)
    shape = _shape_tuple(shape)
    n = math.prod(shape)
    batch = k0.shape
    out = torch.empty(math.prod(batch), n, dtype=dtype, device=keys.device)
    _stream(k0.reshape(-1), k1.reshape(-1), n, out, finish)
    return out.reshape(tuple(batch) + shape)


def _xor_into(y0, y1, dst):
    torch.bitwise_xor(y0, y1, out=y0)
    dst.copy_(y0)


def _mantissa_(y0: torch.Tensor, y1: torch.Tensor) -> torch.Tensor:
    """In place: (y0 ^ y1) >> 9 (logical), the 23 random mantissa bits, as int32 in [0, 2^23)."""
    return y0.bitwise_xor_(y1).bitwise_right_shift_(9).bitwise_and_(_N_MANTISSAS - 1)


def bits(keys: torch.Tensor, shape=()) -> torch.Tensor:
    """Random 32-bit words (*batch, *shape) as int64 holding uint32 values, as jax.random.bits (uint32).

    Element j (row-major) is y0 ^ y1 of threefry(key; hi32(j), lo32(j)). Compare with numpy via to_uint32.
    """
    return _u32_to_int64(_draw(keys, shape, torch.int32, _xor_into))


def _fma32(a: torch.Tensor, b: float, c: float) -> torch.Tensor:
    """float32 a*b + c rounded once, as XLA's fused multiply-add: float64 product (exact) and sum rounded
    to odd (exact sum's neighbour with odd last bit), so the final rounding to float32 is correct."""
    p = a.double() * b
    s = p + c
    back = s - p
    err = (p - (s - back)) + (c - back)                       # exact (p + c) - s (TwoSum)
    s_bits = s.view(torch.int64)
    inexact_even = (err != 0) & ((s_bits & 1) == 0)
    toward = torch.where((err > 0) == (s > 0), 1, -1)         # one step up or down in magnitude, toward err
    return torch.where(inexact_even, s_bits + toward, s_bits).view(torch.float64).float()


def float32_bounds(minval: float, maxval: float) -> tuple[float, float]:
    """(lo, span) as JAX forms them: lo = float32(minval), span = float32(float32(maxval) - lo)."""
    lo = float(np.float32(minval))
    hi = float(np.float32(maxval))
    return lo, float(np.float32(hi) - np.float32(lo))


def uniform_of_bits(words: torch.Tensor, lo: float, span: float) -> torch.Tensor:
    """float32 uniforms of 32-bit words (int64 holding uint32 values, any shape), as jax.random.uniform turns its bits
    into them: f = bitcast((bits >> 9) | 0x3F800000) - 1 (exact), then max(lo, fma(f, span, lo)); lo, span from
    float32_bounds."""
    f = ((words >> 9) | 0x3F800000).to(torch.int32).view(torch.float32) - 1.0
    if lo == 0.0 and span == 1.0:                              # f * 1 + 0 is exact
        return f
    return torch.clamp_min(_fma32(f, span, lo), lo)


def uniform(keys: torch.Tensor, shape=(), minval: float = 0.0, maxval: float = 1.0) -> torch.Tensor:
    """float32 uniforms in [minval, maxval) (*batch, *shape), as jax.random.uniform:
    max(lo, fma(f, hi - lo, lo)) with f = bitcast((bits >> 9) | 0x3F800000) - 1 and lo, hi in float32."""
    return uniform_of_bits(bits(keys, shape), *float32_bounds(minval, maxval))


# ------------------------------------------------------------------------------------------- normals
def _r(x: torch.Tensor) -> torch.Tensor:
    """Round a float64 tensor to float32, keep it in float64 (the carrier of the emulation)."""
    return x.float().double()


def _sqrt(x: torch.Tensor) -> torch.Tensor:
    """Correctly rounded float64 sqrt (numpy's on the CPU: torch's float64 sqrt threads badly for small blocks)."""
    if x.device.type == "cpu":
        return torch.from_numpy(np.sqrt(x.numpy()))
    return torch.sqrt(x)


def _where(mask: torch.Tensor, a, b) -> torch.Tensor:
    """torch.where; between two constants, the blend mask (a - b) + b (exact: a - b is exact in float64 for these
    float32 constants), which spares a float32 constant tensor and its promotion on every polynomial step."""
    if isinstance(a, float) and isinstance(b, float):
        return mask.double() * (a - b) + b
    return torch.where(mask, a, b)


_OPS = J.Float32Ops(_r, _where, _sqrt)           # XLA's float32 steps (spec.jax_rng) on float64 tensors


def _xla_log(y: torch.Tensor) -> torch.Tensor:
    """XLA CPU's float32 log for positive normal y (float64 carrier), with the FMAs its code gets."""
    m, e = torch.frexp(y)                                     # y = m * 2^e, m in [0.5, 1)
    below = (m < J.LOG_SQRTHF).double()
    t = (m - 1.0) + m * below                                 # exact: m - 1, or 2m - 1 below sqrt(1/2)
    return J.log_of_parts(_OPS, t, e.double() - below)


def _nv_parts(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """libdevice log1pf's reduction of 1 + x (float64 carrier): k with (1 + x) 2^-k in [0.75, 1.5), and 2^-k."""
    mant, ex = torch.frexp(1.0 + x)
    k = ex - (mant < 0.75).to(ex.dtype)
    return k.double(), torch.ldexp(torch.ones_like(x), -k)


@functools.lru_cache(maxsize=None)
def _gpu_sqrt_offsets(device: str) -> torch.Tensor:
    """spec.jax_rng.gpu_sqrt_offsets as an int32 tensor on `device` (2 GPU_TAIL entries)."""
    return torch.tensor(J.gpu_sqrt_offsets(), dtype=torch.int32, device=device)


def _gpu_sqrt(m: torch.Tensor) -> Callable[[torch.Tensor], torch.Tensor]:
    """The GPU's sqrt.approx.f32 for mantissas m (int64): the correctly rounded sqrt moved by spec.jax_rng's offsets."""
    index = torch.where(m < J.GPU_TAIL, m, (m - (_N_MANTISSAS - 2 * J.GPU_TAIL)).clamp_min(0))
    moved = _gpu_sqrt_offsets(str(m.device)).index_select(0, index.reshape(-1)).view(index.shape)

    def sqrt_approx(w: torch.Tensor) -> torch.Tensor:
        return (_sqrt(w).float().view(torch.int32) + moved).view(torch.float32).double()
    return sqrt_approx


def normal_from_mantissa(m: torch.Tensor, backend: str = "cpu") -> torch.Tensor:
    """The float32 normal JAX draws on `backend` for mantissa bits m = bits >> 9 (int tensor, values in [0, 2^23)).

    u = 2f - 1 + 2^-24 (exact), then float32(sqrt 2) * erf_inv(u) evaluated step by step as XLA's code does on the
    CPU ("cpu": spec.jax_rng.normal_of_u, FMAs) or on an NVIDIA GPU ("gpu": normal_of_u_gpu, libdevice's log1pf,
    unfused steps, sqrt.approx.f32): each float32 operation rounded, sqrt and division correctly rounded.
    """
    m = m.to(torch.int64)
    u = J.u_of_mantissa(m.to(torch.float64))
    if J.check_backend(backend) == "gpu":
        return J.normal_of_u_gpu(_OPS, u, _nv_parts, _gpu_sqrt(m)).float()
    return J.normal_of_u(_OPS, u, _xla_log).float()


_CPU_TABLES: dict[str, torch.Tensor] = {}                     # backend -> its table, once built


def _cpu_table(backend: str = "cpu") -> torch.Tensor:
    """All 2^23 float32 normals of `backend` indexed by bits >> 9 (32 MB), computed once in blocks."""
    if backend not in _CPU_TABLES:
        table = torch.empty(_N_MANTISSAS, dtype=torch.float32)
        step = 1 << 14                                        # stays on one thread, in cache
        for s in range(0, _N_MANTISSAS, step):
            table[s:s + step] = normal_from_mantissa(torch.arange(s, s + step, dtype=torch.int64), backend)
        _CPU_TABLES[backend] = table
    return _CPU_TABLES[backend]


@functools.lru_cache(maxsize=None)
def _device_table(device: str, backend: str = "cpu") -> torch.Tensor:
    return _cpu_table(backend).to(device)


def normal_table(device: str | torch.device = "cpu", backend: str = "cpu") -> torch.Tensor:
    """The (2^23,) float32 table of every normal JAX draws on `backend` ("cpu" or "gpu"), indexed by bits >> 9;
    built on first use."""
    device = torch.device(device)
    backend = J.check_backend(backend)
    return _cpu_table(backend) if device.type == "cpu" else _device_table(str(device), backend)


def normal(keys: torch.Tensor, shape=(), backend: str = "cpu") -> torch.Tensor:
    """Standard normals (*batch, *shape) float32, equal to jax.random.normal(key, shape) on JAX's `backend`: "cpu"
    (XLA's CPU code) or "gpu" (XLA's CUDA code on an NVIDIA GPU: the same draws, 4.7% of the normals 1-3 ULP apart),
    evaluated by the formula (the table backend reads normal_table instead: _normal(..., True, ...), the same bits)."""
    return _normal(keys, shape, False, J.check_backend(backend))


def _normal(keys: torch.Tensor, shape, use_table: bool, backend: str = "cpu") -> torch.Tensor:
    """normal() by table look-up (use_table: the table backend) or by the formula, the path chosen by the caller."""
    _key_words(keys)
    if use_table:
        table = normal_table(keys.device, backend)

        def finish(y0, y1, dst):
            m = _mantissa_(y0, y1)                                           # (R, C) int32 in [0, 2^23)
            dst.copy_(torch.index_select(table, 0, m.reshape(-1)).view(m.shape))
    else:
        def finish(y0, y1, dst):
            dst.copy_(normal_from_mantissa(_mantissa_(y0, y1), backend))

    return _draw(keys, shape, torch.float32, finish)
