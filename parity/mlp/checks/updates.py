"""Updates: the optimizer step and its learning-rate schedule over several epochs.

Both sides start from the same parameters; each epoch gets the reference's noise and a fresh shaped
fitness vector. The port runs `optimizer_step`; the reference runs its optax solver (the reference
run's optimizer and lr schedule) on the gradient the PORT computes (`gradient()`), so only the
optimizer and its schedule are compared here (the gradients check covers the estimate). Allowed:
per step u |p_new| + gamma_24 |update| on each side, accumulated over epochs; deterministic.
A mismatch is matched against optax sgd, adam and adamw, each also up to a fitted gradient scale (parity.core.optscale:
"adam on a gradient 1/sigma times the reference's", "sgd without the sqrt(N) factor"), and against a fitted
per-epoch lr factor.
"""
from __future__ import annotations

from typing import NamedTuple

import numpy as np

from parity.core import diagnose, optscale
from parity.core.repro import Var, step
from parity.core.tolerances import update_bound
from parity.core.verdict import Recorder, fmt, summarize

NAME = "updates"
MATCH = 1e-4   # an optimizer candidate reproduces the port's first update within this share of its largest entry


def _reference_chain(ctx, params0, grads_per_epoch, sigmas, **run_knobs):
    """The reference optimizer (optionally other run knobs) applied to the given gradients, epoch by epoch."""
    ref = ctx.reference.with_run_knobs(**run_knobs) if run_knobs else ctx.reference
    params, state = dict(params0), ref.optimizer_init(params0)
    chain = []
    for epoch, grads in enumerate(grads_per_epoch):
        params, state = ref.optimizer_apply(params, state, grads, ctx.cfg.pop, epoch)
        chain.append(params)
    return chain


class Measured(NamedTuple):
    ratios: tuple[float, ...]             # per epoch: max |params port - ref| / the accumulated bound
    update_norms: tuple[float, ...]       # per epoch: ||port's update|| / ||reference's||
    first_errors: dict[str, float]        # on a mismatch: optax optimizer -> how far its first update is
    lr_ratios: dict[int, float]           # ... and, same optimizer, update size per epoch / the reference's
    pop: int
    lr: float
    epochs: int
    optimizer: str
    lr_decay: float
    scale_fits: tuple = ()                # on a mismatch: parity.core.optscale.ScaleFit per optax optimizer (first update)
    sigma: float = 0.0


def _delta(chain, e: int, start) -> np.ndarray:
    """The parameter change of epoch e of a chain, flattened in float64."""
    before = start if e == 0 else chain[e - 1]
    return np.concatenate([(chain[e][k].astype(np.float64) - before[k]).ravel() for k in start])


def _port_chain(ctx, params0, sigmas, rng):
    """The port's own optimizer_step over the epochs, the gradients it computed, and its calls as repro steps
    (parity.core.repro.Step: optimizer_init, then one optimizer_step per epoch, arguments as the port receives them)."""
    shapes, n = ctx.shapes, ctx.cfg.pop
    steps = [step("optimizer_init", params0, out="state")]
    port_params, port_state = dict(params0), ctx.port.optimizer_init(params0)
    chain, grads = [], []
    for e, sigma in enumerate(sigmas):
        noise = ctx.reference.noise(shapes, ctx.seed, e, np.arange(n), n, sigma, ctx.cfg.rank)
        shaped = ctx.ref.shape_fitness(rng.standard_normal(n).astype(np.float32), 0)
        grads.append(ctx.port.gradient(noise, shaped, sigma, shapes))
        steps.append(step("optimizer_step", Var("params") if e else port_params, Var("state"), ctx.port.received(noise),
                          np.asarray(shaped, np.float32), float(sigma), int(e), out=("params", "state")))
        port_params, port_state = ctx.port.optimizer_step(port_params, port_state, noise, shaped, sigma, e, shapes)
        chain.append(port_params)
    return chain, grads, steps


def _allowed(params0, ref_chain) -> list[dict]:
    """Per epoch, {key: |port - ref| allowed}: one step's bound on each side, accumulated over the epochs."""
    allowed = {k: np.zeros(v.shape) for k, v in params0.items()}
    prev, out = params0, []
    for ref in ref_chain:
        allowed = {k: allowed[k] + 2 * update_bound(ref[k], ref[k].astype(np.float64) - prev[k]) for k in params0}
        out.append(allowed)
        prev = ref
    return out


def _ratios(params0, port_chain, ref_chain, allowed) -> list[float]:
    """Per epoch, the worst |port - ref| over its allowed difference."""
    return [max(float(np.max(np.abs(port[k].astype(np.float64) - ref[k]) / np.maximum(bound[k], 1e-300)))
                for k in params0) for port, ref, bound in zip(port_chain, ref_chain, allowed)]


def _witness_first_failure(ctx, ratios, steps, port_chain, ref_chain, allowed) -> None:
    """Hand the repro collector the port's calls up to the first epoch beyond its bound (optimizer_init and one
    optimizer_step per epoch) and that epoch's comparison."""
    e = next((i for i, r in enumerate(ratios) if r > 1), None)
    if e is not None:
        ctx.replay(f"epoch {e} N={ctx.cfg.pop}", steps[:e + 2], "params", port_chain[e], ref_chain[e], allowed[e],
                   "u |p| + gamma_24 |update| per step and side, accumulated over the epochs")


def _candidates(ctx, params0, port_chain, grads) -> tuple[dict[str, float], dict[int, float]]:
    """How far each optax optimizer's first update is from the port's; with the same optimizer, the ratio of
    update sizes per epoch (what an lr schedule changes)."""
    port_d0 = _delta(port_chain, 0, params0)
    errors = {}
    for opt in ("sgd", "adam", "adamw"):
        cand = _delta(_reference_chain(ctx, params0, grads[:1], None, optimizer=opt), 0, params0)
        errors[opt] = float(np.max(np.abs(port_d0 - cand)) / max(np.max(np.abs(cand)), 1e-30))
    ratios = {}
    if errors[ctx.reference.run.optimizer] < 1e-4:
        chain = _reference_chain(ctx, params0, grads, None)
        ratios = {e: float(np.linalg.norm(_delta(port_chain, e, params0)) / np.linalg.norm(_delta(chain, e, params0)))
                  for e in range(len(port_chain))}
    return errors, ratios


def measure(ctx) -> Measured:
    rng = ctx.rng("update fitness")
    params0 = {k: (v if k.endswith(".weight") else (0.1 * rng.standard_normal(v.shape)).astype(np.float32))
               for k, v in ctx.reference.init_params(ctx.shapes, ctx.seed).items()}
    sigmas = [ctx.reference.sigma_at(e) for e in range(ctx.sizes.update_epochs)]
    port_chain, grads, steps = _port_chain(ctx, params0, sigmas, rng)
    ref_chain = _reference_chain(ctx, params0, grads, sigmas)
    allowed = _allowed(params0, ref_chain)
    ratios = _ratios(params0, port_chain, ref_chain, allowed)
    _witness_first_failure(ctx, ratios, steps, port_chain, ref_chain, allowed)
    norms = [float(np.linalg.norm(_delta(port_chain, e, params0)) / np.linalg.norm(_delta(ref_chain, e, params0)))
             if np.linalg.norm(_delta(ref_chain, e, params0)) > 0 else float("nan") for e in range(len(ratios))]
    mismatch = any(r > 1 for r in ratios)
    errors, lr_ratios = _candidates(ctx, params0, port_chain, grads) if mismatch else ({}, {})
    fits = optscale.candidates(ctx.reference, ("sgd", "adam", "adamw"), params0, grads[0], port_chain[0], ctx.cfg.pop,
                               ctx.reference.lr_at(0), sigmas[0]) if mismatch else ()
    run = ctx.reference.run
    return Measured(tuple(ratios), tuple(norms), errors, lr_ratios, ctx.cfg.pop, ctx.cfg.lr, len(sigmas),
                    run.optimizer, run.lr_decay, fits, sigmas[0])


def _cause(m: Measured):
    """Which optimizer reproduces the port's first update, and which lr factor per epoch its later ones."""
    best = min(m.first_errors, key=m.first_errors.get)
    worst = f"first update differs from {m.optimizer}'s by {fmt(m.first_errors[m.optimizer])} of its largest entry"
    if m.first_errors[best] < MATCH and best != m.optimizer:
        return diagnose.optimizer_cause(best, m.optimizer, worst, scale_words(m, best))
    if m.lr_ratios:     # same optimizer at epoch 0: the schedule is what differs
        return diagnose.lr_schedule_cause(m.lr_ratios, m.lr_decay)
    fit = optscale.best_match(m.scale_fits, MATCH)
    if fit is not None:
        return diagnose.scaled_optimizer_cause(fit, m.optimizer, optscale.words(fit, m.sigma, m.pop), worst)
    return diagnose.optimizer_cause(None, m.optimizer, worst)


def scale_words(m: Measured, optimizer: str) -> str:
    """For an optimizer that matched unscaled: its gradient scale in words when the fit pins one other than 1."""
    fit = next((f for f in m.scale_fits if f.optimizer == optimizer), None)
    if fit is None or not fit.identified or fit.name == "1" or fit.error >= MATCH:
        return ""
    return optscale.words(fit, m.sigma, m.pop)


def judge(m: Measured) -> Recorder:
    rec = Recorder(NAME)
    cause = _cause(m) if m.first_errors else None
    for e, (worst, norm) in enumerate(zip(m.ratios, m.update_norms)):
        rec.bound("max |params port - ref| / bound", "both", f"epoch {e} N={m.pop} lr={fmt(m.lr)}", worst, 1.0,
                  "u |p| + gamma_24 |update| per step and side, accumulated", cause=cause)
        rec.info("update norm ratio port/ref", "both", f"epoch {e}", norm)
    return rec


def section(m: Measured) -> str:
    return "\n".join([
        f"{m.epochs} epochs from the same parameters (the reference's init, biases set non-zero), population {m.pop}; "
        "each epoch the reference's noise at the reference's sigma schedule and a fresh standard-normal fitness "
        "vector shaped by the reference. The port runs its own `optimizer_step`; the reference runs optax "
        f"{m.optimizer} (lr {fmt(m.lr)}, lr_decay {fmt(m.lr_decay)}) on -(g sqrt(N)) with g the port's own "
        "`gradient()` (so the optimizer and its schedule are all that is compared).",
        "",
        "Allowed: per step and side u |p_new| (the rounding of p + update) + gamma_24 |update| (the optimizer's "
        "elementwise arithmetic), accumulated over epochs; deterministic. On a mismatch the port's first update is "
        "matched against optax sgd, adam and adamw, each also on the port's gradient times a fitted scale "
        "(parity.core.optscale: least squares in the step for sgd, in Adam's eps deficit for adam; named 1/sigma, "
        "1/sqrt(N), ... when inside the fit's worst-case interval, a match only within 1e-4 of the largest entry), "
        "and the ratio of update sizes per epoch against lr_decay^e.",
    ])


def run(ctx):
    m = measure(ctx)
    return summarize(NAME, judge(m), section(m))
