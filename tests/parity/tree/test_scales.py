"""Issue 53, item 2: a gradient's scale is named in distribution mode as draw by draw, per leaf (the port's gradient
fitted to the reference's on the same noise, its direction judged within the rounding bound), in sigma, N and r
(N/sigma, 1/(sigma^2 sqrt(N)), sqrt(r), ...), and a step or gradient clipped per leaf at a norm is said to be. Planted
on the worked GPT (tests/ports/scales_ports.py) at two sizes and in both modes; the faithful examples at ten seeds
are never flagged, and their gradients always fit the reference's at c = 1 within the bound."""
from __future__ import annotations

import math

import numpy as np
import pytest

from examples.gpt_adapter import GPTAdapter
from examples.module_adapter import Adapter
import examples.module_port as mp
from parity.core import optscale
from parity.tree import check as tree_check, dist as D
from parity.tree.adapter import CheckedTreePort, PortSide, declared_run
from parity.tree.base import ref_perturbs
from spec.tree_knobs import TreeKnobs
import tests.ports.module_ports as module_ports
import tests.ports.scales_ports as ports
from tests.parity.tree.test_check import SIZES, rows_of

MODES = {"exact": TreeKnobs(), "distribution": TreeKnobs(rng="torch")}


# ----------------------------------------------------------------------------- the vocabulary
@pytest.mark.parametrize("sigma, pop, rank", [(0.05, 8, 2), (0.05, 16, 2), (0.05, 16, 3), (0.05, 16, 4), (0.2, 32, 2),
                                              (1 / 16, 16, 2), (0.5, 4, 2)])
def test_a_new_name_never_takes_an_older_ones_place(sigma, pop, rank):
    """Each older name's value is still read as that name first (the newer names come after it in the table)."""
    table = optscale.named_scales(sigma, pop, rank)
    older = list(table)[:list(table).index("N/sigma")]
    for name in older:
        v = table[name]
        first = optscale.scale_names(v, v / (1 + 1e-3), v * (1 + 1e-3), sigma, pop, rank)[0]
        assert table[first] == pytest.approx(v, rel=1e-12) and list(table).index(first) <= list(table).index(name)


def test_ties_keep_the_tables_order():
    """At N = 1/sigma, N/sigma is 1/sigma^2 and 1/(sigma^2 sqrt(N)) is sqrt(N)/sigma: the older name comes first."""
    assert optscale.scale_names(256.0, 255.0, 257.0, 1 / 16, 16)[:2] == ["1/sigma^2", "N/sigma"]
    assert optscale.scale_names(64.0, 63.0, 65.0, 1 / 16, 16)[:2] == ["sqrt(N)/sigma", "1/(sigma^2 sqrt(N))"]


def test_the_new_factors_are_named():
    for value, name in [(160.0, "N/sigma"), (100 * math.sqrt(2), "1/(sigma^2 sqrt(N))"), (math.sqrt(2), "sqrt(r)")]:
        assert optscale.scale_names(value, value * 0.999, value * 1.001, 0.05, 8, 2)[0] == name


# ----------------------------------------------------------------------------- the per-leaf fit
def test_fit_leaf_takes_a_scaled_gradient_and_refuses_another_direction():
    """Within the bound at c = 1 and at c = 160 (the scaling's own float32 rounding); not 20 bounds off it."""
    rng = np.random.default_rng(3)
    ref = rng.standard_normal(500)
    bound = np.full(500, 1e-6)
    faithful = (ref + bound * rng.uniform(-1, 1, 500)).astype(np.float32)
    for c in (1.0, 160.0):
        fit = optscale.fit_leaf((faithful * np.float32(c)).astype(np.float32), ref, bound)
        assert fit.aligned and fit.lo <= c <= fit.hi and fit.excess < 1, fit
    turned = ref + 20 * bound * rng.standard_normal(500)
    assert not optscale.fit_leaf(turned, ref, bound).aligned


def test_a_cap_is_a_round_norm_or_one_several_leaves_share():
    tol = optscale.cap_tolerance(64)
    assert optscale.caps({"a": (1.0 - 1e-6, tol), "b": (0.731, tol)}) == {"a": 1.0}
    shared = optscale.caps({"a": (0.731, tol), "b": (0.731 * (1 + 1e-6), tol), "c": (0.42, tol)})
    assert set(shared) == {"a", "b"} and shared["a"] == pytest.approx(0.731)
    assert optscale.caps({"a": (0.731, tol)}) == {}


# ----------------------------------------------------------------------------- planted, named in both modes
# (the port, its extra settings, the check, the words every failing row of that check carries, the leaves' classes)
PLANTS = {
    "param gradient N/sigma": (ports.ParamGradientNOverSigma, dict(freeze_nonlora=False), "gradients",
                               "gradient is {v}x the reference's, a factor N/sigma at sigma=0.05, N={pop} (same "
                               "direction)", {"param"}),
    "gradient 1/(sigma^2 sqrt N)": (ports.GradientOverSigma2SqrtN, {}, "gradients",
                                    "gradient is {v}x the reference's, a factor 1/(sigma^2 sqrt(N)) at sigma=0.05, "
                                    "N={pop} (same direction)", {"mm", "tmm"}),
    "gradient sqrt(r)": (ports.GradientTimesSqrtRank, {}, "gradients",
                         "gradient is 1.414x the reference's, a factor sqrt(r) at r=2 (same direction)", {"mm", "tmm"}),
    "update clipped at 1.0": (ports.UpdateClippedPerLeaf, dict(lr=ports.CLIP_LR), "updates",
                              "is clipped at norm 1.0 (", {"mm", "tmm"}),
    "gradient clipped at 0.1": (ports.GradientClippedPerLeaf, {}, "gradients", "is clipped at norm 0.1 (", None),
}
VALUES = {"param gradient N/sigma": lambda pop: f"{pop / 0.05:g}",
          "gradient 1/(sigma^2 sqrt N)": lambda pop: f"{1 / (0.05 ** 2 * math.sqrt(pop)):.4g}"}


def failing(rows, check):
    return [r for r in rows if r.verdict == "fail" and r.check == check]


@pytest.mark.slow
@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("plant", PLANTS)
def test_a_planted_scale_is_named_in_both_modes(plant, mode, size):
    port_class, extra, check, words, classes = PLANTS[plant]
    port = port_class(MODES[mode], **SIZES[size], **extra)
    rows = rows_of(port, seed=2)
    fails = failing(rows, check)
    says = words.format(v=VALUES.get(plant, lambda pop: "")(port.pop), pop=port.pop)
    assert fails and all(says in r.cause for r in fails), [r.cause for r in fails[:2]]
    assert not [r.cause for r in rows if r.verdict == "fail" and r.cause.rstrip(". ").endswith("differs")]
    if classes is not None:          # exactly the scaled (or clipped) leaves fail
        assert {r.quantity.split(" (")[1].split(")")[0] for r in fails} == classes
    if "clipped" in says:
        assert all("same direction" in r.cause for r in fails)
    if check == "updates":           # the gradient is the reference's; the lockstep names the clipping too
        assert failing(rows, "gradients") == []
        trajectory = failing(rows, "trajectory")
        assert trajectory and all("is clipped at norm 1.0" in r.cause for r in trajectory)


def test_distribution_mode_names_the_scale_as_the_exact_mode_does():
    """The fast case: the two modes' gradient checks give the same words for one plant."""
    texts = {}
    for mode, knobs in MODES.items():
        side, run = side_of(ports.GradientOverSigma2SqrtN(knobs, **SIZES["small"]))
        check = tree_check.check_gradients if knobs.rng != "torch" else D.check_gradients
        rows = check(reference(), side, run, 1, np.random.default_rng(0), set())
        texts[mode] = {r.cause for r in rows if r.verdict == "fail"}
    assert texts["exact"] == texts["distribution"] and len(texts["exact"]) == 7
    assert all("a factor 1/(sigma^2 sqrt(N)) at sigma=0.05, N=8" in t for t in texts["exact"])


# ----------------------------------------------------------------------------- faithful: never flagged
def side_of(port):
    run, _ = declared_run(port, tree_check.TREE_SIZES["quick"])
    return PortSide(CheckedTreePort(port, run), run), run


def reference():
    from parity.tree import reference as tree_reference
    return tree_reference.on_platform(None)


FAITHFUL = {
    "gpt": lambda s, **kw: GPTAdapter(**SIZES[s], **kw),
    "gpt torch-rng": lambda s, **kw: GPTAdapter(TreeKnobs(rng="torch"), **SIZES[s], **kw),
    "module": lambda s, **kw: Adapter(**{**(module_ports.SMALL if s == "small" else {}),
                                         "es": mp.ES(pop=SIZES[s]["pop"], **kw)}),
}


@pytest.mark.slow
@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("full_rank", [False, True])
@pytest.mark.parametrize("example", FAITHFUL)
def test_the_faithful_examples_pass_gradients_and_updates_and_fit_at_one(example, full_rank, size):
    """Ten seeds: no gradient or update row fails, and every leaf's gradient fits the reference's at c = 1 within
    the rounding bound (optscale.fit_leaf), so the scale diagnosis could not misread a faithful leaf."""
    R = reference()
    for seed in range(10):
        port = FAITHFUL[example](size, **({"freeze_nonlora": False} if full_rank else {}))
        side, run = side_of(port)
        seen = {}
        if port.jax_compatible_rng:
            def witness(label, whole, p, r, bound, how, *rest):
                if "einsum/mean" in how:
                    seen[label] = (p, r, bound)
            rows = tree_check.check_gradients(R, side, run, seed, np.random.default_rng([seed, 20]), set(), witness)
        else:
            noise, shaped = side.protocol(seed, 0), R.shape(run, np.random.default_rng([seed, 20]).standard_normal(
                run.pop).astype(np.float32))
            grads = side.grads(seed, 0, shaped)
            seen = {leaf.path: (grads[leaf.path], D.estimate(leaf, noise[leaf.path], shaped),
                                D.grad_bound(run, leaf, noise[leaf.path], shaped))
                    for leaf in run.tree.leaves if leaf.path in noise and noise[leaf.path] is not None
                    and ref_perturbs(run, leaf)}
            rows = D.check_gradients(R, side, run, seed, np.random.default_rng([seed, 20]), set())
        rows += tree_check.check_updates(R, side, run, seed, np.random.default_rng([seed, 21]))
        assert [(r.check, r.cause) for r in rows if r.verdict == "fail"] == [], seed
        assert seen and all(optscale.fit_leaf(p, r, b).aligned for p, r, b in seen.values()), seed
