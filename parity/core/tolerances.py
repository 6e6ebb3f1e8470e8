"""Tolerances and why they hold: float32 rounding bounds and statistical thresholds.

Float32 bounds (deterministic: a faithful port can never exceed them). With the unit roundoff
u = 2^-24, Higham's gamma_n = n*u / (1 - n*u) bounds the error of ANY evaluation order of a
length-n sum of products: |fl(sum x_i y_i) - sum x_i y_i| <= gamma_n * sum |x_i y_i|
(Higham, Accuracy and Stability of Numerical Algorithms, 2nd ed., sec. 3.1). A chain of k
roundings along the longest path gives gamma_k. Each side is within the bound of the exact
(float64) value, so the two sides differ by at most the sum of their bounds; every bound
below is computed in float64 from the actual inputs and is per element.

Statistical thresholds (false-alarm rate stated). The quick suite's statistical tests share a
family-wise false-alarm budget FAMILY_ALPHA = 1e-3 per run: each check gets a share
(CHECK_SHARES) and splits it evenly over its tests (Bonferroni), so the chance that a faithful
port fails any statistical test in a run is at most 1e-3 (up to the normal/t approximation of
the per-member means, which average many elements each).
"""
from __future__ import annotations

import math

import numpy as np
from scipy import special

from reporting import ulp_distance  # noqa: F401  (the checks' ULP measure, re-exported)

U32 = 2.0 ** -24               # float32 unit roundoff
FAMILY_ALPHA = 1e-3            # family-wise false-alarm budget of one suite run
CHECK_SHARES = {               # fraction of FAMILY_ALPHA each check may spend (sums to <= 1)
    "noise": 0.45,
    "init": 0.1,
    "gradients": 0.3,
    "trajectory": 0.1,
}
ULP_TOLERANCE = 0              # JAX-compatible draws must be bit-identical on the same backend (DESIGN.md)


def gamma(n: float, u: float = U32) -> float:
    """Higham's gamma_n = n u / (1 - n u): relative error bound of n chained float32 roundings."""
    if n * u >= 1:
        return math.inf
    return n * u / (1 - n * u)


def with_operands(g: float, k: int, u_operand: float = 0.0) -> float:
    """A float32 evaluation's relative bound g widened by k roundings of its operands to a coarser unit u_operand
    (the reference's TF32 matmuls, u = 2^-11): |fl(x~ y~) - x y| <= g |x~||y~| + |x~ y~ - x y|, and rounding each
    operand to nearest moves their products by at most gamma_k(u_operand) of |x||y|, so the bound is
    (1 + g)(1 + gamma_k(u_operand)) - 1 = g + e + g e. u_operand = 0 (float32 products): g itself."""
    if not u_operand:
        return g
    e = gamma(k, u_operand)
    return g + e + g * e


def check_alpha(check: str) -> float:
    """The false-alarm budget of one check."""
    return FAMILY_ALPHA * CHECK_SHARES.get(check, 0.0)


# ----------------------------------------------------------------------------- perturbed products
def linear_bound(W: np.ndarray, A: np.ndarray, B: np.ndarray, x: np.ndarray, u_operand: float = 0.0) -> np.ndarray:
    """One side's float32 error bound for x @ W^T + (x @ B) @ A^T, per element (m, batch, out).

    The longest rounding chain is x@B (in products and sums), then @A^T (r more), then the final
    addition: gamma_{in + r + 1} times the same expression in absolute values. u_operand: a side whose matmuls
    round their operands first (the reference's TF32 at JAX's default precision on NVIDIA GPUs, U_TF32): four
    such roundings along the longest chain (x and B, then x@B and A), with_operands(gamma_{in + r + 1}, 4, u).
    """
    n_in, r = W.shape[1], A.shape[-1]
    ax, aw, aa, ab = (np.abs(np.asarray(t, dtype=np.float64)) for t in (x, W, A, B))
    magnitude = ax @ aw.T + (ax @ ab) @ np.swapaxes(aa, -1, -2)           # (m, batch, out)
    return with_operands(gamma(n_in + r + 1), 4, u_operand) * magnitude


U_TF32 = 2.0 ** -11             # TF32 keeps 10 mantissa bits: operands rounded to nearest lose at most 2^-11


def linear_bound_tf32(W: np.ndarray, A: np.ndarray, B: np.ndarray, x: np.ndarray) -> np.ndarray:
    """The same bound when every matmul operand is first rounded to TF32 (x, W; x, B; x@B, A): at most 4
    roundings of relative size 2^-11 along the longest chain, then float32 accumulation as in linear_bound.
    A port within this but not within linear_bound computes with TF32 matmuls (knob matmul_precision=high)."""
    return linear_bound(W, A, B, x) * (1 + gamma(4, U_TF32) / gamma(W.shape[1] + A.shape[-1] + 1))


def linear_exact(W, A, B, x) -> np.ndarray:
    """x @ W^T + (x @ B) @ A^T in float64 (the value both float32 sides approximate)."""
    x64, w64, a64, b64 = (np.asarray(t, dtype=np.float64) for t in (x, W, A, B))
    return x64 @ w64.T + (x64 @ b64) @ np.swapaxes(a64, -1, -2)


# ----------------------------------------------------------------------------- MLP forward
LN_EPS = 1e-5
ACTIVATION_LIPSCHITZ = {"relu": 1.0, "tanh": 1.0, "silu": 1.1, "pqn": 1.0}
ACTIVATION_ROUNDINGS = {"relu": 0, "tanh": 4, "silu": 6, "pqn": 0}   # ULPs of the elementwise function


def _activate64(z: np.ndarray, activation: str) -> np.ndarray:
    if activation == "relu":
        return np.maximum(z, 0.0)
    if activation == "tanh":
        return np.tanh(z)
    if activation == "silu":
        return z / (1.0 + np.exp(-z))
    if activation == "pqn":
        mu = z.mean(-1, keepdims=True)
        var = ((z - mu) ** 2).mean(-1, keepdims=True)
        return np.maximum((z - mu) / np.sqrt(var + LN_EPS), 0.0)
    raise ValueError(f"unknown activation {activation!r}; known: pqn, tanh, relu, silu")


class ForwardBound:
    """The MLP in float64 with a first-order bound on one float32 side's error, per logit.

    noise: the protocol's dict (weight name -> (A, B) or a dense E, bias name -> eps) or None; member i sees
    row i of x (a dense E enters as E does in x (W + E)^T, with r = 0 in the rounding count). The error is tracked as a 2-norm per member: each layer adds the rounding of the
    perturbed product (gamma_{in+r+3} on the absolute values: the chain x@B, @A^T and three
    additions) and propagates the incoming error through ||W + A B^T||_2 <= ||W||_2 + ||A||_2 ||B||_2;
    `param_err` (name -> elementwise bound on a parameter difference between the sides) adds
    || |h| |dW|^T + |db| ||_2. Activations are Lipschitz (relu, tanh: 1; silu: 1.1) plus a few ULPs of
    their own; the parameter-free layer norm has Jacobian 2-norm <= 1/s (s = sqrt(var + 1e-5)), plus
    the rounding of its mean (gamma_n), variance (gamma_{n+2}), + eps and sqrt or a reciprocal sqrt
    (4u) and the division or product (u). The last layer's logit i gets its row's norm
    ||(W + A B^T)_i||_2 times the incoming error norm. First order in u.
    """

    def __init__(self, params: dict, noise: dict | None, activation: str, param_err: dict | None = None,
                 u_operand: float = 0.0):
        self.u_operand = u_operand
        if activation not in ACTIVATION_LIPSCHITZ:
            raise ValueError(f"unknown activation {activation!r}; known: {', '.join(ACTIVATION_LIPSCHITZ)}")
        self.activation = activation
        self.layers = []
        n_layers = sum(name.endswith(".weight") for name in params)
        for t in range(n_layers):
            W = np.asarray(params[f"{t}.weight"], dtype=np.float64)
            b = np.asarray(params[f"{t}.bias"], dtype=np.float64)
            A = B = E = eps = None
            spec = np.linalg.norm(W, 2)                                                    # scalar or (m,)
            value = None if noise is None else noise.get(f"{t}.weight")
            if isinstance(value, tuple):
                A, B = (np.asarray(v, dtype=np.float64) for v in value)                  # (m,out,r), (m,in,r)
                spec = spec + np.linalg.norm(A, 2, axis=(1, 2)) * np.linalg.norm(B, 2, axis=(1, 2))
            elif value is not None:                                                       # dense: E (m, out, in)
                E = np.asarray(value, dtype=np.float64)
                spec = spec + np.linalg.norm(E, 2, axis=(1, 2))
            if noise is not None and f"{t}.bias" in noise:
                eps = np.asarray(noise[f"{t}.bias"], dtype=np.float64)                   # (m, out)
            rows = None
            if t == n_layers - 1:   # per-logit row norms of W + A B^T (or W + E)
                w_eff = W[None] if A is None else W[None] + A @ np.swapaxes(B, 1, 2)
                w_eff = w_eff if E is None else W[None] + E
                rows = np.linalg.norm(w_eff, axis=-1)                                     # (1 or m, out)
            dW = db = None
            if param_err is not None:
                dW = np.asarray(param_err[f"{t}.weight"], dtype=np.float64)
                db = np.asarray(param_err[f"{t}.bias"], dtype=np.float64)
            self.layers.append((W, b, A, B, E, eps, np.broadcast_to(spec, (1,)) if np.ndim(spec) == 0 else spec,
                                rows, dW, db))

    def __call__(self, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(float64 logits (m, out), one side's error bound (m, out)) for inputs x (m, in)."""
        h = np.asarray(x, dtype=np.float64)[:, None, :]                              # (m, 1, in)
        norm = np.zeros(h.shape[0])                                                   # error 2-norm per member
        last = len(self.layers) - 1
        for t, (W, b, A, B, E, eps, spec, rows, dW, db) in enumerate(self.layers):
            ah = np.abs(h)
            z = h @ W.T + b
            mag = ah @ np.abs(W).T + np.abs(b)
            r = 0
            if A is not None:
                At = np.swapaxes(A, 1, 2)
                z = z + (h @ B) @ At
                mag = mag + (ah @ np.abs(B)) @ np.abs(At)
                r = A.shape[-1]
            if E is not None:      # dense: h (W + E)^T, the same chain without the rank-r inner product
                z = z + h @ np.swapaxes(E, 1, 2)
                mag = mag + ah @ np.abs(np.swapaxes(E, 1, 2))
            if eps is not None:
                z = z + eps[:, None, :]
                mag = mag + np.abs(eps)[:, None, :]
            rounding = (with_operands(gamma(W.shape[1] + r + 3), 4, self.u_operand) * (mag + np.abs(z)))[:, 0, :]
            from_params = 0.0
            if dW is not None:
                from_params = (ah @ dW.T + db)[:, 0, :]                                  # (m, out) elementwise
            if t == last:
                return z[:, 0, :], rounding + from_params + rows * norm[:, None]
            norm = (np.linalg.norm(rounding + from_params, axis=-1) + spec * norm)      # error of z
            if self.activation == "pqn":
                n = z.shape[-1]
                mu = z.mean(-1, keepdims=True)
                d = z - mu
                var = (d ** 2).mean(-1, keepdims=True)
                s = np.sqrt(var + LN_EPS)
                y = d / s
                rel_s = 0.5 * gamma(n + 2) * var / (var + LN_EPS) + 4 * U32   # +eps, sqrt or rsqrt (<= 2 ulp)
                ln_round = np.abs(y) * (rel_s + U32) + (gamma(n) * np.abs(z).mean(-1, keepdims=True)
                                                        + U32 * np.abs(d)) / s
                norm = norm / s[:, 0, 0] + np.linalg.norm(ln_round[:, 0, :], axis=-1)   # relu after: 1-Lipschitz
                h = np.maximum(y, 0.0)
            else:
                h = _activate64(z, self.activation)
                norm = (ACTIVATION_LIPSCHITZ[self.activation] * norm
                        + ACTIVATION_ROUNDINGS[self.activation] * U32 * np.linalg.norm(h[:, 0, :], axis=-1))
        raise ValueError("params hold no layers")


# ----------------------------------------------------------------------------- fitness shaping
def shaping_bound(f: np.ndarray, eps: float = 1e-5) -> np.ndarray:
    """One side's float32 error bound for (f - mean) / sqrt(var + eps), per element (first order).

    mean: gamma_N * mean|f|; the centred value d adds one rounding; var = mean(d^2) has relative
    error gamma_{N+2} (its first-order dependence on the mean's error vanishes since sum d = 0);
    sqrt and + eps add 2u to the scale s; the division one more u.
    """
    f = np.asarray(f, dtype=np.float64)
    n = f.size
    d = f - f.mean()
    var = (d ** 2).mean()
    s = math.sqrt(var + eps)
    err_d = gamma(n) * np.abs(f).mean() + U32 * np.abs(d)
    rel_s = 0.5 * gamma(n + 2) * var / (var + eps) + 2 * U32
    return err_d / s + np.abs(d) / s * (rel_s + U32)


# ----------------------------------------------------------------------------- gradients and updates
def weight_grad_bound(f: np.ndarray, A: np.ndarray, B: np.ndarray, f_err: np.ndarray | None = None,
                      u_operand: float = 0.0) -> np.ndarray:
    """One side's bound for einsum('nir,njr->ij', f*A, B) / N, (out, in): gamma_{N r + 3} sum|f A B| / N.

    f_err (N,), when given, adds what an error in the shaped fitness itself propagates. u_operand: the einsum is a
    matmul whose two operands (f*A and B) a TF32 side rounds first: with_operands(gamma_{N r + 3}, 2, u).
    """
    af = np.abs(np.asarray(f, dtype=np.float64))
    aa, ab = np.abs(np.asarray(A, dtype=np.float64)), np.abs(np.asarray(B, dtype=np.float64))
    n, r = aa.shape[0], aa.shape[-1]
    weight = with_operands(gamma(n * r + 3), 2, u_operand) * af
    if f_err is not None:
        weight = weight + np.asarray(f_err, dtype=np.float64)
    # sum_n w_n |A_n| |B_n|^T as one BLAS contraction over (n, r)
    return np.tensordot(weight[:, None, None] * aa, ab, axes=([0, 2], [0, 2])) / n


def bias_grad_bound(f: np.ndarray, eps: np.ndarray, f_err: np.ndarray | None = None) -> np.ndarray:
    """One side's bound for mean_n(f_n eps_n), (out,): gamma_{N + 2} mean|f eps|."""
    af = np.abs(np.asarray(f, dtype=np.float64))
    ae = np.abs(np.asarray(eps, dtype=np.float64))
    out = gamma(af.size + 2) * (af[:, None] * ae).mean(0)
    if f_err is not None:
        out = out + (np.asarray(f_err, dtype=np.float64)[:, None] * ae).mean(0)
    return out


OPT_ROUNDINGS = 24   # float32 roundings of one elementwise optimizer step (adam's: moments, corrections, sqrt, div)


def update_bound(new_params: np.ndarray, update: np.ndarray) -> np.ndarray:
    """One side's bound for one optimizer step from the same params and gradient, elementwise.

    u |p_new| for the rounding of p + update, plus gamma_24 |update| for the optimizer's own
    elementwise arithmetic (adam: two moments, two bias corrections, sqrt, +eps, division, lr, wd).
    """
    return U32 * np.abs(np.asarray(new_params, np.float64)) + gamma(OPT_ROUNDINGS) * np.abs(np.asarray(update, np.float64))


def step_bound(before, ref_new, ref_step, step_abs, n_round: int, adds: int) -> np.ndarray:
    """Both sides' bound on |port's new params - reference's| for one ES step from the same params `before`, in any
    order of summation a port may use: the step added once, or up to `adds` (N) per-member contributions (N/2 per
    pair) added into the weights one at a time. Elementwise, float64; the callers add the gap between the reference's
    s g and the port's exact step D below (lr sqrt(N) times the gradient's bound, and the shaping's where it is the
    port's own).

    The exact step is D = s sum_n f_n E_n / N (s = lr sqrt(N); the reference forms g = einsum(f A, B) / N, or
    mean(f eps), and applies params + s g), and step_abs = s sum_n |f_n| |E_n| / N >= |D| bounds the sum of the
    members' |contributions| (|E_n| as |A_n||B_n|^T: the noise's own magnitude per member).
    - The reference: fl(p + fl(s g)) is within update_bound(ref_new, ref_step) = u |p'| + gamma_24 |s g| of p + s g.
    - The port, added once: fl(p + fl(s g')) with its own g' (|s g'| <= (1 + G) step_abs, G below) is within
      u (|p| + (1 + G) step_abs) + gamma_24 (1 + G) step_abs of p + s g'.
    - The port, K = adds sequential adds p_k = fl(p_{k-1} + c_k), each c_k = s sum_{n in its group} f_n E_n / N a
      float32 quantity of its own: forming c_k rounds at most n_round + OPT_ROUNDINGS times (its E_n from r-term
      products, f, s, the division; n_round the gradient's roundings, N r + 3 or N + 2, covers any grouping), so
      |c_k - exact c_k| <= G s sum_{n in group k} |f_n||E_n| / N, G = gamma_{n_round + 24}, their sum <= G step_abs
      and sum |c_k| <= (1 + G) step_abs; recursive
      summation of the K + 1 terms p, c_1..c_K (Higham, 2nd ed., eq. 4.4) adds at most gamma_K (|p| + sum |c_k|).
      So |port - (p + D)| <= gamma_K (|p| + (1 + G) step_abs) + G step_abs.
    One side's port term is the sum of the added-once and the K-adds bounds (whichever the port does), so the bound
    holds for every order; the reference's is update_bound. gamma_K |p| (K = N) is what a per-member port's
    rounding at the weights' size needs; a planted step error (a factor, another optimizer) moves entries by a
    share of |D|, orders above it."""
    p = np.abs(np.asarray(before, np.float64))
    step_abs = np.asarray(step_abs, np.float64)
    G, gk = gamma(n_round + OPT_ROUNDINGS), gamma(adds)
    once = U32 * (p + (1 + G) * step_abs) + gamma(OPT_ROUNDINGS) * (1 + G) * step_abs
    return update_bound(ref_new, ref_step) + once + gk * (p + (1 + G) * step_abs) + G * step_abs


def drift_bound(before, noise_sum, members: int, rank: int) -> np.ndarray:
    """How far `members` in-place perturb-and-restores can move the weights by rounding, elementwise: each member
    adds E_n into p and subtracts it again in float32, two roundings of at most u |p + E_n| and u |p| (and an E_n
    formed twice from r-term products differs by up to 2 gamma_r |E_n|), so after N members
    |p_N - p| <= (1 + gamma_2N) (2 N u |p| + (u + 2 gamma_r) sum_n |E_n|); noise_sum is sum_n |E_n| (|A_n||B_n|^T
    for low-rank noise). Names a step that moves params on zero fitness: within it, rounding; beyond it, a step."""
    p = np.abs(np.asarray(before, np.float64))
    return (1 + gamma(2 * members)) * (2 * members * U32 * p + (U32 + 2 * gamma(rank)) *
                                       np.asarray(noise_sum, np.float64))


# ----------------------------------------------------------------------------- statistics
def _stats():
    """scipy.stats, imported at first use: 0.6 s of CPU that every `python -m parity` (--help and usage errors
    included) and every test subprocess importing the suite paid at start (1.1 -> 0.45 s for --help)."""
    from scipy import stats

    return stats


def z_threshold(alpha: float) -> float:
    """Two-sided standard-normal threshold at level alpha."""
    return float(_stats().norm.isf(alpha / 2))


def t_threshold(alpha: float, dof: int) -> float:
    """Two-sided Student-t threshold at level alpha (dof >= 1)."""
    return float(_stats().t.isf(alpha / 2, max(int(dof), 1)))


def mean_interval(samples: np.ndarray, expected: float, alpha: float) -> tuple[float, float, float]:
    """(sample mean, lo, hi): the region expected +- t * se that the mean must fall in at level alpha.

    The samples are independent per-member statistics (each an average over many elements), so
    their mean is close to normal; the t quantile accounts for estimating the standard error.
    """
    x = np.asarray(samples, dtype=np.float64)
    n = x.size
    mean = float(x.mean())
    se = float(x.std(ddof=1) / math.sqrt(n)) if n > 1 else math.inf
    half = t_threshold(alpha, n - 1) * se
    return mean, expected - half, expected + half


def chi2_interval(n: int, alpha: float) -> tuple[float, float]:
    """Exact two-sided region of mean(z^2) for n iid standard normals (chi-square with n dof, over n)."""
    return float(_stats().chi2.ppf(alpha / 2, n) / n), float(_stats().chi2.isf(alpha / 2, n) / n)


def normal_mean_interval(n: int, alpha: float) -> tuple[float, float]:
    """Exact two-sided region of mean(z) for n iid standard normals."""
    half = z_threshold(alpha) / math.sqrt(n)
    return -half, half


def ks_critical(n: int, alpha: float) -> float:
    """Exact critical value of the two-sided one-sample Kolmogorov-Smirnov statistic at level alpha."""
    return float(_stats().kstwo.isf(alpha, n))


def two_sample_interval(a: np.ndarray, b: np.ndarray, alpha: float) -> tuple[float, float]:
    """(mean(a) - mean(b), half-width) of a Welch-type interval at level alpha."""
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    diff = float(a.mean() - b.mean())
    va, vb = a.var(ddof=1) / a.size, b.var(ddof=1) / b.size
    se = math.sqrt(va + vb)
    dof = (va + vb) ** 2 / max(va ** 2 / max(a.size - 1, 1) + vb ** 2 / max(b.size - 1, 1), 1e-300)
    return diff, t_threshold(alpha, int(dof)) * se


# ----------------------------------------------------------------------------- dense noise (ports with dense_noise)
# A dense port gets E = fl32(A B^T) where the suite holds factors: the product is formed in float64 (exact for
# float32 factors up to 2^-53) and rounded once, so |E - A B^T| <= u |A B^T| <= u |A| |B|^T elementwise.
def dense_linear_exact(W, E, x) -> np.ndarray:
    """x @ (W + E)^T in float64, per member: (m, batch, out)."""
    x64, w64, e64 = (np.asarray(t, dtype=np.float64) for t in (x, W, E))
    return x64 @ w64.T + x64 @ np.swapaxes(e64, -1, -2)


def dense_linear_bound(W, E, x) -> np.ndarray:
    """One dense side's float32 bound for x @ (W + E)^T: gamma_{in+2} |x| (|W| + |E|)^T, per element.

    A length-in dot product (gamma_in, any order), the addition W + E (or of x W^T and x E^T) and one more for a
    zero bias added after: in + 2 chained roundings on the absolute values.
    """
    ax, aw, ae = (np.abs(np.asarray(t, dtype=np.float64)) for t in (x, W, E))
    return gamma(W.shape[1] + 2) * (ax @ aw.T + ax @ np.swapaxes(ae, -1, -2))


def dense_grad_bound(f: np.ndarray, E: np.ndarray, f_err: np.ndarray | None = None) -> np.ndarray:
    """One dense side's bound for sum_n f_n E_n / N, (out, in): gamma_{N+2} sum |f| |E| / N (a length-N dot
    product and the division); f_err adds what an error of the shaped fitness propagates."""
    weight = gamma(np.size(f) + 2) * np.abs(np.asarray(f, dtype=np.float64))
    if f_err is not None:
        weight = weight + np.asarray(f_err, dtype=np.float64)
    return np.tensordot(weight, np.abs(np.asarray(E, dtype=np.float64)), axes=1) / np.size(f)


def representation_bound(f: np.ndarray, A: np.ndarray, B: np.ndarray) -> np.ndarray:
    """How far sum f E / N moves when E = fl32(A B^T) replaces A B^T: u sum |f| |A| |B|^T / N, (out, in).

    With this term twice the factor bound (gamma_{N r + 3}) still covers a dense side for r >= 2, which is why
    checks comparing against the reference's factor bound need no change for dense ports.
    """
    af = np.abs(np.asarray(f, dtype=np.float64))
    aa, ab = np.abs(np.asarray(A, dtype=np.float64)), np.abs(np.asarray(B, dtype=np.float64))
    return U32 * np.tensordot(af[:, None, None] * aa, ab, axes=([0, 2], [0, 2])) / af.size


RANK_TAIL = 1e-12   # chi-square tail used to bound ||A||_F and ||B||_F (not part of the false-alarm budget)


def rank_threshold(scale: float, n_out: int, n_in: int, r: int) -> float:
    """The largest singular value beyond the r-th that float32 rounding can give a rank-r product E = A B^T.

    Weyl: sigma_{r+1}(E) <= ||E - A B^T||_2 <= ||E - A B^T||_F <= gamma_{r+3} || |A| |B|^T ||_F
    <= gamma_{r+3} ||A||_F ||B||_F (a length-r dot product per entry, A's scaling, the cast, one spare). Under
    EGGROLL A = scale/sqrt(r) * N(0,1) (out x r) and B = N(0,1) (in x r), so ||A||_F^2 r / scale^2 and ||B||_F^2
    are chi-square with out*r and in*r degrees of freedom; their 1 - 1e-12 quantiles bound them. The float64
    SVD that measures sigma_{r+1} adds ~1e-16 relative (negligible). A full-rank E's sigma_{r+1} is of the order
    of its entries' scale, thousands of times this threshold (tests/parity/core/test_tolerances.py).
    """
    q_a = _stats().chi2.isf(RANK_TAIL, n_out * r)
    q_b = _stats().chi2.isf(RANK_TAIL, n_in * r)
    return gamma(r + 3) * scale * math.sqrt(q_a * q_b / r)


def entry_moment(k: int, r: int) -> float:
    """E[x^(2k)] of an entry of EGGROLL's A B^T / sigma: x = sqrt(chi2_r / r) * Z, so (2k-1)!! prod_j (r+2j)/r.

    k = 1: 1 (variance sigma^2); k = 2: 3 + 6/r (the kurtosis).
    """
    moment = float(math.prod(range(1, 2 * k, 2)))
    for j in range(k):
        moment *= (r + 2 * j) / r
    return moment


_NEGLIGIBLE_WEIGHT = 1e-17   # entry_cdf leaves out quadrature nodes of smaller weight; their sum joins its bound


def _entry_cdf_nodes(r: int, h: float) -> tuple[np.ndarray, np.ndarray]:
    """(u = log G nodes with step h, their trapezoid weights) for entry_cdf: G = e^u ~ Gamma(r/2)."""
    k = r / 2
    u = np.arange(-60 / k - 10, math.log(k + 60 + 10 * math.sqrt(k)) + h, h)
    return u, h * np.exp(k * u - np.exp(u) - special.gammaln(k))


def entry_cdf(x: np.ndarray, r: int) -> tuple[np.ndarray, float]:
    """(CDF of an entry of EGGROLL's A B^T / sigma at x, its numerical error bound).

    x = Z sqrt(V / r) with V = 2G, G ~ Gamma(r/2): F(x) = E_G[Phi(x sqrt(r / (2G)))], integrated over u = log G by
    the trapezoidal rule, which converges exponentially for this smooth, doubly-exponentially decaying integrand;
    the error is estimated as the change from step 2h to h (about 1e-15 at r = 4). The step-2h rule is the step-h
    rule's even nodes, so the two share one evaluation of Phi; nodes of weight below _NEGLIGIBLE_WEIGHT (about half
    of them, in the tails of G) are left out, and as Phi <= 1 their weights' sum bounds what that moves each rule:
    it is added to the bound.
    """
    x = np.asarray(x, dtype=np.float64).ravel()
    u, fine = _entry_cdf_nodes(r, min(0.25, 0.5 / math.sqrt(r / 2)) / 2)
    coarse = np.where(np.arange(u.size) % 2 == 0, 2 * fine, 0.0)
    kept = fine >= _NEGLIGIBLE_WEIGHT
    left_out = 2 * float(fine[~kept].sum()) + float(coarse[~kept].sum())
    weights = np.stack([fine[kept], coarse[kept]], axis=1)                          # (nodes, 2)
    scale = math.sqrt(r / 2) * np.exp(-u[kept] / 2)
    out = np.empty((x.size, 2))
    for start in range(0, x.size, 4096):                                            # bounded memory
        out[start:start + 4096] = special.ndtr(x[start:start + 4096, None] * scale) @ weights
    return out[:, 0], float(np.max(np.abs(out[:, 0] - out[:, 1]), initial=0.0)) + left_out + 1e-12


def entry_ks(x: np.ndarray, r: int) -> tuple[float, float]:
    """(Kolmogorov-Smirnov distance of the sample x to EGGROLL's entry distribution, the CDF's error bound)."""
    x = np.sort(np.asarray(x, dtype=np.float64).ravel())
    cdf, err = entry_cdf(x, r)
    steps = np.arange(1, x.size + 1) / x.size
    return float(max(np.max(steps - cdf), np.max(cdf - (steps - 1 / x.size)))), err
