"""Trajectory: both sides train the same policy in lockstep; every quantity is compared at every epoch.

Both start from the reference's initial parameters (copied across), see the same CartPole resets
(seed + epoch + member) and the same action uniforms (the reference's). Episodes run on the REFERENCE's
policy and actions (rollout.episodes.run_episodes itself), so the returns are the reference's; both sides'
`es_tell` get those returns every epoch and each continues from its own state, however far the two have
parted. Each epoch's comparison is re-synchronised so that it isolates one piece of that epoch:

- noise: the port's own `es_ask` (element by element for a JAX-compatible port);
- sigma: its sigma_e / sigma_0 read off its own noise against its own epoch 0 (parity.mlp.lockstep);
- schedule: apart from the lockstep, Sizes.sigma_epochs epochs of the port's own es_ask / es_tell on synthetic
  fitness, its noise's log mean square over the reference's sigma_e^2 against the epoch (parity.mlp.sigma_schedule):
  exact where the draws repeat, else a t test of the slope over enough fresh draws to resolve a 0.999 decay;
- outputs: the port's forward on the REFERENCE's parameters and noise along the reference's episodes, judged
  at every step (the steps where the port's own action would differ are counted);
- fitness: both sides shape the same returns;
- gradient: both sides' estimate on the reference's noise and the reference's shaped fitness;
- step, lr: the port's parameters after `es_tell` against the reference optimizer applied to the port's own
  parameters with the port's own `gradient()` of its own shaping (so shaping and gradient drifts, caught above,
  do not reach it), and that step's size along the reference's direction.

Every row beyond tolerance gets a cause: the isolated check that explains it (UPSTREAM), or what this check
reads off the port (sigma schedule, optimizer, lr schedule, a learning rate no knob names). Tolerances: the
float32 bounds of parity.core.tolerances and those derived in parity.mlp.lockstep and parity.mlp.sigma_schedule; the statistical
rows (the sigma F test of each epoch after the first, from fresh draws, and the schedule's slope test) split the
check's share of the false-alarm budget evenly (`statistical_alpha`), so a faithful port fails one of them with
probability at most check_alpha("trajectory") = 1e-4 per run.
"""
from __future__ import annotations

import dataclasses
import math
from typing import NamedTuple

import numpy as np

from parity.core import diagnose
from parity.mlp import lockstep, noiseform, sigma_schedule
from parity.core.port import SplitNoise
from parity.core.repro import Var, step as repro_step
from parity.core.tolerances import ForwardBound, bias_grad_bound, check_alpha, shaping_bound, weight_grad_bound
from parity.core.verdict import Recorder, fmt, summarize
from rollout import cartpole
from rollout.episodes import run_episodes, sample_actions

NAME = "trajectory"
WATCHED = 256   # members whose logits are judged at every step (all of them up to this population)
QUANTITIES = ("noise", "sigma", "schedule", "outputs", "fitness", "gradient", "step", "lr")
UPSTREAM = {"noise": ("noise",), "outputs": ("products",), "fitness": ("fitness",), "gradient": ("gradients",),
            "step": ("updates",), "lr": ("updates",), "sigma": (), "schedule": ()}
WORDS = {"noise": "the noise es_ask returns", "sigma": "the sigma schedule", "outputs": "the policy's logits",
         "schedule": "the sigma schedule over many epochs",
         "fitness": "the shaped fitness", "gradient": "the gradient estimate",
         "step": "the parameters after es_tell (the ES step inside the port's training loop)",
         "lr": "the size of the es_tell step"}


def statistical_alpha(traj_epochs: int) -> float:
    """Each statistical row's alpha: the check's budget split over the F tests of epochs 1.. and the slope test."""
    return check_alpha(NAME) / (max(traj_epochs - 1, 1) + 1)


def _lockstep(ref_policy, port_policy, allowed_of, watched, init_state, uniforms, max_steps, choose=sample_actions):
    """run_episodes with actions from the reference; returns (returns, worst logit ratio, forks, steps).

    The logits of the `watched` members are judged against allowed_of(obs) (both sides' ForwardBound over those
    members, summed); port_policy None: the reference's episodes alone.
    """
    tally = {"worst": 0.0, "forks": 0, "steps": 0}

    def judge(t, obs, logits_ref, action, alive):   # the port's logits on the reference's step
        logits_port = port_policy(obs)
        allowed = allowed_of(obs[watched])
        diff = np.abs(logits_port[watched].astype(np.float64) - logits_ref[watched])
        live = alive[watched]
        if live.any():
            tally["worst"] = max(tally["worst"], float(np.max((diff / allowed)[live])))
        tally["forks"] += int(np.sum((choose(logits_port, uniforms[t]) != action) & alive))
        tally["steps"] += int(alive.sum())

    episodes = run_episodes(ref_policy, init_state, uniforms, max_steps, watch=None if port_policy is None else judge)
    return episodes.returns, tally["worst"], tally["forks"], tally["steps"]


def _noise_ulps(port: dict, ref: dict) -> tuple[int, set]:
    """Max ULP distance over the leaves both have, and the leaves only one side has."""
    worst = 0
    for name in set(port) & set(ref):
        worst = max(worst, noiseform.max_ulps(port, ref, name))     # a dense E: 0 within float32 rounding of A B^T
    return worst, set(port) ^ set(ref)


def _grad_bound(name, noise, shaped, u_operand: float = 0.0):
    if name.endswith(".weight"):
        return weight_grad_bound(shaped, *noise[name], u_operand=u_operand)
    if name in noise:
        return bias_grad_bound(shaped, noise[name])
    return np.zeros(1)


class Observation(NamedTuple):
    """One judged (or reported) quantity of one epoch."""

    epoch: int
    quantity: str | None       # one of QUANTITIES for a judged row; None for an info row
    row: str                   # the CSV's quantity
    side: str
    size: str
    value: float
    limit: tuple               # ("bound", allowed) | ("stat", lo, hi, alpha) | ("info",)
    why: str = ""
    detail: object = None      # noise: ("scale", c) when the draws agree; sigma: ("sigma", the ratio seen);
                               # schedule: ("exact", sigma_schedule.Exact) | ("trend", sigma_schedule.Trend)

    @property
    def ok(self) -> bool:
        if self.limit[0] == "bound":
            return math.isfinite(self.value) and self.value <= self.limit[1]
        if self.limit[0] == "stat":
            return math.isfinite(self.value) and self.limit[1] <= self.value <= self.limit[2]
        return True


class Measured(NamedTuple):
    observations: tuple[Observation, ...]
    steps: tuple[lockstep.Step, ...]       # the port's es_tell step per epoch, against the expected one
    candidates: dict                       # on a first step that differs: optax optimizer -> its distance
    candidate_ratios: dict                 # ... and the port's step sizes per epoch under the one that matches
    epochs: int
    pop: int
    seed: int
    max_steps: int
    jax_compatible: bool
    has_forward: bool
    optimizer: str                         # the reference run's settings the diagnosis compares with
    lr_decay: float
    sigma_decay: float
    scale_fits: tuple = ()                 # on a first step that differs: parity.core.optscale.ScaleFit per optimizer
    sigma: float = 0.0
    schedule_epochs: int = 0               # es_ask/es_tell epochs the sigma schedule reading ran

    @property
    def failures(self) -> dict[str, list[int]]:
        """quantity -> the epochs where it is beyond tolerance."""
        out: dict[str, list[int]] = {}
        for o in self.observations:
            if not o.ok:
                out.setdefault(o.quantity, []).append(o.epoch)
        return out


class _Run(NamedTuple):
    """What the lockstep run carries from one epoch to the next."""

    port: object               # the port's ES state (its own, never reset)
    ref: object                # the reference's ES state
    shadow: object             # the reference optimizer's state, fed the port's own gradients
    moments: lockstep.Moments  # float64 moments and their rounding bounds (stateful optimizers)
    noise0: tuple | None       # (the port's, the reference's) epoch-0 noise
    history: tuple             # per epoch: (port params before es_tell, its gradient, port params after)
    calls: tuple = ()          # the port's ES calls so far as repro steps (parity.core.repro.Step): a failing step's replay


def _noise_obs(ctx, e: int, run: _Run, alpha: float):
    """The port's own es_ask at epoch e: bit-identical (JAX-compatible) and its sigma schedule.
    Returns (observations, the reference's noise, the port's sigma_e as read, run)."""
    shapes, pop, r, reference = ctx.shapes, ctx.cfg.pop, ctx.cfg.rank, ctx.reference
    size, sigma_e = f"epoch {e} pop={pop}", reference.sigma_at(e)
    n_ref = ctx.ref.es_ask(run.ref, e, shapes, pop, r)
    n_own = ctx.port.es_ask(run.port, e, shapes, pop, r)
    asked = run.calls + (repro_step("es_ask", Var("state"), e, out="noise"),)
    run = run._replace(noise0=run.noise0 or (n_own, n_ref), calls=run.calls + (repro_step("es_ask", Var("state"), e),))
    obs = []
    if ctx.port.jax_compatible_rng:
        ulps, odd = _noise_ulps(n_own, n_ref)
        ulps = max(ulps, 1 << 31) if odd else ulps
        detail = (("scale", noiseform.scale_ratio(n_own, n_ref))
                  if ulps and not odd and noiseform.same_draws(n_own, n_ref) else None)
        obs.append(Observation(e, "noise", "noise: max ULP port vs ref", "both", size, float(ulps), ("bound", 0),
                               "bit-identical (JAX-compatible)", detail))
        if not obs[-1].ok and not odd and not ctx.port.dense and not isinstance(n_own, SplitNoise):
            _replay_noise(ctx, size, asked, n_own, n_ref)
    sigma_port = sigma_e
    if e > 0:
        s = lockstep.read_sigma(n_own, run.noise0[0], n_ref, run.noise0[1], sigma_e, reference.sigma_at(0), pop,
                                alpha, r)
        obs.append(Observation(e, "sigma", "sigma: port's sigma_e/sigma_0 over the reference's"
                               + (", |ratio - 1|" if s.exact else ", F"), "both", size, s.value, s.limit, s.why,
                               ("sigma", s.ratio)))
        if s.exact and not obs[-1].ok:      # the port's es_tell runs at its own sigma_e (bias_grad=over_sigma)
            sigma_port = float(np.float32(sigma_e * s.ratio))
    return obs, n_ref, sigma_port, run


def _replay_noise(ctx, size: str, calls: tuple, n_own: dict, n_ref: dict) -> None:
    """Hand the repro collector the ES loop up to this epoch's es_ask and its noise against the reference's, leaf by
    leaf and factor by factor, exact (the noise row's 0 ULP)."""
    paths = {(f"{k} {'AB'[i]}" if isinstance(v, tuple) else k): ((k, i) if isinstance(v, tuple) else (k,))
             for k, v in n_own.items() for i in range(len(v) if isinstance(v, tuple) else 1)}

    def at(noise, path):
        return noise[path[0]][path[1]] if len(path) == 2 else noise[path[0]]

    ctx.replay(size, calls, "noise", {k: at(n_own, p) for k, p in paths.items()},
               {k: at(n_ref, p) for k, p in paths.items()}, {k: 0.0 for k in paths},
               "exact: the port claims JAX-compatible draws (jax_compatible_rng)", paths)


def _outputs_obs(ctx, e: int, r_params: dict, n_ref: dict) -> tuple[list[Observation], np.ndarray]:
    """The reference's episodes (its returns) and, when the port has a forward, both sides' logits along them
    on the reference's parameters and noise."""
    shapes, pop, seed = ctx.shapes, ctx.cfg.pop, ctx.seed
    size = f"epoch {e} pop={pop}"
    n_out = shapes[max((k for k in shapes if k.endswith(".weight")), key=lambda k: int(k.split(".")[0]))][0]
    watched = np.arange(pop) if pop <= WATCHED else np.linspace(0, pop - 1, WATCHED).astype(np.int64)
    seen = {k: (tuple(x[watched] for x in v) if isinstance(v, tuple) else v[watched]) for k, v in n_ref.items()}
    bound = ForwardBound(r_params, seen, ctx.reference.run.activation)
    allowed_of = lambda obs: 2 * bound(obs)[1]              # noqa: E731  (both sides' float32 bounds)
    if ctx.ref_u:                                           # the port's float32 bound + the reference's TF32 one
        ref_bound = ForwardBound(r_params, seen, ctx.reference.run.activation, u_operand=ctx.ref_u)
        allowed_of = lambda obs: bound(obs)[1] + ref_bound(obs)[1]      # noqa: E731
    uniforms = ctx.ref.action_uniforms(seed, e, pop, cartpole.MAX_STEPS)
    forward = ctx.port.has("forward")
    returns, worst, forks, steps = _lockstep(
        lambda obs: ctx.ref.forward(r_params, n_ref, obs, n_out),
        (lambda obs: ctx.port.forward(r_params, n_ref, obs, n_out)) if forward else None,
        allowed_of, watched, cartpole.reset(seed + e + np.arange(pop)), uniforms, ctx.sizes.traj_max_steps,
        ctx.port.actions if ctx.port.has("actions") else sample_actions)
    mean = Observation(e, None, "mean return (lockstep)", "both", size, float(returns.mean()), ("info",))
    if not forward:
        return [mean], returns
    return [Observation(e, "outputs", "outputs: max |logits port - ref| / bound", "both",
                        f"{size} {steps} member-steps ({watched.size} members judged)", worst, ("bound", 1.0),
                        "ForwardBound, both sides on the reference's parameters and noise" + (
                            " (the reference's with TF32 operands)" if ctx.ref_u else "")),
            Observation(e, None, "steps where the port's own sample would differ", "port",
                        f"{size} {steps} member-steps", forks, ("info",)), mean], returns


def _shaping_gradient_obs(ctx, e: int, n_ref: dict, returns: np.ndarray):
    """Shaped fitness (both sides, the same returns) and the gradient estimate (both sides, the reference's noise
    and shaped fitness). Returns (observations, the port's shaped fitness, the port's gradient on it or None)."""
    shapes, cfg = ctx.shapes, ctx.cfg
    size, sigma_e = f"epoch {e} pop={cfg.pop}", ctx.reference.sigma_at(e)
    sp, sr = ctx.port.shape_fitness(returns, cfg.group_size), ctx.ref.shape_fitness(returns, cfg.group_size)
    f_err = 2 * shaping_bound(returns)
    obs = [Observation(e, "fitness", "fitness: max |shaped port - ref| / bound", "both", size,
                       float(np.max(np.abs(sp.astype(np.float64) - sr) / f_err)), ("bound", 1.0),
                       "float32 shaping bound, both sides")]
    gp, gr = ctx.port.gradient(n_ref, sr, sigma_e, shapes), ctx.ref.gradient(n_ref, sr, sigma_e, shapes)
    g_err = {k: _grad_bound(k, n_ref, sr) + _grad_bound(k, n_ref, sr, ctx.ref_u) for k in shapes}
    worst = max(float(np.max(np.abs(gp[k].astype(np.float64) - gr[k]) / np.maximum(g_err[k], 1e-300)))
                if np.any(gp[k] != gr[k]) else 0.0 for k in shapes)
    obs.append(Observation(e, "gradient", "gradient: max |port - ref| / bound", "both", size, worst, ("bound", 1.0),
                           "float32 bound of the estimate on the reference's noise and shaped fitness"))
    return obs, sp, (gp if np.array_equal(sp, sr) else None)


def _step_obs(ctx, e: int, run: _Run, n_ref: dict, returns, sigma_port: float, sp, gp):
    """One es_tell on each side (the reference's returns); the port's against the reference optimizer on its own
    parameters and gradient. Returns (observations, the step, run)."""
    shapes, pop, reference = ctx.shapes, ctx.cfg.pop, ctx.reference
    size = f"epoch {e} pop={pop}"
    old = {k: v.copy() for k, v in ctx.port.es_params(run.port, shapes).items()}   # es_tell may update in place
    grad = gp if gp is not None and sigma_port == reference.sigma_at(e) else ctx.port.gradient(
        n_ref, sp, sigma_port, shapes)
    grad = {k: v.copy() for k, v in grad.items()}
    expected, shadow = reference.optimizer_apply(old, run.shadow, grad, pop, e)
    allowed, moments = lockstep.step_allowance(reference.run.optimizer, run.moments, old, grad, expected, pop,
                                               reference.lr_at(e))
    calls = run.calls + (repro_step("es_tell", Var("state"), ctx.port.received(n_ref),
                                    np.asarray(returns, np.float32), e, out="state"),)
    port_state = ctx.port.es_tell(run.port, n_ref, returns, e)
    new = ctx.port.es_params(port_state, shapes)
    ref_state = ctx.ref.es_tell(run.ref, n_ref, returns, e)
    step = lockstep.compare_step(e, old, new, expected, allowed)
    if step.worst > 1:      # the repro collector keeps the first: the ES loop replayed up to this epoch
        ctx.replay(size, calls + (repro_step("es_params", Var("state"), out="params"),), "params", new, expected,
                   allowed, f"one {reference.run.optimizer} step from the port's parameters on its own gradient "
                   "(the expected parameters), float32 bound of both sides (parity.mlp.lockstep)")
    new_ref = ctx.ref.es_params(ref_state, shapes)
    apart = max(float(np.max(np.abs(new[k].astype(np.float64) - new_ref[k]))) for k in shapes)
    obs = [Observation(e, "step", "step: max |port - expected| / bound", "both", size, step.worst, ("bound", 1.0),
                       f"one {reference.run.optimizer} step from the port's parameters on its own gradient, "
                       "float32 bound of both sides (parity.mlp.lockstep)"),
           Observation(e, "lr", "lr: port's step along the expected one, |ratio - 1|", "both",
                       f"{size} lr={fmt(reference.lr_at(e))}", abs(step.lr_ratio - 1), ("bound", step.lr_allowed),
                       "|step bound|_2 / |expected step|_2") if step.moved > 0 else
           Observation(e, None, "lr: no expected step (zero gradient)", "both", size, 0.0, ("info",)),
           Observation(e, None, "parameters: max |port - ref| (each side on its own trajectory)", "both", size,
                       apart, ("info",))]
    run = run._replace(port=port_state, ref=ref_state, shadow=shadow, moments=moments,
                       history=run.history + ((old, grad, new),), calls=calls)
    return obs, step, run


def _schedule_obs(ctx, params0: dict, alpha: float) -> tuple[list[Observation], int]:
    """The sigma schedule over Sizes.sigma_epochs epochs of the port's own es_ask / es_tell on the suite's synthetic
    fitness stream (parity.mlp.sigma_schedule). Returns (observations, epochs read)."""
    cfg = ctx.cfg
    fitness = ctx.rng("sigma schedule fitness").standard_normal((ctx.sizes.sigma_epochs, cfg.pop))
    draws = sigma_schedule.collect(ctx.port, ctx.reference, params0, ctx.seed, ctx.shapes, cfg.pop, cfg.rank, fitness)
    reading = sigma_schedule.read(draws, alpha)
    obs = []
    if reading.exact is not None:
        ex = reading.exact
        obs.append(Observation(ex.epoch, "schedule", "sigma schedule: repeated draws, |port's sigma_e/sigma_b over "
                               "the reference's - 1|", "both", f"epochs {ex.first} to {ex.epoch} pop={cfg.pop}",
                               ex.value, ("bound", ex.allowed), "same draws: A_e / A_b, 8u (parity.mlp.sigma_schedule)",
                               ("exact", ex)))
    if reading.trend is not None:
        tr = reading.trend
        obs.append(Observation(tr.last, "schedule", "sigma schedule: t of the slope of log mean square / sigma_e^2 "
                               "over fresh draws", "both", f"{tr.epochs} fresh epochs pop={cfg.pop}, slope "
                               f"{fmt(tr.slope)} +- {fmt(tr.stderr)} per epoch", tr.t, ("stat", -tr.crit, tr.crit,
                                                                                       tr.alpha),
                               f"t({tr.epochs - 2}), alpha={tr.alpha:.2g} (parity.mlp.sigma_schedule)", ("trend", tr)))
    if not obs:
        obs.append(Observation(reading.epochs - 1, None, "sigma schedule: too few fresh epochs for a slope", "both",
                               f"{reading.epochs} epochs pop={cfg.pop}", float(reading.epochs), ("info",)))
    return obs, reading.epochs


def measure(ctx) -> Measured:
    cfg, epochs, shapes = ctx.cfg, ctx.sizes.traj_epochs, ctx.shapes
    alpha = statistical_alpha(epochs)
    params0 = ctx.reference.init_params(shapes, ctx.seed)
    init = repro_step("es_init", params0, int(ctx.seed), out="state")
    run = _Run(ctx.port.es_init(params0, ctx.seed), ctx.ref.es_init(params0, ctx.seed),
               ctx.reference.optimizer_init(params0), lockstep.moments_init(params0), None, (), (init,))
    observations: list[Observation] = []
    steps: list[lockstep.Step] = []
    for e in range(epochs):
        ctx.log(f"[{NAME}] epoch {e}")
        noise_obs, n_ref, sigma_port, run = _noise_obs(ctx, e, run, alpha)
        output_obs, returns = _outputs_obs(ctx, e, ctx.ref.es_params(run.ref, shapes), n_ref)
        math_obs, sp, gp = _shaping_gradient_obs(ctx, e, n_ref, returns)
        step_obs, step, run = _step_obs(ctx, e, run, n_ref, returns, sigma_port, sp, gp)
        observations += noise_obs + output_obs + math_obs + step_obs
        steps.append(step)
    ctx.log(f"[{NAME}] sigma schedule over up to {ctx.sizes.sigma_epochs} epochs")
    schedule_obs, schedule_epochs = _schedule_obs(ctx, params0, alpha)
    observations += schedule_obs
    first_differs = bool(steps) and not steps[0].ok
    candidates, ratios = (lockstep.optimizer_candidates(ctx.reference, run.history, cfg.pop)
                          if first_differs else ({}, {}))
    sigma0 = ctx.reference.sigma_at(0)
    fits = lockstep.scale_fits(ctx.reference, run.history, cfg.pop, sigma0) if first_differs else ()
    settings = ctx.reference.run
    return Measured(tuple(observations), tuple(steps), candidates, ratios, epochs, cfg.pop, ctx.seed,
                    ctx.sizes.traj_max_steps, ctx.port.jax_compatible_rng, ctx.port.has("forward"),
                    settings.optimizer, settings.lr_decay, settings.sigma_decay, fits, sigma0, schedule_epochs)


def _diagnose(o: Observation, m: Measured, upstream: dict) -> list:
    """The causes of one row beyond tolerance: what this check reads off the port where it can (sigma schedule,
    optimizer, lr schedule), else every cause of the isolated check that explains it, else the quantity in words."""
    schedule = [s for s in m.observations if s.quantity == "schedule" and not s.ok]
    if o.quantity in ("sigma", "schedule") and schedule:     # the reading over the most epochs says the most
        kind, found = schedule[0].detail
        if kind == "exact":
            return [diagnose.sigma_schedule_cause(found.epoch, found.ratio, m.sigma_decay, found.first)]
        return [diagnose.sigma_trend_cause(found.epochs, found.slope, found.stderr, m.sigma_decay)]
    if o.quantity == "sigma":     # one fit for the run: the last epoch that differs says the most
        last = [s for s in m.observations if s.quantity == "sigma" and not s.ok][-1]
        return [diagnose.sigma_schedule_cause(last.epoch, last.detail[1], m.sigma_decay)]
    if o.quantity in ("step", "lr"):
        found = lockstep.step_causes(m.steps, m.candidates, m.candidate_ratios, m.optimizer, m.lr_decay,
                                     m.scale_fits, m.sigma, m.pop)
        if found:
            return found
    causes = [c for check in UPSTREAM[o.quantity] for c in diagnose.follows(check, upstream.get(check, ()))]
    if causes:      # one per knob (an upstream check may name a knob once per leaf or case)
        first: dict = {}
        for c in causes:
            first.setdefault(c.knob or c.text, c)
        return list(first.values())
    if o.quantity == "noise" and o.detail:
        sigma = next((s for s in m.observations if s.quantity == "sigma" and s.epoch == o.epoch), None)
        if sigma is not None and not sigma.ok:
            return _diagnose(sigma, m, upstream)
        return [diagnose.other("noise scale", f"the port's noise at epoch {o.epoch} is {fmt(o.detail[1])}x the "
                                              "reference's (same draws)")]
    return [diagnose.other("training trajectory", f"{WORDS[o.quantity]} part from the reference's at epoch "
                                                  f"{o.epoch} although the isolated checks pass")]


def judge(m: Measured, upstream: dict) -> Recorder:
    """upstream: check name -> its causes (a row the isolated checks explain is attributed to them)."""
    rec = Recorder(NAME)
    for o in m.observations:
        if o.limit[0] == "bound":
            ok = rec.bound(o.row, o.side, o.size, o.value, o.limit[1], o.why)
        elif o.limit[0] == "stat":
            ok = rec.stat(o.row, o.side, o.size, o.value, o.limit[1], o.limit[2], o.limit[3], o.why)
        else:
            ok = True
            rec.info(o.row, o.side, o.size, o.value)
        if not ok:
            found = _diagnose(o, m, upstream)
            rec.rows[-1] = dataclasses.replace(rec.rows[-1], cause="; ".join(c.text for c in found))
            rec.causes.extend(found)
    rec.causes[:] = list(dict.fromkeys(rec.causes))
    return rec


def section(m: Measured) -> str:
    failures = m.failures
    verdict_lines = ([f"- {q}: beyond tolerance at epoch{'s' if len(es) > 1 else ''} {', '.join(map(str, es))}"
                      for q in QUANTITIES if (es := failures.get(q))]
                     or [f"The sides agree on every quantity at all {m.epochs} epochs."])
    return "\n".join([
        f"{m.epochs} epochs, population {m.pop}, from the reference's initial parameters (seed {m.seed}); CartPole "
        f"resets seed + epoch + member, the reference's action uniforms; episodes of at most {m.max_steps} steps "
        "on the reference's policy and actions. Both sides' es_tell get the reference's returns every epoch and "
        "each continues from its own state, so every epoch is compared however far the sides have parted; each "
        "comparison is re-synchronised to isolate that epoch's piece: "
        + ("the port's es_ask noise bit for bit (it claims JAX-compatible draws); "
           if m.jax_compatible else "the port's es_ask noise by its sigma schedule only (its own generator); ")
        + "its sigma_e / sigma_0 against its own epoch 0 (exact from repeated draws, else an F test); "
        + f"apart from the lockstep, its sigma schedule over {m.schedule_epochs} epochs of its own es_ask / es_tell "
        "on synthetic fitness (exact where the draws repeat, else a t test of the slope of the noise's log mean "
        "square over the reference's sigma_e^2, resolving a 0.999 decay: parity.mlp.sigma_schedule); "
        + ("its logits on the reference's parameters and noise at every step; " if m.has_forward else
           "(no `forward`: logits not compared); ")
        + "shaped fitness of the same returns; the gradient on the reference's noise and shaped fitness; its "
        f"parameters after es_tell against one {m.optimizer} step (lr_decay {fmt(m.lr_decay)}) from its own "
        "parameters on its own gradient of its own shaping, and that step's size (lr). Allowed: float32 bounds "
        "(parity.core.tolerances, parity.mlp.lockstep).",
        "",
        *verdict_lines,
    ])


def run(ctx):
    m = measure(ctx)
    upstream = {check: ctx.causes_of(check) for checks in UPSTREAM.values() for check in checks}
    return summarize(NAME, judge(m, upstream), section(m))
