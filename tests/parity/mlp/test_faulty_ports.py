"""Individual checks against hand-made faulty ports (faults no knob produces, as a foreign port might have)."""
from __future__ import annotations

import numpy as np
import pytest

from parity.mlp.adapter import CheckedPort
from parity.mlp.checks.gradients import _objective_values
from parity.mlp.reference import ReferencePort
from parity.mlp.sizes import SELFTEST
from parity.mlp.suite import Context, run_check


def _run(port, check: str, seed: int = 0):
    reference = ReferencePort(SELFTEST.cfg)
    ctx = Context(CheckedPort(port), CheckedPort(reference), reference, SELFTEST, seed)
    return run_check(check, ctx)


class OneKeyForAllLeaves(ReferencePort):
    """Draws every leaf from one stream per pair: the leaves share their first numbers."""

    jax_compatible_rng = False

    def noise(self, shapes, seed, epoch, members, pop, sigma, rank):
        out = {}
        for name, shape in shapes.items():
            rows = []
            for m in members:
                z = np.random.default_rng([seed, m // 2]).standard_normal(4096).astype(np.float32)
                sign = np.float32(1 if m % 2 == 0 else -1)
                if len(shape) == 2:
                    o, i = shape
                    zz = z[:(i + o) * rank].reshape(i + o, rank)
                    rows.append((zz[i:] * (sign * np.float32(sigma / np.sqrt(rank))), zz[:i]))
                else:
                    rows.append(z[:shape[0]] * (sign * np.float32(sigma)))
            out[name] = (tuple(np.stack(x) for x in zip(*rows)) if len(shape) == 2 else np.stack(rows))
        return out


class NoSqrtRank(ReferencePort):
    def noise(self, shapes, seed, epoch, members, pop, sigma, rank):
        out = super().noise(shapes, seed, epoch, members, pop, sigma, rank)
        return {k: ((v[0] * np.float32(np.sqrt(rank)), v[1]) if isinstance(v, tuple) else v) for k, v in out.items()}


class BiasSeedPerPairAndEpoch(ReferencePort):
    """Bias noise seeded like the published OOP port's: seed + 10000 * leaf + epoch + pair (reused an epoch later)."""

    jax_compatible_rng = False

    def noise(self, shapes, seed, epoch, members, pop, sigma, rank):
        out = super().noise(shapes, seed, epoch, members, pop, sigma, rank)
        for leaf, (name, shape) in enumerate(shapes.items()):
            if len(shape) == 1:
                out[name] = np.stack([
                    np.random.default_rng(seed + 10000 * leaf + epoch + int(m) // 2).standard_normal(shape[0])
                    .astype(np.float32) * np.float32(sigma if m % 2 == 0 else -sigma) for m in members])
        return out


def test_leaves_sharing_one_key_are_found():
    result = _run(OneKeyForAllLeaves(SELFTEST.cfg), "noise")
    assert result.verdict == "fail" and "rng" in result.knobs
    assert "draw the same first" in result.cause_text


def test_missing_sqrt_rank_is_a_scaling_failure():
    result = _run(NoSqrtRank(SELFTEST.cfg), "noise")
    assert result.verdict == "fail"
    assert "sigma/sqrt(r)" in result.cause_text


def test_bias_seeds_reused_across_epochs_are_found():
    result = _run(BiasSeedPerPairAndEpoch(SELFTEST.cfg), "noise")
    assert result.verdict == "fail" and result.knobs == ("bias_noise",)
    rows = {r.quantity: r for r in result.rows}
    assert rows["bias draws reused across epochs with different noise"].verdict == "fail"
    assert "equals member" in result.cause_text


def test_the_reference_itself_passes_the_noise_check():
    assert _run(ReferencePort(SELFTEST.cfg), "noise", seed=3).verdict == "pass"


@pytest.mark.parametrize("kind", ["linear", "quadratic"])
def test_synthetic_objectives_equal_the_formed_perturbation(kind):
    rng = np.random.default_rng(1)
    noise = {"0.weight": (rng.standard_normal((5, 6, 3)).astype(np.float32),
                          rng.standard_normal((5, 4, 3)).astype(np.float32)),
             "0.bias": rng.standard_normal((5, 6)).astype(np.float32)}
    target = {"0.weight": rng.standard_normal((6, 4)), "0.bias": rng.standard_normal(6)}
    delta = noise["0.weight"][0].astype(np.float64) @ np.swapaxes(noise["0.weight"][1].astype(np.float64), 1, 2)
    eps = noise["0.bias"].astype(np.float64)
    if kind == "linear":
        want = (delta * target["0.weight"]).sum((1, 2)) + (eps * target["0.bias"]).sum(1)
    else:
        want = -((target["0.weight"] + delta) ** 2).sum((1, 2)) - ((target["0.bias"] + eps) ** 2).sum(1)
    np.testing.assert_allclose(_objective_values(kind, noise, target, ["0.bias", "0.weight"]), want, rtol=1e-5)


class RejectsNonfinite(ReferencePort):
    """The reference's shaping, plus the validation the built-in trainers have: NaN/inf raise."""

    def shape_fitness(self, f, group_size=0):
        if not np.all(np.isfinite(f)):
            raise ValueError("fitness must be finite")
        return super().shape_fitness(f, group_size)


def _nonfinite_rows(result) -> dict:
    return {(r.quantity, r.side): r for r in result.rows if "fitness rejected" in r.quantity}


@pytest.mark.parametrize("seed", [0, 5])
def test_a_port_that_accepts_nonfinite_fitness_gets_a_warning_not_a_failure(seed):
    result = _run(ReferencePort(SELFTEST.cfg), "fitness", seed)    # accepts NaN/inf, as upstream EggRoll does
    assert result.verdict == "pass"
    rows = _nonfinite_rows(result)
    assert {q for q, _ in rows} == {"NaN fitness rejected", "+inf fitness rejected", "-inf fitness rejected"}
    for (quantity, side), row in rows.items():
        assert row.verdict == "info" and row.value == 0.0, (quantity, side)
        assert ("warning" in row.tolerance and "advice" in row.tolerance) == (side == "port")
    assert "warning: the port accepts non-finite fitness" in result.section


@pytest.mark.parametrize("seed", [0, 5])
def test_a_port_that_rejects_nonfinite_fitness_still_passes(seed):
    result = _run(RejectsNonfinite(SELFTEST.cfg), "fitness", seed)
    assert result.verdict == "pass" and "warning" not in result.section
    for (quantity, side), row in _nonfinite_rows(result).items():
        assert row.verdict == "info" and row.value == (1.0 if side == "port" else 0.0), (quantity, side)
    assert "reference says `None`" in result.section
