"""The step's order of summation and in-place drift (issue 53, items 1 and 6): the updates bound
(parity.core.tolerances.step_bound) allows a step added once or member by member into the weights, so the faithful
ports that add it pair by pair or member by member pass the whole tree suite; a port that perturbs its weights in
place and restores them (float32) is named as such, in its step and in its forward; a step beyond the bound whose
best fit is the reference's own sgd is not called 'sgd, c = 1'."""
from __future__ import annotations

import re

import numpy as np
import pytest

from examples.gpt_adapter import GPTAdapter
from parity.core.tolerances import gamma, step_bound, update_bound
from parity.tree.base import IN_PLACE
from tests.ports import order_ports
from tests.parity.tree.test_check import ALL_CHECKS, SIZES, judged, knobs_named, rows_of


def fails(rows):
    return [r for r in rows if r.verdict == "fail"]


# ----------------------------------------------------------------------------- the bound itself
def sequential(p: np.ndarray, parts: np.ndarray) -> np.ndarray:
    """p + parts[0] + parts[1] + ... in float32, one add at a time (parts (K, *p.shape), already float32)."""
    out = p.copy()
    for c in parts:
        out = (out + c).astype(np.float32)
    return out


def test_the_step_bound_holds_for_member_by_member_adds_where_the_added_once_bound_does_not():
    """Weights near 1 and members' contributions of a few ulps of them, all of one sign (the worst case for
    rounding at the weights' size): N sequential float32 adds stay within step_bound, and exceed 2 update_bound (the
    added-once bound) on some entries."""
    rng = np.random.default_rng(0)
    N, s = 16, 0.08
    p = (1 + rng.random(4096) * 0.5).astype(np.float32)
    f = np.abs(rng.standard_normal(N)).astype(np.float32)
    E = (rng.random((N, 4096)) * 3e-6).astype(np.float32)              # |E_n|: a few ulps of |p| after s f / N
    parts = (np.float32(s) * (f[:, None] * E) / np.float32(N)).astype(np.float32)
    exact = p.astype(np.float64) + np.sum(s * f[:, None].astype(np.float64) * E / N, 0)
    got = sequential(p, parts)
    ref_step = np.sum(parts.astype(np.float64), 0)
    ref_new = (p + ref_step.astype(np.float32)).astype(np.float32)
    step_abs = s * np.mean(f[:, None] * E.astype(np.float64), 0)
    bound = step_bound(p, ref_new, ref_step, step_abs, N + 2, N)
    err = np.abs(got - exact)
    assert np.max(err / bound) <= 1
    assert np.max(err / (2 * update_bound(ref_new, ref_step))) > 1    # the added-once bound is too tight for this
    assert np.max(bound / (gamma(N) * np.abs(p) + 1e-300)) < 2          # and the bound stays at gamma_N |p|'s size


# ----------------------------------------------------------------------------- faithful orders pass
@pytest.mark.slow
@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("port", ["PerPairStep", "PerMemberStep"])
def test_a_port_adding_its_step_pair_by_pair_or_member_by_member_passes_at_ten_seeds(port, size):
    for seed in range(10):
        rows = rows_of(getattr(order_ports, port)(**SIZES[size]), seed)
        assert [(r.check, r.quantity, r.value) for r in fails(rows)] == [], seed
        assert judged(rows) == ALL_CHECKS
        steps = [r for r in rows if r.check in ("updates", "trajectory") and r.quantity.endswith("/ bound")]
        assert steps and all(0 <= r.value <= 1 for r in steps)


def test_the_zero_fitness_rows_pass_on_the_worked_example():
    rows = rows_of(GPTAdapter(**SIZES["small"]), 3)
    zero = [r for r in rows if "a step on zero fitness" in r.quantity]
    assert {r.check for r in zero} == {"updates", "trajectory"} and all(r.verdict == "pass" for r in zero)
    kept = [r for r in rows if r.quantity.startswith("the params given to population_forward")]
    assert len(kept) == 1 and kept[0].verdict == "pass"


# ----------------------------------------------------------------------------- in place, named
@pytest.mark.parametrize("size", SIZES)
def test_an_in_place_perturb_and_restore_is_named_with_the_leaf_and_the_entries_moved(size):
    rows = rows_of(order_ports.InPlaceRestore(**SIZES[size]), seed=2)
    bad = fails(rows)
    assert bad and IN_PLACE in bad[0].cause, [(r.check, r.cause) for r in bad[:3]]
    zero = [r for r in bad if "a step on zero fitness" in r.quantity]
    assert {r.check for r in zero} == {"updates", "trajectory"}
    for r in zero:
        assert IN_PLACE in r.cause and re.search(r"blocks\.[\w.]+ \((mm|tmm)\): \d+ of \d+ entries moved", r.cause)
        assert r.value > 0
    assert all(IN_PLACE in r.cause for r in bad if "/ bound" in r.quantity)     # a failing step says why
    assert knobs_named(rows) == set()


@pytest.mark.parametrize("size", SIZES)
def test_a_forward_that_perturbs_the_given_params_in_place_is_named(size):
    rows = rows_of(order_ports.InPlaceForward(**SIZES[size]), seed=1)
    kept = [r for r in rows if r.quantity.startswith("the params given to population_forward")]
    assert len(kept) == 1 and kept[0].verdict == "fail" and kept[0].value > 0
    assert IN_PLACE in kept[0].cause and "entries moved" in kept[0].cause


# ----------------------------------------------------------------------------- not 'sgd, c = 1'
@pytest.mark.parametrize("size", SIZES)
def test_a_step_beyond_the_bound_at_the_references_scale_is_not_called_sgd_at_c_1(size):
    rows = rows_of(order_ports.CoarseStep(**SIZES[size]), seed=4)
    bad = fails(rows)
    assert bad and bad[0].check == "updates", [(r.check, r.cause) for r in bad[:3]]
    assert "exceeds even the per-member summation bound" in bad[0].cause, bad[0].cause
    assert "gradient 1 times" not in bad[0].cause
    assert all(r.verdict == "pass" for r in rows if "a step on zero fitness" in r.quantity)


def test_an_in_place_perturb_and_restore_of_full_rank_leaves_names_them_too():
    """freeze_nonlora off: the layer norms' biases drift too, and are named with their counts."""
    rows = rows_of(order_ports.InPlaceRestore(freeze_nonlora=False, **SIZES["small"]), seed=2)
    zero = [r for r in fails(rows) if "a step on zero fitness" in r.quantity]
    assert zero and all(IN_PLACE in r.cause for r in zero)
    assert all(re.search(r"blocks\.ln_\d\.bias \(param\): \d+ of 24", r.cause) for r in zero), zero[0].cause
