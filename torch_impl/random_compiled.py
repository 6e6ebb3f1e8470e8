"""Compiled JAX-compatible draws: threefry2x32 in one compiled kernel, then the uniform or XLA's erf_inv in one more.

The same arithmetic as torch_impl.random_eager (the readable definition), written as pure tensor
expressions and handed to torch.compile: inductor's C++ on the CPU, Triton on CUDA. Results are bit-identical
to the eager path (the tests compare them, normals over all 2^23 mantissas). random.bits/uniform/normal call
`draw` for large requests; anything this module cannot do (no compiler, a compile error, a failed self-check)
leaves them on the eager path, with one warning and the reason in `compiled_status()`.

Exactness does not depend on compiler flags: float32 steps are emulated in float64, where every product of
two float32 values is exact, so contracting a product and a sum into an FMA changes nothing; the rounding to
float32 is a Veltkamp split on the CPU and integer arithmetic on the bits on CUDA (see _round32). The split
needs uncontracted, unreassociated float64 arithmetic: the compile options below pin inductor's
`-ffp-contract=off` and `-fno-unsafe-math-optimizations`, whatever the environment says. On top, each
compiled draw checks itself against the eager path on its first use and stays eager if they differ.
No jax import here.
"""
from __future__ import annotations

import functools
import os
import threading
import time
import warnings
from typing import NamedTuple

import torch

from spec import jax_rng as J
from torch_impl import random_eager as E

__all__ = ["draw", "wanted", "compiled_status", "CompiledStatus", "MIN_DRAWS"]

# From this many draws in one call (keys x shape) the compiled kernel runs; smaller calls stay eager, so a
# process making only small draws (the parity suite, the tests) never pays a compile. Env TORCH_IMPL_RNG_COMPILE:
# "auto" (default, this threshold), "always" (any size, for tests), "never" (eager only).
MIN_DRAWS = 1 << 18
_MODES = ("auto", "always", "never")
# Inductor settings, pinned per compile. The first two are what exactness depends on (module doc). The third
# makes inductor store a reused intermediate once instead of inlining it into every use: the split reads its
# input twice, so inlining grows the traced kernel exponentially (over 500 s to compile the normal on this
# 2-core machine with the CPU default of 50 ops; about 15 s with 16, still one fused loop).
_INDUCTOR_OPTIONS = {
    "cpp.enable_floating_point_contract_flag": "off",
    "cpp.enable_unsafe_math_opt_flag": False,
    "realize_opcount_threshold": 16,
}
_VELTKAMP = float((1 << 29) + 1)       # splits a float64 (53 bits) into 24 + 29 bits
_HALF_ULP32 = (1 << 28) - 1             # float64 bits: just under half a float32 ulp
_KEEP32 = -(1 << 29)                    # float64 bits: sign, exponent and the top 23 mantissa bits
_MANTISSA_MASK = (1 << 23) - 1


# ------------------------------------------------------------------------------------------- kernels
def _rotl(x: torch.Tensor, r: int) -> torch.Tensor:
    """int32 rotate left by r (the right shift made logical by a mask)."""
    return (x << r) | ((x >> (32 - r)) & ((1 << r) - 1))


def _threefry2x32(k0, k1, x0: torch.Tensor, x1: torch.Tensor, pin) -> tuple[torch.Tensor, torch.Tensor]:
    """threefry2x32 (20 rounds) on int32 words, out of place; keys broadcast against the counters.

    `pin` is a zero of the key batch's shape (B, 1), or-ed into every round's words: it changes no value but
    makes each intermediate inductor stores read a per-key input, so all of them keep the (keys, counters)
    loop and fuse into one loop nest (without it inductor flattens some to 1-d and splits the kernel in ~10).
    """
    ks = (k0, k1, k0 ^ k1 ^ J.PARITY32)
    x0, x1 = x0 + k0, x1 + k1
    for i in range(5):
        for r in J.ROTATIONS[i % 2]:
            x0 = (x0 + x1) | pin
            x1 = (_rotl(x1, r) ^ x0) | pin
        x0 = x0 + ks[(i + 1) % 3]
        x1 = x1 + (ks[(i + 2) % 3] + (i + 1))
    return x0, x1


def words_kernel(k0: torch.Tensor, k1: torch.Tensor, start: torch.Tensor, n: int) -> torch.Tensor:
    """(B, n) int32 draws y0 ^ y1 for counters start[b] + 0..n-1 under key b; k0, k1, start: (B,) int32."""
    col = torch.arange(n, dtype=torch.int32, device=k0.device)                  # (n,)
    x1 = start[:, None] + col                                                    # (B, n), hi word 0
    pin = start[:, None] & 0                                                     # (B, 1) zeros
    y0, y1 = _threefry2x32(k0[:, None], k1[:, None], torch.zeros_like(x1), x1, pin)
    return y0 ^ y1


def _mantissa(words: torch.Tensor) -> torch.Tensor:
    """words >> 9 (logical) as int32 in [0, 2^23)."""
    return (words >> 9) & _MANTISSA_MASK


def _round32(x: torch.Tensor) -> torch.Tensor:
    """float64 x rounded to the nearest float32 value (ties to even), kept in float64; x in float32's normal range.

    CPU: Veltkamp's split, 3 flops in registers (a float32 round trip goes through memory in inductor's AVX2
    code). CUDA: integer rounding of the bits, immune to the FMA contraction Triton applies and to inductor
    folding a float64 -> float32 -> float64 cast pair into nothing (torch 2.11 does, on an H100).
    """
    if x.device.type == "cpu":
        c = x * _VELTKAMP
        return c - (c - x)
    b = x.view(torch.int64)                                   # drop 29 of 52 mantissa bits, round half to even
    return ((b + (_HALF_ULP32 + ((b >> 29) & 1))) & _KEEP32).view(torch.float64)


_OPS = J.Float32Ops(_round32, torch.where, torch.sqrt)   # XLA's float32 steps (spec.jax_rng), fusable


def _xla_log(y: torch.Tensor) -> torch.Tensor:
    """random_eager._xla_log with frexp done on the float32 bits (y is a positive normal float32 in float64)."""
    b = y.float().view(torch.int32)
    m = ((b & 0x007FFFFF) | 0x3F000000).view(torch.float32).double()            # mantissa in [0.5, 1)
    below = m < J.LOG_SQRTHF
    e = torch.where(below, (b >> 23) - 127, (b >> 23) - 126).double()
    t = torch.where(below, (m + m) - 1.0, m - 1.0)                               # exact
    return J.log_of_parts(_OPS, t, e)


def normal_of_mantissa(m: torch.Tensor) -> torch.Tensor:
    """random.normal_from_mantissa as one fusable expression: int32 m in [0, 2^23) -> float32 normal."""
    return J.normal_of_u(_OPS, J.u_of_mantissa(m.double()), _xla_log).float()


def _nv_parts(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """random_eager._nv_parts on float64 bits: k = the exponent of 1 + x plus its first fraction bit, and 2^-k."""
    b = (1.0 + x).view(torch.int64)
    k = ((b >> 52) & 0x7FF) - 1023 + ((b >> 51) & 1)
    return k.double(), ((1023 - k) << 52).view(torch.float64)


def normal_of_mantissa_gpu(m: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
    """random.normal_from_mantissa(m, "gpu") as one fusable expression; offsets: random_eager._gpu_sqrt_offsets. A
    float32 step of a float32 value in float64 is 2^29 in its float64 bits (carries into the exponent as float32's
    would)."""
    index = torch.where(m < J.GPU_TAIL, m, (m - (J.N_MANTISSAS - 2 * J.GPU_TAIL)).clamp_min(0))
    moved = offsets[index].to(torch.int64) << 29

    def sqrt_approx(w: torch.Tensor) -> torch.Tensor:
        return (_round32(torch.sqrt(w)).view(torch.int64) + moved).view(torch.float64)
    return J.normal_of_u_gpu(_OPS, J.u_of_mantissa(m.double()), _nv_parts, sqrt_approx).float()


def _fma32_from_bits(f: torch.Tensor, span: torch.Tensor, lo: torch.Tensor) -> torch.Tensor:
    """random_eager._fma32: float32 f * span + lo rounded once (round to odd in float64, TwoSum), then to float32."""
    p = f.double() * span
    s = p + lo
    back = s - p
    err = (p - (s - back)) + (lo - back)
    s_bits = s.view(torch.int64)
    inexact_even = (err != 0) & ((s_bits & 1) == 0)
    toward = torch.where((err > 0) == (s > 0), 1, -1)
    return torch.where(inexact_even, s_bits + toward, s_bits).view(torch.float64).float()


def normal_of_words(words: torch.Tensor) -> torch.Tensor:
    """float32 normals from int32 words (any shape), as random.normal."""
    return normal_of_mantissa(_mantissa(words))


def normal_gpu_of_words(words: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
    """float32 normals from int32 words (any shape), as random.normal(..., backend="gpu")."""
    return normal_of_mantissa_gpu(_mantissa(words), offsets)


def uniform_of_words(words: torch.Tensor, lo: torch.Tensor, span: torch.Tensor) -> torch.Tensor:
    """float32 uniforms max(lo, fma(f, span, lo)) from int32 words, as random.uniform; lo, span: 0-d float64."""
    f = (_mantissa(words) | 0x3F800000).view(torch.float32) - 1.0
    return torch.maximum(_fma32_from_bits(f, span, lo), lo.float())


# Two compiled stages per draw: the hash over (keys, counters), then the elementwise finish on the flat words.
# One graph for both would make inductor split the loops anyway (the finish flattens to 1-d) and compile the
# hash once per kind; this way the hash compiles once and the int32 words make one trip through memory.
_KERNELS = {"words": words_kernel, "normal": normal_of_words, "normal_gpu": normal_gpu_of_words,
            "uniform": uniform_of_words}


# ------------------------------------------------------------------------------------------- policy
class CompiledStatus(NamedTuple):
    mode: str                           # auto | always | never (env TORCH_IMPL_RNG_COMPILE)
    min_draws: int                      # compiled from this many draws per call (auto)
    compiled: dict[str, float]          # "kind/device" -> seconds the first call took (compile included)
    failed: dict[str, str]              # "kind/device" -> why it runs eagerly

    def __str__(self) -> str:
        done = ", ".join(f"{k} {s:.1f} s" for k, s in sorted(self.compiled.items())) or "none yet"
        text = f"compiled rng: mode {self.mode}, from {self.min_draws} draws per call; compiled: {done}"
        if self.failed:
            text += "; eager fallback: " + "; ".join(f"{k}: {why}" for k, why in sorted(self.failed.items()))
        return text


_lock = threading.Lock()
_first_call_seconds: dict[str, float] = {}
_failures: dict[str, str] = {}


def _mode() -> str:
    mode = os.environ.get("TORCH_IMPL_RNG_COMPILE", "auto").strip().lower() or "auto"
    return mode if mode in _MODES else "auto"


def compiled_status() -> CompiledStatus:
    """What the compiled path does in this process: mode, threshold, first-call times, fallbacks."""
    return CompiledStatus(_mode(), MIN_DRAWS, dict(_first_call_seconds), dict(_failures))


def wanted(n_keys: int, n: int, device: torch.device) -> bool:
    """Whether a draw of n values per key for n_keys keys goes to the compiled kernel."""
    mode = _mode()
    if mode == "never" or n < 2 or n_keys < 1 or n >= (1 << 31) - 1:     # n = 1, huge n: eager
        return False
    if device.type not in ("cpu", "cuda"):
        return False
    return mode == "always" or n_keys * n >= MIN_DRAWS


@functools.lru_cache(maxsize=None)
def _compiled(kind: str):
    """One torch.compile'd stage per name, shapes dynamic: one compile serves every size (and device type)."""
    return torch.compile(_KERNELS[kind], dynamic=True, options=_INDUCTOR_OPTIONS)


def _probe(kind: str, device: torch.device, extra: tuple) -> str | None:
    """Compiled against eager on a few keys and odd sizes; None if bit-identical, else what differs."""
    keys = E.fold_in(E.key(20240601, device=device), torch.arange(3, device=device))      # (3, 2)
    for n in (4099, 2):
        got = _run(kind, keys, n, extra)                                                  # (3, n)
        if kind == "bits":
            ref = E._u32_to_int64(E._draw(keys, (n,), torch.int32, E._xor_into))
        elif kind in ("normal", "normal_gpu"):
            ref = E._normal(keys, (n,), False, "gpu" if kind == "normal_gpu" else "cpu")
        else:
            ref = E._uniform_eager(keys, (n,), *extra)
        if not torch.equal(got, ref):
            return f"{kind} differs from the eager path in a self-check ({n} values per key)"
    return None


def _run(kind: str, keys: torch.Tensor, n: int, extra: tuple) -> torch.Tensor:
    """The compiled stages on a key batch (..., 2) -> (B, n). One key is spread over two rows (counters from 0
    and from ceil(n/2)) and the finish runs on the flat words: a dynamic-shape kernel would specialize, i.e.
    recompile, for a dimension of 1."""
    k0, k1 = (w.reshape(-1).contiguous() for w in E._key_words(keys))              # (B,) int32
    one_key = k0.shape[0] == 1
    cols = -(-n // 2) if one_key else n
    start = (torch.tensor([0, cols], dtype=torch.int32, device=keys.device) if one_key
             else torch.zeros_like(k0))
    if one_key:
        k0, k1 = k0.expand(2).contiguous(), k1.expand(2).contiguous()
    words = _compiled("words")(k0, k1, start, cols).reshape(-1)[: k0.shape[0] * cols if not one_key else n]
    if kind == "bits":
        out = words.to(torch.int64) & E._MASK32
    else:
        if kind == "uniform":   # bounds as 0-d tensors: new bounds do not recompile
            extra = tuple(torch.tensor(v, dtype=torch.float64, device=keys.device) for v in extra)
        elif kind == "normal_gpu":
            extra = (E._gpu_sqrt_offsets(str(keys.device)),)
        out = _compiled(kind)(words, *extra)                                    # flat: never a dim of 1
    return out.reshape(-1, n)


def _fail(tag: str, why: str) -> None:
    _failures[tag] = why
    warnings.warn(f"torch_impl.random: the compiled {tag} path is unavailable, using the eager path ({why})",
                  RuntimeWarning, stacklevel=4)


def draw(kind: str, keys: torch.Tensor, n: int, extra: tuple = (), backend: str = "cpu") -> torch.Tensor | None:
    """(B, n) draws of `kind` ("bits", "uniform" with extra (lo, span), "normal" of JAX's `backend`) from the compiled
    kernel, or None when it is unavailable here (the caller then draws eagerly). The first call per kind and device
    type compiles (timed in compiled_status) and checks itself against the eager path."""
    kind = "normal_gpu" if kind == "normal" and J.check_backend(backend) == "gpu" else kind
    tag = f"{kind}/{keys.device.type}"
    if tag in _failures:
        return None
    if tag not in _first_call_seconds:
        with _lock:
            if tag in _failures:
                return None
            if tag not in _first_call_seconds:
                t0 = time.perf_counter()
                try:
                    problem = _probe(kind, keys.device, extra)
                except Exception as err:  # noqa: BLE001 - any compile failure means: stay eager
                    problem = f"{type(err).__name__}: {(str(err).strip().splitlines() or [''])[0][:200]}"
                if problem is not None:
                    _fail(tag, problem)
                    return None
                _first_call_seconds[tag] = time.perf_counter() - t0
    return _run(kind, keys, n, extra)
