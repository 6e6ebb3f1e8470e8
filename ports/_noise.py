"""Protocol noise dicts as plain numpy: rows of chosen members, equality, the parameter shapes they imply."""
from __future__ import annotations

from typing import Mapping

import numpy as np


def select(noise: Mapping, members) -> dict:
    """The rows of `members` of a per-member noise dict {weight: (A, B), bias: eps}."""
    idx = np.asarray(members, dtype=np.int64)
    return {k: tuple(np.asarray(x)[idx] for x in v) if isinstance(v, tuple) else np.asarray(v)[idx]
            for k, v in noise.items()}


def same_noise(a: Mapping | None, b: Mapping | None) -> bool:
    """Whether two noise dicts hold the same numbers (is the noise a port is told the noise it drew?)."""
    if a is None or b is None or set(a) != set(b):
        return False
    for k in a:
        pa, pb = (a[k], b[k]) if isinstance(a[k], tuple) else ((a[k],), (b[k],))
        if len(pa) != len(pb) or not all(np.array_equal(np.asarray(x), np.asarray(y)) for x, y in zip(pa, pb)):
            return False
    return True


def noise_shapes(noise: Mapping) -> dict[str, tuple]:
    """Parameter shapes implied by a noise dict (every weight's bias included, noisy or not)."""
    shapes = {}
    for k, v in noise.items():
        if isinstance(v, tuple):
            shapes[k] = (v[0].shape[1], v[1].shape[1])
            shapes.setdefault(k.replace(".weight", ".bias"), (v[0].shape[1],))
        else:
            shapes[k] = tuple(v.shape[1:])
    return shapes
