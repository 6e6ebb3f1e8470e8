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
import math
from typing import NamedTuple

import numpy as np

from parity import diagnose, noiseform
from parity.tolerances import (U32, ForwardBound, bias_grad_bound, check_alpha, shaping_bound, update_bound,
                               weight_grad_bound)
from parity.verdict import Recorder, fmt, summarize
from rollout import cartpole
from rollout.episodes import run_episodes, sample_actions

NAME = "trajectory"
WATCHED = 256   # members whose logits are judged at every step (all of them up to this population)
QUANTITIES = ("noise", "outputs", "fitness", "gradient", "parameters")
UPSTREAM = {"noise": ("noise",), "outputs": ("products",), "fitness": ("fitness",), "gradient": ("gradients",),
            "parameters": ("updates", "gradients")}


def _lockstep(ref_policy, port_policy, bound, watched, init_state, uniforms, max_steps, choose=sample_actions):
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
        tally["forks"] += int(np.sum((choose(logits_port, uniforms[t]) != action) & alive))
        tally["steps"] += int(alive.sum())

    episodes = run_episodes(ref_policy, init_state, uniforms, max_steps, watch=judge)
    return episodes.returns, tally["worst"], tally["forks"], tally["steps"]


def _noise_ulps(port: dict, ref: dict) -> tuple[int, set]:
    """Max ULP distance over the leaves both have, and the leaves only one side has."""
    worst = 0
    for name in set(port) & set(ref):
        worst = max(worst, noiseform.max_ulps(port, ref, name))     # a dense E: 0 within float32 rounding of A B^T
    return worst, set(port) ^ set(ref)


def _same_draws(a: dict, b: dict) -> bool:
    """Whether two noise dicts hold the same draws (B equal), so A's ratio is the ratio of their sigmas."""
    return noiseform.same_draws(a, b)      # a dense port: E proportional


def _sigma_ratio(a: dict, b: dict) -> float:
    """The common factor c with A_a = c * A_b over all weights (same draws assumed): median of the ratios."""
    return noiseform.scale_ratio(a, b)     # a dense port: of E


def _grad_bound(name, noise, shaped, f_err):
    if name.endswith(".weight"):
        return weight_grad_bound(shaped, *noise[name], f_err=f_err)
    if name in noise:
        return bias_grad_bound(shaped, noise[name], f_err=f_err)
    return np.zeros(1)


class Observation(NamedTuple):
    """One judged (or reported) quantity of one epoch, in the order the lockstep run met it."""

    epoch: int
    quantity: str | None       # one of QUANTITIES for a judged row; None for an info row
    row: str                   # the CSV's quantity
    side: str
    size: str
    value: float
    limit: tuple               # ("bound", allowed) | ("stat", lo, hi, alpha) | ("info",)
    why: str = ""
    detail: object = None      # noise: ("sigma", the ratio seen), for the diagnosis

    @property
    def ok(self) -> bool:
        if self.limit[0] == "bound":
            return math.isfinite(self.value) and self.value <= self.limit[1]
        if self.limit[0] == "stat":
            return math.isfinite(self.value) and self.limit[1] <= self.value <= self.limit[2]
        return True


class Measured(NamedTuple):
    observations: tuple[Observation, ...]
    parted: tuple[int, str, object] | None   # (epoch, quantity, detail) of the first quantity beyond tolerance
    epochs: int
    pop: int
    seed: int
    max_steps: int
    jax_compatible: bool


class _Sides(NamedTuple):
    """Both sides' ES states and what the comparison carries from one epoch to the next."""

    port: object
    ref: object
    param_err: dict            # leaf -> the parameter difference allowed so far (elementwise)
    port_noise0: dict | None   # an own-generator port's epoch-0 noise (its sigma schedule is judged against it)


def _noise_obs(ctx, e: int, sides: _Sides, alpha: float) -> tuple[Observation, dict, dict, _Sides]:
    """The port's own es_ask noise at epoch e: bit-identical (JAX-compatible) or its sigma schedule.
    Returns (observation, the reference's noise, the noise the port runs on, sides)."""
    shapes, pop, r, reference = ctx.shapes, ctx.cfg.pop, ctx.cfg.rank, ctx.reference
    size, sigma_e = f"epoch {e} pop={pop}", reference.sigma_at(e)
    n_ref = ctx.ref.es_ask(sides.ref, e, shapes, pop, r)
    n_own = ctx.port.es_ask(sides.port, e, shapes, pop, r)
    if ctx.port.jax_compatible_rng:
        ulps, odd = _noise_ulps(n_own, n_ref)
        ulps = max(ulps, 1 << 31) if odd else ulps
        detail = ("sigma", _sigma_ratio(n_own, n_ref)) if ulps and not odd and _same_draws(n_own, n_ref) else None
        return (Observation(e, "noise", "noise: max ULP port vs ref", "both", size, float(ulps), ("bound", 0),
                            "bit-identical (JAX-compatible)", detail), n_ref, n_own, sides)
    sides = sides._replace(port_noise0=sides.port_noise0 if sides.port_noise0 is not None else n_own)
    ref_ratio = sigma_e / reference.sigma_at(0)
    if _same_draws(n_own, sides.port_noise0):
        c = _sigma_ratio(n_own, sides.port_noise0)
        obs = Observation(e, "noise", "noise: |sigma_e/sigma_0 port / ref - 1|", "both", size, abs(c / ref_ratio - 1),
                          ("bound", 8 * U32), "same draws: float32 rounding of sigma_e and A", ("sigma", c / ref_ratio))
    else:
        w0 = min(noiseform.weight_names(n_own), key=lambda k: noiseform.entries(n_own, k))   # the smallest A B^T
        mirror = diagnose.mirror_map(noiseform.perturbation(n_own, w0).reshape(pop, -1))     # identifies mirrors
        reps = np.array([i for i in range(pop) if mirror[i] < 0 or i < mirror[i]])
        row, value, limit, why, ratio = noiseform.scale_test(n_own, reps, sigma_e, r, alpha)  # chi2 on A; dense: KS
        obs = Observation(e, "noise", row, "both", size, value, limit, why, ("sigma", ratio))
    return obs, n_ref, n_ref, sides      # own generator: both sides run on the reference's noise from here on


def _outputs_obs(ctx, e: int, sides: _Sides, n_ref: dict, n_port: dict) -> tuple[list[Observation], np.ndarray]:
    """The policies' logits along the reference's episodes (lockstep), against the carried forward bound."""
    shapes, pop, seed = ctx.shapes, ctx.cfg.pop, ctx.seed
    size = f"epoch {e} pop={pop}"
    n_out = shapes[max((k for k in shapes if k.endswith(".weight")), key=lambda k: int(k.split(".")[0]))][0]
    p_params, r_params = ctx.port.es_params(sides.port, shapes), ctx.ref.es_params(sides.ref, shapes)
    watched = np.arange(pop) if pop <= WATCHED else np.linspace(0, pop - 1, WATCHED).astype(np.int64)
    bound = ForwardBound(r_params, {k: (tuple(x[watched] for x in v) if isinstance(v, tuple) else v[watched])
                                    for k, v in n_ref.items()}, ctx.reference.run.activation, sides.param_err)
    uniforms = ctx.ref.action_uniforms(seed, e, pop, cartpole.MAX_STEPS)
    returns, worst, forks, steps = _lockstep(
        lambda obs: ctx.ref.forward(r_params, n_ref, obs, n_out),
        lambda obs: ctx.port.forward(p_params, n_port, obs, n_out),
        bound, watched, cartpole.reset(seed + e + np.arange(pop)), uniforms, ctx.sizes.traj_max_steps,
        ctx.port.actions if ctx.port.has("actions") else sample_actions)
    return [Observation(e, "outputs", "outputs: max |logits port - ref| / bound", "both",
                        f"{size} {steps} member-steps ({watched.size} members judged)", worst, ("bound", 1.0),
                        "ForwardBound with the parameter difference allowed so far"),
            Observation(e, None, "steps where the port's own sample would differ", "port",
                        f"{size} {steps} member-steps", forks, ("info",)),
            Observation(e, None, "mean return (lockstep)", "both", size, float(returns.mean()), ("info",))], returns


def _step_obs(ctx, e: int, sides: _Sides, n_ref: dict, n_port: dict, returns: np.ndarray):
    """Shaped fitness, the gradient estimate and the parameters after one es_tell on each side; stops at the
    first quantity beyond tolerance. Returns (observations, sides)."""
    shapes, pop, cfg = ctx.shapes, ctx.cfg.pop, ctx.cfg
    size, sigma_e = f"epoch {e} pop={pop}", ctx.reference.sigma_at(e)
    sp, sr = ctx.port.shape_fitness(returns, cfg.group_size), ctx.ref.shape_fitness(returns, cfg.group_size)
    f_err = 2 * shaping_bound(returns)
    obs = [Observation(e, "fitness", "fitness: max |shaped port - ref| / bound", "both", size,
                       float(np.max(np.abs(sp.astype(np.float64) - sr) / f_err)), ("bound", 1.0),
                       "float32 shaping bound")]
    if not obs[-1].ok:
        return obs, sides
    gp, gr = ctx.port.gradient(n_port, sp, sigma_e, shapes), ctx.ref.gradient(n_ref, sr, sigma_e, shapes)
    g_err = {k: 2 * _grad_bound(k, n_ref, sr, f_err) for k in shapes}
    worst_g = max(float(np.max(np.abs(gp[k].astype(np.float64) - gr[k]) / np.maximum(g_err[k], 1e-300)))
                  if np.any(gp[k] != gr[k]) else 0.0 for k in shapes)
    obs.append(Observation(e, "gradient", "gradient: max |port - ref| / bound", "both", size, worst_g, ("bound", 1.0),
                           "float32 bound of the estimate incl. the shaped fitness' error"))
    if not obs[-1].ok:
        return obs, sides
    r_params = ctx.ref.es_params(sides.ref, shapes)
    sides = sides._replace(port=ctx.port.es_tell(sides.port, n_port, returns, e),
                           ref=ctx.ref.es_tell(sides.ref, n_ref, returns, e))
    worst_p, param_err = _parameter_error(ctx, e, sides, r_params, gr, g_err)
    obs.append(Observation(e, "parameters", "parameters: max |port - ref| / bound", "both", size, worst_p,
                           ("bound", 1.0), "propagated gradient bound x lr sqrt(N) + step rounding, accumulated"))
    return obs, sides._replace(param_err=param_err)


def _parameter_error(ctx, e: int, sides: _Sides, r_params: dict, gr: dict, g_err: dict) -> tuple[float, dict]:
    """(worst |port - ref| over the allowed parameter difference after this epoch's step, the new allowance)."""
    shapes = ctx.shapes
    new_p, new_r = ctx.port.es_params(sides.port, shapes), ctx.ref.es_params(sides.ref, shapes)
    lr_e, root_n = ctx.reference.lr_at(e), float(np.sqrt(np.float32(ctx.cfg.pop)))
    param_err, worst = dict(sides.param_err), 0.0
    for k in shapes:
        step = new_r[k].astype(np.float64) - r_params[k]
        if ctx.reference.run.optimizer == "sgd":
            from_grad = lr_e * root_n * g_err[k]
        else:   # adam's step is normalised: a relative gradient error moves it by at most ~2 lr
            from_grad = np.minimum(2 * lr_e, lr_e * g_err[k] / np.maximum(np.abs(gr[k]), 1e-30))
        param_err[k] = param_err[k] + from_grad + 2 * update_bound(new_r[k], step)
        diff = np.abs(new_p[k].astype(np.float64) - new_r[k])
        if np.any(diff > 0):
            worst = max(worst, float(np.max(diff / np.maximum(param_err[k], 1e-300))))
    return worst, param_err


def measure(ctx) -> Measured:
    cfg, epochs = ctx.cfg, ctx.sizes.traj_epochs
    alpha = check_alpha(NAME) / max(epochs - 1, 1)
    params0 = ctx.reference.init_params(ctx.shapes, ctx.seed)
    sides = _Sides(ctx.port.es_init(params0, ctx.seed), ctx.ref.es_init(params0, ctx.seed),
                   {k: np.zeros(v.shape) for k, v in params0.items()}, None)
    observations: list[Observation] = []
    for e in range(epochs):
        ctx.log(f"[{NAME}] epoch {e}")
        noise_obs, n_ref, n_port, sides = _noise_obs(ctx, e, sides, alpha)
        observations.append(noise_obs)
        if noise_obs.ok:
            outputs, returns = _outputs_obs(ctx, e, sides, n_ref, n_port)
            observations += outputs
            if outputs[0].ok:
                step, sides = _step_obs(ctx, e, sides, n_ref, n_port, returns)
                observations += step
        first = next((o for o in observations if not o.ok), None)
        if first is not None:
            return Measured(tuple(observations), (first.epoch, first.quantity, first.detail), epochs, cfg.pop,
                            ctx.seed, ctx.sizes.traj_max_steps, ctx.port.jax_compatible_rng)
    return Measured(tuple(observations), None, epochs, cfg.pop, ctx.seed, ctx.sizes.traj_max_steps,
                    ctx.port.jax_compatible_rng)


def judge(m: Measured, upstream: dict, sigma_decay: float) -> Recorder:
    """upstream: check name -> its causes (the first parting is attributed to the check that explains it)."""
    rec = Recorder(NAME)
    for o in m.observations:
        if o.limit[0] == "bound":
            rec.bound(o.row, o.side, o.size, o.value, o.limit[1], o.why, cause=None)
        elif o.limit[0] == "stat":
            rec.stat(o.row, o.side, o.size, o.value, o.limit[1], o.limit[2], o.limit[3], o.why, cause=None)
        else:
            rec.info(o.row, o.side, o.size, o.value)
    if m.parted is not None:
        found = _diagnose(m.parted, upstream, sigma_decay)
        rec.rows[:] = [row if row.verdict != "fail" else dataclasses.replace(row, cause=found.text) for row in rec.rows]
        rec.causes.append(found)
    return rec


def section(m: Measured) -> str:
    verdict_line = (f"The sides part at epoch {m.parted[0]}, first in {m.parted[1]}." if m.parted
                    else f"The sides agree for all {m.epochs} epochs.")
    return "\n".join([
        f"{m.epochs} epochs, population {m.pop}, from the reference's initial parameters (seed {m.seed}); CartPole "
        f"resets seed + epoch + member, the reference's action uniforms; episodes of at most {m.max_steps} steps, "
        "in lockstep on the reference's actions. "
        + ("The port claims JAX-compatible draws: its own noise must equal the reference's bit for bit. "
           if m.jax_compatible else
           "The port uses its own generator: its noise is judged by its sigma schedule (exact ratio to its epoch-0 "
           "noise when the draws repeat, else a variance test), and both sides then run on the reference's noise. ")
        + "Quantities per epoch, in order: " + ", ".join(QUANTITIES) + ". Allowed: float32 bounds (products and "
        "layer norm per step, shaping, the gradient estimate), with the parameter difference allowed so far carried "
        "into the next epoch's forward (|h||dW|^T + |db|) and step (lr sqrt(N) times the gradient bound for sgd).",
        "",
        verdict_line,
    ])


def run(ctx):
    missing = [m for m in ("es_init", "forward") if not ctx.port.has(m)]
    if missing:
        return summarize(NAME, Recorder(NAME), f"Skipped: the port has no {' / '.join(missing)} (see parity/adapter.py).")
    m = measure(ctx)
    upstream = {check: ctx.causes_of(check) for checks in UPSTREAM.values() for check in checks}
    return summarize(NAME, judge(m, upstream, ctx.reference.run.sigma_decay), section(m))


def _diagnose(parted, upstream: dict, sigma_decay: float):
    """The first parting, attributed to an upstream check's causes or diagnosed from what was seen."""
    epoch, quantity, detail = parted
    causes = [c for check in UPSTREAM[quantity] for c in diagnose.follows(check, upstream.get(check, ()))]
    if causes:
        return causes[0]
    if quantity == "noise" and detail and detail[0] == "sigma":
        if epoch > 0:
            return diagnose.sigma_schedule_cause(epoch, detail[1], sigma_decay)
        return diagnose.other("noise scale", f"the port's noise at epoch 0 is {fmt(detail[1])}x the reference's")
    words = {"noise": "the noise es_ask returns", "outputs": "the policy's logits",
             "fitness": "the shaped fitness", "gradient": "the gradient estimate",
             "parameters": "the parameters after es_tell (the ES step inside the port's training loop)"}[quantity]
    return diagnose.other("training trajectory", f"{words} part from the reference's at epoch {epoch} although the "
                                                 "isolated checks pass")
