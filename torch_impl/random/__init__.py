"""JAX-compatible random numbers in torch, the public API: keys, bits, uniforms and normals equal to jax.random's,
bit for bit.

A key is an int64 tensor of shape (2,) holding the two uint32 words of `jax.random.key_data(jax.random.key(seed))`;
every function also takes a batch of keys (..., 2) and puts the batch dims first in its result. The definition is
eager.py's plain torch (its docstring states the conventions and what was checked against JAX). Each draw goes to
the first backend of backends.TABLE that takes it, every one bit-identical to the definition: on the CPU the
project's C generator when it is built (native.py, tests/torch_impl/random/test_native.py), on CUDA one fused Triton kernel
when Triton is installed (triton_kernel.py, tests/torch_impl/random/test_triton.py), else the 2^23-entry table for large normal
draws, else the formula. Uniforms are the dispatched bits, shifted and put through one multiply-add. Env
TORCH_IMPL_RNG picks one backend; `status()` says which drew and why. No jax import anywhere.

Package: eager (the definition: the formula and table backends), native (the C backend), triton_kernel (the Triton
backend), backends (the table, the rule, the switch, the status and the self-check).
"""
from __future__ import annotations

import torch

from spec import jax_rng as J
from torch_impl.random import backends as B
from torch_impl.random import eager as E
from torch_impl.random import triton_kernel
from torch_impl.random.backends import SWITCH, Status, status, switch
from torch_impl.random.eager import as_key, key, normal_from_mantissa, normal_table, split, to_uint32

__all__ = ["key", "fold_in", "split", "bits", "uniform", "normal", "as_key", "to_uint32", "normal_from_mantissa",
           "normal_table", "member_normals", "lut_at", "status", "Status", "switch", "SWITCH"]


def fold_in(keys: torch.Tensor, data) -> torch.Tensor:
    """eager.fold_in (jax.random.fold_in), its hash through the backend the rule picks (C for CPU keys when built)."""
    if not isinstance(keys, torch.Tensor):                         # E.fold_in refuses it, saying why
        return E.fold_in(keys, data)
    return E.fold_in(keys, data, B.hash_pairs(keys.device))


def bits(keys: torch.Tensor, shape=()) -> torch.Tensor:
    """Random 32-bit words (*batch, *shape) as int64 holding uint32 values, as jax.random.bits (uint32).

    Element j (row-major) is y0 ^ y1 of threefry(key; hi32(j), lo32(j)). Compare with numpy via to_uint32.
    Drawn by the backend the rule picks (backends.py); every one gives the same words.
    """
    E._key_words(keys)
    return B.draw("bits", keys, E._shape_tuple(shape))


def uniform(keys: torch.Tensor, shape=(), minval: float = 0.0, maxval: float = 1.0) -> torch.Tensor:
    """float32 uniforms in [minval, maxval) (*batch, *shape), as jax.random.uniform:
    max(lo, fma(f, hi - lo, lo)) with f = bitcast((bits >> 9) | 0x3F800000) - 1 and lo, hi in float32, on bits()."""
    lo, span = E.float32_bounds(minval, maxval)
    return E.uniform_of_bits(bits(keys, shape), lo, span)


def normal(keys: torch.Tensor, shape=(), table: bool | None = None, backend: str = "cpu") -> torch.Tensor:
    """Standard normals (*batch, *shape) float32, equal to jax.random.normal(key, shape) on JAX's `backend`: "cpu"
    (XLA's CPU code) or "gpu" (XLA's CUDA code on an NVIDIA GPU: the same draws, 4.7% of the normals 1-3 ULP apart).

    Drawn by the backend the rule picks (backends.py): C for CPU keys when built, Triton for CUDA keys when
    installed, else the table of all 2^23 values (built once, 32 MB per device) for large requests or once it
    exists, else the formula; all give identical bits. table=True takes the table over the formula whatever the
    request's size (a caller that draws every epoch, such as the tree ES, pays its one-off build once and saves the
    formula's cost on every later call), table=False the formula; None decides by size as above.
    """
    backend = J.check_backend(backend)
    E._key_words(keys)
    return B.draw("normal", keys, E._shape_tuple(shape), table, backend)


def member_normals(slice_keys: torch.Tensor, generation: int, n_draws: int, n: int, device: str | torch.device,
                   backend: str = "cpu") -> torch.Tensor | None:
    """(n_draws, S, n) float32: normal(fold_in(fold_in(k_s, generation), p), n) for draw p and slice key k_s of
    slice_keys (S, 2) (keys.py's and tree/keys.py's member draws) in one Triton launch on a CUDA device, the keys
    folded in the kernel; None where the rule does not pick the Triton backend (the caller folds and draws)."""
    device = torch.device(device)
    if not (0 <= generation < (1 << 32) and 1 <= n_draws < (1 << 32)):
        return None
    chosen = B.choose("member_normal", device, n, n_draws * slice_keys.shape[0], None, backend)
    if chosen.name != "triton":
        return None
    return chosen.draw("member_normal", slice_keys.to(device), n, backend, generation=generation, n_draws=n_draws)


def lut_at(key_: torch.Tensor, counters: torch.Tensor, lut: torch.Tensor) -> torch.Tensor | None:
    """lut[bits(j) >> 9] for CUDA counters j under one key (2,): the integer port's noise-table entries in one Triton
    launch, or None where the rule does not pick the Triton backend for bits (its hash is checked as theirs)."""
    if B.choose("bits", counters.device).name != "triton":
        return None
    return triton_kernel.launch("lut_at", key_.reshape(1, 2).to(counters.device), 0, counters=counters, lut=lut)
