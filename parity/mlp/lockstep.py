"""The lockstep trajectory's per-epoch readings, their float32 tolerances, and the diagnosis of a step that differs.

Two readings the trajectory check takes every epoch besides the isolated ones (outputs, shaped fitness, gradient):

- **sigma**: the port's sigma_e / sigma_0 read off its own `es_ask` noise, over the reference's. Relative to
  the port's own epoch 0, so a constant scale drift (the noise check's business) or a missing bias leaf cannot
  make it fail: only a different sigma schedule does.
- **step**: the port's parameters after one `es_tell` on the reference's returns, against the reference's
  optimizer applied to the same parameters (the port's own, before the step) with the port's own `gradient()`
  of its own shaping of those returns, at the reference's lr for the epoch. Shaping and gradient drifts have
  their own rows, so this isolates what only the step adds: the optimizer and the learning-rate schedule (and
  anything else the port's training loop does). `lr` is the step's size along the reference's direction.

Tolerances (u = 2^-24, gamma_n = n u / (1 - n u) as in parity.core.tolerances; every bound is first order in u):

- sigma, the port's draws at epoch e equal its epoch-0 draws (B identical): c = median_i A_e,i / A_0,i. Each A
  element is z * fl(fl(sigma_e) / sqrt r) rounded once more (3 roundings; the rounding of sqrt r is common to
  both epochs and cancels), so A_e / A_0 = (sigma_e / sigma_0)(1 + 6u); the reference's float32 sigma_e and
  sigma_0 add 2u: |c / (sigma_e / sigma_0)_ref - 1| <= 8u (SIGMA_OWN_DRAWS). A median of ratios that each obey
  the bound obeys it.
- sigma, the port's draws equal the reference's at epochs e and 0 (a JAX-compatible port whose draws change):
  (A_port,e / A_ref,e) / (A_port,0 / A_ref,0), four elements of 3 roundings each: 12u (SIGMA_SHARED_DRAWS).
- sigma, fresh draws: with mirrors dropped, F = (mean A_e^2 / sigma_e^2) / (mean A_0^2 / sigma_0^2) (the
  reference's sigmas) is F(n_e, n_0)-distributed for a faithful port (independent standard normals times
  sigma / sqrt r); exact two-sided interval at the check's share of the false-alarm budget.
- step, sgd: both sides take one step from the same parameters and the same gradient (the protocol asks
  es_tell to use the gradient `gradient()` returns for its own shaping, as it asks of optimizer_step): per side
  u |p_new| + gamma_24 |update| (parity.core.tolerances.update_bound), the two sides summed.
- step, adam / adamw (optax's defaults b1 0.9, b2 0.999, eps 1e-8, weight decay 1e-4): the moments' rounding is
  carried in float64 from the gradients both sides saw: |dm_t| <= b1 |dm_t-1| + gamma_6 (b1 |m_t-1| + (1-b1)|d_t|)
  (d = -(g sqrt N), itself 2 roundings), |dv_t| <= b2 |dv_t-1| + gamma_8 (b2 v_t-1 + (1-b2) d_t^2); the bias
  correction 1 - b^t loses gamma_(t+4) b^t / (1 - b^t) (pow and the float32 b, amplified by the cancellation);
  then m^ / (sqrt v^ + eps) to first order, + wd p, x lr, + p: one rounding each. Both sides summed.
- lr: rho = <d_port, d_ref> / |d_ref|^2 with d the parameter change; |rho - 1| <= |allowed|_2 / |d_ref|_2 by
  Cauchy-Schwarz (allowed = the step's elementwise bound), so it passes whenever the step does.

Diagnosis of a step that differs: when the first step differs, each optax optimizer (sgd, adam, adamw, the
reference's lr) is applied to the port's first parameters and gradient; one other than the reference's that comes
within MATCH (the updates check's threshold) names `optimizer`, and the port's step sizes along that optimizer's,
epoch by epoch, name `lr_decay` too when they drift by more than MATCH. When the first step agrees and the later
ones point the same way as the reference's (cosine above ALIGNED: a rounding-level difference in direction), their
size ratios per epoch are fitted to lr_decay^e (parity.core.diagnose.lr_schedule_cause). When no optimizer reproduces the
first step as is, each is tried on the port's gradient times a fitted scale (parity.core.optscale, its fit and tolerance
stated there): "adam on a gradient 1/sigma times the reference's", "sgd without the sqrt(N) factor".
"""
from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np
from scipy import stats

from parity.core import diagnose, optscale
from parity.core.optscale import MATCH
from parity.mlp import noiseform
from parity.core.tolerances import U32, gamma, update_bound
from parity.core.verdict import Cause, fmt
from spec.knobs import CHOICES

SIGMA_OWN_DRAWS = 8 * U32       # |c / ref - 1| with the port's own epoch-0 draws (see the module docstring)
SIGMA_SHARED_DRAWS = 12 * U32   # ... with the reference's draws at both epochs
ADAM = {"b1": 0.9, "b2": 0.999, "eps": 1e-8}   # optax.adam's defaults (the reference's SOLVERS)
ADAMW_DECAY = 1e-4                              # optax.adamw's default weight decay
ALIGNED = 1 - 1e-6   # cosine above which two steps point the same way: their sizes differ, not their directions


# ----------------------------------------------------------------------------- sigma
def _unmirrored(perturbations: np.ndarray, pop: int) -> np.ndarray:
    """Members that are nobody's mirror or the first of their pair (independent draws), from (pop, ...) rows."""
    mirror = diagnose.mirror_map(perturbations.reshape(pop, -1))
    return np.array([i for i in range(pop) if mirror[i] < 0 or i < mirror[i]])


def _independent_a(noise: dict, pop: int) -> np.ndarray:
    """The A entries of the members that are nobody's mirror or the first of their pair (independent normals)."""
    names = noiseform.weight_names(noise)
    w0 = min(names, key=lambda k: noise[k][0][0].size * noise[k][1][0].shape[0])   # smallest A B^T
    a, b = (noise[w0][i].astype(np.float64) for i in (0, 1))
    reps = _unmirrored(a @ np.swapaxes(b, 1, 2), pop)
    return np.concatenate([noise[k][0][reps].ravel() for k in names]).astype(np.float64)


def _dense_reading(own: dict, sigma_e: float, sigma_0: float, pop: int, rank: int, alpha: float) -> "SigmaReading":
    """Fresh dense draws: E_e / sigma_e against EGGROLL's entry distribution (exact KS over independent entries of
    members that are nobody's mirror); the ratio reported is the entries' rms over sigma_e."""
    w0 = min(noiseform.weight_names(own), key=lambda k: noiseform.entries(own, k))
    reps = _unmirrored(noiseform.perturbation(own, w0), pop)
    _, value, limit, why, ratio = noiseform.scale_test(own, reps, sigma_e, rank, alpha)
    return SigmaReading(value, limit, "fresh dense draws at the reference's sigma_e: " + why, ratio, False)


class SigmaReading(NamedTuple):
    """The port's sigma_e / sigma_0 over the reference's, and how it was read."""

    value: float        # |ratio - 1| (exact readings) or the F statistic (fresh draws)
    limit: tuple        # ("bound", allowed) | ("stat", lo, hi, alpha)
    why: str
    ratio: float        # the port's sigma_e / sigma_0 over the reference's
    exact: bool         # read from the same draws (the ratio is exact up to rounding)


def read_sigma(own: dict, own0: dict, ref: dict, ref0: dict, sigma_e: float, sigma_0: float, pop: int,
               alpha: float, rank: int = 1) -> SigmaReading:
    """own/ref: the port's and the reference's es_ask noise at epoch e; own0/ref0: at epoch 0 (rank: r, used for
    a dense port's fresh draws)."""
    expected = sigma_e / sigma_0
    if noiseform.same_draws(own, own0):
        c = noiseform.scale_ratio(own, own0) / expected
        return SigmaReading(abs(c - 1), ("bound", SIGMA_OWN_DRAWS), "same draws as its epoch 0: A_e / A_0, 8u",
                            c, True)
    if noiseform.same_draws(own, ref) and noiseform.same_draws(own0, ref0):
        c = noiseform.scale_ratio(own, ref) / noiseform.scale_ratio(own0, ref0)
        return SigmaReading(abs(c - 1), ("bound", SIGMA_SHARED_DRAWS),
                            "the reference's draws: (A_port / A_ref)_e / (A_port / A_ref)_0, 12u", c, True)
    if noiseform.is_dense(own):
        return _dense_reading(own, sigma_e, sigma_0, pop, rank, alpha)
    a_e, a_0 = _independent_a(own, pop), _independent_a(own0, pop)
    f = float(np.mean(a_e ** 2) / sigma_e ** 2 / (np.mean(a_0 ** 2) / sigma_0 ** 2))
    lo, hi = float(stats.f.ppf(alpha / 2, a_e.size, a_0.size)), float(stats.f.isf(alpha / 2, a_e.size, a_0.size))
    return SigmaReading(f, ("stat", lo, hi, alpha), f"fresh draws: F({a_e.size}, {a_0.size}), alpha={alpha:.2g}",
                        math.sqrt(f), False)


# ----------------------------------------------------------------------------- one es_tell step
class Moments(NamedTuple):
    """Per leaf, float64: a stateful optimizer's exact moments of the gradients seen and their rounding bounds."""

    t: int
    m: dict
    v: dict
    em: dict
    ev: dict


def moments_init(params: dict) -> Moments:
    zeros = {k: np.zeros(np.shape(v)) for k, v in params.items()}
    return Moments(0, zeros, dict(zeros), dict(zeros), dict(zeros))


def _adam_allowance(mo: Moments, optimizer: str, old: dict, grad: dict, new: dict, pop: int, lr: float):
    """(one side's bound on the new params per leaf, the moments after this step) for optax adam/adamw."""
    b1, b2, eps = ADAM["b1"], ADAM["b2"], ADAM["eps"]
    t = mo.t + 1
    c1, c2 = 1 - b1 ** t, 1 - b2 ** t
    rel1, rel2 = gamma(t + 4) * b1 ** t / c1 + U32, gamma(t + 4) * b2 ** t / c2 + U32
    wd = ADAMW_DECAY if optimizer == "adamw" else 0.0
    out, m, v, em, ev = {}, {}, {}, {}, {}
    for k in old:
        d = -np.asarray(grad[k], np.float64) * math.sqrt(pop)
        m[k], v[k] = b1 * mo.m[k] + (1 - b1) * d, b2 * mo.v[k] + (1 - b2) * d * d
        em[k] = b1 * mo.em[k] + gamma(6) * (b1 * np.abs(mo.m[k]) + (1 - b1) * np.abs(d))
        ev[k] = b2 * mo.ev[k] + gamma(8) * (b2 * mo.v[k] + (1 - b2) * d * d)
        m_hat, v_hat = m[k] / c1, v[k] / c2
        em_hat, ev_hat = em[k] / c1 + np.abs(m_hat) * rel1, ev[k] / c2 + v_hat * rel2
        root = np.sqrt(v_hat)
        e_root = np.where(root > 0, ev_hat / (2 * np.maximum(root, 1e-300)), np.sqrt(ev_hat)) + U32 * root
        s = root + eps
        q = m_hat / s
        e_q = em_hat / s + np.abs(q) * (e_root + U32 * s) / s + U32 * np.abs(q)
        p = np.asarray(old[k], np.float64)
        e_q = e_q + gamma(2) * wd * np.abs(p) + U32 * np.abs(q + wd * p)
        out[k] = lr * e_q + U32 * lr * np.abs(q + wd * p) + U32 * np.abs(np.asarray(new[k], np.float64))
    return out, Moments(t, m, v, em, ev)


def step_allowance(optimizer: str, moments: Moments, old: dict, grad: dict, expected: dict, pop: int, lr: float):
    """(both sides' elementwise bound on |port's params after the step - expected|, the moments after the step)."""
    if optimizer == "sgd":
        return {k: 2 * update_bound(expected[k], expected[k].astype(np.float64) - old[k]) for k in old}, moments
    one, moments = _adam_allowance(moments, optimizer, old, grad, expected, pop, lr)
    return {k: 2 * v for k, v in one.items()}, moments


class Step(NamedTuple):
    """One epoch's es_tell step of the port against the expected one (from the same parameters)."""

    epoch: int
    worst: float        # max |port - expected| / allowed over every parameter
    lr_ratio: float     # <d_port, d_expected> / |d_expected|^2 (nan when the expected step is zero)
    lr_allowed: float   # |allowed|_2 / |d_expected|_2
    cosine: float       # of the two parameter changes
    moved: float        # |d_expected|_2

    @property
    def ok(self) -> bool:
        return math.isfinite(self.worst) and self.worst <= 1.0


def _flat(tree: dict, names) -> np.ndarray:
    return np.concatenate([np.asarray(tree[k], np.float64).ravel() for k in names])


def compare_step(epoch: int, old: dict, new: dict, expected: dict, allowed: dict) -> Step:
    names = sorted(old)
    o, n, x, a = (_flat(t, names) for t in (old, new, expected, allowed))
    diff = np.abs(n - x)
    worst = float(np.max(np.where(diff > 0, diff / np.maximum(a, 1e-300), 0.0)))
    d_port, d_exp = n - o, x - o
    moved = float(np.linalg.norm(d_exp))
    if moved == 0:
        return Step(epoch, worst, float("nan"), float("nan"), float("nan"), 0.0)
    norm_port = float(np.linalg.norm(d_port))
    cosine = float(d_port @ d_exp / (norm_port * moved)) if norm_port > 0 else 0.0
    return Step(epoch, worst, float(d_port @ d_exp) / moved ** 2, float(np.linalg.norm(a)) / moved, cosine, moved)


def _chain_ratios(reference, history, pop: int) -> dict[int, float]:
    """Per epoch, the port's step along `reference`'s optimizer step on the same parameters and gradient (its own
    state fed the port's gradients): what an lr schedule changes."""
    state, ratios = reference.optimizer_init(history[0][0]), {}
    for e, (old, grad, new) in enumerate(history):
        names = sorted(old)
        params, state = reference.optimizer_apply(old, state, grad, pop, e)
        cand = _flat(params, names) - _flat(old, names)
        if cand @ cand > 0:
            ratios[e] = float((_flat(new, names) - _flat(old, names)) @ cand / (cand @ cand))
    return ratios


def optimizer_candidates(reference, history, pop: int) -> tuple[dict[str, float], dict[int, float]]:
    """How far each optax optimizer's first step (the reference's lr at epoch 0, on the port's gradient, from the
    port's parameters) is from the port's first es_tell step, as a share of the candidate's largest entry; and, when
    another optimizer than the reference's reproduces it, the port's step sizes per epoch relative to that one's.
    history: per epoch (the port's parameters before es_tell, its gradient, its parameters after)."""
    old, grad, new = history[0]
    names = sorted(old)
    port = _flat(new, names) - _flat(old, names)
    errors = {}
    for opt in CHOICES["optimizer"]:
        cand = reference.with_run_knobs(optimizer=opt)
        params, _ = cand.optimizer_apply(old, cand.optimizer_init(old), grad, pop, 0)
        step = _flat(params, names) - _flat(old, names)
        errors[opt] = float(np.max(np.abs(port - step)) / max(float(np.max(np.abs(step))), 1e-30))
    best = min(errors, key=errors.get)
    matched = errors[best] < MATCH and best != reference.run.optimizer
    return errors, (_chain_ratios(reference.with_run_knobs(optimizer=best), history, pop) if matched else {})


def scale_fits(reference, history, pop: int, sigma: float) -> tuple:
    """parity.core.optscale's fitted and verified gradient scale per optax optimizer, for the port's first es_tell step
    (the reference's lr at epoch 0, the port's own gradient and parameters)."""
    old, grad, new = history[0]
    return optscale.candidates(reference, CHOICES["optimizer"], old, grad, new, pop, reference.lr_at(0), sigma)


def _scale_words(fits, name: str, sigma: float, pop: int) -> str:
    """The matched optimizer's gradient scale in words when its fit pins one other than 1 (else '')."""
    fit = next((f for f in fits if f.optimizer == name), None)
    if fit is None or not fit.identified or fit.name == "1" or fit.error >= MATCH:
        return ""
    return optscale.words(fit, sigma, pop)


def step_causes(steps, candidates: dict[str, float], ratios: dict[int, float], optimizer: str,
                lr_decay: float, fits: tuple = (), sigma: float = 0.0, pop: int = 0) -> list[Cause]:
    """The knobs a differing es_tell step points at (optimizer, possibly on a scaled gradient, and lr_decay from the
    step sizes under the matching optimizer), or a learning rate no knob names; [] when the steps alone cannot tell
    (the caller then asks the updates check, or words it generally). fits: parity.core.optscale fits of the first step."""
    failing = [s for s in steps if not s.ok]
    if not failing:
        return []
    if candidates:
        best = min(candidates, key=candidates.get)
        if candidates[best] < MATCH and best != optimizer:
            found = [diagnose.optimizer_cause(best, optimizer, f"{fmt(candidates[optimizer])} of the largest entry "
                                              f"of the first es_tell step; {best}'s is within "
                                              f"{fmt(candidates[best])}", _scale_words(fits, best, sigma, pop))]
            if any(abs(r - 1) > MATCH for r in ratios.values()):
                found.append(diagnose.lr_schedule_cause(ratios, lr_decay))
            return found
    fit = optscale.best_match(fits, MATCH) if not steps[0].ok else None
    if fit is not None and not (fit.optimizer == optimizer and fit.name == "1"):
        worst = (f"{fmt(candidates[optimizer])} of the largest entry of the first es_tell step"
                 if optimizer in candidates else "")
        return [diagnose.scaled_optimizer_cause(fit, optimizer, optscale.words(fit, sigma, pop), worst)]
    moved = [s for s in failing if s.moved > 0]
    if not moved or not all(s.cosine > ALIGNED for s in moved):
        return []
    if all(abs(s.lr_ratio - 1) <= s.lr_allowed for s in moved):
        worst = max(moved, key=lambda s: s.worst)
        return [diagnose.other("es_tell step", f"the port's step at epoch {worst.epoch} is {fmt(worst.worst)} bounds "
                                               f"from one {optimizer} step on its own gradient, though its size "
                                               f"({worst.lr_ratio:.6f}x) and direction (cosine {worst.cosine:.6f}) "
                                               "match: not a schedule; rounding in the port's own update beyond one "
                                               "step's float32 bound, or a step taken on a gradient other than the "
                                               "one it reports")]
    if steps[0].ok:
        return [diagnose.lr_schedule_cause({s.epoch: s.lr_ratio for s in steps if s.moved > 0}, lr_decay)]
    return [diagnose.other("learning rate", f"the port's es_tell step is {steps[0].lr_ratio:.6f}x the reference "
                                            f"{optimizer} step on the port's own gradient from epoch 0 on (same "
                                            "direction); no knob names the base learning rate")]
