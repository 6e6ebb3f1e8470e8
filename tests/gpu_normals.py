"""JAX's GPU normals for the tests of the emulated GPU reference (gpu-sim), without a GPU.

`jax_reference.normals` (JAX's GPU normal table, derived in torch and numpy by the normals work) when this checkout
has it; else a stand-in built from today's CPU table and the measured difference of the GPU's
(`../shared/data/jax-gpu-normal/delta.npz` beside the checkout, or $EGGROLL_JAX_GPU_DELTA), checked against the
GPU table's SHA-256 recorded with it. `normals_module()` is None when neither is at hand (the tests skip, saying so).
"""
from __future__ import annotations

import hashlib
import importlib.util
import os
import sys
import types
from pathlib import Path

import numpy as np

GPU_SHA256 = "b950f50d83059c9788b630f2884bef7cde3c78afe7bdcc97a6c028296e86acff"   # its README
DELTA = Path(os.environ.get("EGGROLL_JAX_GPU_DELTA") or
             Path(__file__).resolve().parents[2] / "shared" / "data" / "jax-gpu-normal" / "delta.npz")
WHY_MISSING = (f"no jax_reference/normals.py in this checkout and no GPU normal delta at {DELTA} "
               "(../shared beside the checkout, or $EGGROLL_JAX_GPU_DELTA)")


def _cpu_table() -> np.ndarray:
    import jax
    import jax.numpy as jnp
    from jax_reference import int8 as q
    with jax.default_device(jax.devices("cpu")[0]):
        return np.asarray(jax.random.normal(jax.random.key(0, impl=q._PATTERNS), (2 ** 23,), jnp.float32))


def _stand_in() -> types.ModuleType:
    import jax
    import jax.numpy as jnp
    d = np.load(DELTA)
    mant, delta = d["mantissa"].astype(np.uint32), d["bits_delta"].astype(np.int32)
    order = np.argsort(mant)
    mant, delta = mant[order], delta[order]
    cpu = _cpu_table()
    gpu = cpu.view(np.int32).copy()
    gpu[mant] += delta
    gpu = gpu.view(np.float32)
    assert hashlib.sha256(gpu.astype("<f4").tobytes()).hexdigest() == GPU_SHA256, "delta.npz is not the GPU table's"
    tables = {"cpu": cpu, "gpu": gpu}

    def normal_table(backend: str) -> np.ndarray:
        return tables[backend]

    def normal(key, shape, dtype, backend):
        """JAX's own normal on its backend; else its CPU normal of the same bits moved by the GPU's delta."""
        if backend == jax.default_backend() or backend == "cpu" and jax.default_backend() == "cpu":
            return jax.random.normal(key, shape, dtype)
        if backend != "gpu" or jax.default_backend() != "cpu":
            raise NotImplementedError("the stand-in draws GPU normals on JAX's CPU backend only")
        m = jax.random.bits(key, shape, jnp.uint32) >> jnp.uint32(9)
        idx = jnp.clip(jnp.searchsorted(jnp.asarray(mant), m), 0, mant.size - 1)
        hit = jnp.asarray(mant)[idx] == m
        base = jax.lax.bitcast_convert_type(jax.random.normal(key, shape, jnp.float32), jnp.int32)
        return jax.lax.bitcast_convert_type(base + jnp.where(hit, jnp.asarray(delta)[idx], 0), jnp.float32)

    module = types.ModuleType("jax_reference.normals")
    module.__spec__ = importlib.util.spec_from_loader("jax_reference.normals", loader=None)
    module.normal_table, module.normal = normal_table, normal
    module.STAND_IN = True
    return module


def normals_module() -> types.ModuleType | None:
    """jax_reference.normals (the real one, or the stand-in, installed once), or None."""
    if "jax_reference.normals" in sys.modules:
        return sys.modules["jax_reference.normals"]
    if importlib.util.find_spec("jax_reference.normals") is not None:
        return importlib.import_module("jax_reference.normals")
    if not DELTA.exists():
        return None
    module = _stand_in()
    sys.modules["jax_reference.normals"] = module
    import jax_reference
    jax_reference.normals = module
    return module
