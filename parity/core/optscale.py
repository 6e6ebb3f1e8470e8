"""The optimizer up to a gradient scale: which optax optimizer, fed the port's gradient times c, reproduces the port's
first step, and which c (named when it is 1/sigma, 1/sqrt(N), ...).

Ports often step on a gradient in another convention: divided by sigma once more, or without the reference's
sqrt(N) factor. Compared by exact equality such a step matches no optimizer. Here c is fitted in closed form, in a
space where the first step is linear in the unknown and each entry's rounding error is bounded:

- sgd: the step is c s with s the sgd step at c = 1 (lr sqrt(N) g): linear in c. Weighted least squares in the
  parameter-change space, weight 1/e_i^2 with e_i the entry's float32 bound (parity.core.tolerances.update_bound):
  c_hat = sum(p s / e^2) / sum(s^2 / e^2); worst case |c_hat - c| <= sum(|s| / e) / sum(s^2 / e^2), since each
  |p_i - c s_i| <= e_i. For sgd a gradient scale and a learning-rate factor are the same thing (said so).
- adam, adamw (optax's defaults): the first step is bias-corrected, m_hat = c d, sqrt(v_hat) = c |d| (d = g sqrt N),
  so |step_i| = lr c |d_i| / (c |d_i| + eps) once adamw's lr wd p is removed. Adam is scale-invariant but for eps:
  y_i = lr / |step_i| - 1 = (eps / |d_i|) k with k = 1/c is linear in k. Weighted least squares in y, x = eps/|d|,
  weight 1/delta^2 with delta_i = (1 + y_i) e_i / |step_i| (the bound on y_i's error from e_i):
  k_hat = sum(x y / delta^2) / sum(x^2 / delta^2), worst case |k_hat - k| <= sum(|x| / delta) / sum(x^2 / delta^2).
  Only entries where c|d_i| is not far above eps carry information; when none does, the interval is wide and the
  scale is reported as not identified (Adam at any scale then reproduces the step).

Tolerance for "matches up to scale": a named scale is taken when its value lies in the fitted worst-case interval
(deterministic: no false-alarm rate), else the fitted value is given. Whatever the name, the candidate optimizer fed
c g must reproduce the port's first step within MATCH of its largest entry (MATCH below, the threshold
an unscaled candidate must meet): that verification, not the fit, decides a match.

One leaf's gradient up to a scale (fit_leaf, for the tree suite's gradients check in both modes): the port's p
against the reference's r on the same noise, c = <p, r> / <r, r>, and "the same direction" when every |p_i - c r_i|
is within its worst case for a scaled reference (fit_leaf's docstring derives it from the check's own bound). A leaf
scaled down along that direction whose norm is a round value, or one norm several leaves share (caps, within
cap_tolerance), is read as clipped at that norm.
"""
from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np

from parity.core.tolerances import U32, gamma, update_bound

ADAM_EPS = 1e-8     # optax.adam's and adamw's default eps
ADAMW_DECAY = 1e-4  # optax.adamw's default weight decay
MATCH = 1e-4        # an optimizer candidate reproduces the port's first step within this share of its largest entry


class ScaleFit(NamedTuple):
    """A fitted gradient scale c for one optimizer, its worst-case interval and, once verified, the residual."""

    optimizer: str
    c: float
    lo: float
    hi: float
    name: str | None     # "1/sigma", "1/sqrt(N)", ... when one lies in [lo, hi] (the closest when several)
    error: float = math.inf   # max |port step - candidate step at c| / max |candidate step|

    @property
    def identified(self) -> bool:
        """Whether the interval pins the scale: bounded, positive, within a factor 2 either way."""
        return 0 < self.lo and math.isfinite(self.hi) and self.hi <= 4 * self.lo


def named_scales(sigma: float, pop: int, rank: int | None = None) -> dict[str, float]:
    """The conventions a port's gradient is seen to differ by, as factors on the reference's gradient (the rank's
    where it is given)."""
    root = math.sqrt(pop)
    names = {"1": 1.0, "1/sigma": 1 / sigma, "sigma": sigma, "1/sqrt(N)": 1 / root, "sqrt(N)": root,
             "1/(sigma sqrt(N))": 1 / (sigma * root), "sqrt(N)/sigma": root / sigma, "1/sigma^2": 1 / sigma ** 2,
             "N": float(pop), "1/N": 1 / pop}
    if rank is not None:
        names.update({"sqrt(r)": math.sqrt(rank), "1/sqrt(r)": 1 / math.sqrt(rank)})
    # seen in real ports (issue 53), after the older names so that one equal in value at some size never takes
    # its place (scale_names keeps the table's order on ties)
    later = {"N/sigma": pop / sigma, "1/(sigma^2 sqrt(N))": 1 / (sigma ** 2 * root)}
    return {**names, "2": 2.0, "1/2": 0.5, **later}


def scale_names(c: float, lo: float, hi: float, sigma: float, pop: int, rank: int | None = None) -> list[str]:
    """Every named scale inside [lo, hi], the closest to c in log first (ties in the table's order); [] when none
    is or c is not a positive finite number."""
    inside = {n: v for n, v in named_scales(sigma, pop, rank).items() if lo <= v <= hi}
    if not (0 < c < math.inf):
        return []
    # equal values formed by different float64 expressions (N/sigma and 1/sigma^2 at N = 1/sigma) differ by an ulp:
    # rounded to 1e-9, they tie and keep the table's order (the older name first)
    return sorted(inside, key=lambda n: round(abs(math.log(inside[n] / c)), 9))


def name_scale(c: float, lo: float, hi: float, sigma: float, pop: int) -> str | None:
    """The named scale inside [lo, hi], the closest to c in log when several; None when none is."""
    found = scale_names(c, lo, hi, sigma, pop)
    return found[0] if found else None


# ----------------------------------------------------------------------------- one leaf's gradient up to a scale
SCALE_ROUNDINGS = 4     # roundings a port's scaling of its gradient adds per entry (constants formed and applied)


class LeafFit(NamedTuple):
    """A leaf's port gradient p against the reference's r: p ~ c r (least squares), c's worst-case interval, the
    cosine, and whether p - c r is within the rounding bound (the direction is the reference's)."""

    c: float
    lo: float
    hi: float
    cosine: float
    aligned: bool
    excess: float         # max |p - c r| / its allowance (<= 1: aligned)


def fit_leaf(port: np.ndarray, ref: np.ndarray, bound: np.ndarray) -> LeafFit:
    """p = c* r + d with |d_i| <= e_i = |c*| b_i + SCALE_ROUNDINGS u |p_i| when the port's gradient is the
    reference's scaled (b: the check's bound on |port - ref| at scale 1, both sides' rounding; u |p| per rounding of
    the scaling). Then c_hat = <p, r> / <r, r> has |c_hat - c*| <= h = sum(e |r|) / <r, r>, and
    |p_i - c_hat r_i| <= e_i + h |r_i|: within that, for every entry, the direction is the reference's."""
    p, r = (np.asarray(x, np.float64).ravel() for x in (port, ref))
    b = np.broadcast_to(np.asarray(bound, np.float64), np.shape(ref)).ravel()
    rr, norms = float(r @ r), float(np.linalg.norm(p)) * float(np.linalg.norm(r))
    if rr == 0 or not np.all(np.isfinite(p)):
        return LeafFit(math.nan, -math.inf, math.inf, math.nan, False, math.inf)
    c = float(p @ r) / rr
    half = float(np.abs(r) @ (abs(c) * b + SCALE_ROUNDINGS * U32 * np.abs(p))) / rr
    e = (abs(c) + half) * b + SCALE_ROUNDINGS * U32 * np.abs(p)       # |c*| <= |c_hat| + h
    half = float(np.abs(r) @ e) / rr
    excess = float(np.max(np.abs(p - c * r) / np.maximum(e + half * np.abs(r), 1e-300)))
    return LeafFit(c, c - half, c + half, float(p @ r) / norms if norms else 0.0, excess <= 1, excess)


# A norm that is a cap: torch's clip_grad_norm_ scales by max / (norm + 1e-6), off by 1e-6 / norm relative (1e-5
# allows norms down to 0.1), and the norm a port computes in float32 over n entries is within gamma_n of it.
CAP_RTOL = 1e-5
ROUND_MANTISSAS = (1.0, 2.0, 2.5, 5.0)


def cap_tolerance(n: int, extra: float = 0.0) -> float:
    """How far (relative) a leaf's norm may be from a cap it was clipped at: CAP_RTOL + gamma_n + extra (the
    caller's own rounding of the norm it measures)."""
    return CAP_RTOL + gamma(n) + extra


def round_value(x: float, rtol: float) -> float | None:
    """m 10^k (m in ROUND_MANTISSAS) within rtol of x, else None."""
    if not (x > 0 and math.isfinite(x)):
        return None
    k = math.floor(math.log10(x))
    for e in (k - 1, k, k + 1):
        for m in ROUND_MANTISSAS:
            v = m * 10.0 ** e
            if abs(x / v - 1) <= rtol:
                return v
    return None


def caps(norms: dict[str, tuple[float, float]]) -> dict[str, float]:
    """{leaf: the cap its norm sits at} among leaves scaled down along the reference's direction ({leaf: (norm,
    rtol)}): a round value (1.0, 0.5, ...) within rtol, else a norm two or more of them share within rtol."""
    out = {}
    for k, (x, rtol) in norms.items():
        v = round_value(x, rtol)
        shared = [y for j, (y, t) in norms.items() if j != k and abs(y / x - 1) <= max(rtol, t)]
        if v is not None:
            out[k] = v
        elif shared:
            out[k] = float(np.mean([x, *shared]))
    return out


def fit_sgd(port_step: np.ndarray, unit_step: np.ndarray, new: np.ndarray) -> tuple[float, float, float]:
    """(c, lo, hi): port_step ~ c unit_step, weighted least squares with each entry's float32 bound (flat float64)."""
    e = np.maximum(update_bound(new, port_step), 1e-300)
    w = unit_step / e
    den = float(w @ w)
    if den == 0:
        return math.nan, -math.inf, math.inf
    c = float((port_step / e) @ w) / den
    half = float(np.sum(np.abs(w))) / den
    return c, c - half, c + half


def fit_adam(port_step: np.ndarray, d: np.ndarray, old: np.ndarray, new: np.ndarray, lr: float,
             weight_decay: float = 0.0) -> tuple[float, float, float]:
    """(c, lo, hi) from the eps deficit of Adam's first step (flat float64 arrays; d = g sqrt(N), the port's
    gradient; the step's weight-decay term -lr wd p removed first)."""
    step = np.abs(port_step + lr * weight_decay * old)
    use = (step > 0) & (np.abs(d) > 0)
    if not use.any():
        return math.nan, -math.inf, math.inf
    step, d = step[use], np.abs(d[use])
    y = lr / step - 1
    x = ADAM_EPS / d
    delta = np.maximum((1 + np.abs(y)) * update_bound(new[use], step) / step, 1e-300)
    xw = x / delta
    den = float(xw @ xw)
    k = float((y / delta) @ xw) / den
    half = float(np.sum(np.abs(xw))) / den
    lo_k, hi_k = k - half, k + half
    c = 1 / k if k > 0 else math.inf
    return c, (1 / hi_k if hi_k > 0 else math.inf), (1 / lo_k if lo_k > 0 else math.inf)


def fit(optimizer: str, old: dict, grad: dict, new: dict, pop: int, lr: float, sigma: float) -> ScaleFit:
    """The gradient scale c that makes `optimizer`'s first step (lr, from `old`, on c x the port's gradient `grad`)
    closest to the port's (`new` - `old`), with its worst-case interval and the named scale inside it."""
    names = sorted(old)
    flat = {k: np.concatenate([np.asarray(t[n], np.float64).ravel() for n in names])
            for k, t in (("old", old), ("grad", grad), ("new", new))}
    port_step = flat["new"] - flat["old"]
    d = flat["grad"] * math.sqrt(pop)
    if optimizer == "sgd":
        c, lo, hi = fit_sgd(port_step, lr * d, flat["new"])
    else:
        c, lo, hi = fit_adam(port_step, d, flat["old"], flat["new"], lr, ADAMW_DECAY if optimizer == "adamw" else 0.0)
    return ScaleFit(optimizer, c, lo, hi, name_scale(c, lo, hi, sigma, pop))


def scaled(grad: dict, c: float) -> dict:
    """The gradient times c, float32 (what a port stepping on c g hands its optimizer)."""
    return {k: (np.asarray(v, np.float64) * c).astype(np.float32) for k, v in grad.items()}


def words(f: ScaleFit, sigma: float, pop: int) -> str:
    """The scale in the report's words: 'without the sqrt(N) factor' for sgd at 1/sqrt(N), else 'on a gradient
    <name> times the reference's', with the fitted value and its interval."""
    fitted = f"fitted c = {f.c:.6g} in [{f.lo:.6g}, {f.hi:.6g}], sigma={sigma:g}, N={pop}"
    if not f.identified and f.name is None:
        return f"on a gradient whose scale its first step cannot pin ({fitted}: eps never matters enough)"
    if f.name == "1/sqrt(N)" and f.optimizer == "sgd":
        return f"without the sqrt(N) factor (a gradient 1/sqrt(N) times the reference's; {fitted})"
    if f.name is None:
        return f"on a gradient {f.c:.6g} times the reference's ({fitted})"
    return f"on a gradient {f.name} times the reference's ({fitted})"


def verified(reference, f: ScaleFit, old: dict, grad: dict, new: dict, pop: int) -> ScaleFit:
    """The fit with its residual: `reference` (parity.mlp.reference.ReferencePort) under f's optimizer, one step at
    epoch 0 from `old` on c x grad, against the port's step, as a share of the candidate's largest entry."""
    if not (math.isfinite(f.c) and f.c > 0):
        return f
    cand = reference.with_run_knobs(optimizer=f.optimizer)
    params, _ = cand.optimizer_apply(old, cand.optimizer_init(old), scaled(grad, f.c), pop, 0)
    names = sorted(old)
    step = np.concatenate([(np.asarray(params[k], np.float64) - old[k]).ravel() for k in names])
    port = np.concatenate([(np.asarray(new[k], np.float64) - old[k]).ravel() for k in names])
    return f._replace(error=float(np.max(np.abs(port - step)) / max(float(np.max(np.abs(step))), 1e-30)))


def candidates(reference, optimizers, old: dict, grad: dict, new: dict, pop: int, lr: float,
               sigma: float) -> tuple[ScaleFit, ...]:
    """Each optimizer's fitted and verified scale for the port's first step (old -> new on its gradient grad)."""
    return tuple(verified(reference, fit(opt, old, grad, new, pop, lr, sigma), old, grad, new, pop)
                 for opt in optimizers)


def best_match(fits, match: float) -> ScaleFit | None:
    """The verified fit with the smallest residual, when it is within `match`; else None."""
    ok = [f for f in fits if f.error < match]
    return min(ok, key=lambda f: f.error) if ok else None
