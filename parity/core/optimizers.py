"""optax's sgd, adam and adamw in numpy float32 at optax's defaults, as the reference's noiser drives them: the
solver input -(g sqrt(N)), the update, and the step applied. Shared by the CartPole replay (parity.mlp.numpy_reference)
and the tree suite's step diagnosis (parity.tree.base.NumpyOptimizers).
"""
from __future__ import annotations

from typing import NamedTuple

import numpy as np

F32 = np.float32


ADAM = {"b1": 0.9, "b2": 0.999, "eps": 1e-8}      # optax.adam / adamw defaults
ADAMW_DECAY = 1e-4                                 # optax.adamw's default weight_decay
OPTIMIZERS = ("sgd", "adam", "adamw")              # jax_reference.train.SOLVERS


def solver_input(g: np.ndarray, n: int) -> np.ndarray:
    """What the noiser hands optax: -(g * sqrt(N)) in float32."""
    return (-(np.asarray(g, F32) * np.sqrt(F32(n)))).astype(F32)


class OptState(NamedTuple):
    """An optax solver's state as plain numpy: adam's step count and moments (empty for sgd)."""

    optimizer: str
    count: int
    mu: dict
    nu: dict


def optimizer_init(optimizer: str, params: dict) -> OptState:
    if optimizer not in OPTIMIZERS:
        raise ValueError(f"unknown optimizer {optimizer!r}; known: {', '.join(OPTIMIZERS)}")
    zeros = {} if optimizer == "sgd" else {k: np.zeros_like(v, F32) for k, v in params.items()}
    return OptState(optimizer, 0, zeros, {k: v.copy() for k, v in zeros.items()})


def optimizer_update(state: OptState, direction: dict, params: dict, lr: float) -> tuple[dict, OptState]:
    """optax's updates for `direction` (the solver input) at learning rate lr: sgd -lr d; adam -lr m_hat /
    (sqrt(v_hat) + eps); adamw adds weight_decay * params before the -lr scale."""
    lr = F32(lr)
    if state.optimizer == "sgd":
        return {k: (-lr * np.asarray(d, F32)).astype(F32) for k, d in direction.items()}, state
    b1, b2, eps = F32(ADAM["b1"]), F32(ADAM["b2"]), F32(ADAM["eps"])
    count = state.count + 1
    mu = {k: ((F32(1) - b1) * d + b1 * state.mu[k]).astype(F32) for k, d in direction.items()}
    nu = {k: ((F32(1) - b2) * np.square(d) + b2 * state.nu[k]).astype(F32) for k, d in direction.items()}
    c1, c2 = F32(1) - b1 ** F32(count), F32(1) - b2 ** F32(count)
    updates = {k: ((mu[k] / c1) / (np.sqrt(nu[k] / c2) + eps)).astype(F32) for k in direction}
    if state.optimizer == "adamw":
        updates = {k: (u + F32(ADAMW_DECAY) * np.asarray(params[k], F32)).astype(F32) for k, u in updates.items()}
    return {k: (-lr * u).astype(F32) for k, u in updates.items()}, OptState(state.optimizer, count, mu, nu)


def optimizer_apply(params: dict, state: OptState, grads: dict, n: int, lr: float) -> tuple[dict, OptState]:
    """The noiser's solver step on a given gradient (ascent, before sqrt(N)), applied: params + updates."""
    direction = {k: solver_input(g, n) for k, g in grads.items()}
    updates, state = optimizer_update(state, direction, params, lr)
    return {k: (np.asarray(params[k], F32) + updates[k]).astype(F32) for k in params}, state
