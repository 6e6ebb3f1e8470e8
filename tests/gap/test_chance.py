"""gap.chance against exact enumeration of every replication, at two small sizes."""
import itertools

import numpy as np
import pytest

from gap.chance import gap_chance


def _exact_means(steps, n, method):
    """{mean: probability} of a replication's mean of n seeds, by enumerating every equally likely draw."""
    steps = np.asarray(steps, np.float64)
    k = steps.size
    out: dict[float, float] = {}
    populations = ([tuple(range(k))] if method == "one_stage"
                   else list(itertools.product(range(k), repeat=k)))
    for pop in populations:
        for picks in itertools.product(range(len(pop)), repeat=n):
            m = float(np.mean([steps[pop[p]] for p in picks]))
            out[m] = out.get(m, 0.0) + 1.0 / (len(populations) * len(pop) ** n)
    return out


def _exact(base, arm, threshold, n, method):
    mb, ma = _exact_means(base, n, method), _exact_means(arm, n, method)
    return sum(pa * pb for a, pa in ma.items() for b, pb in mb.items() if a / b >= threshold)


@pytest.mark.parametrize("method", ["one_stage", "two_stage"])
@pytest.mark.parametrize("k,n", [(3, 2), (2, 4)])
def test_the_monte_carlo_probability_matches_exact_enumeration(method, k, n):
    rng = np.random.default_rng(k * 10 + n)
    base = rng.uniform(12e6, 20e6, k)
    arm = rng.uniform(12e6, 20e6, k) * 1.05
    threshold = float(np.median([a / b for a in arm for b in base]))
    exact = _exact(base, arm, threshold, n, method)
    c = gap_chance(base, arm, threshold, n=n, method=method, resamples=200_000, seed=1)
    assert abs(c.probability - exact) <= 4 * c.mc_se, (c, exact)


def test_constant_arms_give_certainty():
    base, arm = np.full(5, 10.0), np.full(5, 11.0)
    assert gap_chance(base, arm, 1.1, n=10, resamples=1000).probability == 1.0
    assert gap_chance(base, arm, 1.1000001, n=10, resamples=1000).probability == 0.0


def test_two_stage_adds_the_study_uncertainty():
    """The two-stage predictive is wider, so a tail gap is more likely under it than under the one-stage one."""
    rng = np.random.default_rng(3)
    base, arm = rng.lognormal(0, 0.1, 10), rng.lognormal(0, 0.1, 10)
    one = gap_chance(base, arm, 1.15, method="one_stage", resamples=100_000)
    two = gap_chance(base, arm, 1.15, method="two_stage", resamples=100_000)
    assert two.probability > one.probability + 4 * (one.mc_se + two.mc_se)


def test_bad_arguments_are_refused():
    with pytest.raises(ValueError, match="method must be one of"):
        gap_chance(np.ones(3), np.ones(3), 1.1, method="three_stage")
    with pytest.raises(ValueError, match="need n >= 1"):
        gap_chance(np.ones(3), np.ones(0), 1.1)
