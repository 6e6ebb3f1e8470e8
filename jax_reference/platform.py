"""Where the reference runs: `resolve` turns the suites' --reference-platform / --reference-precision into a
spec.platform.ReferencePlatform (JAX's backend and device, what `default` precision means there, whose normals),
and `scope` runs the reference's calls there: on that device, at that precision, under jax_reference.emulation
for gpu-sim. Nothing outside a `scope` is touched: no global JAX setting changes, but for the persistent compile
cache that `enable_compile_cache` turns on for a live reference (a cache changes no value).
"""
from __future__ import annotations

import contextlib
from typing import Iterator

import jax

from jax_reference import emulation
from spec.platform import PlatformRequest, ReferencePlatform, compile_cache_settings, resolve_precision


def enable_compile_cache() -> None:
    """Keep JAX's compiled executables on disk between runs, so a live reference's second run at a size loads what
    the first compiled (the LM suite at selftest: 27.9 s, then 11.3 s; int8 21.3 s, then 8.1 s). Called before the
    reference's first compile. A directory already configured ($JAX_COMPILATION_CACHE_DIR) is kept; else
    spec.platform.compile_cache_settings (~/.cache/eggroll-parity/jax, or under $XDG_CACHE_HOME)."""
    if jax.config.jax_compilation_cache_dir:
        return
    for name, value in compile_cache_settings().items():
        jax.config.update(name, value)


class PlatformError(ValueError):
    """The platform asked for does not exist here (a GPU JAX cannot see)."""


def _device(request: PlatformRequest, gpu: bool):
    """The JAX device the reference runs on: JAX's default (auto), its CPU (cpu, gpu-sim) or its GPU (gpu=True)."""
    if gpu:
        try:
            return jax.devices("gpu")[0]
        except RuntimeError:
            raise PlatformError("JAX sees no GPU on this machine") from None
    if request.platform in ("cpu", "gpu-sim"):
        return jax.devices("cpu")[0]
    return jax.devices()[0]


def resolve(request: PlatformRequest = PlatformRequest(), gpu: bool = False) -> ReferencePlatform:
    """The platform `request` means on this machine (gpu=True: JAX's GPU, as `parity record --device cuda` asks)."""
    device = _device(request, gpu)
    backend = "gpu" if device.platform in ("gpu", "cuda", "rocm") else device.platform
    simulated = request.platform == "gpu-sim"
    cc = getattr(device, "compute_capability", None) if backend == "gpu" else None
    precision = resolve_precision(backend, cc, request.precision, jax.config.jax_default_matmul_precision, simulated)
    return ReferencePlatform(backend=backend, device=device.device_kind,
                             compute_capability=None if cc is None else str(cc),
                             simulated=simulated, requested=request.platform, precision_requested=request.precision,
                             precision=precision, normals="gpu" if simulated or backend == "gpu" else "cpu")


def normals_available(platform: ReferencePlatform) -> bool:
    """Whether `platform`'s normals can be drawn here: JAX's own on its backend, else through
    jax_reference.normals' table (absent: False)."""
    if platform.normals == platform.backend:
        return True
    import importlib.util
    return importlib.util.find_spec("jax_reference.normals") is not None


@contextlib.contextmanager
def scope(platform: ReferencePlatform) -> Iterator[None]:
    """The reference's calls inside run on `platform`: its device, `highest` pinned where asked, and emulated
    what JAX on that device does not do itself: TF32 operands on the CPU (gpu-sim), another backend's normals."""
    with contextlib.ExitStack() as stack:
        if platform.backend == "cpu" and jax.default_backend() != "cpu":
            stack.enter_context(jax.default_device(jax.devices("cpu")[0]))
        if platform.precision_requested == "highest":
            stack.enter_context(jax.default_matmul_precision("highest"))
        tf32 = platform.tf32 and platform.backend == "cpu"
        normals = "native" if platform.normals == platform.backend else platform.normals
        if tf32 or normals != "native":
            stack.enter_context(emulation.emulating(tf32=tf32, normals=normals))
        yield
