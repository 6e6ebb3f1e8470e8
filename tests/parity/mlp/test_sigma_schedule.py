"""The sigma schedule over many epochs (parity.mlp.sigma_schedule): a 0.999 decay is resolved with fresh draws.

The epoch counts in Sizes are the least that resolve it; the slope test's false-alarm rate and power are checked
by simulation of the log mean squares it reads; through the suite, a drifted sigma_decay is caught and named at two
sizes whether the port keeps its draws (exact) or draws afresh every epoch (the t test), and the faithful sides
(torch_impl, the numpy port, dense or not) are never flagged. Each suite run draws a fresh seed (in the messages).
"""
from __future__ import annotations

import dataclasses
import math
import sys
from pathlib import Path

import numpy as np
import pytest
from scipy import stats

ROOT = Path(__file__).resolve().parents[3]
if str(ROOT) not in sys.path:        # tests.ports imports from the repository root
    sys.path.insert(0, str(ROOT))

from parity.mlp import sigma_schedule as ss  # noqa: E402
from parity.mlp.checks.trajectory import statistical_alpha as trajectory_alpha  # noqa: E402
from parity.mlp.sizes import FULL, QUICK, SELFTEST  # noqa: E402
from parity.mlp.suite import run_suite
from parity.mlp.torch_side import TorchPort, one_thread  # noqa: E402
from spec.config import Config  # noqa: E402
from spec.knobs import Knobs  # noqa: E402
from tests.ports.numpy_port import Drift, NumpyPort  # noqa: E402

WIDE = dataclasses.replace(SELFTEST, name="selftest-wide", cfg=Config(pop=48, hidden=16, layers=2), noise_pop=96,
                           grad_pops=(48,), synthetic_pops=(48,), traj_epochs=3, traj_max_steps=120, sigma_epochs=100)
SIZES = {"selftest": SELFTEST, "wide": WIDE}


@pytest.fixture
def seed() -> int:
    """A fresh run seed per test (printed on failure through the assertion messages)."""
    return int(np.random.default_rng().integers(0, 1_000_000))


# ----------------------------------------------------------------------------- the epochs and the test itself
@pytest.mark.parametrize("sizes", [QUICK, SELFTEST, FULL, WIDE], ids=lambda s: s.name)
def test_sizes_hold_the_least_epochs_that_resolve_a_0999_decay(sizes):
    cfg = sizes.cfg
    n = ss.effective_entries(cfg.pop, cfg.sizes, cfg.rank)
    alpha = trajectory_alpha(sizes.traj_epochs)
    k = sizes.sigma_epochs
    assert ss.slope_power(k, n, alpha) >= ss.POWER > ss.slope_power(k - 1, n, alpha), (sizes.name, k)
    assert ss.epochs_needed(n, alpha) == k


def _null_series(rng, runs: int, epochs: int, n: int, decay_ratio: float = 1.0) -> np.ndarray:
    """(runs, epochs) of y_e = log(mean of n squared normals) + 2 e log(decay_ratio): what the reading sees of a
    port with fresh draws whose decay is decay_ratio x the reference's."""
    y = np.log(rng.chisquare(n, size=(runs, epochs)) / n)
    return y + 2 * np.arange(epochs) * math.log(decay_ratio)


def _rejects(rng, runs: int, epochs: int, n: int, alpha: float, decay_ratio: float = 1.0) -> int:
    series = _null_series(rng, runs, epochs, n, decay_ratio)
    draws = [tuple(ss.Draw(e, float(y), e, math.nan) for e, y in enumerate(row)) for row in series]
    return sum(not ss.read(d, alpha).trend.ok for d in draws)


def test_the_slope_test_keeps_its_false_alarm_rate():
    """At alpha 0.05 (so that the rate is measurable) over log chi-square series of the selftest's n: the rejection
    count of 4000 faithful series lies in the binomial's two-sided 1e-6 interval."""
    rng = np.random.default_rng()
    n, runs, alpha = 1152, 4000, 0.05
    lo, hi = stats.binom.ppf(5e-7, runs, alpha), stats.binom.isf(5e-7, runs, alpha)
    for epochs in (6, 30):
        assert lo <= _rejects(rng, runs, epochs, n, alpha) <= hi, epochs


@pytest.mark.parametrize("sizes", [QUICK, SELFTEST], ids=lambda s: s.name)
def test_the_derived_epochs_resolve_a_0999_decay(sizes):
    """Simulated ports with a constant sigma (1/0.999 x the reference's decay) at the size's n, alpha and epochs:
    misses are within what 1 - POWER allows (binomial, 1e-6), and the power of one epoch fewer is below POWER."""
    rng = np.random.default_rng()
    cfg = sizes.cfg
    n, alpha, k, runs = ss.effective_entries(cfg.pop, cfg.sizes, cfg.rank), trajectory_alpha(sizes.traj_epochs), \
        sizes.sigma_epochs, 2000
    missed = runs - _rejects(rng, runs, k, n, alpha, 1 / 0.999)
    assert missed <= stats.binom.isf(1e-6, runs, 1 - ss.POWER), (sizes.name, missed)


def test_repeated_draws_are_read_exactly():
    """The same draws at the reference's sigma_e pass within 8u; at a constant sigma they give 1/0.999 per epoch."""
    rng = np.random.default_rng()
    z = rng.standard_normal((8, 16, 4)).astype(np.float32)
    b = rng.standard_normal((8, 12, 4)).astype(np.float32)

    class Ref:
        @staticmethod
        def sigma_at(e):
            return float(np.float32(0.2 * 0.999 ** e))

    class Port:      # es_ask: the same draws every epoch at sigma_at(e); es_tell does nothing
        def __init__(self, decay):
            self.decay = decay

        def es_init(self, params, seed):
            return None

        def es_ask(self, state, e, shapes, pop, rank):
            s = np.float32(np.float32(0.2 * self.decay ** e) / np.sqrt(np.float32(4)))
            return {"0.weight": (z * s, b)}

        def es_tell(self, state, noise, fitness, e):
            return state

    fitness = np.zeros((10, 8), np.float32)
    faithful = ss.read(ss.collect(Port(0.999), Ref, {}, 0, {}, 8, 4, fitness), 1e-4)
    constant = ss.read(ss.collect(Port(1.0), Ref, {}, 0, {}, 8, 4, fitness), 1e-4)
    assert faithful.epochs == 2 and faithful.trend is None and faithful.exact.ok, faithful
    assert not constant.exact.ok and abs(constant.exact.decay_ratio * 0.999 - 1) < 1e-6, constant


# ----------------------------------------------------------------------------- through the suite
def _trajectory(port, sizes, seed):
    with one_thread():
        return run_suite(port, sizes, seed, checks=("trajectory",))[0]


def _schedule_rows(traj):
    return [r for r in traj.rows if r.quantity.startswith("sigma schedule:")]


PORTS = {   # name -> (port for a cfg, whether its draws are fresh every epoch)
    "torch": (lambda cfg, decay: TorchPort(cfg, Knobs(sigma_decay=decay)), False),
    "torch fresh": (lambda cfg, decay: TorchPort(cfg, Knobs(noise_reuse=1, sigma_decay=decay)), True),
    "numpy fresh": (lambda cfg, decay: NumpyPort(cfg, Drift(rng="numpy", noise_reuse=1, sigma_decay=decay)), True),
    "numpy dense fresh": (lambda cfg, decay: NumpyPort(cfg, Drift(rng="numpy", dense="product", noise_reuse=1,
                                                                  sigma_decay=decay)), True),
}
DRIFTED = [(p, d, s) for p in PORTS for d in (1.0, 0.99) for s in SIZES if not (d == 0.99 and "numpy" in p)]


@pytest.mark.slow
@pytest.mark.parametrize("port, decay, size", DRIFTED)
def test_a_drifted_sigma_decay_is_caught_and_named_by_the_schedule(port, decay, size, seed):
    make, fresh = PORTS[port]
    traj = _trajectory(make(SIZES[size].cfg, decay), SIZES[size], seed)
    rows = _schedule_rows(traj)
    assert any(r.verdict == "fail" for r in rows), (seed, rows)
    assert "sigma_decay" in traj.knobs, (seed, traj.cause_text)
    kind = "t of the slope" if fresh else "repeated draws"
    assert all(kind in r.quantity for r in rows), (seed, rows)
    cause = next(c for c in traj.causes if c.knob == "sigma_decay").text
    assert "the reference uses 0.999" in cause, cause


@pytest.mark.slow
@pytest.mark.parametrize("port, size", [(p, s) for p in PORTS for s in SIZES])
def test_the_faithful_schedule_is_never_flagged(port, size, seed):
    """The reference's own decay (the preset's 0.999), with draws kept or fresh: every schedule row passes."""
    make, fresh = PORTS[port]
    traj = _trajectory(make(SIZES[size].cfg, 0.999), SIZES[size], seed)
    rows = _schedule_rows(traj)
    assert rows and all(r.verdict == "pass" for r in rows), (seed, rows)
    assert "sigma_decay" not in traj.knobs, (seed, traj.cause_text)
    if not fresh:
        assert traj.verdict == "pass", (seed, [r for r in traj.rows if r.verdict == "fail"])


def _log_ms_variance(rng, pop: int, sizes: list[int], rank: int, dense: bool, reps: int) -> float:
    """Var of the log mean square the reading sees per epoch: of the A entries, or of a dense port's E = A B^T."""
    ys = []
    for _ in range(reps):
        parts = []
        for n_in, n_out in zip(sizes[:-1], sizes[1:]):
            a = rng.standard_normal((pop // 2, n_out, rank))
            b = rng.standard_normal((pop // 2, n_in, rank))
            parts.append((np.einsum("mor,mir->moi", a, b) / math.sqrt(rank)).ravel() if dense else a.ravel())
        x = np.concatenate(parts)
        ys.append(math.log(np.mean(x * x)))
    return float(np.var(ys, ddof=1))


@pytest.mark.parametrize("cfg, reps", [(SELFTEST.cfg, 4000), (WIDE.cfg, 4000), (QUICK.cfg, 600)],
                         ids=["selftest", "wide", "quick"])
def test_dense_noise_varies_less_than_the_epochs_allow(cfg, reps):
    """The epochs are derived for n / DENSE_VARIANCE entries: a dense port's log mean square must vary less than
    DENSE_VARIANCE times as much as the factors' (the ratio's sampling error is about sqrt(2 / reps) per variance, so
    the bound is met by a few standard errors)."""
    rng = np.random.default_rng()
    factors = _log_ms_variance(rng, cfg.pop, cfg.sizes, cfg.rank, False, reps)
    dense = _log_ms_variance(rng, cfg.pop, cfg.sizes, cfg.rank, True, reps)
    assert 1.0 < dense / factors < ss.DENSE_VARIANCE, dense / factors
