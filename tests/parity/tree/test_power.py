"""Power on the low-rank noise's law in distribution mode (issue 53 item 5): the mean square of every entry of
E = A B^T over sigma^2 (parity.tree.dist.slice_mean_squares, its exact null mean 1 and variance, gamma / log-normal
tails) catches a 0.38x variance at pop 64 at two sizes and names the factor, names the rank clamped to the layer's
smaller side, is invariant to a scale moved between A and B and to a rotation of the r columns, pools an epoch's
draws once, and never flags the faithful torch-rng GPT.

Measured by a Monte Carlo of the reference's law (6M statistics per row, each the mean of its K slices drawn from a
pool of 10M exact slice mean squares, null_slices; `python -m tests.parity.tree.test_power` reruns the per-leaf shapes with
4M direct draws each; the suite's alpha per row on the example GPT is 1.5e-5): false-alarm rate / alpha
at alpha 1.5e-5, per-leaf rows small pop 8 (attn 8x8, fc 8x32, head 32x8) 0.37, 0.33, 0.24, pooled 0.72; example
pop 16 (attn 16x16, fc 16x64, head 64x16) 0.54, 0.44, 0.51, pooled 0.59; at 1e-3 at most 0.89 (each tail at most
0.92 of alpha/2). Faithful torch-rng GPT, 10 seeds at pops 8 / 16 and 64, both sizes: no row flagged; the pooled
mean square's p-values spread over (0.06, 0.99), median 0.5-0.6.

Power, fraction of 20 seeds caught by the noise check (VarianceScaled: every A times sqrt(c)):
    size     pop   0.38x   0.8x   1.2x        (KS rows alone: 0.38x / 0.8x / 1.2x)
    small      8   20      4      0           15 / 0 / 0
    small     16   20      16     13          20 / 0 / 0
    small     64   20      20     20          20 / 2 / 0
    example    8   20      11     6           19 / 0 / 0
    example   16   20      20     18          20 / 0 / 0
    example   64   20      20     20          20 / 4 / 0
"""
from __future__ import annotations

import numpy as np
import pytest

from examples.gpt_adapter import GPTAdapter
from parity.tree import check as tree_check
from parity.tree import dist as D
from parity.tree import numpy_reference as NR
from parity.tree.adapter import CheckedTreePort, PortSide, declared_run
from spec.tree_knobs import TreeKnobs
from tests.ports.power_ports import AskVarianceScaled, RankClamp, TorchRngAt, VarianceScaled
from tests.parity.tree.test_check import SIZES, rows_of


def noise_rows(port, seed: int):
    """The in-distribution noise check alone on a port (its rows, and the run's configuration)."""
    run, _ = declared_run(port, tree_check.TREE_SIZES["quick"])
    return D.check_noise(NR, PortSide(CheckedTreePort(port, run), run), run, seed)[0], run


def factors(rng, m: int, a: int, b: int, r: int, sigma: float):
    """EGGROLL's law: A (m, a, r) N(0, 1) sigma / sqrt(r), B (m, b, r) N(0, 1), antithetic pairs."""
    A = rng.standard_normal((m // 2, a, r)) * sigma / np.sqrt(r)
    B = rng.standard_normal((m // 2, b, r))
    return np.repeat(A, 2, 0) * np.tile([1.0, -1.0], m // 2)[:, None, None], np.repeat(B, 2, 0)


@pytest.mark.parametrize("a, b, r", [(8, 32, 2), (3, 5, 4), (16, 16, 8)])
def test_the_slice_mean_square_has_the_derived_null_mean_and_variance(a, b, r):
    """Mean 1 and variance 2 (a + b + r + 1) / (r a b) (the module docstring), against 40,000 slices of the law;
    a b < r a rank-deficient slice as the reference draws it. A wrong fourth moment (e.g. (a + b) / (r a b)) fails."""
    rng = np.random.default_rng(1)
    s = D.slice_mean_squares(factors(rng, 80_000, a, b, r, 0.05), 0.05)
    var = D.slice_null_var(a, b, r)
    assert s.size == 40_000 and abs(s.mean() - 1) < 5 * np.sqrt(var / s.size)
    assert abs(s.var() / var - 1) < 0.08, (s.var(), var)


def test_the_statistic_is_invariant_to_a_scale_between_the_factors_and_a_rotation_of_the_columns():
    """A -> A M, B -> B M^-T (M: a scale times a rotation) keeps E, so it keeps the statistic (to rounding)."""
    rng = np.random.default_rng(2)
    A, B = factors(rng, 8, 16, 64, 4, 0.05)
    q, _ = np.linalg.qr(rng.standard_normal((4, 4)))
    moved = (A @ (3.0 * q), B @ (q / 3.0))
    assert np.allclose(D.slice_mean_squares(moved, 0.05), D.slice_mean_squares((A, B), 0.05), rtol=1e-12)
    assert not np.allclose(moved[0], A)


def test_the_rank_clamp_is_named_from_the_fitted_variance_when_no_column_is_zero():
    """A clamped port whose r columns are rotated (no zero column): the fitted variance min(a, b) / r names it."""
    from spec.tree import Leaf
    rng = np.random.default_rng(3)
    leaf = Leaf("w", (6, 40), "mm")
    A, B = factors(rng, 64, 6, 40, 16, 0.05)
    A, B = A.copy(), B.copy()
    A[..., 6:], B[..., 6:] = 0, 0
    q, _ = np.linalg.qr(rng.standard_normal((16, 16)))
    value = (A @ q, B @ q)
    assert D.zero_columns(value) == 0 and D.zero_columns((A, B)) == 10
    cfg = type("Cfg", (), {"sigma": 0.05, "rank": 16})
    row = D.leaf_variance_row("noise", "w", leaf, [value], cfg, 1e-5)
    assert row.verdict == "fail" and "the noise of w has 0.4" in row.cause, row
    assert "the fitted variance is min(a, b) / r = 6/16 = 0.375: the rank clamped to the layer's smaller side " \
           "min(a, b) = 6 with the requested rank's scale sigma / sqrt(16)" in row.cause, row.cause


def test_an_epoch_reusing_its_generation_is_pooled_once():
    """noise_reuse 2: epochs 0 and 1 hand the same draws; the pooled rows count them once."""
    rows, run = noise_rows(TorchRngAt(**SIZES["example"]), 0)
    pooled = [r for r in rows if r.quantity.startswith("every low-rank leaf")]
    per_leaf = [r for r in rows if "epoch 0: mean square of E" in r.quantity]
    assert run.noise_reuse == 2 and len(pooled) == 2
    assert f"({sum(int(r.quantity.split('(')[2].split()[0]) for r in per_leaf)} entries" in pooled[0].quantity


def test_the_noise_rows_spend_exactly_the_stated_budget():
    rows, run = noise_rows(TorchRngAt(**SIZES["small"]), 1)
    assert sum("alpha=" in r.allowed for r in rows) == D.noise_tests(run)
    assert all(f"alpha={D.check_alpha('noise') / D.noise_tests(run):.2g}" in r.allowed for r in rows
               if "alpha=" in r.allowed)


@pytest.mark.slow
@pytest.mark.parametrize("size", SIZES)
def test_the_faithful_torch_rng_gpt_is_never_flagged(size):
    """10 seeds each at the size's pop and at pop 64: no noise row fails, and the pooled mean square's p-values are
    not all near 0 or 1 (the statistic is centred on the faithful law)."""
    ps = []
    for pop in (SIZES[size]["pop"], 64):
        for seed in range(10):
            rows, run = noise_rows(TorchRngAt(**{**SIZES[size], "pop": pop}), seed)
            assert [r.cause for r in rows if r.verdict == "fail"] == []
            ps.append(_pooled_p(rows))
    assert 0.02 < np.median(ps) < 0.98, ps


def _pooled_p(rows) -> float:
    """The pooled mean square's two-sided p-value, recomputed from its row (value and the variance it states)."""
    row = [r for r in rows if r.quantity.startswith("every low-rank leaf") and "mean square" in r.quantity][0]
    var = float(row.allowed.split("variance ")[1].split(":")[0])
    return D.mean_square_p(D.MeanSquare(row.value, var, 0, 0))


@pytest.mark.slow
@pytest.mark.parametrize("size", SIZES)
def test_a_variance_of_0_38_is_caught_at_pop_64_and_named(size):
    rows, _ = noise_rows(VarianceScaled(0.38, **{**SIZES[size], "pop": 64}), 4)
    causes = [r.cause for r in rows if r.verdict == "fail" and "mean square of E" in r.quantity]
    assert len(causes) == 2 * 7 + 1, causes                        # every low-rank leaf at both epochs, and pooled
    assert any(c.startswith("the noise of blocks.attn.k has 0.3") and "x the reference's variance (sigma^2 = 0.0025"
               in c for c in causes), causes
    assert not any("rank clamped" in c for c in causes)             # a plain scale is not a clamp


@pytest.mark.slow
@pytest.mark.parametrize("size, rank, side", [("small", 16, 8), ("example", 32, 16)])
def test_the_rank_clamp_is_caught_and_named_by_the_suite(size, rank, side):
    """Rank above every leaf's smaller side, its columns beyond min(a, b) zeroed, the scale sigma / sqrt(r) kept:
    the whole suite fails only noise, named per leaf."""
    rows = rows_of(RankClamp(rank=rank, **SIZES[size]), 2)
    fails = [r for r in rows if r.verdict == "fail"]
    assert fails and {r.check for r in fails} == {"noise"}, [(r.check, r.cause) for r in fails]
    assert f"{rank - side} of the {rank} factor columns are zero: the rank clamped to {side}, the layer's smaller " \
           f"side min(a, b) = {side}, with the requested rank's scale sigma / sqrt({rank}) (variance {side}/{rank}" \
           in fails[0].cause and fails[0].cause.startswith("the noise of blocks.attn.k has 0."), fails[0].cause


@pytest.mark.slow
@pytest.mark.parametrize("size", SIZES)
def test_the_lockstep_names_a_training_loop_at_0_38_of_the_variance(size):
    """es_ask's noise at 0.38x the variance (its own steps consistent with it): the trajectory's es_ask rows name it."""
    rows = rows_of(AskVarianceScaled(0.38, **{**SIZES[size], "pop": 64}), 1)
    causes = [r.cause for r in rows if r.verdict == "fail" and r.check == "trajectory"]
    assert any(c.startswith("the noise of blocks.attn.k has 0.3") for c in causes), causes
    assert any(c.startswith("the noise of every low-rank leaf of the training loop (es_ask) has 0.3") for c in causes), \
        causes


# ----------------------------------------------------------------------------- the reference's law by Monte Carlo
def gram_roots(rng, m: int, n: int, r: int) -> np.ndarray:
    """(m, r, k) F with F F^T ~ Wishart_r(n, I), the Gram matrix of an (n, r) N(0, 1) factor: Bartlett's lower
    triangle (k = r) when n >= r, else the factor's transpose itself (k = n)."""
    if n < r:
        return np.swapaxes(rng.standard_normal((m, n, r)), 1, 2)
    L = np.zeros((m, r, r))
    for i in range(r):
        L[:, i, i] = np.sqrt(rng.chisquare(n - i, m))
        L[:, i, :i] = rng.standard_normal((m, i))
    return L


def null_slices(rng, m: int, a: int, b: int, r: int) -> np.ndarray:
    """m exact draws of one slice's ||A B^T||_F^2 / (a b sigma^2) under EGGROLL's law: ||F_X^T F_B||_F^2 / (r a b)."""
    fx, fb = gram_roots(rng, m, a, r), gram_roots(rng, m, b, r)
    return np.sum((np.swapaxes(fx, 1, 2) @ fb) ** 2, axis=(1, 2)) / (r * a * b)


def false_alarms(rng, leaf: tuple[int, int, int, int], m: int, alpha: float) -> float:
    """The fraction of m null mean squares of a leaf (a, b, r, K slices) outside mean_square_region at alpha."""
    a, b, r, k = leaf
    v = sum(null_slices(rng, m, a, b, r) for _ in range(k)) / k
    lo, hi = D.mean_square_region(D.slice_null_var(a, b, r) / k, alpha)
    return float(np.mean((v < lo) | (v > hi)))


def test_the_bartlett_sampler_is_the_law_of_the_factors():
    rng = np.random.default_rng(5)
    direct = D.slice_mean_squares(factors(rng, 40_000, 8, 32, 2, 1.0), 1.0)
    from scipy import stats
    assert stats.ks_2samp(direct, null_slices(rng, 20_000, 8, 32, 2)).pvalue > 1e-3


@pytest.mark.slow
@pytest.mark.parametrize("leaf", [(8, 8, 2, 12), (32, 8, 2, 4), (16, 64, 2, 16), (8, 8, 16, 12), (3, 40, 16, 8)])
def test_the_false_alarm_rate_is_within_alpha_at_the_examples_shapes(leaf):
    """400,000 null mean squares per shape (the tests' leaves, a rank above the side, a leaf narrower than r) at
    alpha 1e-2: at most alpha plus 3 standard errors (the module docstring reports 1.5e-5)."""
    alpha, m = 1e-2, 400_000
    rate = false_alarms(np.random.default_rng(list(leaf)), leaf, m, alpha)
    assert rate <= alpha + 3 * np.sqrt(alpha / m), rate


if __name__ == "__main__":          # the module docstring's false-alarm rates at the suite's own alpha
    gen = np.random.default_rng(0)
    for shape in [(8, 8, 2, 12), (8, 32, 2, 12), (32, 8, 2, 4), (16, 16, 2, 16), (16, 64, 2, 16), (64, 16, 2, 8)]:
        for a_ in (1.5e-5, 1e-4, 1e-3):
            print(shape, a_, false_alarms(gen, shape, 4_000_000, a_) / a_)
