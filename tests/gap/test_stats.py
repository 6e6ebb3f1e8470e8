"""Statistics of the gap study: known cases, censoring, and the published CartPole numbers."""
import itertools
import math
from pathlib import Path

import numpy as np
import pytest
from scipy import stats as sps

from gap import published, stats
from gap.stats import sample


def _lognormal(rng, mean, cv, n):
    """n draws with the given mean and coefficient of variation (lognormal: positive, skewed like step counts)."""
    s2 = math.log(1 + cv ** 2)
    return rng.lognormal(math.log(mean) - s2 / 2, math.sqrt(s2), n)


# ---------------------------------------------------------------- the published numbers
def test_published_reproduces_the_quoted_numbers():
    jax, torch = published.samples()
    assert (jax.n, torch.n) == (10, 10) and not jax.n_censored and not torch.n_censored
    assert round(jax.steps.mean()) == 15_495_267 and round(torch.steps.mean()) == 17_180_004
    c = stats.compare(jax, torch)
    assert round(c.ratio, 3) == 1.109
    # "about 1.03 to 1.20": the percentile bound's Monte Carlo error at 10,000 resamples is ~0.002.
    assert abs(c.ratio_lo - 1.03) < 0.01 and abs(c.ratio_hi - 1.20) < 0.01
    assert round(c.welch_p, 2) == 0.04
    assert round(c.mann_whitney_p, 2) == 0.06
    assert round(c.gehan_p, 2) == 0.06          # the same rank test without continuity correction
    assert c.p_improvement == pytest.approx(0.25)   # 25 of 100 torch/jax pairs have torch faster
    assert c.seeds_needed == 15 and 0.6 < c.power < 0.7


def test_published_copy_equals_the_shared_file():
    """The package's copy equals the project's shared data file (`../shared` beside the checkout, as in CI)."""
    path = Path(__file__).resolve().parents[3] / "shared" / "data" / "published_cartpole_steps.csv"
    if not path.exists():
        pytest.skip(f"no shared folder beside this checkout ({path})")
    assert path.read_text().strip() == published.CSV.strip()


# ---------------------------------------------------------------- effect size and its interval
@pytest.mark.parametrize("n,true_ratio", [(12, 1.3), (40, 0.9)])
def test_bootstrap_interval_covers_the_true_ratio(n, true_ratio):
    """Coverage over 150 fresh studies; percentile intervals under-cover a little at small n.

    Nominal 95%: the count of covering intervals is Binomial(150, ~0.93); >= 126 (84%) fails by chance
    with probability below 1e-4.
    """
    rng = np.random.default_rng(n)
    covered = 0
    for rep in range(150):
        a = sample(_lognormal(rng, 1e6, 0.15, n))
        b = sample(_lognormal(rng, 1e6 * true_ratio, 0.15, n))
        lo, hi = stats.bootstrap_ratio_ci(a, b, n_resamples=1000, seed=rep)
        covered += lo <= true_ratio <= hi
    assert covered >= 126


def test_bootstrap_is_deterministic_per_seed():
    rng = np.random.default_rng(3)
    a, b = sample(_lognormal(rng, 5e5, 0.2, 9)), sample(_lognormal(rng, 6e5, 0.2, 7))
    assert stats.bootstrap_ratio_ci(a, b, 500, seed=1) == stats.bootstrap_ratio_ci(a, b, 500, seed=1)
    assert stats.bootstrap_ratio_ci(a, b, 500, seed=1) != stats.bootstrap_ratio_ci(a, b, 500, seed=2)


@pytest.mark.parametrize("n", [8, 25])
def test_identical_distributions_rarely_flagged(n):
    """Under no difference each test's p < 0.05 in about 5% of 120 studies; > 15 hits (12.5%) has chance < 0.3%."""
    rng = np.random.default_rng(100 + n)
    hits = {"welch": 0, "mw": 0, "gehan": 0}
    ratios = []
    for _ in range(120):
        a, b = sample(_lognormal(rng, 2e6, 0.1, n)), sample(_lognormal(rng, 2e6, 0.1, n))
        hits["welch"] += stats.welch_p(a, b) < 0.05
        hits["mw"] += stats.mann_whitney_p(a, b) < 0.05
        hits["gehan"] += stats.gehan(a, b).p < 0.05
        ratios.append(stats.ratio_of_means(a, b))
    assert all(h <= 15 for h in hits.values()), hits
    # The mean ratio sits at 1 within 4 standard errors (sd of one ratio ~ 0.1 * sqrt(2/n)).
    assert abs(np.mean(ratios) - 1) < 4 * 0.1 * math.sqrt(2 / n) / math.sqrt(120)


def test_a_real_difference_is_found():
    rng = np.random.default_rng(7)
    a, b = sample(_lognormal(rng, 1e6, 0.05, 20)), sample(_lognormal(rng, 1.5e6, 0.05, 20))
    c = stats.compare(a, b, n_resamples=2000)
    assert c.ratio_lo > 1.3 and c.welch_p < 1e-6 and c.gehan_p < 1e-6 and c.p_improvement < 0.05


# ---------------------------------------------------------------- rank statistics and censoring
def test_gehan_equals_mann_whitney_without_censoring():
    rng = np.random.default_rng(11)
    for na, nb in [(6, 9), (15, 11)]:
        a, b = sample(rng.uniform(1e5, 2e5, na)), sample(rng.uniform(1.1e5, 2.2e5, nb))
        mw = sps.mannwhitneyu(b.steps, a.steps, method="asymptotic", use_continuity=False).pvalue
        assert stats.gehan(a, b).p == pytest.approx(mw, rel=1e-9)


def test_gehan_variance_is_the_exact_permutation_variance():
    """Mantel's variance equals the variance of W over every relabelling of the pooled runs (with censoring)."""
    rng = np.random.default_rng(5)
    steps = rng.integers(10, 30, 8).astype(float)       # integer steps: ties happen
    cens = rng.random(8) < 0.4
    cens[0], cens[1] = True, False
    na = 3
    ws = []
    for idx in itertools.combinations(range(8), na):
        mask = np.zeros(8, bool)
        mask[list(idx)] = True
        a, b = sample(steps[mask], cens[mask]), sample(steps[~mask], cens[~mask])
        ws.append(stats.gehan(a, b).w)
    g = stats.gehan(sample(steps[:na], cens[:na]), sample(steps[na:], cens[na:]))
    var = (g.w / g.z) ** 2 if g.z else 0.0
    assert np.mean(ws) == pytest.approx(0.0, abs=1e-9)
    assert var == pytest.approx(np.var(ws), rel=1e-9)


def test_order_matrix_follows_gehans_rule():
    a = sample([100.0, 300.0, 200.0], [False, False, True])   # the third stopped unsolved at 200
    b = sample([150.0, 200.0, 250.0], [False, False, True])
    m = stats.order_matrix(a, b)
    expected = np.array([
        [-1, -1, -1],   # 100 solved: below all of b (250 censored is > 250 > 100)
        [+1, +1, 0],    # 300 solved: above 150 and 200; vs censored 250 (> 250) unknown
        [+1, +1, 0],    # censored at 200 (> 200): above 150 and 200 solved; two censored: unknown
    ])
    np.testing.assert_array_equal(m, expected)


@pytest.mark.parametrize("na,nb", [(3, 4), (6, 6), (10, 7)])
def test_min_gehan_p_is_complete_separation(na, nb):
    rng = np.random.default_rng(na * nb)
    a = sample(rng.uniform(1e6, 2e6, na))
    b = sample(rng.uniform(3e6, 4e6, nb))         # every b above every a
    assert stats.gehan(a, b).p == pytest.approx(stats.min_gehan_p(na, nb), rel=1e-12)


def test_censored_runs_are_kept_and_bounded():
    rng = np.random.default_rng(21)
    budget = 3e6
    a = sample(_lognormal(rng, 1e6, 0.1, 8))
    b = sample(np.full(8, budget), np.ones(8, bool))   # nothing solved: every value is a bound
    c = stats.compare(a, b, n_resamples=500)
    assert c.ratio_kind == "lower bound" and c.censored_b == 8
    assert c.p_improvement == 0.0 and c.gehan_p < 0.001 and c.mann_whitney_p < 0.001
    assert stats.ratio_bound(b, a) == "upper bound" and stats.ratio_bound(b, b) == "no bound"
    # Some censored on each side, the rest solved below the budget: censored pairs count as ties.
    x = sample(np.r_[rng.uniform(1e6, 2e6, 5), [budget] * 3], [False] * 5 + [True] * 3)
    y = sample(np.r_[rng.uniform(1e6, 2e6, 6), [budget] * 2], [False] * 6 + [True] * 2)
    top = budget + 1
    mw = sps.mannwhitneyu(np.r_[y.steps[:6], [top] * 2], np.r_[x.steps[:5], [top] * 3]).pvalue
    assert stats.mann_whitney_p(x, y) == pytest.approx(mw)
    assert stats.gehan(x, y).p > 0.05     # same distribution: nothing to find (and deterministic here)


def test_prob_improvement_counts_pairs():
    rng = np.random.default_rng(2)
    a, b = sample(rng.uniform(1, 10, 13)), sample(rng.uniform(2, 12, 9))
    brute = np.mean([[float(y < x) + 0.5 * (y == x) for y in b.steps] for x in a.steps])
    assert stats.prob_improvement(a, b) == pytest.approx(brute)
    lo, hi = stats.bootstrap_prob_improvement_ci(a, b, n_resamples=1000)
    assert lo <= stats.prob_improvement(a, b) <= hi
    assert stats.prob_improvement(a, a) == pytest.approx(0.5)


# ---------------------------------------------------------------- summaries and power
def test_iqm_is_the_mean_of_the_middle_half():
    rng = np.random.default_rng(4)
    for n in (8, 20):
        x = rng.uniform(0, 1e6, n)
        assert stats.iqm(x) == pytest.approx(np.sort(x)[n // 4: n - n // 4].mean())


def test_holm_adjustment():
    p = np.array([0.01, 0.04, 0.03, np.nan, 0.005])
    np.testing.assert_allclose(stats.holm(p), [0.03, 0.06, 0.06, np.nan, 0.02])


@pytest.mark.parametrize("m", [1, 7, 40])
def test_holm_is_statsmodels_holm(m):
    """The same adjusted p values, bit for bit, as statsmodels' multipletests (ties, ones and tiny p included)."""
    from statsmodels.stats.multitest import multipletests

    rng = np.random.default_rng(1000 + m)
    p = rng.uniform(0, 1, m) ** rng.uniform(1, 8)
    if m > 1:
        p[rng.integers(0, m, 2)] = [p[0], 1.0]
    np.testing.assert_array_equal(stats.holm(p), multipletests(p, method="holm")[1])


def test_seeds_needed_and_power_agree():
    for cv in (0.05, 0.12, 0.3):
        n = stats.seeds_needed(cv)
        expected = 2 * (sps.norm.ppf(0.975) + sps.norm.ppf(0.8)) ** 2 * cv ** 2 / 0.01
        assert n == max(2, math.ceil(expected))
        assert stats.power_at(n, cv) >= 0.8 and (n == 2 or stats.power_at(n - 1, cv) < 0.8)
        assert stats.detectable_diff(n, cv) <= 0.1 + 1e-12


def test_power_matches_simulation():
    """Welch at the advertised seeds detects a true 10% difference ~80% of the time.

    400 studies: Binomial sd 0.02; the z approximation overstates the t-test's power by ~0.02 at n~15,
    so [0.70, 0.90] is a 4-sd window.
    """
    rng = np.random.default_rng(9)
    cv = 0.1
    n = stats.seeds_needed(cv)
    hits = sum(stats.welch_p(sample(rng.normal(1.0, cv, n) * 1e6), sample(rng.normal(1.1, cv, n) * 1e6)) < 0.05
               for _ in range(400))
    assert 0.70 <= hits / 400 <= 0.90


def test_bad_input_is_refused():
    with pytest.raises(ValueError, match="finite and > 0"):
        sample([1.0, np.nan])
    with pytest.raises(ValueError, match="one flag per run"):
        sample([1.0, 2.0], [True])
    with pytest.raises(ValueError, match="non-empty"):
        sample([])
    with pytest.raises(ValueError, match="rel_diff"):
        stats.seeds_needed(0.1, rel_diff=0)
