"""The parity suite's diagnosis: from observations (mirror maps, schedules, candidate matches) to the knob."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from parity.core import diagnose
from torch_impl.fitness import shape_fitness


def _fingerprints(layout: str, n: int, seed: int) -> np.ndarray:
    """Per-member fingerprints of an antithetic layout: a member's mirror holds the exact negation."""
    rng = np.random.default_rng(seed)
    draws = rng.standard_normal((n, 12))
    idx = np.arange(n)
    if layout == "interleaved":
        return draws[idx // 2] * np.where(idx % 2 == 0, 1.0, -1.0)[:, None]
    if layout == "halves":
        return draws[idx % (n // 2)] * np.where(idx < n // 2, 1.0, -1.0)[:, None]
    return draws


@pytest.mark.parametrize("n", [8, 128])
@pytest.mark.parametrize("layout", ["interleaved", "halves", "off"])
def test_mirror_map_recovers_the_layout(layout, n):
    mirror = diagnose.mirror_map(_fingerprints(layout, n, n))
    assert diagnose.layout_name(mirror) == layout


def test_pairing_cause_names_members_and_knob():
    n = 2048
    ref = diagnose.mirror_map(_fingerprints("interleaved", n, 1))
    port = diagnose.mirror_map(_fingerprints("halves", n, 1))
    found = diagnose.pairing_cause(port, ref)
    assert found.knob == "antithetic"
    assert "member 0 is the mirror of member 1024, not of member 1" in found.text
    assert diagnose.pairing_cause(ref, ref) is None
    off = diagnose.pairing_cause(diagnose.mirror_map(_fingerprints("off", 16, 2)), ref[:16])
    assert off.knob == "antithetic" and "no antithetic pairs" in off.text


EPOCHS = (0, 1, 2, 3, 4, 5, 7, 8, 16, 100, 1000, 1_000_000)


@pytest.mark.parametrize("k", [1, 3, 1000])
def test_describe_schedule_infers_noise_reuse(k):
    groups = diagnose.partition([str(e // k).encode() for e in EPOCHS])
    assert f"noise_reuse={k}" in diagnose.describe_schedule(EPOCHS, groups)
    assert "noise_reuse=0" in diagnose.describe_schedule(EPOCHS, [0] * len(EPOCHS))


def test_schedule_cause_separates_weights_from_biases():
    same, fresh = [0] * len(EPOCHS), list(range(len(EPOCHS)))
    weights_differ = diagnose.schedule_cause(EPOCHS, fresh, same, fresh, same)
    assert [c.knob for c in weights_differ] == ["noise_reuse"]
    bias_only = diagnose.schedule_cause(EPOCHS, same, same, fresh, same)
    assert [c.knob for c in bias_only] == ["bias_noise"] and "fresh" in bias_only[0].text
    assert diagnose.schedule_cause(EPOCHS, same, same, same, same) == []


@pytest.mark.parametrize("method,n,group", [(m, n, g) for m in ("jax", "std", "std_unbiased", "rank")
                                             for n, g in ((16, 0), (256, 0), (64, 8)) if not (m == "rank" and g)])
def test_fitness_candidates_reproduce_torch_shapings(method, n, group):
    """The diagnosis' float64 candidates are the knob's shapings (so a match names the right value)."""
    rng = np.random.default_rng(n)
    f = rng.integers(8, 60, size=n).astype(np.float32)          # ties, like CartPole returns
    got = shape_fitness(torch.from_numpy(f), method, group).numpy()
    cand = diagnose.FITNESS_CANDIDATES[method][1](f.astype(np.float64), group)
    np.testing.assert_allclose(got, cand, rtol=1e-5, atol=1e-6)


def test_fitness_cause_names_the_full_match():
    found = diagnose.fitness_cause({"jax": 2, "std": 9, "rank": 0}, 9, 9, 3, "tiny spread")
    assert found.knob == "fitness" and "as fitness=std" in found.text
    unknown = diagnose.fitness_cause({"jax": 2, "std": 4, "rank": 0}, 9, 9, 7, "x")
    assert unknown.knob == "fitness" and "none of the known" in unknown.text


@pytest.mark.parametrize("d", [0.9995, 0.9, 1.0])
def test_decay_estimate_recovers_the_factor(d):
    ratios = {e: (d / 1.0) ** e for e in range(5)}
    assert diagnose.decay_estimate(ratios, 1.0) == pytest.approx(d, rel=1e-12)
    found = diagnose.lr_schedule_cause(ratios, 1.0)
    assert found.knob == "lr_decay"


def test_sigma_schedule_cause_reports_the_fitted_decay():
    found = diagnose.sigma_schedule_cause(2, (0.99 / 0.999) ** 2, 0.999)
    assert found.knob == "sigma_decay" and "sigma_decay=0.99" in found.text


def test_gradient_cause_tells_over_sigma_from_other_scales():
    over = diagnose.gradient_cause("0.bias", 5.0, 1.0, 10.0, 0.2, 0.1)
    assert over.knob == "bias_grad"
    const = diagnose.gradient_cause("0.bias", 3.0, 1.0, 3.0, 0.2, 0.1)
    assert const.knob is None and "3x" in const.text
    flipped = diagnose.gradient_cause("1.weight", 1.0, -1.0, None, 0.2, None)
    assert flipped.knob is None and "opposite" in flipped.text


@pytest.mark.parametrize("ratio, named", [(16.0, "a factor N at N=16"), (1 / 16, "a factor 1/N at N=16"),
                                          (4.0, "a factor sqrt(N) at N=16"), (0.05, "a factor sigma at sigma=0.05"),
                                          (math.sqrt(3), "a factor sqrt(r) at r=3"), (2.0, "a factor 2 (same")])
def test_gradient_cause_names_a_scale_in_sigma_n_and_r(ratio, named):
    """Given pop and rank, a pure scale is named with parity.core.optscale's vocabulary (1/sigma keeps its own words:
    its knob for a bias); without them only 1/sigma is, as the CartPole suite asks."""
    found = diagnose.gradient_cause("w (mm)", ratio * (1 + 2e-4), 1.0, None, 0.05, None, 16, 3)
    assert found.knob is None and named in found.text, found.text
    assert ", a factor" not in diagnose.gradient_cause("w (mm)", ratio, 1.0, None, 0.05, None).text
    assert ", a factor" not in diagnose.gradient_cause("w (mm)", ratio * 1.01, 1.0, None, 0.05, None, 16, 3).text


def test_gradient_cause_joins_scales_that_tie():
    assert "a factor sqrt(r) = 2 at r=4" in diagnose.gradient_cause("w (mm)", 2.0, 1.0, None, 0.05, None, 16, 4).text


def test_init_cause_recognises_torch_default():
    found = diagnose.init_cause(1 / 3, 1.8, False, True)
    assert found.knob == "init" and "nn.Linear" in found.text


def test_follows_keeps_the_knob():
    upstream = (diagnose.cause("activation", "x"),)
    (found,) = diagnose.follows("products", upstream)
    assert found.knob == "activation" and found.text.startswith("follows from the products check")


# ----------------------------------------------------------------------------- bias noise in the knob table's words
def test_a_zero_bias_gradient_is_named_bias_noise_off():
    found = diagnose.gradient_cause("1.bias", 0.0, 0.0, 0.0, 0.2, 0.1)
    assert found.knob == "bias_noise" and "bias_noise=off" in found.text and "cosine" not in found.text
    weight = diagnose.gradient_cause("1.weight", 0.0, 0.0, 0.0, 0.2, 0.1)
    assert weight.knob is None and "is zero" in weight.text


@pytest.mark.parametrize("update_only", [False, True])
def test_fresh_bias_noise_is_named_update_only_when_the_forward_leaves_it_out(update_only):
    epochs = [0, 1, 2, 3]
    found = diagnose.schedule_cause(epochs, [0, 0, 0, 0], [0, 0, 0, 0], [0, 1, 2, 3], [0, 0, 0, 0], update_only)
    assert [c.knob for c in found] == ["bias_noise"]
    assert (diagnose.UPDATE_ONLY in found[0].text) == update_only and "fresh bias noise" in found[0].text
    assert diagnose.names_update_only(found) == update_only


def test_a_forward_without_bias_noise_is_off_or_update_only_by_the_ports_own_noise():
    from parity.mlp.checks.products import Forward, _forward_causes

    f = Forward("perturbed", 9.0, 9.0, 0.1, True, ("pqn", False), 1.0)
    assert "bias_noise=off" in _forward_causes(f, "pqn", own_bias_noise=False)[0].text
    assert diagnose.UPDATE_ONLY in _forward_causes(f, "pqn", own_bias_noise=True)[0].text
