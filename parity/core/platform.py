"""The reference's platform for a command line, shared by every suite and by `python -m parity record`: resolved
from the --reference-platform / --reference-precision request and checked before any work. parity's one door to
jax_reference.platform (PlatformError: JAX sees no GPU where one is asked for).
"""
from __future__ import annotations

# PlatformError: callers'; enable_compile_cache: every live reference's (the LM's, int8's, CartPole's)
from jax_reference.platform import PlatformError, enable_compile_cache, normals_available, resolve  # noqa: F401
from spec.platform import ReferencePlatform


def platform_for(request, gpu: bool = False) -> ReferencePlatform:
    """The reference's platform for a command line's request (spec.platform.PlatformRequest), checked before any
    work: ValueError (exit 2) where it cannot run here (a GPU JAX does not see, GPU normals without their table)."""
    platform = resolve(request, gpu)
    if not normals_available(platform):
        raise ValueError(f"--reference-platform {request.platform}: JAX's {platform.normals.upper()} normals on "
                         f"{platform.backend} need jax_reference/normals.py's table, which this checkout lacks")
    return platform
