"""Optimizer state told from a gradient scale: which sgd with momentum (nesterov or not) and weight decay, on the
reference's gradient times a constant c, reproduces a port's steps over several epochs.

One step from a fresh optimizer cannot tell them apart: torch's nesterov momentum mu makes the first step (1 + mu)
times plain sgd's, a "1.1x gradient scale". Over epochs the momentum buffer carries earlier gradients into later
steps, and weight decay adds a term along the params, so several steps separate them.

The model (torch.optim.SGD with dampening 0; optax.sgd(momentum, nesterov), whose `trace` is the same recursion, with
optax.add_decayed_weights before it), in the parameter-change space of the reference's ascent step s_e = lr sqrt(N)
g_e (g_e the reference's gradient at epoch e, on the params p_e before it):
  G_e = -c s_e / lr + wd p_e                  the port's loss gradient with coupled weight decay
  buf_e = mu buf_{e-1} + G_e                   (buf_{-1} = 0)
  step_e = G_e + mu buf_e (nesterov), buf_e (else);  delta_e = -lr step_e
so delta_e = sum_{k<=e} w_ek (c s_k - lr wd p_k) with w_ek = mu^(e-k) (plain), or w_ee = 1 + mu and
w_ek = mu^(e-k+1) for k < e (nesterov). Decoupled weight decay (p -= lr wd p beside the step, as AdamW does) puts
-lr wd p_e alone. For a fixed mu the model is linear in (c, wd): weighted least squares (weight 1/b, b the step's
bound per entry), mu by a grid on [0, 0.99] and a bounded scalar search around its best point.

Identification: epoch 0 gives c (1 + mu) and wd (1 + mu) (nesterov) or c and wd; epoch 1 the ratio of g_0's weight
to g_1's (mu, or mu^2 / (1 + mu) with nesterov: the two conventions agree on two epochs); epoch 2 separates them
(mu'^2 against mu^3 / (1 + mu)), so 3 epochs identify (c, mu, wd) and nesterov (MIN_EPOCHS).

Verified, not fitted, decides: the model's steps reproduce the port's at every epoch and entry within the model's
own bound, sum_k |w_ek| (max(|c|, 1) b_k + gamma(2e + 5) |c s_k - lr wd p_k|): b_k the lockstep's step bound at
epoch k (both gradients' float32 bounds, which scale with c, and both steps' update_bound, whose rounding of the
params does not), carried through the buffer by the same weights, plus the port's float32 buffer arithmetic (two
roundings per epoch's buffer update, the nesterov add, the lr product and the decay product). No chance enters: a
verified model has no false-alarm rate; one that is not verified is never named.
"""
from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np

from parity.core.tolerances import gamma

MIN_EPOCHS = 3          # epochs that identify (c, mu, wd) and nesterov (the module docstring)
MU_GRID = np.linspace(0.0, 0.99, 100)


class MomentumFit(NamedTuple):
    """A fitted sgd with momentum and weight decay on c x the reference's gradient, and how it reproduces the port."""

    mu: float
    nesterov: bool
    decoupled: bool
    wd: float
    c: float
    ratio: float          # max |port step - model step| / the model's bound, every epoch and entry (<= 1: verified)

    @property
    def verified(self) -> bool:
        return self.ratio <= 1


def weights(mu: float, e: int, nesterov: bool) -> np.ndarray:
    """w_ek for k = 0..e (the module docstring): how much of epoch k's gradient step e carries."""
    w = mu ** np.arange(e, -1, -1, dtype=np.float64)
    if nesterov:
        w = w * mu
        w[-1] = 1 + mu
    return w


def _columns(mu: float, nesterov: bool, decoupled: bool, unit: np.ndarray, params: np.ndarray, lr: float):
    """(A, P) (E, K): the model's step is c A - lr wd P."""
    A, P = np.empty_like(unit), np.empty_like(params)
    for e in range(unit.shape[0]):
        w = weights(mu, e, nesterov)
        A[e] = w @ unit[: e + 1]
        P[e] = params[e] if decoupled else w @ params[: e + 1]
    return A, P


def _solve(mu, nesterov, decoupled, steps, unit, params, bounds, lr, decay: bool):
    """(c, wd, weighted residual sum of squares) at a fixed mu."""
    A, P = _columns(mu, nesterov, decoupled, unit, params, lr)
    X = np.stack([(A / bounds).ravel()] + ([(-lr * P / bounds).ravel()] if decay else []), 1)
    y = (steps / bounds).ravel()
    coef = np.linalg.lstsq(X, y, rcond=None)[0]
    rss = float(np.sum((y - X @ coef) ** 2))
    return float(coef[0]), float(coef[1]) if decay else 0.0, rss


def model_steps(f: MomentumFit, unit: np.ndarray, params: np.ndarray, lr: float) -> np.ndarray:
    A, P = _columns(f.mu, f.nesterov, f.decoupled, unit, params, lr)
    return f.c * A - lr * f.wd * P


def model_bound(f: MomentumFit, unit: np.ndarray, params: np.ndarray, bounds: np.ndarray, lr: float) -> np.ndarray:
    """The model's bound per epoch and entry (the module docstring)."""
    out = np.empty_like(unit)
    for e in range(unit.shape[0]):
        w = np.abs(weights(f.mu, e, f.nesterov))
        g = np.abs(f.c * unit[: e + 1] - (0.0 if f.decoupled else lr * f.wd) * params[: e + 1])
        out[e] = w @ (max(abs(f.c), 1.0) * bounds[: e + 1]) + gamma(2 * e + 5) * (w @ g)
        if f.decoupled:
            out[e] += gamma(2) * lr * abs(f.wd) * np.abs(params[e])
    return out


def fit(steps: np.ndarray, unit: np.ndarray, params: np.ndarray, bounds: np.ndarray, lr: float,
        momentum: bool = True, decay: bool = True, nesterov: bool = False, decoupled: bool = False) -> MomentumFit:
    """The best (c, mu, wd) of one convention for the port's steps (E, K) from epoch 0 on: unit the reference's sgd
    steps s_e, params the port's params before each step, bounds the step bound per entry (all (E, K) float64);
    momentum / decay False hold mu / wd at 0. Its ratio says whether it is verified."""
    from scipy.optimize import minimize_scalar
    args = (nesterov, decoupled, steps, unit, params, bounds, lr, decay)
    if momentum:
        rss = [_solve(mu, *args)[2] for mu in MU_GRID]
        i = int(np.argmin(rss))
        lo, hi = MU_GRID[max(i - 1, 0)], MU_GRID[min(i + 1, len(MU_GRID) - 1)]
        best = minimize_scalar(lambda m: _solve(m, *args)[2], bounds=(lo, hi), method="bounded",
                               options={"xatol": 1e-10})
        mu = float(best.x) if best.fun <= rss[i] else float(MU_GRID[i])
    else:
        mu = 0.0
    c, wd, _ = _solve(mu, *args)
    f = MomentumFit(mu, nesterov and momentum, decoupled and decay, wd, c, math.inf)
    worst = np.abs(steps - model_steps(f, unit, params, lr)) / np.maximum(model_bound(f, unit, params, bounds, lr),
                                                                          1e-300)
    return f._replace(ratio=float(np.max(worst)))


def simplest(steps: np.ndarray, unit: np.ndarray, params: np.ndarray, bounds: np.ndarray,
             lr: float) -> tuple[MomentumFit | None, list[MomentumFit]]:
    """(the first verified fit in order of unknowns: weight decay alone, momentum alone, both; the smallest ratio
    among those of one order; None when none is verified, every fit tried). A constant scale alone (mu = wd = 0) is
    the caller's (it names it in the optimizer-scale words)."""
    orders = [[dict(momentum=False, decay=True)],
              [dict(momentum=True, decay=False, nesterov=n) for n in (False, True)],
              [dict(momentum=True, decay=True, nesterov=n, decoupled=d) for n in (False, True) for d in (False, True)]]
    tried = []
    for order in orders:
        fits = [fit(steps, unit, params, bounds, lr, **kw) for kw in order]
        tried += fits
        ok = [f for f in fits if f.verified]
        if ok:
            return min(ok, key=lambda f: f.ratio), tried
    return None, tried


def words(f: MomentumFit) -> str:
    """'sgd with momentum 0.1 (nesterov) and weight decay 0.01' for a fit."""
    parts = []
    if f.mu > 0:
        parts.append(f"momentum {f.mu:.3g}" + (" (nesterov)" if f.nesterov else " (not nesterov)"))
    if f.wd != 0:
        parts.append(f"{'decoupled ' if f.decoupled else ''}weight decay {f.wd:.3g}")
    return "sgd with " + " and ".join(parts) if parts else "plain sgd"
