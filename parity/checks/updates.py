"""Updates: the optimizer step and its learning-rate schedule over several epochs.

Both sides start from the same parameters; each epoch gets the reference's noise and a fresh shaped
fitness vector. The port runs `optimizer_step`; the reference runs its optax solver (the reference
run's optimizer and lr schedule) on the gradient the PORT computes (`gradient()`), so only the
optimizer and its schedule are compared here (the gradients check covers the estimate). Allowed:
per step u |p_new| + gamma_24 |update| on each side, accumulated over epochs; deterministic.
A mismatch is matched against optax sgd, adam and adamw and against a fitted per-epoch lr factor.
"""
from __future__ import annotations

import numpy as np

from parity import diagnose
from parity.tolerances import update_bound
from parity.verdict import Recorder, fmt, summarize

NAME = "updates"


def _reference_chain(ctx, params0, grads_per_epoch, sigmas, **run_knobs):
    """The reference optimizer (optionally other run knobs) applied to the given gradients, epoch by epoch."""
    ref = ctx.reference.with_run_knobs(**run_knobs) if run_knobs else ctx.reference
    params, state = dict(params0), ref.optimizer_init(params0)
    chain = []
    for epoch, grads in enumerate(grads_per_epoch):
        params, state = ref.optimizer_apply(params, state, grads, ctx.cfg.pop, epoch)
        chain.append(params)
    return chain


def run(ctx):
    rec = Recorder(NAME)
    if not ctx.port.has("optimizer_step"):
        return summarize(NAME, rec, "Skipped: the port has no `optimizer_init`/`optimizer_step`.")
    cfg, shapes, r, n = ctx.cfg, ctx.shapes, ctx.cfg.rank, ctx.cfg.pop
    names = list(shapes)
    rng = ctx.rng(51)
    params0 = {k: (v if k.endswith(".weight") else (0.1 * rng.standard_normal(v.shape)).astype(np.float32))
               for k, v in ctx.reference.init_params(shapes, ctx.seed).items()}
    epochs = ctx.sizes.update_epochs
    sigmas = [ctx.reference.sigma_at(e) for e in range(epochs)]

    port_params, port_state = dict(params0), ctx.port.optimizer_init(params0)
    port_chain, grads_per_epoch = [], []
    for e in range(epochs):
        noise = ctx.reference.noise(shapes, ctx.seed, e, np.arange(n), n, sigmas[e], r)
        shaped = ctx.ref.shape_fitness(rng.standard_normal(n).astype(np.float32), 0)
        grads_per_epoch.append(ctx.port.gradient(noise, shaped, sigmas[e], shapes))
        port_params, port_state = ctx.port.optimizer_step(port_params, port_state, noise, shaped, sigmas[e], e, shapes)
        port_chain.append(port_params)
    ref_chain = _reference_chain(ctx, params0, grads_per_epoch, sigmas)

    # The allowed difference accumulates one step's bound per epoch on each side.
    allowed = {k: np.zeros(v.shape) for k, v in params0.items()}
    prev = params0
    ratios, first_bad = [], None
    for e in range(epochs):
        for k in names:
            step = ref_chain[e][k].astype(np.float64) - prev[k]
            allowed[k] = allowed[k] + 2 * update_bound(ref_chain[e][k], step)
        worst = max(float(np.max(np.abs(port_chain[e][k].astype(np.float64) - ref_chain[e][k]) /
                                 np.maximum(allowed[k], 1e-300))) for k in names)
        ratios.append(worst)
        if worst > 1 and first_bad is None:
            first_bad = e
        prev = ref_chain[e]

    cause = None
    if first_bad is not None:
        cause = _diagnose(ctx, params0, port_chain, grads_per_epoch, sigmas, allowed_ratio=ratios)
    for e, worst in enumerate(ratios):
        rec.bound("max |params port - ref| / bound", "both", f"epoch {e} N={n} lr={fmt(cfg.lr)}", worst, 1.0,
                  "u |p| + gamma_24 |update| per step and side, accumulated", cause=cause)
        d_port = np.concatenate([(port_chain[e][k].astype(np.float64) - (params0 if e == 0 else port_chain[e - 1])[k]).ravel()
                                 for k in names])
        d_ref = np.concatenate([(ref_chain[e][k].astype(np.float64) - (params0 if e == 0 else ref_chain[e - 1])[k]).ravel()
                                for k in names])
        rec.info("update norm ratio port/ref", "both", f"epoch {e}",
                 float(np.linalg.norm(d_port) / np.linalg.norm(d_ref)) if np.linalg.norm(d_ref) > 0 else float("nan"))
    run = ctx.reference.run
    section = "\n".join([
        f"{epochs} epochs from the same parameters (the reference's init, biases set non-zero), population {n}; each "
        "epoch the reference's noise at the reference's sigma schedule and a fresh standard-normal fitness vector "
        "shaped by the reference. The port runs its own `optimizer_step`; the reference runs optax "
        f"{run.optimizer} (lr {fmt(cfg.lr)}, lr_decay {fmt(run.lr_decay)}) on -(g sqrt(N)) with g the port's own "
        "`gradient()` (so the optimizer and its schedule are all that is compared).",
        "",
        "Allowed: per step and side u |p_new| (the rounding of p + update) + gamma_24 |update| (the optimizer's "
        "elementwise arithmetic), accumulated over epochs; deterministic. On a mismatch the port's first update is "
        "matched against optax sgd, adam and adamw, and the ratio of update sizes per epoch against lr_decay^e.",
    ])
    return summarize(NAME, rec, section)


def _diagnose(ctx, params0, port_chain, grads_per_epoch, sigmas, allowed_ratio):
    """Which optimizer reproduces the port's first update, and which lr factor per epoch its later ones."""
    names = list(params0)
    ref_opt, ref_decay = ctx.reference.run.optimizer, ctx.reference.run.lr_decay

    def delta(chain, e, start):
        before = start if e == 0 else chain[e - 1]
        return np.concatenate([(chain[e][k].astype(np.float64) - before[k]).ravel() for k in names])

    port_d0 = delta(port_chain, 0, params0)
    errors = {}
    for opt in ("sgd", "adam", "adamw"):
        chain = _reference_chain(ctx, params0, grads_per_epoch[:1], sigmas, optimizer=opt)
        cand = delta(chain, 0, params0)
        errors[opt] = float(np.max(np.abs(port_d0 - cand)) / max(np.max(np.abs(cand)), 1e-30))
    best = min(errors, key=errors.get)
    worst = f"first update differs from {ref_opt}'s by {fmt(errors[ref_opt])} of its largest entry"
    if errors[best] < 1e-4 and best != ref_opt:
        return diagnose.optimizer_cause(best, ref_opt, worst)
    if errors[ref_opt] < 1e-4:
        # Same optimizer at epoch 0: the schedule is what differs (update sizes relative to the reference's).
        chain = _reference_chain(ctx, params0, grads_per_epoch, sigmas)
        ratios = {e: float(np.linalg.norm(delta(port_chain, e, params0)) / np.linalg.norm(delta(chain, e, params0)))
                  for e in range(len(port_chain))}
        return diagnose.lr_schedule_cause(ratios, ref_decay)
    return diagnose.optimizer_cause(None, ref_opt, worst)
