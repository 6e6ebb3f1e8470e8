"""The parity suite's tolerance math: float32 bounds hold for real float32 evaluations and are not vacuous."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from parity.core import tolerances as tol


def test_gamma_values_and_overflow():
    u = 2.0 ** -24
    assert tol.gamma(1) == pytest.approx(u / (1 - u), rel=1e-12)
    assert tol.gamma(1000) == pytest.approx(1000 * u / (1 - 1000 * u), rel=1e-12)
    assert tol.gamma(2 ** 24) == math.inf


def test_ulp_distance_counts_representable_floats():
    x = np.float32(1.5)
    up = np.nextafter(x, np.float32(2))
    assert tol.ulp_distance(np.array([x]), np.array([x]))[0] == 0
    assert tol.ulp_distance(np.array([x]), np.array([up]))[0] == 1
    assert tol.ulp_distance(np.array([0.0], np.float32), np.array([-0.0], np.float32))[0] == 0
    tiny = np.float32(1e-45)        # the smallest subnormal
    assert tol.ulp_distance(np.array([tiny]), np.array([-tiny]))[0] == 2


def test_family_budget_is_at_most_the_stated_rate():
    assert sum(tol.CHECK_SHARES.values()) <= 1.0
    assert tol.FAMILY_ALPHA <= 1e-3


@pytest.mark.parametrize("out_dim,in_dim,r", [(8, 4, 1), (64, 64, 4), (256, 256, 8)])
def test_linear_bound_holds_for_float32_orders_and_is_tight(out_dim, in_dim, r):
    rng = np.random.default_rng(out_dim * 7 + r)
    m, batch = 5, 3
    W = (rng.standard_normal((out_dim, in_dim)) / np.sqrt(in_dim)).astype(np.float32)
    A = (rng.standard_normal((m, out_dim, r)) * 0.1).astype(np.float32)
    B = rng.standard_normal((m, in_dim, r)).astype(np.float32)
    x = rng.standard_normal((m, batch, in_dim)).astype(np.float32)
    exact = tol.linear_exact(W, A, B, x)
    bound = tol.linear_bound(W, A, B, x)
    tx, tw, ta, tb = (torch.from_numpy(t) for t in (x, W, A, B))
    factored = (tx @ tw.T + (tx @ tb) @ ta.transpose(1, 2)).numpy()
    formed = (tx @ (tw + ta @ tb.transpose(1, 2)).transpose(1, 2)).numpy()      # W + A B^T formed first
    for got in (factored, formed):
        assert np.all(np.abs(got - exact) <= bound)
    # Not vacuous: far below the values themselves.
    assert np.max(bound) < 1e-3 * np.max(np.abs(exact))


@pytest.mark.parametrize("activation", ["pqn", "tanh", "relu"])
@pytest.mark.parametrize("hidden", [8, 64])
def test_forward_bound_holds_for_torch_float32(activation, hidden):
    from spec.config import Config
    from torch_impl import model
    from torch_impl.keys import GENERATORS
    from torch_impl.noise import Noise

    cfg = Config(pop=6, hidden=hidden)
    rng = np.random.default_rng(hidden)
    params = {k: v.numpy() for k, v in model.init_params(cfg.sizes, "jax", GENERATORS["torch"], 3).items()}
    params = {k: (v if k.endswith("weight") else (0.1 * rng.standard_normal(v.shape)).astype(np.float32))
              for k, v in params.items()}
    noise = {}
    for t in range(cfg.layers):
        o, i = params[f"{t}.weight"].shape
        noise[f"{t}.weight"] = ((rng.standard_normal((6, o, 4)) * 0.1).astype(np.float32),
                                rng.standard_normal((6, i, 4)).astype(np.float32))
        noise[f"{t}.bias"] = (rng.standard_normal((6, o)) * 0.2).astype(np.float32)
    x = rng.standard_normal((6, 4)).astype(np.float32)
    tnoise = Noise({k: torch.from_numpy(v[0]) for k, v in noise.items() if isinstance(v, tuple)},
                   {k: torch.from_numpy(v[1]) for k, v in noise.items() if isinstance(v, tuple)},
                   {k: torch.from_numpy(v) for k, v in noise.items() if not isinstance(v, tuple)})
    tparams = {k: torch.from_numpy(v) for k, v in params.items()}
    for nz, tnz in ((None, None), (noise, tnoise)):
        got = model.forward(tparams, torch.from_numpy(x), tnz, activation).numpy()
        exact, bound = tol.ForwardBound(params, nz, activation)(x)
        assert np.all(np.abs(got - exact) <= bound)
        assert np.max(bound) < 1e-2 * max(1.0, np.max(np.abs(exact)))   # far below an O(1) drift
    # A different activation is far outside the bound.
    other = "tanh" if activation != "tanh" else "pqn"
    got = model.forward(tparams, torch.from_numpy(x), tnoise, other).numpy()
    exact, bound = tol.ForwardBound(params, noise, activation)(x)
    assert np.max(np.abs(got - exact) / bound) > 10


@pytest.mark.parametrize("n", [2, 64, 4096])
@pytest.mark.parametrize("scale,offset", [(1.0, 0.0), (1e-3, 0.0), (1.0, 500.0)])
def test_shaping_bound_holds_for_torch_and_jax(n, scale, offset):
    import jax.numpy as jnp

    rng = np.random.default_rng(n)
    f = (offset + scale * rng.standard_normal(n)).astype(np.float32)
    f64 = f.astype(np.float64)
    exact = (f64 - f64.mean()) / np.sqrt(f64.var() + 1e-5)
    bound = tol.shaping_bound(f)
    t = torch.from_numpy(f)
    got_torch = ((t - t.mean()) / torch.sqrt(t.var(correction=0) + 1e-5)).numpy()
    jf = jnp.asarray(f)
    got_jax = np.asarray((jf - jnp.mean(jf)) / jnp.sqrt(jnp.var(jf) + 1e-5))
    for got in (got_torch, got_jax):
        assert np.all(np.abs(got - exact) <= bound)


@pytest.mark.parametrize("n,r", [(8, 1), (256, 4)])
def test_gradient_bounds_hold(n, r):
    rng = np.random.default_rng(n + r)
    f = rng.standard_normal(n).astype(np.float32)
    A = (rng.standard_normal((n, 16, r)) * 0.1).astype(np.float32)
    B = rng.standard_normal((n, 8, r)).astype(np.float32)
    eps = (rng.standard_normal((n, 16)) * 0.2).astype(np.float32)
    exact_w = np.einsum("n,nir,njr->ij", f.astype(np.float64), A.astype(np.float64), B.astype(np.float64)) / n
    got_w = (torch.einsum("nir,njr->ij", torch.from_numpy(f)[:, None, None] * torch.from_numpy(A),
                          torch.from_numpy(B)) / n).numpy()
    assert np.all(np.abs(got_w - exact_w) <= tol.weight_grad_bound(f, A, B))
    exact_b = (f.astype(np.float64)[:, None] * eps).mean(0)
    got_b = (torch.from_numpy(f)[:, None] * torch.from_numpy(eps)).mean(0).numpy()
    assert np.all(np.abs(got_b - exact_b) <= tol.bias_grad_bound(f, eps))


def test_mean_interval_covers_at_its_level():
    """At alpha = 0.01 a correct expected value falls outside in about 1% of 2000 repeats (binomial: <= 45)."""
    rng = np.random.default_rng(5)
    outside = 0
    for _ in range(2000):
        mean, lo, hi = tol.mean_interval(rng.standard_normal(50) + 2.0, 2.0, 0.01)
        outside += not (lo <= mean <= hi)
    assert 2 <= outside <= 45
    mean, lo, hi = tol.mean_interval(rng.standard_normal(50) + 3.0, 2.0, 1e-4)
    assert not (lo <= mean <= hi)          # a shift of 1 sd at n = 50 is 7 se, beyond t(1e-4) ~ 4.1


# ----------------------------------------------------------------------------- dense noise
def _factors(rng, m, out_dim, in_dim, r, sigma=0.2):
    A = (rng.standard_normal((m, out_dim, r)) * sigma / np.sqrt(r)).astype(np.float32)
    return A, rng.standard_normal((m, in_dim, r)).astype(np.float32)


@pytest.mark.parametrize("out_dim,in_dim,r", [(8, 8, 4), (64, 64, 4), (256, 64, 8), (16, 32, 1)])
def test_rank_threshold_holds_for_float32_products_and_is_far_below_full_rank(out_dim, in_dim, r):
    """Every float32 way of forming A B^T stays within rank r at the threshold; Gaussian noise is far above it."""
    rng = np.random.default_rng(out_dim + 3 * r)
    A, B = _factors(rng, 32, out_dim, in_dim, r)
    tau = tol.rank_threshold(0.2, out_dim, in_dim, r)
    ta, tb = torch.from_numpy(A), torch.from_numpy(B)
    for E in (A @ np.swapaxes(B, 1, 2), (ta @ tb.transpose(1, 2)).numpy(),
              np.einsum("mor,mir->moi", A, B), (A / np.float32(0.2)) @ np.swapaxes(B, 1, 2) * np.float32(0.2)):
        s = np.linalg.svd(E.astype(np.float64), compute_uv=False)
        assert np.all(s[:, r:] <= tau), (s[:, r].max(), tau)
    gaussian = rng.standard_normal((32, out_dim, in_dim)) * 0.2
    assert np.linalg.svd(gaussian, compute_uv=False)[:, r].min() > 1e3 * tau


@pytest.mark.parametrize("r", [1, 2, 4, 8])
def test_entry_moments_are_eggrolls(r):
    """E x^2 = 1, E x^4 = 3 + 6/r (the kurtosis), and the higher ones, against a large Monte Carlo sample."""
    assert tol.entry_moment(1, r) == 1.0 and tol.entry_moment(2, r) == pytest.approx(3 + 6 / r)
    rng = np.random.default_rng(r)
    x = (rng.standard_normal((400_000, r)) * rng.standard_normal((400_000, r))).sum(1) / np.sqrt(r)
    for k, rel in ((1, 0.01), (2, 0.03), (3, 0.15)):
        assert np.mean(x ** (2 * k)) == pytest.approx(tol.entry_moment(k, r), rel=rel)


def test_entry_cdf_against_closed_forms():
    """r = 2: x = Laplace(1) / sqrt 2; r = 4: x = (sum of two Laplace(1)) / 2; errors below what it reports."""
    x = np.linspace(-8, 8, 4001)
    ax = np.abs(x)
    laplace = np.where(x >= 0, 1 - np.exp(-np.sqrt(2) * ax) / 2, np.exp(-np.sqrt(2) * ax) / 2)
    s = 2 * ax
    two = np.where(x >= 0, 1 - (2 + s) * np.exp(-s) / 4, (2 + s) * np.exp(-s) / 4)
    for r, closed in ((2, laplace), (4, two)):
        cdf, err = tol.entry_cdf(x, r)
        assert np.max(np.abs(cdf - closed)) <= max(err, 1e-12) and err < 1e-9


@pytest.mark.parametrize("r", [1, 3, 16])
def test_entry_cdf_is_the_distribution_of_a_b_t_entries(r):
    """Odd and large r: a sample of entries of A B^T / sigma passes the exact KS test against entry_cdf, and a
    Gaussian sample of the same size fails it (r = 1, 3) -- the test is not vacuous.

    n = 50,000: the critical distance at 1e-6 is 0.012, while the Gaussian lies 0.108 (r = 1) and 0.043 (r = 3)
    from entry_cdf (sup over a grid of 24,001 points in [-6, 6]), so a Gaussian sample passes with probability
    below 2 exp(-2 n 0.031^2) < 1e-40 (Dvoretzky-Kiefer-Wolfowitz): the power is still 1, at a quarter of the cost."""
    from scipy import stats

    rng = np.random.default_rng(100 + r)
    n = 50_000
    x = (rng.standard_normal((n, r)) * rng.standard_normal((n, r))).sum(1) / np.sqrt(r)
    crit = tol.ks_critical(n, 1e-6)
    assert stats.kstest(x, lambda v: tol.entry_cdf(v, r)[0]).statistic < crit
    if r < 16:
        assert stats.kstest(rng.standard_normal(n), lambda v: tol.entry_cdf(v, r)[0]).statistic > crit


@pytest.mark.parametrize("out_dim,in_dim", [(8, 4), (64, 64), (256, 256)])
def test_dense_bounds_hold_for_float32_evaluations(out_dim, in_dim):
    """x (W + E)^T and sum f E / N in float32 (materialised, split, einsum) within their bounds; E = fl32(A B^T)
    moves the exact estimate by no more than representation_bound; none of the bounds is vacuous."""
    from parity.mlp.noiseform import dense_of

    rng = np.random.default_rng(out_dim * 11 + in_dim)
    m, n, r = 6, 64, 4
    W = (rng.standard_normal((out_dim, in_dim)) / np.sqrt(in_dim)).astype(np.float32)
    A, B = _factors(rng, n, out_dim, in_dim, r)
    E = dense_of(A, B)
    x = rng.standard_normal((m, 3, in_dim)).astype(np.float32)
    exact, bound = tol.dense_linear_exact(W, E[:m], x), tol.dense_linear_bound(W, E[:m], x)
    tx, tw, te = (torch.from_numpy(t) for t in (x, W, E[:m]))
    for got in ((tx @ (tw + te).transpose(1, 2)).numpy(), (tx @ tw.T + tx @ te.transpose(1, 2)).numpy(),
                np.einsum("mbi,moi->mbo", x, W[None] + E[:m])):
        assert np.all(np.abs(got - exact) <= bound)
    assert np.max(bound) < 1e-3 * np.max(np.abs(exact))
    f = rng.standard_normal(n).astype(np.float32)
    g_exact = np.tensordot(f.astype(np.float64), E.astype(np.float64), axes=1) / n
    g_bound = tol.dense_grad_bound(f, E)
    for got in (np.einsum("n,nij->ij", f, E) / np.float32(n), (torch.from_numpy(f) @ torch.from_numpy(E).reshape(n, -1))
                .reshape(out_dim, in_dim).numpy() / np.float32(n)):
        assert np.all(np.abs(got - g_exact) <= g_bound)
    product = np.tensordot(f.astype(np.float64), A.astype(np.float64) @ np.swapaxes(B, 1, 2).astype(np.float64), 1) / n
    assert np.all(np.abs(g_exact - product) <= tol.representation_bound(f, A, B))
    assert np.max(tol.representation_bound(f, A, B)) < 1e-5 * np.max(np.abs(product))


def test_entry_ks_is_the_exact_distance():
    """entry_ks against scipy's KS statistic with the same CDF."""
    from scipy import stats

    x = np.random.default_rng(9).standard_normal(5000)
    distance, err = tol.entry_ks(x, 4)
    assert distance == pytest.approx(stats.kstest(x, lambda v: tol.entry_cdf(v, 4)[0]).statistic, abs=1e-12)
    assert err < 1e-9
