"""The LM suite's in-distribution mode: the checks for a side that does not draw JAX's numbers (torch_impl with
`--torch rng=torch`, or a tree port with `jax_compatible_rng = False`).

Its draws cannot be compared element by element with the reference's, so every draw-dependent check either tests the
draws' law (init, noise) or runs the reference on the side's OWN draws (gradients, forward, trajectory):

- init: leaves with a deterministic rule (spec.lm.init_plan: ones, zeros, shift rows (1, 0)) equal the reference's
  exactly; each normal leaf divided by its stated scale (float32 1/sqrt(fan_in), h0 0.1), pooled over the run seed
  and the next, must be N(0, 1): exact Kolmogorov-Smirnov and chi-square (mean square) tests. Exact: the two seeds'
  draws differ, and no two slices of a stacked leaf are identical.
- noise, per leaf, at epochs 0 and 1 (noise_reuse 1: a fresh generation each):
    exact: antithetic pairs (member 2k+1 = -member 2k; low-rank leaves within the rounding of the two products,
    float64's gamma_r (u = 2^-53) |A||B|^T per member, as both are float64 products of float32 factors); leaves
    the reference never perturbs (embedding, excluded, params under freeze_nonlora) unperturbed, naming `embedding`
    / `frozen_leaves`;
    no two slices of a stacked leaf identical (identical slices name `stack_keys`: one key shared by the layers);
    epochs 0 and 1 different exactly when noise_reuse gives them different generations.
    statistical: low-rank leaves' independent entries (the diagonal of each slice's E = A B^T, one member per pair:
    entry (i, i) involves row i of A and of B only) over sigma are EGGROLL's sqrt(chi2_r / r) N(0, 1)
    (parity.core.tolerances.entry_ks against its exact critical value, plus the CDF's numerical error: the law's
    shape); low-rank leaves' variance by the mean square of ALL of E's entries (below); param leaves the reference
    perturbs (freeze_nonlora off) eps / sigma N(0, 1) (KS and chi-square); and, pooled over every low-rank leaf and
    the epochs' distinct draws (an epoch of the same generation under noise_reuse counted once: the same values
    pooled twice would halve the KS's critical distance for the same information), one KS of the diagonal entries
    and one mean square of every entry.
    rank <= r is not tested: the tree protocol carries a low-rank leaf only as factors with r columns
    (CheckedTreePort refuses any other shape), so every member's E has rank <= r by construction.
  The mean square of E's entries (dist.slice_mean_squares, issue 53). Per member and slice, with A = sigma/sqrt(r) X,
    X (a, r) and B (b, r) i.i.d. N(0, 1): S = ||A B^T||_F^2 / (a b sigma^2) = tr(G_X G_B) / (r a b), G_X = X^T X and
    G_B = B^T B the r x r Gram matrices (so S is computed without forming E, and is invariant to a scale moved
    between A and B and to any rotation of the r columns, as E's law is; a test on A's or B's entries alone would
    flag those legitimate conventions). Given G_B, tr(G_X G_B) sums a quadratic forms x_i^T G_B x_i of the rows of X:
    mean a tr G_B, variance 2 a tr G_B^2; with E tr G_B = b r, Var tr G_B = 2 b r (tr G_B = ||B||^2 ~ chi2_{b r})
    and E tr G_B^2 = r b (b + r + 1) (Wishart fourth moments: E|b_k|^4 = b (b + 2), E (b_k . b_l)^2 = b), so
    E S = 1 and Var S = 2 (a + b + r + 1) / (r a b) exactly (dist.slice_null_var; a Monte Carlo of 40,000 slices
    agrees, tests/parity/tree/test_power.py). Slices and pairs are independent, so a leaf's mean square over its entries
    (one member per pair; the odd member is the same matrix negated) has mean 1 and variance the sum of (a b)^2
    Var S over (sum a b)^2 (dist.mean_square_of). Its region (dist.mean_square_region): the lower end is the
    alpha/2 quantile of the gamma with that mean and variance, the upper the 1 - alpha/2 quantile of the log-normal
    with them. Why: S is a sum of squares of products of normals, so its right tail is heavier than a gamma's (the
    gamma's upper end under-covers up to 4.4x at 1e-5, a three-moment Pearson III still 2.2x) and its left tail
    lighter. Its skewness (third cumulant by the same conditioning, with E tr G^3 and E tr G tr G^2 of the Wishart)
    lies between the gamma's 2 CV and the log-normal's 3 CV + CV^3: over (a, b, r) in {1, 2, 3, 8, 16, 64, 768,
    3072}^2 x {1, 2, 3, 4, 8, 16, 64} it is 1.00 to 1.56 x 2 CV, and below 3 CV (at most 0.99 x) except for a 1 x 1
    slice (1.04 x at r = 1); averaging K slices divides skewness and CV alike by sqrt(K), so the ordering holds at
    any K and each tail is the conservative one's. The approximation, not a bound: measured by a Monte
    Carlo of the reference's law at the tests' shapes (tests/parity/tree/test_power.py's module docstring): at the
    suite's alpha 1.5e-5 the false-alarm rate is 0.24 to 0.72 alpha, each tail at most its alpha/2. A failure names the factor ("the noise of <leaf> has c x the
    reference's variance"), and the rank clamped to the layer's smaller side when the factors have zero columns or
    the fitted variance is min(a, b) / r within the region (the requested rank's sigma / sqrt(r) scale kept).
    Power (20 seeds, VarianceScaled ports): a 0.38x variance is caught at every seed at pop 8, 16 and 64 at both
    test sizes; 0.8x and 1.2x in the module docstring of tests/parity/tree/test_power.py.
- gradients: the reference's estimate einsum(f A, B) / N (param: mean(f eps)) in numpy float64 on the side's own
  noise, within the exact mode's float32 bound 2 gamma_{N r + 3} mean(|f| |A||B|^T) (param 2 gamma_{N + 2}
  mean(|f| |eps|)): one side's float32 einsum bound doubled; the float64 reference uses ~1e-16 of it. A leaf beyond
  it gets the exact mode's words (parity.tree.base.gradient_texts): its scale against that estimate, fitted and
  judged "same direction" within this bound (parity.core.optscale.fit_leaf), named in sigma, N and r (N/sigma,
  1/(sigma^2 sqrt(N)), sqrt(r), ...), or clipped at a norm.
- forward: the reference's forward (jax_reference.lm.model.member_score, noise off) on params + E_i per member, E_i the
  side's own perturbation of each leaf the reference perturbs (formed in float64 from the factors, rounded once),
  against the side's forward on its own noise, within the exact mode's FORWARD_ULPS ulps of each intermediate's
  scale. Why it still holds: the dense path changes each low-rank product's rounding from x W^T + (x B) A^T
  (gamma_{in + r + 1}) to x fl(W + fl(E))^T (two more roundings of each weight entry, gamma_{in + 2} after), the
  same order as one more float32 operation per block, while the bound allows 64 ulps against 11 measured in the
  exact mode. Measured: the reference's dense path against its own key path (the same draws) at most 10.3 ulps
  (selftest and quick, seeds 0-3); the faithful rng=torch side against the dense path at most 8.4 ulps (seeds 0-9,
  through the protocol 0-3). Leaves only the side perturbs get no noise on the reference's side, so such a drift
  shows as the forward's first departure.
- trajectory: lockstep as in the exact mode, the reference's step (forward, shaping, float64 estimate, optax sgd)
  taken on the side's own es_ask noise (PortSide.epoch_step hands it back), with the exact mode's stage bounds; and
  that noise itself: antithetic pairs per leaf and epoch (exact), and over the epochs' distinct draws one KS of every
  low-rank leaf's diagonal entries, one mean square of all their entries and a mean square per low-rank leaf
  (check_alpha("trajectory") split evenly over the asked_tests(cfg) rows; a training loop drawing otherwise than the port's noise() would pass the lockstep, which is
  computed on its own draws).

The knobs `tmm_layout` and `leaf_order` only relabel i.i.d. draws (which normals fill which factor, which key index a
leaf gets), so no law of the draws changes: they cannot be seen in distribution, and the noise check says so in a
skipped row for each rather than pretend. `stack_keys`, `frozen_leaves`, `embedding` (exact rows above) and
`group_fitness` (the draw-free fitness check) are caught and named.

False alarms: only the statistical tests of init, noise and the trajectory's es_ask noise can fail a faithful side by
chance. Init spends check_alpha("init") = 1e-4 split evenly over its tests, noise check_alpha("noise") = 4.5e-4 and
the trajectory check_alpha("trajectory") = 1e-4 likewise (Bonferroni; each row states its alpha; issue 53 added the
mean-square rows and re-split each share over noise_tests(cfg) and asked_tests(cfg) rows, totals unchanged: on the
example GPT 30 noise rows at 1.5e-5 each, 9 trajectory rows at 1.1e-5), so a faithful side
fails a run with probability at most FALSE_ALARM = 6.5e-4 (< the suite's FAMILY_ALPHA = 1e-3); every other row is a
deterministic float32 bound or an exact comparison, which a faithful side never exceeds.

At real sizes (a GPT-2-sized leaf holds 77M values over the two init seeds) a KS test sorts at most KS_SAMPLE = 2^24
values: evenly spaced entries, chosen without looking at the values, so under the null they are iid and the exact
critical value at that n keeps the row's alpha; the budget above is unchanged. What it costs is power: the critical
distance grows as 1 / sqrt(n) (6.2e-4 at 2^24 values and alpha 5.6e-6, GPT-2's init rows for the head and the token
table, against 2.9e-4 for all 77M), while the chi-square row beside it keeps every value (at 77M values a variance
off by 7.3e-4 of 1 fails it). No leaf
of the example GPT up to 6 x 384, nor of the LM, reaches the cap. The exact structure rows (pairs, slices, epochs)
are computed block by block over every entry (parity/tree/blocks.py), never sampled.
"""
from __future__ import annotations

import math
from typing import Callable, NamedTuple

import numpy as np

from parity.core.diagnose import is_rescaled, scale_cause
from parity.core.tolerances import check_alpha, chi2_interval, entry_ks, gamma, ks_critical
from parity.tree import blocks as B
from parity.tree.adapter import dense_of
from parity.tree.base import (EPOCHS, Row, cause, float32_of, pairing_text, ref_perturbs, ref_u,
                              with_gradient_causes)
from spec.lm import H0_SCALE, LMConfig, init_plan, lm_tree
from spec.tree import Leaf

# The chance that a faithful side fails a run: only init's, noise's and the trajectory's statistical tests can, each
# check within its share.
FALSE_ALARM = check_alpha("init") + check_alpha("noise") + check_alpha("trajectory")

# Knobs that only relabel i.i.d. draws: no test in distribution can see them (why, in the report's words).
INVISIBLE = {
    "tmm_layout": "a transposed (in, out) factoring fills A and B with the same i.i.d. normals in another order, so "
                  "E has the same law",
    "leaf_order": "a leaf's key index only chooses which independent stream it draws from, so its draws have the "
                  "same law",
}


# ----------------------------------------------------------------------------- a leaf's noise as numbers
def dense64(leaf: Leaf, value) -> np.ndarray:
    """(m, *leaf.shape) float64 perturbation from one leaf's protocol noise: A B^T per slice (products of float32
    factors are exact in float64; the r-term sums round once each), or eps."""
    if isinstance(value, tuple):
        return dense_of(leaf, tuple(np.asarray(v, np.float64) for v in value))
    return np.asarray(value, np.float64)


def magnitude(leaf: Leaf, value) -> np.ndarray:
    """(m, *leaf.shape) |A| |B|^T (low-rank) or |eps|: what bounds float32 rounding of a product or a sum."""
    if isinstance(value, tuple):
        return dense_of(leaf, tuple(np.abs(np.asarray(v, np.float64)) for v in value))
    return np.abs(np.asarray(value, np.float64))


def independent_entries(value, sigma: float) -> np.ndarray:
    """Mutually independent entries over sigma, flattened: one member per antithetic pair (the even ones); low-rank:
    the diagonal of every slice's A B^T (entry (i, i) uses row i of A and of B only); param: every entry."""
    if isinstance(value, tuple):
        A, B = (np.asarray(v, np.float64)[::2] for v in value)          # (P, *stack, a, r), (P, *stack, b, r)
        k = min(A.shape[-2], B.shape[-2])
        return np.einsum("...ir,...ir->...i", A[..., :k, :], B[..., :k, :]).ravel() / sigma
    return np.asarray(value, np.float64)[::2].ravel() / sigma


def stack_first(leaf: Leaf, x: np.ndarray) -> np.ndarray:
    """(m, *leaf.shape) -> (m, n_slices, *slice_shape): the scanned axes gathered after the member axis."""
    moved = np.moveaxis(x, [1 + a for a in leaf.scan_axes], list(range(1, 1 + len(leaf.scan_axes))))
    return moved.reshape(x.shape[0], leaf.n_slices, *leaf.slice_shape)


def identical_slices(leaf: Leaf, x: np.ndarray) -> tuple[int, int]:
    """(pairs of slices holding identical values for every member, pairs compared) of a stacked leaf."""
    s = stack_first(leaf, x)
    pairs = [(i, j) for i in range(leaf.n_slices) for j in range(i + 1, leaf.n_slices)]
    return sum(bool(np.array_equal(s[:, i], s[:, j])) for i, j in pairs), len(pairs)


def estimate(leaf: Leaf, value, shaped: np.ndarray) -> np.ndarray:
    """The reference's ES gradient on given noise, float64 at the leaf's shape: einsum(f A, B) / N (one matmul of
    the factors, blocks.weighted_sum), mean(f eps)."""
    return B.weighted_sum(leaf, value, np.asarray(shaped, np.float64)) / len(shaped)


def grad_bound(cfg: LMConfig, leaf: Leaf, value, shaped: np.ndarray) -> np.ndarray:
    """The exact mode's gradient bound on this noise: 2 gamma_n |f| |noise| averaged over members, n = N r + 3
    (low-rank einsum) or N + 2 (param mean); |A||B|^T summed as factors (blocks.weighted_sum)."""
    n = cfg.pop * cfg.rank + 3 if isinstance(value, tuple) else cfg.pop + 2
    w = 2 * gamma(n) * np.abs(np.asarray(shaped, np.float64))
    return B.weighted_sum(leaf, B.magnitude_of(value), w) / len(shaped)


# ----------------------------------------------------------------------------- statistics
# The most values one KS test sorts (the module docstring: its alpha kept, its power at GPT-2's size); the largest
# leaf below it is 6 x 384's MLP at 7.1M values over two seeds.
KS_SAMPLE = 2 ** 24


def evenly_spaced(n: int, cap: int | None = None) -> int:
    """The stride that takes at most `cap` (default KS_SAMPLE) of n values, evenly spaced from the first (1 when
    n <= cap)."""
    return max(1, -(-n // (KS_SAMPLE if cap is None else cap)))


def normal_ks(x: np.ndarray, presorted: bool = False) -> float:
    """The two-sided one-sample KS distance of x to N(0, 1), as scipy.stats.kstest(x, "norm") computes it (sorted x,
    Phi by scipy.special.ndtr, D+ = max(i / n - Phi), D- = max(Phi - (i - 1) / n)) without scipy's generic
    distribution wrapper, which copies and masks every value several times."""
    from scipy.special import ndtr
    x = np.asarray(x, np.float64) if presorted else np.sort(np.asarray(x, np.float64))
    n = x.size
    cdf = ndtr(x)
    dplus = np.max(np.arange(1.0, n + 1, dtype=x.dtype) / n - cdf)
    dminus = np.max(cdf - np.arange(0.0, n, dtype=x.dtype) / n)
    return float(max(dplus, dminus))


def ks_row(check: str, quantity: str, x: np.ndarray, alpha: float, why: str, r: int = 0, of: int | None = None,
           presorted: bool = False) -> Row:
    """Exact KS of x against N(0, 1) (r = 0) or EGGROLL's entry law at rank r (its CDF's error added); x larger than
    KS_SAMPLE is tested on evenly spaced entries of it. `of`: how many values x was already taken from (the
    quantity then says so)."""
    step = evenly_spaced(x.size)
    n_all = (of or x.size)
    sample = x.ravel()[::step] if step > 1 else x
    distance, err = entry_ks(sample, r) if r else (normal_ks(sample, presorted and step == 1), 0.0)
    crit = ks_critical(sample.size, alpha) + err
    law = f"sqrt(chi2_{r} / {r}) N(0, 1)" if r else "N(0, 1)"
    ok = distance <= crit
    counted = f"{sample.size} values" if sample.size == n_all else \
        f"{sample.size} evenly spaced of {n_all} values (KS_SAMPLE)"
    return Row(check, f"{quantity}: KS distance to {law} ({counted})", distance,
               f"<= {crit:.4g} (exact KS critical value, alpha={alpha:.2g})", "pass" if ok else "fail",
               "" if ok else f"{why}: not distributed as {law} (mean square {np.mean(sample ** 2):.4g}, expected 1)")


def chi2_row(check: str, quantity: str, x: np.ndarray, alpha: float, why: str) -> Row:
    """mean(x^2) of n iid N(0, 1) values against chi-square(n)/n's exact two-sided region."""
    return mean_square_row(check, quantity, float(np.mean(x ** 2)), x.size, alpha, why)


def mean_square_row(check: str, quantity: str, v: float, n: int, alpha: float, why: str) -> Row:
    """chi2_row on a mean square v of n values computed elsewhere (in blocks)."""
    lo, hi = chi2_interval(n, alpha)
    ok = lo <= v <= hi
    return Row(check, f"{quantity}: mean square ({n} values)", v,
               f"in [{lo:.4g}, {hi:.4g}] (chi-square({n})/{n}, alpha={alpha:.2g})", "pass" if ok else "fail",
               "" if ok else f"{why}: variance {v:.4g} x the stated scale^2, expected 1")


def exact_row(check: str, quantity: str, value: float, allowed: str, ok: bool, why: str) -> Row:
    return Row(check, quantity, float(value), allowed, "pass" if ok else "fail", "" if ok else why)


# ----------------------------------------------------------------------------- the variance of low-rank noise
class MeanSquare(NamedTuple):
    """The mean square of E's entries over sigma^2 (one member per antithetic pair, every slice), its exact null
    variance under EGGROLL's law, and what it pooled."""
    value: float
    var: float
    slices: int          # (member, slice) matrices pooled
    entries: int         # E's entries pooled


def slice_mean_squares(value, sigma: float) -> np.ndarray:
    """(P * n_slices,) ||A_i B_i^T||_F^2 / (a b sigma^2) per even member i and slice, as tr((A^T A)(B^T B)) / (a b
    sigma^2) from the r x r Gram matrices (no E formed): invariant to a scale moved between A and B and to any
    rotation of the r columns, as E's law is."""
    A, B = (np.asarray(v, np.float64)[::2] for v in value)              # (P, *stack, a, r), (P, *stack, b, r)
    ga, gb = np.einsum("...ir,...is->...rs", A, A), np.einsum("...ir,...is->...rs", B, B)
    return (np.einsum("...rs,...rs->...", ga, gb) / (A.shape[-2] * B.shape[-2] * sigma ** 2)).ravel()


def slice_null_var(a: int, b: int, r: int) -> float:
    """Var(||A B^T||_F^2 / (a b sigma^2)) for one (a, b) slice of EGGROLL's noise: 2 (a + b + r + 1) / (r a b)
    (the module docstring derives it; the mean is 1)."""
    return 2.0 * (a + b + r + 1) / (r * a * b)


def mean_square_of(parts: list[tuple[np.ndarray, int, int, int]]) -> MeanSquare:
    """Pool (slice mean squares, a, b, r) parts, each slice weighted by its a b entries: the mean square of every
    pooled entry, and its null variance sum (a b)^2 var_s / (sum a b)^2 (slices independent)."""
    w = sum(s.size * a * b for s, a, b, _ in parts)
    value = sum(float(np.sum(s)) * a * b for s, a, b, _ in parts) / w
    var = sum(s.size * (a * b) ** 2 * slice_null_var(a, b, r) for s, a, b, r in parts) / w ** 2
    return MeanSquare(value, var, sum(s.size for s, *_ in parts), w)


def mean_square_region(var: float, alpha: float) -> tuple[float, float]:
    """[lo, hi] holding the null mean square (mean 1, variance var) but with chance <= alpha: lo the alpha/2 quantile
    of the gamma, hi the 1 - alpha/2 quantile of the log-normal, each with mean 1 and variance var (the module
    docstring: why each tail's approximation is conservative, and the Monte Carlo that measures it)."""
    from scipy import stats
    s2 = math.log1p(var)
    return (float(stats.gamma(1 / var, scale=var).ppf(alpha / 2)),
            float(stats.lognorm(math.sqrt(s2), scale=math.exp(-s2 / 2)).isf(alpha / 2)))


def mean_square_p(ms: MeanSquare) -> float:
    """The two-sided p-value of a mean square under mean_square_region's tails: 2 min(gamma CDF, log-normal SF)."""
    from scipy import stats
    s2 = math.log1p(ms.var)
    low = stats.gamma(1 / ms.var, scale=ms.var).cdf(ms.value)
    high = stats.lognorm(math.sqrt(s2), scale=math.exp(-s2 / 2)).sf(ms.value)
    return float(min(1.0, 2 * min(low, high)))


def zero_columns(value) -> int:
    """How many of the r factor columns are zero in A or in B for every member, slice and row."""
    A, B = (np.asarray(v) for v in value)
    axes = tuple(range(A.ndim - 1))
    return int(np.sum(np.all(A == 0, axis=axes) | np.all(B == 0, axis=axes)))


def clamp_text(leaf: Leaf, value, ms: MeanSquare, r: int, alpha: float) -> str:
    """Name the rank clamped to the layer's smaller side when the factors hold zero columns, or when min(a, b) < r
    and the fitted variance is min(a, b) / r within the test's region."""
    k, zero = min(leaf.factor_dims), zero_columns(value)
    scale = f"with the requested rank's scale sigma / sqrt({r})"
    if zero:
        kept = r - zero
        where = f", the layer's smaller side min(a, b) = {k}," if kept == k else ""
        return (f"; {zero} of the {r} factor columns are zero: the rank clamped to {kept}{where} {scale} (variance "
                f"{kept}/{r} = {kept / r:.3g} x)")
    lo, hi = mean_square_region(ms.var, alpha)
    if k < r and lo * k / r <= ms.value <= hi * k / r:
        return (f"; the fitted variance is min(a, b) / r = {k}/{r} = {k / r:.3g}: the rank clamped to the layer's "
                f"smaller side min(a, b) = {k} {scale}")
    return ""


def variance_row(check: str, quantity: str, ms: MeanSquare, sigma: float, alpha: float, who: str,
                 clamp: str = "") -> Row:
    """The mean square of E's entries over sigma^2 against mean_square_region; a failure names the factor c."""
    lo, hi = mean_square_region(ms.var, alpha)
    ok = lo <= ms.value <= hi
    return Row(check, f"{quantity}: mean square of E / sigma ({ms.entries} entries of {ms.slices} slices, one member "
                      f"per pair)", ms.value,
               f"in [{lo:.4g}, {hi:.4g}] (mean 1, variance {ms.var:.3g}: gamma / log-normal tails, alpha={alpha:.2g})",
               "pass" if ok else "fail",
               "" if ok else f"the noise of {who} has {ms.value:.3g} x the reference's variance (sigma^2 = "
                             f"{sigma ** 2:.4g}; the mean square of E's entries is {ms.value * sigma ** 2:.4g})" + clamp)


def leaf_variance_row(check: str, q: str, leaf: Leaf, values: list, cfg, alpha: float) -> Row:
    """variance_row of one low-rank leaf over the given (distinct) draws, the rank clamp named where it fits."""
    a, b = leaf.factor_dims
    ms = mean_square_of([(slice_mean_squares(v, cfg.sigma), a, b, v[0].shape[-1]) for v in values])
    row = variance_row(check, q, ms, cfg.sigma, alpha, leaf.path)
    return row._replace(cause=row.cause + clamp_text(leaf, values[0], ms, cfg.rank, alpha)) if row.cause else row


def distinct(values: list) -> list:
    """The draws of a list that are not bit for bit an earlier one's (epochs of one generation under noise_reuse hold
    the same draws; pooling them twice would count them as independent)."""
    kept = []
    for v in values:
        if not any(all(np.array_equal(x, y) for x, y in zip(_parts(v), _parts(k))) for k in kept):
            kept.append(v)
    return kept


def _parts(value) -> tuple:
    return value if isinstance(value, tuple) else (value,)


# ----------------------------------------------------------------------------- init
INIT_SEEDS = 2          # the run seed and the next: pooled for the statistics, compared for the seed's effect


def init_scale(rule) -> float:
    """A drawn leaf's stated scale as the reference forms it in float32: 1/sqrt(fan_in) (sqrt rounded, then the
    reciprocal) or h0's 0.1."""
    if rule.kind == "h0":
        return float(np.float32(H0_SCALE))
    return float(np.float32(1) / np.sqrt(np.float32(rule.fan_in)))


def check_init(R, side, cfg: LMConfig, seed: int) -> list[Row]:
    """Deterministic leaves exactly as the reference's; drawn leaves / their scale N(0, 1) (KS and chi-square per
    leaf, pooled over INIT_SEEDS seeds, alpha = check_alpha("init") / (2 x drawn leaves)); seeds and slices differ."""
    plan, tree = init_plan(cfg), lm_tree(cfg)
    ref = R.init(cfg, seed)
    inits = [side.init(seed + k) for k in range(INIT_SEEDS)]
    drawn = [p for p in tree.paths if plan[p].kind in ("normal", "h0")]
    alpha = check_alpha("init") / (2 * len(drawn))
    rows = []
    for leaf in tree.leaves:
        p, rule = leaf.path, plan[leaf.path]
        if p not in drawn:
            diff = float(np.max(np.abs(inits[0][p].astype(np.float64) - ref[p])))
            rows.append(exact_row("init", f"{p} ({rule.kind}): max |port - ref|", diff, "== 0 (a deterministic rule)",
                                  diff == 0, f"init differs: {p} is not the reference's {rule.kind}"))
            continue
        scale = init_scale(rule)
        why = f"init differs: {p} / {scale:.4g} (normal / sqrt({rule.fan_in}))" if rule.kind == "normal" else \
            f"init differs: {p} / 0.1 (h0's normal * 0.1)"
        rows += _drawn_rows(leaf, inits, scale, alpha, seed, why)
    return rows


def pooled_law_rows(check: str, what: str, parts: list[np.ndarray], scale: float, alpha: float, why: str) -> list[Row]:
    """KS and chi-square of the values of `parts` pooled, each over `scale`, as N(0, 1): the chi-square on every
    value, summed block by block (one block, the pooled float64 array, when it holds at most blocks.BLOCK_ENTRIES);
    the KS on at most KS_SAMPLE evenly spaced pooled values, sorted in the parts' own dtype first (x -> x / scale
    keeps the order, so the sorted sample is the same)."""
    flat = [np.asarray(part).ravel() for part in parts]
    n = sum(f.size for f in flat)
    if n <= B.BLOCK_ENTRIES:
        x = np.concatenate([f.astype(np.float64) / scale for f in flat])
        return [ks_row(check, what, x, alpha, why), chi2_row(check, what, x, alpha, why)]
    squares, step, sample, start = 0.0, evenly_spaced(n), [], 0
    for f in flat:
        for c in B.chunks(f.size):
            squares += float(np.sum((f[c].astype(np.float64) / scale) ** 2))
        sample.append(f[(-start) % step::step])
        start += f.size
    x = np.sort(np.concatenate(sample)).astype(np.float64) / scale
    return [ks_row(check, what, x, alpha, why, of=n, presorted=True),
            mean_square_row(check, what, squares / n, n, alpha, why)]


def _drawn_rows(leaf: Leaf, inits: list[dict], scale: float, alpha: float, seed: int, why: str) -> list[Row]:
    """A drawn leaf's init: value / scale N(0, 1) (KS and chi-square over the INIT_SEEDS inits pooled), the seeds
    drawing apart and, for a stack, no two slices alike (exact)."""
    p = leaf.path
    what = f"{p} / {scale:.4g}"
    rows = pooled_law_rows("init", what, [init[p] for init in inits], scale, alpha, why)
    same = bool(np.array_equal(inits[0][p], inits[1][p]))
    rows.append(exact_row("init", f"{p}: seeds {seed} and {seed + 1} draw alike", float(same),
                          "== 0 (the run seed keys the init)", not same,
                          f"init differs: {p} is the same at seeds {seed} and {seed + 1}"))
    if leaf.scan_axes:
        n, of = identical_slices(leaf, inits[0][p][None])
        rows.append(exact_row("init", f"{p}: identical slice pairs", n, f"== 0 of {of} (a key per slice)", n == 0,
                              f"init differs: {n} of {of} pairs of {p}'s slices are identical"))
    return rows


NO_INIT_LAWS = ("the adapter declares no init laws (`init_laws`): a foreign model's init is its own, and the reference "
                "has none to compare it with")


def check_init_laws(side, cfg, seed: int) -> list[Row]:
    """A declared tree's init on the leaves whose law the port states (spec.tree.TreeRun.init_laws): "zeros" and
    "ones" exactly; ("normal", std) as _drawn_rows at alpha = check_alpha("init") / (2 x normal leaves). The other
    leaves' init is the port's own: not checked."""
    if not cfg.init_laws:
        return [Row("init", "-", float("nan"), "-", "skip", NO_INIT_LAWS)]
    inits = [side.init(seed + k) for k in range(INIT_SEEDS)]
    alpha = check_alpha("init") / (2 * max(sum(law == "normal" for _, law, _ in cfg.init_laws), 1))
    rows = []
    for path, law, scale in cfg.init_laws:
        leaf = cfg.tree.leaf(path)
        if law == "normal":
            rows += _drawn_rows(leaf, inits, scale, alpha, seed, f"init differs: {path} / {scale:.4g} (its declared "
                                                                  f"normal(0, {scale:g}))")
            continue
        want = 0.0 if law == "zeros" else 1.0
        diff = float(np.max(np.abs(inits[0][path].astype(np.float64) - want)))
        rows.append(exact_row("init", f"{path} ({law}): max |port - {want:g}|", diff, "== 0 (its declared law)",
                              diff == 0, f"init differs: {path} is not {law}, as the adapter declares"))
    return rows


# ----------------------------------------------------------------------------- noise
def members_of(value) -> int:
    """How many members a leaf's protocol noise holds."""
    return (value[0] if isinstance(value, tuple) else value).shape[0]


def max_abs(leaf: Leaf, value) -> float:
    """max |E| over every member's perturbation (dense64), block by block."""
    return max(float(np.max(np.abs(B.dense_block(leaf, value, blk, np.float64))))
               for blk in B.blocks(leaf, members_of(value)))


def unperturbed_row(leaf: Leaf, value, q: str) -> Row:
    """A leaf the reference never perturbs: the side's noise must be absent or zero; else name the knob."""
    worst = 0.0 if value is None else max_abs(leaf, value)
    knob = "embedding" if leaf.cls == "embedding" else "frozen_leaves"
    why = cause(knob, f"{leaf.path} is perturbed (max |noise| {worst:.3g}); the reference leaves {leaf.cls} leaves"
                      + (" under freeze_nonlora" if leaf.cls == "param" else "") + " unperturbed") \
        if leaf.cls in ("embedding", "param") else f"{leaf.path} ({leaf.cls}) is perturbed; the reference never is"
    return exact_row("noise", f"{q}: max |noise|", worst, "== 0 (not perturbed)", worst == 0, why)


def _antithetic_row(leaf: Leaf, value, q: str) -> Row:
    """Member 2k+1 = -member 2k: |E_2k + E_2k+1| within gamma_r (|A||B|^T of both) for factors (each float64 product
    of float32 factors rounds its r-term sum), exactly for eps (a sign flip is exact). Block by block
    (parity.tree.blocks); a block after the first whose pairs' values are negated bit for bit is within it by
    construction (the two products are then exact negations) and is not formed."""
    mag = B.magnitude_of(value) if isinstance(value, tuple) else None

    def excess(blk: B.Block) -> float:
        d = B.dense_block(leaf, value, blk, np.float64)
        gap = np.abs(d[0::2] + d[1::2])
        if mag is None:
            return float(np.max(gap))
        m = B.magnitude_block(leaf, mag, blk)
        return float(np.max(gap - gamma(value[0].shape[-1], 2.0 ** -53) * (m[0::2] + m[1::2])))
    worst, done, every = B.worst_over(leaf, members_of(value), lambda blk: B.mirrored(value, blk, leaf), excess)
    pairing = worst > 0 and pairing_text(leaf, B.dense_block(leaf, value, B.head(leaf, members_of(value)),
                                                             np.float64))
    return exact_row("noise", f"{q}: antithetic pairs, max (|E_2k + E_2k+1| - bound)", worst,
                     "<= 0 (member 2k+1 = -member 2k; float64 rounding of the products)" + B.skipped_words(done, every),
                     worst <= 0, "; ".join(filter(None, [f"{leaf.path}: member 2k+1 is not the negation of member 2k "
                                                         f"(interleaved antithetic pairs)", pairing])))


def _slices_row(leaf: Leaf, value, q: str) -> Row:
    n, of = B.identical_slices(leaf, value)
    return exact_row("noise", f"{q}: identical slice pairs", n, f"== 0 of {of} (one key per slice)", n == 0,
                     cause("stack_keys", f"{n} of {of} pairs of {leaf.path}'s {leaf.n_slices} slices hold identical "
                                         f"noise: every slice drawn from one key, so the layers share their noise"))


def _law_rows(cfg: LMConfig, leaf: Leaf, value, q: str, alpha: float) -> list[Row]:
    """Low-rank: KS of the diagonal of E / sigma against EGGROLL's entry law (its shape), and the mean square of every
    entry of E / sigma (its variance, with the power of all a b entries per slice); param: KS and chi-square."""
    x = independent_entries(value, cfg.sigma)
    why = f"{leaf.path}'s noise over sigma"
    if isinstance(value, tuple):
        row = ks_row("noise", f"{q}: diagonal entries of E / sigma", x, alpha, why, cfg.rank)
        if row.verdict == "fail" and is_rescaled(x, cfg.rank):   # EGGROLL-shaped at another variance: a scale
            row = row._replace(cause=f"{row.cause}; {scale_cause(leaf.path, x).text}")
        return [leaf_variance_row("noise", q, leaf, [value], cfg, alpha), row]     # the variance named first
    return [ks_row("noise", f"{q}: eps / sigma", x, alpha, why), chi2_row("noise", f"{q}: eps / sigma", x, alpha, why)]


def noise_tests(cfg: LMConfig) -> int:
    """Statistical tests the noise check runs: per epoch, a KS and a mean square per low-rank leaf, a KS and a
    chi-square per param leaf the reference perturbs; and, pooled over every low-rank leaf and the epochs' distinct
    draws, one KS and one mean square (the most power against a drift of the whole noise's scale)."""
    return 2 + len(EPOCHS) * 2 * sum(1 for leaf in cfg.tree.leaves if ref_perturbs(cfg, leaf))


def _pooled_row(cfg: LMConfig, seen: dict, alpha: float) -> list[Row]:
    """KS of all low-rank leaves' independent entries over sigma and the mean square of all their entries, over the
    epochs' distinct draws (an epoch drawing the same generation as an earlier one is not counted again)."""
    low = {p: distinct(vs) for p, vs in seen.items() if isinstance(vs[0], tuple)}
    if not low:
        return []
    return pooled_variance_rows("noise", "every low-rank leaf, epochs' distinct draws", cfg, low, alpha,
                                "the low-rank noise over sigma")


def pooled_variance_rows(check: str, what: str, cfg: LMConfig, low: dict, alpha: float, why: str,
                         who: str = "every low-rank leaf") -> list[Row]:
    """The pooled mean square of every entry of E / sigma (first: it names the factor) and the pooled KS of the
    diagonal entries, over the draws {path: [factors, ...]} (each list already distinct)."""
    x = np.concatenate([independent_entries(v, cfg.sigma) for vs in low.values() for v in vs])
    parts = [(slice_mean_squares(v, cfg.sigma), *cfg.tree.leaf(p).factor_dims, v[0].shape[-1])
             for p, vs in low.items() for v in vs]
    return [variance_row(check, what, mean_square_of(parts), cfg.sigma, alpha, who),
            ks_row(check, f"{what}: diagonal entries of E / sigma", x, alpha, why, cfg.rank)]


def _epoch_row(R, cfg: LMConfig, leaf: Leaf, values: list) -> Row:
    """Epochs 0 and 1 draw alike exactly when noise_reuse gives them one generation."""
    same = B.equal_dense(leaf, members_of(values[0]), values[0], values[1])
    expected = R.true_epoch(EPOCHS[0], cfg.noise_reuse) == R.true_epoch(EPOCHS[1], cfg.noise_reuse)
    return exact_row("noise", f"{leaf.path}: epochs {EPOCHS[0]} and {EPOCHS[1]} draw alike", float(same),
                     f"== {int(expected)} (noise_reuse {cfg.noise_reuse})", same == expected,
                     f"{leaf.path}: the noise at epochs {EPOCHS[0]} and {EPOCHS[1]} is "
                     f"{'the same' if same else 'different'}; with noise_reuse {cfg.noise_reuse} the reference draws "
                     f"{'one generation' if expected else 'a fresh generation each'}")


def invisible_rows() -> list[Row]:
    return [Row("noise", f"knob `{k}`", float("nan"), "-", "skip", f"not observable in distribution: {why}")
            for k, why in INVISIBLE.items()]


def check_noise(R, side, cfg: LMConfig, seed: int) -> tuple[list[Row], set[str]]:
    """Every leaf at EPOCHS (see the module docstring); returns the rows and the leaves whose noise is structurally
    not the reference's (perturbed where it is not, or the reverse): their gradients are not compared."""
    alpha = check_alpha("noise") / max(noise_tests(cfg), 1)
    rows, parted, seen = [], set(), {}
    for epoch in EPOCHS:
        for leaf in cfg.tree.leaves:
            value = side.leaf_noise(seed, epoch, leaf)
            q = f"{leaf.path} ({leaf.cls}) epoch {epoch}"
            if not ref_perturbs(cfg, leaf):
                rows.append(unperturbed_row(leaf, value, q))
                parted.update([leaf.path] if rows[-1].verdict == "fail" else [])
            elif value is None:
                parted.add(leaf.path)
                rows.append(Row("noise", f"{q}: perturbed", 0.0, "perturbed as the reference", "fail",
                                f"{leaf.path} is not perturbed; the reference perturbs {leaf.cls} leaves"))
            else:
                seen.setdefault(leaf.path, []).append(value)
                rows += [_antithetic_row(leaf, value, q)] + ([_slices_row(leaf, value, q)] if leaf.scan_axes else []) \
                    + _law_rows(cfg, leaf, value, q, alpha)     # shared slices named before they skew the law's test
    rows += [_epoch_row(R, cfg, cfg.tree.leaf(p), v) for p, v in seen.items() if len(v) == len(EPOCHS)]
    return rows + _pooled_row(cfg, seen, alpha) + invisible_rows(), parted


# ----------------------------------------------------------------------------- the reference on the side's noise
def reference_dense(cfg: LMConfig, noise: dict) -> dict[str, np.ndarray]:
    """{path: E (m, *shape) float32} of every leaf the reference perturbs that the side's noise holds (formed in
    float64, rounded once); leaves only the side perturbs are left out, as the reference would."""
    return {leaf.path: dense64(leaf, noise[leaf.path]).astype(np.float32) for leaf in cfg.tree.leaves
            if ref_perturbs(cfg, leaf) and noise.get(leaf.path) is not None}


def check_gradients(R, side, cfg: LMConfig, seed: int, rng, parted: set[str]) -> list[Row]:
    """Per leaf: the side's gradient against the reference's float64 estimate on the side's own noise (epoch 0); a
    leaf beyond the bound is diagnosed in the exact mode's words (parity.tree.base.with_gradient_causes: its scale
    named in sigma, N and r when port - c ref is within the bound, clipped at a norm, or its cosine)."""
    shaped = R.shape(cfg, rng.standard_normal(cfg.pop).astype(np.float32))
    port, noise = side.grads(seed, 0, shaped), side.protocol(seed, 0)
    rows, failing = [], []
    for leaf in cfg.tree.leaves:
        p = leaf.path
        if p in parted:
            rows.append(Row("gradients", f"{p} ({leaf.cls})", float("nan"), "-", "skip",
                            f"{p}'s noise already differs"))
        elif not ref_perturbs(cfg, leaf):
            moved = float(np.max(np.abs(port[p])))
            rows.append(exact_row("gradients", f"{p} ({leaf.cls}): max |port|", moved, "== 0 (no update)", moved == 0,
                                  f"{p} gets an update the reference never gives it"))
        else:
            bound = np.maximum(grad_bound(cfg, leaf, noise[p], shaped), 1e-30)
            ref = estimate(leaf, noise[p], shaped)
            ratio = float(np.max(np.abs(port[p].astype(np.float64) - ref) / bound))
            rows.append(exact_row("gradients", f"{p} ({leaf.cls}): max |port - ref on the port's noise| / bound", ratio,
                                  "<= 1 (2 gamma_{N r + 3} mean |f||A||B|^T; param 2 gamma_{N + 2} mean |f||eps|)",
                                  ratio <= 1, ""))
            failing += [] if ratio <= 1 else [(leaf, port[p], ref, bound)]
    return with_gradient_causes(cfg, rows, failing)


def forward_reference(R, side, cfg: LMConfig, seed: int) -> Callable:
    """(params, tokens) -> the reference's (scores, intermediates) on the side's own noise at epoch 0."""
    return lambda params, tokens: R.scores_dense(cfg, params, reference_dense(cfg, side.protocol(seed, 0)), tokens)


def reference_step(R, cfg: LMConfig, params: dict, noise: dict, tokens: np.ndarray) -> dict:
    """One reference epoch on given noise: scores (its forward on params + E), shaped fitness, the float64 estimate
    per leaf (zero where it perturbs nothing) and the optax-sgd step on it."""
    dense = reference_dense(cfg, noise)
    scores, _ = R.scores_dense(cfg, params, dense, tokens)
    shaped = R.shape(cfg, scores)
    grads = {leaf.path: estimate(leaf, noise[leaf.path], shaped) if leaf.path in dense else np.zeros(leaf.shape)
             for leaf in cfg.tree.leaves}
    new = R.update(cfg, params, {k: v.astype(np.float32) for k, v in grads.items()})
    return {"scores": scores, "shaped": shaped, "grads": grads, "params": new}


def trajectory_step(R, side, cfg: LMConfig, seed: int, asked: list | None = None) -> Callable:
    """(params, epoch, tokens) -> (reference, port, {path: (|noise|, roundings)}, the reference's step at float32
    or None): the side's epoch, then the reference's step on the noise its es_ask drew, for the lockstep of
    parity.tree.check.check_trajectory (each epoch's noise appended to `asked` when given); a TF32 reference's step
    is also taken at float32, its own rounding measured."""
    def step(params, epoch, tokens):
        port = side.epoch_step(seed, params, epoch, tokens)
        noise = port["noise"]
        if asked is not None:
            asked.append(noise)
        mags = {leaf.path: (magnitude(leaf, noise[leaf.path]),
                            cfg.pop * cfg.rank + 3 if leaf.cls in ("mm", "tmm") else cfg.pop + 2)
                for leaf in cfg.tree.leaves if ref_perturbs(cfg, leaf) and noise.get(leaf.path) is not None}
        ref32 = reference_step(float32_of(R), cfg, params, noise, tokens) if ref_u(R) else None   # TF32: its own gap
        return reference_step(R, cfg, params, noise, tokens), port, mags, ref32
    return step


def asked_tests(cfg: LMConfig) -> int:
    """Statistical tests of asked_rows: a mean square per low-rank leaf the reference perturbs, and the pooled KS and
    mean square."""
    return 2 + sum(1 for leaf in cfg.tree.leaves if leaf.cls in ("mm", "tmm") and ref_perturbs(cfg, leaf))


def asked_rows(cfg: LMConfig, asked: list) -> list[Row]:
    """The training loop's own noise (es_ask): antithetic pairs per perturbed leaf and epoch (exact); over the
    epochs' distinct draws (a generation reused by noise_reuse counted once), one KS of every low-rank leaf's
    independent entries over sigma and one mean square of all their entries, and a mean square per low-rank leaf,
    at check_alpha("trajectory") / asked_tests(cfg)."""
    rows, low = [], {}
    for epoch, noise in enumerate(asked):
        leaves = [leaf for leaf in cfg.tree.leaves if noise.get(leaf.path) is not None]
        rows += [_antithetic_row(leaf, noise[leaf.path], f"epoch {epoch}: es_ask noise, {leaf.path}")._replace(
            check="trajectory") for leaf in leaves]
        for leaf in leaves:
            if leaf.cls in ("mm", "tmm"):
                low.setdefault(leaf.path, []).append(noise[leaf.path])
    if not low:
        return rows
    low, alpha = {p: distinct(vs) for p, vs in low.items()}, check_alpha("trajectory") / asked_tests(cfg)
    rows += pooled_variance_rows("trajectory", f"es_ask noise, epochs 0-{len(asked) - 1} (distinct draws), every "
                                               f"low-rank leaf", cfg, low, alpha,
                                 "the training loop's (es_ask) low-rank noise over sigma",
                                 "every low-rank leaf of the training loop (es_ask)")
    return rows + [leaf_variance_row("trajectory", f"es_ask noise, {p}, epochs' distinct draws", cfg.tree.leaf(p), vs,
                                     cfg, alpha) for p, vs in low.items()]
