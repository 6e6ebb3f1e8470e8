"""JAX's float32 normals as either backend draws them, so the reference can draw a GPU's normals on a CPU (and back).

jax.random.normal turns a draw's 32 bits into a float32 normal through its mantissa bits >> 9 alone, and XLA's CPU
and CUDA code round that normal differently (4.7% of the 2^23 values, 1-3 ULP: spec.jax_rng's two sets of steps).
`normal_table(backend)` evaluates spec.jax_rng's steps for every mantissa in numpy (spec.numpy_normal: float32 steps
carried exactly in float64); `normal(key, shape, dtype, backend)` is jax.random.normal itself where `backend` is the
one JAX runs on, and otherwise jax.random.bits gathered through that backend's table (the same bits on both).
"""
from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np

from spec import jax_rng as J
from spec.numpy_normal import normal_of_mantissa

__all__ = ["normal_table", "normal", "jax_backend"]

_BLOCK = 1 << 20                                 # mantissas per numpy pass (bounds the float64 temporaries)


@functools.lru_cache(maxsize=None)
def normal_table(backend: str) -> np.ndarray:
    """(2^23,) float32, read-only: the normal JAX draws on `backend` ("cpu", or "gpu": an NVIDIA GPU) for every
    mantissa bits >> 9, from spec.jax_rng's steps in numpy (about 5 s, once per process and backend)."""
    J.check_backend(backend)
    table = np.empty(J.N_MANTISSAS, np.float32)
    for start in range(0, J.N_MANTISSAS, _BLOCK):
        table[start:start + _BLOCK] = normal_of_mantissa(np.arange(start, start + _BLOCK, dtype=np.int64), backend)
    table.flags.writeable = False
    return table


def jax_backend() -> str:
    """Whose normals jax.random.normal draws here by default: "cpu", "gpu" on an NVIDIA GPU, else the platform's name
    (e.g. "rocm", "tpu": normals spec.jax_rng does not know)."""
    platform = jax.devices()[0].platform
    return "gpu" if platform == "cuda" else platform


@functools.lru_cache(maxsize=None)
def _device_table(backend: str) -> jax.Array:
    """normal_table(backend) as a concrete device array, even when the first draw is traced under jit (else the cache
    would keep a tracer that leaks into later calls)."""
    with jax.ensure_compile_time_eval():
        return jnp.asarray(normal_table(backend))


def normal(key, shape=(), dtype=jnp.float32, backend: str | None = None) -> jax.Array:
    """jax.random.normal(key, shape, dtype) as JAX's `backend` draws it (None: the backend JAX runs on, i.e.
    jax.random.normal itself). Another backend's normals are float32 only: jax.random.bits(key, shape) >> 9
    gathered through normal_table(backend), so the bits and hence the draws' layout are jax.random's."""
    if backend is None or backend == jax_backend():
        return jax.random.normal(key, shape, dtype)
    J.check_backend(backend)
    if jnp.dtype(dtype) != jnp.float32:
        raise ValueError(f"{backend}'s normals are float32 only (spec.jax_rng); got dtype {jnp.dtype(dtype)}")
    shape = tuple(int(n) for n in np.atleast_1d(shape))                               # an int n: (n,)
    if not jax.config.jax_threefry_partitionable:
        return _table_normal(key, shape, backend)
    size = math.prod(shape)                           # a shape's draw is a longer flat draw's first entries
    return _table_normal(key, (J.size_bucket(size),), backend)[:size].reshape(shape)


@functools.partial(jax.jit, static_argnums=(1, 2))
def _table_normal(key, shape: tuple, backend: str) -> jax.Array:
    """normal's table path, jitted once per backend and flat length, a power of two (op by op, each draw was a few
    small compiles; per shape, each leaf's own compile)."""
    index = jax.random.bits(key, shape, jnp.uint32) >> 9
    if jax.default_backend() == "cpu":
        return _host_gather(backend, index)
    return _device_table(backend)[index]


def _host_gather(backend: str, index: jax.Array) -> jax.Array:
    """normal_table(backend)[index] on the host (a pure callback), so that a jitted draw does not carry the 32 MiB
    table as a constant: every executable drawing them would embed it, and the persistent compile cache compress it
    (about half a second per executable). The same values as the device gather: the table's entries, moved."""
    table = normal_table(backend)
    return jax.pure_callback(lambda i: table[np.asarray(i)], jax.ShapeDtypeStruct(index.shape, jnp.float32), index,
                             vmap_method="expand_dims")
