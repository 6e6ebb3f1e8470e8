"""The one switch that makes the reference compute as on another platform: TF32 matmul operands, another backend's
float32 normals. Off (the default), every function here is exactly the JAX call it wraps, so nothing moves.

The noiser's and the models' products (`matmul`, `einsum`) and every normal the reference draws (`normal`: init,
noise, the LM, int8's look-ups) go through here. `emulating(tf32=..., normals=...)` turns it on for the calls made
inside it only (the parity suite scopes it to the reference's calls: `jax_reference.platform.scope`); both settings
are JAX configuration states that take part in jit's cache key, so a function traced under one setting is never
reused under another.

- tf32: each matmul operand rounded to TF32 (lax.reduce_precision: 8 exponent bits, 10 mantissa bits, round to
  nearest even) before a float32 product, as JAX's default precision does on NVIDIA GPUs of compute capability 8.0+.
- normals "cpu" / "gpu": `jax_reference.normals.normal(key, shape, dtype, backend)`, JAX's float32 normal of that
  backend for the same threefry bits (its own on that backend, else its table); "native": `jax.random.normal`.
"""
from __future__ import annotations

import contextlib
from typing import Iterator

import jax
import jax.numpy as jnp
from jax import lax

TF32_EXPONENT_BITS, TF32_MANTISSA_BITS = 8, 10
NORMALS = ("native", "cpu", "gpu")


def _states():
    """(tf32, normals) as JAX configuration states in jit's cache key; None where this JAX offers none."""
    try:
        from jax._src import config as jax_config
        tf32 = jax_config.bool_state("eggroll_emulate_tf32", False, "round matmul operands to TF32 (jax_reference)",
                                     include_in_jit_key=True, include_in_trace_context=True)
        normals = jax_config.enum_state("eggroll_normals_backend", list(NORMALS), "native",
                                        "whose float32 normals jax_reference draws",
                                        include_in_jit_key=True, include_in_trace_context=True)
        return tf32, normals
    except (ImportError, AttributeError, TypeError, ValueError):     # another JAX: _Fallback below
        return None


class _Fallback:
    """The settings as plain values for a JAX without configuration states: jit's caches are cleared on a change."""

    def __init__(self, value):
        self.value = value

    @contextlib.contextmanager
    def __call__(self, value):
        old, self.value = self.value, value
        if old != value:
            jax.clear_caches()
        try:
            yield
        finally:
            if self.value != old:
                self.value = old
                jax.clear_caches()


_TF32, _NORMALS = _states() or (_Fallback(False), _Fallback("native"))


def tf32_on() -> bool:
    return bool(_TF32.value)


def normals_backend() -> str:
    """'native' (jax.random.normal on the backend it runs on), 'cpu' or 'gpu'."""
    return str(_NORMALS.value)


@contextlib.contextmanager
def emulating(tf32: bool = False, normals: str = "native") -> Iterator[None]:
    """Within: matmul operands rounded to TF32 (tf32) and the normals of backend `normals`."""
    if normals not in NORMALS:
        raise ValueError(f"normals must be one of {', '.join(NORMALS)}, got {normals!r}")
    with _TF32(bool(tf32)), _NORMALS(normals):
        yield


def tf32(x):
    """x rounded to TF32 (float32 storage, 10 mantissa bits); other dtypes (integer products) as they are."""
    x = jnp.asarray(x)
    if x.dtype != jnp.float32:
        return x
    return lax.reduce_precision(x, exponent_bits=TF32_EXPONENT_BITS, mantissa_bits=TF32_MANTISSA_BITS)


def matmul(a, b):
    """a @ b; under tf32, of the operands rounded to TF32."""
    if tf32_on():
        return tf32(a) @ tf32(b)
    return a @ b


def einsum(subscripts: str, *operands):
    """jnp.einsum; under tf32, of the operands rounded to TF32 (a contraction is a matmul on the GPU)."""
    if tf32_on():
        operands = tuple(tf32(o) for o in operands)
    return jnp.einsum(subscripts, *operands)


def normal(key, shape=(), dtype=None):
    """jax.random.normal(key, shape[, dtype]) (dtype None: JAX's default float), or another backend's normals of
    the same bits (normals 'cpu'/'gpu')."""
    backend = normals_backend()
    if backend == "native":
        return jax.random.normal(key, shape) if dtype is None else jax.random.normal(key, shape, dtype)
    from jax_reference import normals
    return normals.normal(key, shape, jnp.float32 if dtype is None else dtype, backend)

