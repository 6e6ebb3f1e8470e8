"""parity.tree_numpy_reference against parity.tree_reference (JAX), at two sizes on fresh random inputs, each within
the bound parity.tree_check holds the two sides to: what lets a replayed check answer the port's own inputs."""
from __future__ import annotations

import math

import numpy as np
import pytest

from parity.tree import check as tree_check, reference as R
from parity.core.tolerances import gamma, linear_bound, linear_exact, update_bound
from parity.tree.numpy_reference import NumpyTreeReference, factors, perturbs
from parity.tree import numpy_reference as N
from spec.lm import lm_tree

# selftest as the suite runs it, and quick with the full-rank leaves perturbed too (freeze_nonlora off)
CASES = [("selftest", 4, False), ("quick", 9, True)]


def config(size, unfreeze):
    cfg = tree_check.sizes()[size]
    return cfg.replace(freeze_nonlora=False) if unfreeze else cfg


@pytest.fixture(params=CASES, ids=[c[0] for c in CASES])
def case(request):
    size, seed, unfreeze = request.param
    return config(size, unfreeze), seed, np.random.default_rng([seed, 77])


def variants(leaf):
    return ["faithful"] + (["shared"] if leaf.scan_axes else []) + ["insertion"] + \
        (["tmm_transposed"] if leaf.cls == "tmm" else [])


def test_the_noise_is_the_references_within_the_noise_checks_bound(case):
    """Every perturbed leaf and key variant at two epochs: low-rank within 2 gamma_r |A||B|^T of that variant's
    factors (tree_check.check_noise's bound); param leaves bit for bit (one float32 product on both sides)."""
    cfg, seed, _ = case
    NR = NumpyTreeReference(R.draws)
    checked = set()
    for epoch in (0, 3):
        for leaf in lm_tree(cfg).leaves:
            if not perturbs(cfg, leaf):
                continue
            for variant in variants(leaf):
                ref = R.dense_noise(cfg, seed, epoch, leaf, variant)
                got = NR.dense_noise(cfg, seed, epoch, leaf, variant)
                assert got.dtype == ref.dtype == np.float32 and got.shape == ref.shape
                if leaf.cls == "param":
                    np.testing.assert_array_equal(got, ref)
                else:
                    drawn = "faithful" if variant == "tmm_transposed" else variant
                    A, B = (np.abs(v.astype(float)) for v in
                            factors(cfg, leaf, R.draws(cfg, seed, epoch, leaf, drawn), variant))
                    bound = 2 * gamma(cfg.rank) * (A @ np.swapaxes(B, -1, -2))
                    if variant == "tmm_transposed":
                        bound = np.swapaxes(bound, -1, -2)
                    assert np.all(np.abs(got.astype(float) - ref) <= bound), (leaf.path, variant)
                checked.add(leaf.cls)
            if leaf.cls != "param":                 # the same float64 arithmetic: equal up to the r-term sum's order
                mag, ref_mag = NR.factors_abs_product(cfg, seed, epoch, leaf), R.factors_abs_product(cfg, seed, epoch,
                                                                                                        leaf)
                np.testing.assert_allclose(mag, ref_mag, rtol=gamma(cfg.rank, 2.0 ** -53), atol=0)
    assert checked >= {"mm", "tmm"} | ({"param"} if not cfg.freeze_nonlora else set())


def test_a_different_seed_or_epoch_gives_different_draws(case):
    """The draws are keyed: the comparison above could not pass with draws ignoring seed or epoch."""
    cfg, seed, _ = case
    leaf = lm_tree(cfg).leaf("head")
    z = R.draws(cfg, seed, 0, leaf)
    assert not np.array_equal(z, R.draws(cfg, seed + 1, 0, leaf)) and not np.array_equal(z, R.draws(cfg, seed, 1, leaf))


def test_shaping_gradient_and_update_within_the_checks_bounds(case):
    cfg, seed, rng = case
    NR = NumpyTreeReference(R.draws)
    f = (rng.standard_normal(cfg.pop) * 2 + rng.standard_normal(cfg.pop // cfg.group_size).repeat(cfg.group_size) * 3)
    f = f.astype(np.float32)
    ref_shaped = R.shape(cfg, f)
    ratio = np.abs(N.shape(cfg, f).astype(float) - ref_shaped) / tree_check.shaping_pair_bound(f, cfg.group_size)
    assert ratio.max() <= 1
    ref_g, got_g = R.grads(cfg, seed, 1, ref_shaped), NR.grads(cfg, seed, 1, ref_shaped)
    w = np.abs(ref_shaped).astype(float)
    for leaf in lm_tree(cfg).leaves:
        if not perturbs(cfg, leaf):
            assert not np.any(got_g[leaf.path]) and not np.any(ref_g[leaf.path])
            continue
        mag, n = ((R.factors_abs_product(cfg, seed, 1, leaf), cfg.pop * cfg.rank + 3) if leaf.cls != "param" else
                  (np.abs(R.dense_noise(cfg, seed, 1, leaf)), cfg.pop + 2))
        bound = 2 * gamma(n) * np.tensordot(w, mag, axes=1) / cfg.pop       # tree_check.check_gradients' bound
        assert np.all(np.abs(got_g[leaf.path].astype(float) - ref_g[leaf.path]) <= bound), leaf.path
    params = {k: (v + rng.standard_normal(v.shape) * 0.05).astype(np.float32) for k, v in R.init(cfg, seed).items()}
    grads = {k: (rng.standard_normal(v.shape) * 0.1).astype(np.float32) for k, v in params.items()}
    ref_new, got_new = R.update(cfg, params, grads), N.update(cfg, params, grads)
    step = math.sqrt(cfg.pop) * cfg.lr
    for k in params:                                  # tree_check.check_updates' bound
        bound = 2 * update_bound(ref_new[k], step * grads[k].astype(float))
        assert np.all(np.abs(got_new[k].astype(float) - ref_new[k]) <= bound), k


@pytest.mark.parametrize("form", ["mm", "tmm"])
def test_products_within_one_sides_float32_bound(form, case):
    cfg, _, rng = case
    for a, b in [(cfg.d_model, cfg.d_hidden), (7, 5)]:
        W = rng.standard_normal((a, b)).astype(np.float32)
        A, B = (rng.standard_normal((3, n, cfg.rank)).astype(np.float32) for n in (a, b))
        x = rng.standard_normal((3, 4, b if form == "mm" else a)).astype(np.float32)
        args = (W, A, B, x) if form == "mm" else (W.T, B, A, x)
        exact, bound = linear_exact(*args), linear_bound(*args)
        assert np.all(np.abs(N.product(W, A, B, x, form) - exact) <= bound)
        assert np.all(np.abs(R.product(W, A, B, x, form) - exact) <= bound)


def test_the_forward_within_the_forward_checks_ulps(case):
    """scores (noise off and on, the reference's keys) and scores_dense (given noise) on fresh params: every
    intermediate within FORWARD_ULPS ulps of its scale (tree_check.forward_row)."""
    from rollout.corpus import load_corpus, member_tokens, train_windows
    cfg, seed, rng = case
    NR = NumpyTreeReference(R.draws)
    corpus = load_corpus(seq_len=cfg.seq_len)
    tokens = member_tokens(train_windows(corpus, seed, 2, cfg.n_streams, cfg.seq_len), cfg.pop, cfg.group_size)
    params = tree_check.fresh_params(R, cfg, seed, rng)
    for noise in (False, True):
        row = tree_check.forward_row(cfg, R.scores(cfg, seed, params, 1, tokens, noise)[1],
                                     NR.scores(cfg, seed, params, 1, tokens, noise)[1], f"noise {noise}")
        assert row.verdict == "pass", row
    dense = {k: (rng.standard_normal((cfg.pop,) + v.shape) * cfg.sigma).astype(np.float32)
             for k, v in params.items() if perturbs(cfg, lm_tree(cfg).leaf(k))}
    ref, got = R.scores_dense(cfg, params, dense, tokens), N.scores_dense(cfg, params, dense, tokens)
    assert set(got[1]) == set(ref[1])
    assert tree_check.forward_row(cfg, ref[1], got[1], "dense").verdict == "pass"


def test_a_training_epoch_within_the_trajectory_checks_stage_bounds(case):
    from rollout.corpus import load_corpus, member_tokens, train_windows
    cfg, seed, rng = case
    NR = NumpyTreeReference(R.draws)
    corpus = load_corpus(seq_len=cfg.seq_len)
    tokens = member_tokens(train_windows(corpus, seed, 1, cfg.n_streams, cfg.seq_len), cfg.pop, cfg.group_size)
    params = tree_check.fresh_params(R, cfg, seed, rng)
    ref, got = R.epoch_step(cfg, seed, params, 1, tokens), NR.epoch_step(cfg, seed, params, 1, tokens)
    rows, f_err = tree_check._trajectory_fitness(cfg, ref, got, "epoch 1")
    assert f_err is not None and all(r.verdict == "pass" for r in rows), rows
    mags = tree_check._reference_magnitudes(R, cfg, seed, 1)
    for leaf in lm_tree(cfg).leaves:
        rows = tree_check._trajectory_leaf(cfg, leaf, params, ref, got, f_err, "epoch 1",
                                           *mags.get(leaf.path, (None, 0)))
        assert all(r.verdict == "pass" for r in rows), rows
