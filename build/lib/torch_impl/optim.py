"""Optimizers with optax's semantics and defaults, as pure (init, update) pairs over dicts of tensors.

`update(grads, state, params, lr) -> (updates, state)`: grads are descent gradients (the ES hands over
-(g * sqrt(N))), the updates are added to the params (optax.apply_updates), and `lr` is this epoch's
learning rate (a schedule lives in the caller). Everything stays float32.
"""
from __future__ import annotations

from typing import Callable, NamedTuple

import torch

Tree = dict[str, torch.Tensor]


class Optimizer(NamedTuple):
    init: Callable[[Tree], object]
    update: Callable[[Tree, object, Tree, float], tuple[Tree, object]]


class AdamState(NamedTuple):
    count: int       # steps taken (optax: int32 counter)
    mu: Tree         # first moment
    nu: Tree         # second moment


def _scalar32(value: float, like: torch.Tensor) -> torch.Tensor:
    """A Python number as a float32 scalar on the tensor's device (jax's weak-typed scalars act so)."""
    return torch.tensor(value, dtype=torch.float32, device=like.device)


def _pow32(decay: float, count: int, like: torch.Tensor) -> torch.Tensor:
    """float32(decay) ** count rounded once to float32 (optax's `decay**count`; XLA's pow agrees to <= 1 ULP)."""
    base = float(torch.tensor(decay, dtype=torch.float32))
    return _scalar32(base ** count, like)


def sgd(momentum: float | None = None) -> Optimizer:
    """optax.sgd(lr) without momentum: updates = -lr * g."""
    if momentum is not None:
        raise ValueError("sgd with momentum is not part of the reference; use momentum=None")

    def init(params: Tree) -> tuple:
        return ()

    def update(grads: Tree, state: tuple, params: Tree, lr: float) -> tuple[Tree, tuple]:
        return {k: -_scalar32(lr, g) * g for k, g in grads.items()}, state

    return Optimizer(init, update)


def adam(b1: float = 0.9, b2: float = 0.999, eps: float = 1e-8, eps_root: float = 0.0,
         weight_decay: float | None = None) -> Optimizer:
    """optax.adam (weight_decay None) or optax.adamw (decoupled: -lr * (adam direction + wd * param))."""

    def init(params: Tree) -> AdamState:
        return AdamState(0, {k: torch.zeros_like(p) for k, p in params.items()},
                         {k: torch.zeros_like(p) for k, p in params.items()})

    def update(grads: Tree, state: AdamState, params: Tree, lr: float) -> tuple[Tree, AdamState]:
        count = min(state.count + 1, 2**31 - 1)   # optax's safe_increment of an int32
        mu, nu, updates = {}, {}, {}
        for k, g in grads.items():
            mu[k] = _scalar32(1 - b1, g) * g + _scalar32(b1, g) * state.mu[k]
            nu[k] = _scalar32(1 - b2, g) * (g * g) + _scalar32(b2, g) * state.nu[k]
            mu_hat = mu[k] / (1 - _pow32(b1, count, g))
            nu_hat = nu[k] / (1 - _pow32(b2, count, g))
            direction = mu_hat / (torch.sqrt(nu_hat + _scalar32(eps_root, g)) + _scalar32(eps, g))
            if weight_decay is not None:
                direction = direction + _scalar32(weight_decay, g) * params[k]
            updates[k] = -_scalar32(lr, g) * direction
        return updates, AdamState(count, mu, nu)

    return Optimizer(init, update)


def adamw(b1: float = 0.9, b2: float = 0.999, eps: float = 1e-8, eps_root: float = 0.0,
          weight_decay: float = 1e-4) -> Optimizer:
    """optax.adamw defaults: adam plus decoupled weight decay 1e-4."""
    return adam(b1, b2, eps, eps_root, weight_decay=weight_decay)


# knob optimizer -> constructor with optax's defaults
OPTIMIZERS: dict[str, Callable[[], Optimizer]] = {
    "sgd": sgd,
    "adam": adam,
    "adamw": adamw,
}


def make_optimizer(name: str) -> Optimizer:
    """The optimizer a knob names, with optax's defaults."""
    if name not in OPTIMIZERS:
        raise ValueError(f"unknown optimizer {name!r}; allowed: {', '.join(OPTIMIZERS)}")
    return OPTIMIZERS[name]()


def apply_updates(params: Tree, updates: Tree) -> Tree:
    """optax.apply_updates: params + updates, leaf by leaf."""
    return {k: p + updates[k].to(p.dtype) for k, p in params.items()}
