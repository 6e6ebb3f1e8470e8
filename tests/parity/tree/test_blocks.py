"""The tree suite's memory at real sizes (parity/tree/blocks.py): a leaf's per-member noise is handled in blocks of at
most BLOCK_ENTRIES entries, kept as factors where sums over the members are taken, and a KS test sorts at most
KS_SAMPLE values. Here, at small sizes with the caps made small: the blocks cover each leaf exactly once and give the
unblocked arrays (bit for bit where a block holds whole slices); the factored sums are the dense ones; the suite's
verdicts and the drifts it names are the same; and, measured with tracemalloc, the checks' memory does not grow as
population x a big leaf, where with one block per leaf it does."""
from __future__ import annotations

import tracemalloc

import numpy as np
import pytest
from scipy import stats

from examples.gpt_adapter import GPTAdapter
from examples.gpt_port import GPTConfig
from parity.core.tolerances import gamma
from parity.tree import blocks as B
from parity.tree import check as tree_check
from parity.tree import dist as D
from parity.tree import lockstep
from parity.tree.adapter import CheckedTreePort, PortSide, declared_run, dense_of
from spec.tree import Leaf
from spec.tree_knobs import TreeKnobs
import tests.ports.gpt_ports as ports

LEAVES = [Leaf("w", (6, 5), "mm"), Leaf("s", (3, 7, 4), "mm", (0,)), Leaf("t", (2, 3, 4, 5), "tmm", (0, 1)),
          Leaf("p", (3, 9), "param", (0,)), Leaf("v", (7,), "param"), Leaf("c", (), "param")]
SMALL = dict(model=GPTConfig(vocab=32, block_size=6, n_layer=3, n_head=2, n_embd=8), pop=8)


def noise_of(leaf: Leaf, m: int, rng, r: int = 2):
    """Random protocol noise of one leaf for m members: (A, B) float32 or eps float32."""
    if leaf.cls in ("mm", "tmm"):
        a, b = leaf.slice_shape
        return (rng.standard_normal((m, *leaf.stack_shape, a, r)).astype(np.float32),
                rng.standard_normal((m, *leaf.stack_shape, b, r)).astype(np.float32))
    return rng.standard_normal((m, *leaf.shape)).astype(np.float32)


@pytest.mark.parametrize("leaf", LEAVES, ids=[leaf.path for leaf in LEAVES])
@pytest.mark.parametrize("budget", [1, 7, 40, 10 ** 6])
def test_blocks_cover_each_leaf_once_in_pairs_and_give_the_unblocked_arrays(leaf, budget):
    m = 6
    value = noise_of(leaf, m, np.random.default_rng(0))
    full = dense_of(leaf, value)
    S, R, per_row = B.grid(leaf)
    seen = np.zeros((m, S, R), int)
    for blk in B.blocks(leaf, m, budget):
        seen[blk] += 1
        members, slices, rows = len(range(m)[blk.members]), len(range(S)[blk.slices]), len(range(R)[blk.rows])
        assert blk.members.start % 2 == 0 and members % 2 == 0                          # whole antithetic pairs
        assert members * slices * rows * per_row <= max(budget, 2 * per_row)
        got = B.dense_block(leaf, value, blk)
        want = full.reshape(m, S, R, -1)[blk].reshape(got.shape)
        if rows == R or not isinstance(value, tuple):      # whole slices (or eps): the unblocked values, bit for bit
            assert np.array_equal(got, want)
        else:                                              # a slice's rows: another float32 product of the same terms
            exact = B.dense_block(leaf, value, blk, np.float64)
            assert np.all(np.abs(got - exact) <= gamma(2) * B.magnitude_block(leaf, B.magnitude_of(value), blk))
    assert np.all(seen == 1)
    assert (len(B.blocks(leaf, m, budget)) == 1) == (m * S * R * per_row <= budget)
    assert np.array_equal(B.dense_block(leaf, value), full)                        # the whole leaf: dense_of's bits


@pytest.mark.parametrize("leaf", LEAVES, ids=[leaf.path for leaf in LEAVES])
def test_sums_over_members_as_factors_are_the_dense_sums(leaf):
    m, rng = 8, np.random.default_rng(1)
    value = noise_of(leaf, m, rng, r=3)
    w = rng.standard_normal(m)
    dense = dense_of(leaf, tuple(v.astype(np.float64) for v in value) if isinstance(value, tuple) else
                     value.astype(np.float64))
    want = np.tensordot(w, dense, axes=1)
    got = B.weighted_sum(leaf, value, w)
    assert got.shape == leaf.shape
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12 * np.abs(dense).max())
    mag = B.magnitude_of(value)
    absdense = np.abs(dense) if not isinstance(value, tuple) else B.magnitude_block(leaf, mag)
    wa = np.abs(w)
    np.testing.assert_allclose(B.mean_abs(leaf, mag, wa), np.mean(wa.reshape((-1,) + (1,) * len(leaf.shape)) *
                                                                  absdense, 0), rtol=1e-12, atol=0)
    if not isinstance(value, tuple):                 # eps: the members reduced in order, as np.mean: the same bits
        assert np.array_equal(B.mean_abs(leaf, mag, wa), np.mean(wa.reshape((-1,) + (1,) * len(leaf.shape)) *
                                                                 absdense, 0))


def test_identical_slices_and_equal_perturbations_as_the_dense_arrays_say():
    leaf, rng = Leaf("s", (4, 6, 5), "mm", (0,)), np.random.default_rng(2)
    A, Bf = noise_of(leaf, 4, rng)
    A[:, 2], Bf[:, 2] = A[:, 0], Bf[:, 0]                                # slices 0 and 2 identical
    A2 = A.copy()
    A2[:, 3] = A[:, 1]
    B2 = Bf.copy()
    B2[:, 3] = Bf[:, 1]
    for value in ((A, Bf), (A2, B2), (-A, -Bf)):
        assert B.identical_slices(leaf, value) == D.identical_slices(leaf, D.dense64(leaf, value))
    assert B.identical_slices(leaf, (A2, B2)) == (2, 6)
    assert B.equal_dense(leaf, 4, (A, Bf), (A.copy(), Bf.copy()))
    assert B.equal_dense(leaf, 4, (A, Bf), (-A, -Bf))                    # other factors, the same products
    assert not B.equal_dense(leaf, 4, (A, Bf), (A2, B2))                 # differs past the first row and slice


def test_mirrored_and_same_read_the_values_bit_for_bit():
    leaf, rng = Leaf("w", (5, 3), "mm"), np.random.default_rng(3)
    A, Bf = noise_of(leaf, 4, rng)
    A[1::2], Bf[1::2] = -A[0::2], Bf[0::2]                       # A negated, B shared
    blk = B.whole(leaf, 4)
    assert B.mirrored((A, Bf), blk, leaf)
    A2, B2 = A.copy(), Bf.copy()
    A2[1::2], B2[1::2] = A[0::2], -Bf[0::2]                     # B negated, A shared
    assert B.mirrored((A2, B2), blk, leaf)
    B3 = Bf.copy()
    B3[1::2] = -Bf[0::2]
    assert not B.mirrored((A, B3), blk, leaf)                   # both negated: the same product, no mirror
    A[3, 0, 0] = np.nextafter(A[3, 0, 0], np.float32(1))       # one bit
    assert not B.mirrored((A, Bf), blk, leaf)
    assert B.same((A, Bf), (A.copy(), Bf.copy()), blk, leaf) and not B.same((A, Bf), (A, -Bf), blk, leaf)
    eps = rng.standard_normal((4, 5)).astype(np.float32)
    eps[1::2] = -eps[0::2]
    assert B.mirrored(eps, B.whole(Leaf("v", (5,), "param"), 4), Leaf("v", (5,), "param"))


def test_the_ks_distance_is_scipys_bit_for_bit():
    rng = np.random.default_rng(4)
    for x in (rng.standard_normal(1000), rng.standard_normal(777) * 1.3 + 0.1, np.sort(rng.standard_normal(50))):
        assert D.normal_ks(x) == float(stats.kstest(x, "norm").statistic)
        assert D.normal_ks(np.sort(x), presorted=True) == float(stats.kstest(x, "norm").statistic)


def test_a_pooled_law_over_the_caps_tests_every_value_and_an_evenly_spaced_sample(monkeypatch):
    """Past BLOCK_ENTRIES the mean square is summed in blocks (the same value); past KS_SAMPLE the KS takes evenly
    spaced values, its exact critical value at that n: a faithful sample passes, one at 1.3x the scale fails."""
    rng = np.random.default_rng(5)
    parts = [rng.standard_normal(30_000).astype(np.float32) * 0.5, rng.standard_normal(20_000).astype(np.float32) * 0.5]
    whole = D.pooled_law_rows("init", "x", parts, 0.5, 1e-3, "why")
    monkeypatch.setattr(B, "BLOCK_ENTRIES", 4_096)
    monkeypatch.setattr(D, "KS_SAMPLE", 5_000)
    capped = D.pooled_law_rows("init", "x", parts, 0.5, 1e-3, "why")
    assert [r.verdict for r in whole] == [r.verdict for r in capped] == ["pass", "pass"]
    assert capped[1].value == pytest.approx(whole[1].value, rel=1e-12) and "(50000 values)" in capped[1].quantity
    assert "5000 evenly spaced of 50000 values" in capped[0].quantity
    want = np.concatenate(parts).astype(np.float64)[::10] / 0.5
    assert capped[0].value == float(stats.kstest(want, "norm").statistic)
    wide = D.pooled_law_rows("init", "x", [p * 1.3 for p in parts], 0.5, 1e-3, "why")
    assert [r.verdict for r in wide] == ["fail", "fail"]


# ----------------------------------------------------------------------------- the suite with small blocks
def rows_of(port, seed: int, budget: int, monkeypatch):
    monkeypatch.setattr(B, "BLOCK_ENTRIES", budget)
    run, _ = declared_run(port, tree_check.TREE_SIZES["quick"])
    return tree_check.run(run, TreeKnobs(), seed, lambda line: None, side=PortSide(CheckedTreePort(port, run), run))


@pytest.mark.parametrize("port", [GPTAdapter(**SMALL), GPTAdapter(TreeKnobs(rng="torch"), **SMALL)],
                         ids=["exact", "in distribution"])
def test_the_example_passes_every_check_in_small_blocks(port, monkeypatch):
    rows = rows_of(port, 3, 64, monkeypatch)
    assert [(r.check, r.cause) for r in rows if r.verdict == "fail"] == []
    assert {r.check for r in rows if r.verdict != "skip"} == set(tree_check.CHECKS)
    assert any("blocks of 64 entries formed" in r.allowed for r in rows if r.check in ("noise", "trajectory"))


# (the port, the check that fails first, what its cause says): drifts whose noise differs from the reference's in
# every block, so that no block is skipped and each is named as with one block per leaf
BLOCKED_DRIFTS = [
    (lambda: GPTAdapter(TreeKnobs(stack_keys="shared"), **SMALL), "noise", "(knob `stack_keys`)"),
    (lambda: GPTAdapter(TreeKnobs(tmm_layout="transposed"), **SMALL), "noise", "(knob `tmm_layout`)"),
    (lambda: ports.HalvesPairing(**SMALL), "noise", "(knob `antithetic`): member 0 is the mirror of member"),
    (lambda: ports.NoiseNotOverSqrtRank(**SMALL), "noise", "noise scaling differs"),
    (lambda: ports.IgnoresNoiseReuse(**SMALL), "trajectory", "(knob `noise_reuse`)"),
    (lambda: GPTAdapter(TreeKnobs(rng="torch", stack_keys="shared"), **SMALL), "noise", "(knob `stack_keys`)"),
    (lambda: ports.SigmaDecay(TreeKnobs(rng="torch"), **SMALL), "trajectory", "(knob `sigma_decay`)"),
]


@pytest.mark.slow
@pytest.mark.parametrize("make, check, says", BLOCKED_DRIFTS,
                         ids=["stack_keys", "tmm_layout", "halves", "sqrt_r", "noise_reuse", "dist-stack_keys",
                              "dist-sigma_decay"])
def test_drifts_are_named_in_small_blocks(make, check, says, monkeypatch):
    fails = [r for r in rows_of(make(), 2, 64, monkeypatch) if r.verdict == "fail"]
    assert fails and fails[0].check == check and says in fails[0].cause, [(r.check, r.cause) for r in fails[:3]]


# ----------------------------------------------------------------------------- memory, measured
BIG_HEAD = GPTConfig(vocab=1024, block_size=4, n_layer=1, n_head=2, n_embd=128)


def traced_peak(fn) -> int:
    """The most bytes numpy (and Python) held at once during fn(), beyond what was held before (tracemalloc)."""
    tracemalloc.start()
    try:
        tracemalloc.reset_peak()
        base = tracemalloc.get_traced_memory()[0]
        fn()
        return tracemalloc.get_traced_memory()[1] - base
    finally:
        tracemalloc.stop()


def checks_peak(exact: bool, pop: int, budget: int, monkeypatch) -> int:
    """tracemalloc's peak over the noise, gradients and trajectory checks of the BIG_HEAD GPT at `pop`, blocks of
    `budget` entries, against the reference in numpy on JAX's draws (so that every array is numpy's, seen by
    tracemalloc; the port's own tensors are torch's, not counted); every row must pass."""
    from parity.tree import reference as tree_reference
    from parity.tree.numpy_reference import NumpyTreeReference
    port = GPTAdapter(TreeKnobs(rng="jax" if exact else "torch"), model=BIG_HEAD, pop=pop, noise_reuse=1)
    run, _ = declared_run(port, tree_check.TREE_SIZES["quick"])
    side = PortSide(CheckedTreePort(port, run), run)
    R = NumpyTreeReference(tree_reference.draws)

    def checks():
        rows, parted = (tree_check.check_noise if exact else D.check_noise)(R, side, run, 0)
        rng = np.random.default_rng([0, 20])
        rows += tree_check.check_gradients(R, side, run, 0, rng, parted) if exact else \
            D.check_gradients(R, side, run, 0, rng, parted)
        rows += lockstep.check(R, side, run, 0, exact)
        assert [(r.check, r.cause) for r in rows if r.verdict == "fail"] == []

    side.noise(0, 0), side.noise(0, 1)                  # the port's own noise (factors), drawn once per epoch
    checks()                                            # the reference's draws, kept (lru_cache), drawn outside
    monkeypatch.setattr(B, "BLOCK_ENTRIES", budget)
    return traced_peak(checks)


@pytest.mark.slow
@pytest.mark.parametrize("exact", [True, False], ids=["exact", "in distribution"])
def test_the_checks_memory_does_not_grow_as_population_times_a_big_leaf(exact, monkeypatch):
    """A GPT whose head and token table (1,024 x 128: 131,072 entries each) dwarf its other leaves. From population
    8 to 24 one float64 (pop, *shape) array of the head grows by 16 MiB; with blocks of 2^14 entries the noise,
    gradients and trajectory checks' peak grows by less than a quarter of that (what grows is the factors, (a + b) r
    per member: measured 0.9 MB both ways), while with one block per leaf (the unblocked computation) the peak at 24
    holds more than one such array beyond the blocked one: the measure tells the two apart."""
    leaf_bytes = 1024 * 128 * 8
    small, big = (checks_peak(exact, pop, 2 ** 14, monkeypatch) for pop in (8, 24))
    whole = checks_peak(exact, 24, 2 ** 40, monkeypatch)
    assert big - small < (24 - 8) * leaf_bytes / 4, (small, big)
    assert whole > big + 24 * leaf_bytes, (big, whole)
