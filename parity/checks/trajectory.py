"""Trajectory: both sides train the same policy together and the first place they part is reported.

Both start from the reference's initial parameters (copied across), see the same CartPole resets
(seed + epoch + member) and the same action uniforms (the reference's). The episodes run in
lockstep: actions are sampled from the REFERENCE's probabilities, so a one-ULP logit difference at
u ~ p cannot fork an episode; the port's logits are compared at every step, and the steps where
the port's own sample would have differed are counted. Per epoch, in order: noise (the port's own
`es_ask`; element by element for a JAX-compatible port, else its sigma schedule, while both sides
then share the reference's noise), outputs, shaped fitness, gradient, parameters after `es_tell`.
Tolerances are the float32 bounds of parity.tolerances, with the parameter difference allowed so
far propagated into the next epoch's forward and step (first order). The first (epoch, quantity)
beyond tolerance is attributed to the earlier check that explains it, or diagnosed here (sigma
schedule). Rollouts are rollout.episodes.run_episodes itself, the port judged through its watch hook.
"""
from __future__ import annotations

import dataclasses

import numpy as np

from parity import diagnose
from parity.tolerances import (U32, ForwardBound, bias_grad_bound, check_alpha, chi2_interval, shaping_bound,
                               ulp_distance, update_bound, weight_grad_bound)
from parity.verdict import Recorder, fmt, summarize
from rollout import cartpole
from rollout.episodes import run_episodes, sample_actions

NAME = "trajectory"
WATCHED = 256   # members whose logits are judged at every step (all of them up to this population)
QUANTITIES = ("noise", "outputs", "fitness", "gradient", "parameters")
UPSTREAM = {"noise": ("noise",), "outputs": ("products",), "fitness": ("fitness",), "gradient": ("gradients",),
            "parameters": ("updates", "gradients")}


def _lockstep(ref_policy, port_policy, bound, watched, init_state, uniforms, max_steps):
    """run_episodes with actions from the reference; returns (returns, worst logit ratio, forks, steps).

    The logits of the `watched` members are judged against `bound` (a ForwardBound over those members).
    """
    tally = {"worst": 0.0, "forks": 0, "steps": 0}

    def judge(t, obs, logits_ref, action, alive):   # the port's logits on the reference's step
        logits_port = port_policy(obs)
        _, allowed = bound(obs[watched])
        diff = np.abs(logits_port[watched].astype(np.float64) - logits_ref[watched])
        live = alive[watched]
        if live.any():
            tally["worst"] = max(tally["worst"], float(np.max((diff / (2 * allowed))[live])))
        tally["forks"] += int(np.sum((sample_actions(logits_port, uniforms[t]) != action) & alive))
        tally["steps"] += int(alive.sum())

    episodes = run_episodes(ref_policy, init_state, uniforms, max_steps, watch=judge)
    return episodes.returns, tally["worst"], tally["forks"], tally["steps"]


def _noise_ulps(port: dict, ref: dict) -> tuple[int, set]:
    """Max ULP distance over the leaves both have, and the leaves only one side has."""
    worst = 0
    for name in set(port) & set(ref):
        parts = zip(port[name], ref[name]) if isinstance(ref[name], tuple) else [(port[name], ref[name])]
        for a, b in parts:
            worst = max(worst, int(ulp_distance(a, b).max()))
    return worst, set(port) ^ set(ref)


def _same_draws(a: dict, b: dict) -> bool:
    """Whether two noise dicts hold the same draws (B equal), so A's ratio is the ratio of their sigmas."""
    weights = [k for k, v in a.items() if isinstance(v, tuple)]
    return all(k in b and np.array_equal(a[k][1], b[k][1]) for k in weights)


def _sigma_ratio(a: dict, b: dict) -> float:
    """The common factor c with A_a = c * A_b over all weights (same draws assumed): median of the ratios."""
    num = np.concatenate([a[k][0].ravel() for k, v in a.items() if isinstance(v, tuple)]).astype(np.float64)
    den = np.concatenate([b[k][0].ravel() for k, v in b.items() if isinstance(v, tuple)]).astype(np.float64)
    keep = den != 0
    return float(np.median(num[keep] / den[keep]))


def _grad_bound(name, noise, shaped, f_err):
    if name.endswith(".weight"):
        return weight_grad_bound(shaped, *noise[name], f_err=f_err)
    if name in noise:
        return bias_grad_bound(shaped, noise[name], f_err=f_err)
    return np.zeros(1)


def run(ctx):
    rec = Recorder(NAME)
    missing = [m for m in ("es_init", "forward") if not ctx.port.has(m)]
    if missing:
        return summarize(NAME, rec, f"Skipped: the port has no {' / '.join(missing)} (see parity/adapter.py).")
    cfg, shapes, seed = ctx.cfg, ctx.shapes, ctx.seed
    pop, r, epochs = cfg.pop, cfg.rank, ctx.sizes.traj_epochs
    ref_port, reference = ctx.ref, ctx.reference
    act, ref_opt = reference.run.activation, reference.run.optimizer
    jax_compat = ctx.port.jax_compatible_rng
    n_out = shapes[max((k for k in shapes if k.endswith(".weight")), key=lambda k: int(k.split(".")[0]))][0]
    alpha = check_alpha(NAME) / max(epochs - 1, 1)

    params0 = reference.init_params(shapes, seed)
    p_state, r_state = ctx.port.es_init(params0, seed), ref_port.es_init(params0, seed)
    param_err = {k: np.zeros(v.shape) for k, v in params0.items()}
    port_noise0 = None
    parted = None

    def judge(epoch, quantity, ok, detail):
        nonlocal parted
        if not ok and parted is None:
            parted = (epoch, quantity, detail)
        return ok

    for e in range(epochs):
        ctx.log(f"[{NAME}] epoch {e}")
        size = f"epoch {e} pop={pop}"
        sigma_e = reference.sigma_at(e)
        n_ref = ref_port.es_ask(r_state, e, shapes, pop, r)
        n_own = ctx.port.es_ask(p_state, e, shapes, pop, r)
        # -- noise
        noise_detail = None
        if jax_compat:
            ulps, odd = _noise_ulps(n_own, n_ref)
            if odd:
                ulps = max(ulps, 1 << 31)
            if ulps and not odd and _same_draws(n_own, n_ref):
                noise_detail = ("sigma", _sigma_ratio(n_own, n_ref))
            ok = rec.bound("noise: max ULP port vs ref", "both", size, float(ulps), 0, "bit-identical (JAX-compatible)",
                           cause=None)
            n_port = n_own
        else:
            if port_noise0 is None:
                port_noise0 = n_own
            ref_ratio = sigma_e / reference.sigma_at(0)
            if _same_draws(n_own, port_noise0):
                c = _sigma_ratio(n_own, port_noise0)
                ok = rec.bound("noise: |sigma_e/sigma_0 port / ref - 1|", "both", size, abs(c / ref_ratio - 1),
                               8 * U32, "same draws: float32 rounding of sigma_e and A", cause=None)
                noise_detail = ("sigma", c / ref_ratio)
            else:
                w0 = min((k for k, v in n_own.items() if isinstance(v, tuple)), key=lambda k: n_own[k][0][0].size
                         * n_own[k][1][0].shape[0])                 # the smallest A B^T identifies mirrors
                mirror = diagnose.mirror_map((n_own[w0][0].astype(np.float64)
                                              @ np.swapaxes(n_own[w0][1].astype(np.float64), 1, 2)).reshape(pop, -1))
                reps = np.array([i for i in range(pop) if mirror[i] < 0 or i < mirror[i]])
                a = np.concatenate([v[0][reps].ravel() for v in n_own.values() if isinstance(v, tuple)])
                mean = float(np.mean(a.astype(np.float64) ** 2) * r / sigma_e ** 2)
                lo, hi = chi2_interval(a.size, alpha)
                ok = rec.stat("noise: mean square of A / (sigma_e / sqrt r)", "both", size, mean, lo, hi, alpha,
                              f"chi-square({a.size})/{a.size}, alpha={alpha:.2g}", cause=None)
                noise_detail = ("sigma", float(np.sqrt(mean)))
            n_port = n_ref           # own generator: both sides run on the reference's noise from here on
        judge(e, "noise", ok, noise_detail)
        if parted is not None:
            break
        # -- outputs, in lockstep
        p_params, r_params = ctx.port.es_params(p_state, shapes), ref_port.es_params(r_state, shapes)
        watched = np.arange(pop) if pop <= WATCHED else np.linspace(0, pop - 1, WATCHED).astype(np.int64)
        bound = ForwardBound(r_params, {k: (tuple(x[watched] for x in v) if isinstance(v, tuple) else v[watched])
                                        for k, v in n_ref.items()}, act, param_err)
        uniforms = ref_port.action_uniforms(seed, e, pop, cartpole.MAX_STEPS)
        returns, worst, forks, steps = _lockstep(
            lambda obs: ref_port.forward(r_params, n_ref, obs, n_out),
            lambda obs: ctx.port.forward(p_params, n_port, obs, n_out),
            bound, watched, cartpole.reset(seed + e + np.arange(pop)), uniforms, ctx.sizes.traj_max_steps)
        ok = rec.bound("outputs: max |logits port - ref| / bound", "both",
                       f"{size} {steps} member-steps ({watched.size} members judged)", worst, 1.0,
                       "ForwardBound with the parameter difference allowed so far", cause=None)
        rec.info("steps where the port's own sample would differ", "port", f"{size} {steps} member-steps", forks)
        rec.info("mean return (lockstep)", "both", size, float(returns.mean()))
        if not judge(e, "outputs", ok, None):
            break
        # -- fitness
        sp, sr = ctx.port.shape_fitness(returns, cfg.group_size), ref_port.shape_fitness(returns, cfg.group_size)
        f_err = 2 * shaping_bound(returns)
        ok = rec.bound("fitness: max |shaped port - ref| / bound", "both", size,
                       float(np.max(np.abs(sp.astype(np.float64) - sr) / f_err)), 1.0, "float32 shaping bound", cause=None)
        if not judge(e, "fitness", ok, None):
            break
        # -- gradient
        gp = ctx.port.gradient(n_port, sp, sigma_e, shapes)
        gr = ref_port.gradient(n_ref, sr, sigma_e, shapes)
        g_err = {k: 2 * _grad_bound(k, n_ref, sr, f_err) for k in shapes}
        worst_g = max(float(np.max(np.abs(gp[k].astype(np.float64) - gr[k]) / np.maximum(g_err[k], 1e-300)))
                      if np.any(gp[k] != gr[k]) else 0.0 for k in shapes)
        ok = rec.bound("gradient: max |port - ref| / bound", "both", size, worst_g, 1.0,
                       "float32 bound of the estimate incl. the shaped fitness' error", cause=None)
        if not judge(e, "gradient", ok, None):
            break
        # -- parameters after one ES epoch on each side
        p_state = ctx.port.es_tell(p_state, n_port, returns, e)
        r_state = ref_port.es_tell(r_state, n_ref, returns, e)
        new_p, new_r = ctx.port.es_params(p_state, shapes), ref_port.es_params(r_state, shapes)
        lr_e, root_n = reference.lr_at(e), float(np.sqrt(np.float32(pop)))
        worst_p = 0.0
        for k in shapes:
            step = new_r[k].astype(np.float64) - r_params[k]
            if ref_opt == "sgd":
                from_grad = lr_e * root_n * g_err[k]
            else:   # adam's step is normalised: a relative gradient error moves it by at most ~2 lr
                from_grad = np.minimum(2 * lr_e, lr_e * g_err[k] / np.maximum(np.abs(gr[k]), 1e-30))
            param_err[k] = param_err[k] + from_grad + 2 * update_bound(new_r[k], step)
            diff = np.abs(new_p[k].astype(np.float64) - new_r[k])
            if np.any(diff > 0):
                worst_p = max(worst_p, float(np.max(diff / np.maximum(param_err[k], 1e-300))))
        ok = rec.bound("parameters: max |port - ref| / bound", "both", size, worst_p, 1.0,
                       "propagated gradient bound x lr sqrt(N) + step rounding, accumulated", cause=None)
        if not judge(e, "parameters", ok, None):
            break

    found = None
    if parted is not None:
        found = _diagnose(ctx, parted)
        rec.rows[:] = [row if row.verdict != "fail" else dataclasses.replace(row, cause=found.text) for row in rec.rows]
        rec.causes.append(found)
    verdict_line = (f"The sides part at epoch {parted[0]}, first in {parted[1]}." if parted
                    else f"The sides agree for all {epochs} epochs.")
    section = "\n".join([
        f"{epochs} epochs, population {pop}, from the reference's initial parameters (seed {seed}); CartPole resets "
        f"seed + epoch + member, the reference's action uniforms; episodes of at most {ctx.sizes.traj_max_steps} steps, "
        "in lockstep on the reference's actions. "
        + ("The port claims JAX-compatible draws: its own noise must equal the reference's bit for bit. "
           if jax_compat else
           "The port uses its own generator: its noise is judged by its sigma schedule (exact ratio to its epoch-0 "
           "noise when the draws repeat, else a variance test), and both sides then run on the reference's noise. ")
        + "Quantities per epoch, in order: " + ", ".join(QUANTITIES) + ". Allowed: float32 bounds (products and "
        "layer norm per step, shaping, the gradient estimate), with the parameter difference allowed so far carried "
        "into the next epoch's forward (|h||dW|^T + |db|) and step (lr sqrt(N) times the gradient bound for sgd).",
        "",
        verdict_line,
    ])
    return summarize(NAME, rec, section)


def _diagnose(ctx, parted):
    """The first parting, attributed to an upstream check's causes or diagnosed from what was seen."""
    epoch, quantity, detail = parted
    upstream = [c for check in UPSTREAM[quantity] for c in diagnose.follows(check, ctx.causes_of(check))]
    if upstream:
        return upstream[0]
    if quantity == "noise" and detail and detail[0] == "sigma":
        if epoch > 0:
            return diagnose.sigma_schedule_cause(epoch, detail[1], ctx.reference.run.sigma_decay)
        return diagnose.other("noise scale", f"the port's noise at epoch 0 is {fmt(detail[1])}x the reference's")
    words = {"noise": "the noise es_ask returns", "outputs": "the policy's logits",
             "fitness": "the shaped fitness", "gradient": "the gradient estimate",
             "parameters": "the parameters after es_tell (the ES step inside the port's training loop)"}[quantity]
    return diagnose.other("training trajectory", f"{words} part from the reference's at epoch {epoch} although the "
                                                 "isolated checks pass")
