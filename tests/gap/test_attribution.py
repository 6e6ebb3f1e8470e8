"""Arms, their names, and the attribution ladder built from a profile."""
import math

import numpy as np
import pytest

from gap import attribution as attr
from gap import stats
from gap.arms import Arm, dedupe, jax_arm, profile_arm, torch_name
from gap.drifts import drift_order
from spec.knobs import KNOB_NAMES, PROFILE_DRIFTS, KnobError, Knobs, RunSettings, drifts, profile


def _diff(k1: Knobs, k2: Knobs) -> list[str]:
    return [n for n in KNOB_NAMES if getattr(k1, n) != getattr(k2, n)]


@pytest.mark.parametrize("name", ["oop-port", "functional-port", "jax-torchrng"])
def test_ladder_switches_one_drift_back_per_rung(name):
    rungs = attr.ladder(name)
    order = drift_order(name)
    assert order == [k for k in PROFILE_DRIFTS[name]]                   # the profile's own order
    assert len(rungs) == len(order) + 1
    assert rungs[0].arm.knobs == profile(name) and rungs[0].switched is None
    assert rungs[-1].arm.knobs == Knobs() and rungs[-1].arm.name == "torch:jax"
    for prev, rung, knob in zip(rungs, rungs[1:], order):
        assert rung.switched == knob and _diff(prev.arm.knobs, rung.arm.knobs) == [knob]
        assert getattr(rung.arm.knobs, knob) == getattr(Knobs(), knob)
        # cumulative: rung k still carries exactly the drifts not yet switched back
        assert sorted(drifts(rung.arm.knobs)) == sorted(order[rung.index:])


def test_oop_port_rungs_and_singles_by_name():
    names = [r.arm.name for r in attr.ladder("oop-port")]
    assert names == [
        "torch:oop-port",
        "torch:oop-port-rng",
        "torch:oop-port-rng-activation",
        "torch:oop-port-rng-activation-init",
        "torch:jax+fitness=std+bias_grad=over_sigma+lr_decay=0.9995",
        "torch:jax+fitness=std+lr_decay=0.9995",
        "torch:jax+lr_decay=0.9995",
        "torch:jax",
    ]
    singles = attr.singles("oop-port")
    assert [k for k, _ in singles] == list(PROFILE_DRIFTS["oop-port"])
    for knob, arm in singles:
        assert arm.side == "torch" and _diff(arm.knobs, Knobs()) == [knob]
        assert getattr(arm.knobs, knob) == PROFILE_DRIFTS["oop-port"][knob]
    assert dict(singles)["rng"].name == "torch:jax-torchrng"       # the named profile wins
    assert dict(singles)["activation"].name == "torch:jax+activation=tanh"


def test_study_arms_are_deduplicated():
    st = attr.study("oop-port")
    assert [a.name for a in st.main_arms] == ["jax_reference", "torch:jax", "torch:oop-port"]
    assert st.reference.side == "jax" and st.reference.knobs == RunSettings()
    extra = st.attribution_arms
    names = [a.name for a in extra]
    assert len(names) == len(set(names))
    # 6 inner rungs + 7 singles, minus the last inner rung that is also the lr_decay single = 12
    assert len(extra) == 12 and "torch:jax+lr_decay=0.9995" in names
    assert not set(names) & {a.name for a in st.main_arms}
    assert attr.study("oop-port", design="none").attribution_arms == []


def test_names_are_a_function_of_the_knobs():
    k = Knobs(activation="relu", noise_reuse=3)
    assert torch_name(k) == "torch:jax+noise_reuse=3+activation=relu"
    assert torch_name(profile("functional-port")) == "torch:functional-port"
    assert profile_arm("torch:oop-port").knobs == profile("oop-port")
    assert profile_arm("jax_reference") == jax_arm()
    with pytest.raises(KnobError, match="unknown arm"):
        profile_arm("torch:nope")
    tf32 = profile_arm("torch:oop-port+matmul_precision=high")          # a profile with departures, named canonically
    assert tf32.knobs == profile("oop-port").replace(matmul_precision="high")
    assert tf32.name == "torch:oop-port+matmul_precision=high"
    assert profile_arm("torch:functional-port+matmul_precision=high").config == (("layers", 2),)
    with pytest.raises(KnobError, match="unknown knob 'bogus'"):
        profile_arm("torch:jax+bogus=1")
    with pytest.raises(KnobError, match="unknown profile"):
        attr.ladder("nope")
    with pytest.raises(ValueError, match="share the name"):
        dedupe([Arm("x", "torch", Knobs()), Arm("x", "torch", Knobs(activation="relu"))])


def _fake_samples(st, effect: dict[str, float], n: int, seed: int) -> dict[str, stats.Sample]:
    """Steps ~ lognormal(cv 0.05) times the product of each active drift's effect."""
    rng = np.random.default_rng(seed)
    out = {}
    for arm in st.main_arms + st.attribution_arms:
        factor = math.prod(effect.get(k, 1.0) for k in drifts(arm.knobs))
        out[arm.name] = stats.sample(2e6 * factor * rng.lognormal(0, 0.05, n))
    return out


def test_attribution_finds_the_drift_that_matters():
    st = attr.study("oop-port")
    samples = _fake_samples(st, {"activation": 1.5}, n=10, seed=1)
    steps = attr.attribute(st, samples, n_resamples=1000)
    assert [s.view for s in steps] == ["ladder"] * 7 + ["single"] * 7
    assert attr.verdict(steps, "activation") == "matters"
    act = [s for s in steps if s.knob == "activation"]
    assert all(1.35 < s.cmp.ratio < 1.65 for s in act)          # 1.5 within ~3 sd of cv 0.05 / sqrt(10)
    ladder = [s for s in steps if s.view == "ladder"]
    # step ratios telescope: log shares sum to 1 exactly
    assert sum(s.share for s in ladder) == pytest.approx(1.0, abs=1e-9)
    # the others: a false "matters" needs Holm p < 0.05 over 6 tests (family-wise rate <= 5% per view)
    others = [k for k in PROFILE_DRIFTS["oop-port"] if k != "activation"]
    assert sum(attr.verdict(steps, k) == "matters" for k in others) <= 1


def test_attribution_with_missing_arms():
    st = attr.study("oop-port")
    samples = _fake_samples(st, {}, n=4, seed=2)
    del samples["torch:oop-port-rng"]
    steps = attr.attribute(st, samples, n_resamples=200)
    missing = [s for s in steps if s.cmp is None]
    assert {s.with_drift for s in missing} | {s.without for s in missing} >= {"torch:oop-port-rng"}
    assert attr.verdict([s for s in steps if s.knob == "rng" and s.cmp is None], "rng") == "not run"
