"""torch_impl on trees (keys, noise, products, shaping, gradients, knobs) and the byte-level LM, against JAX.

Exact where both sides run the same float32 operations (keys, draws, the factors' scaling, init); within
float32 bounds stated at each check where the two may order a sum differently (products, means, einsums).
u = 2^-24 and gamma(k) = k u / (1 - k u) bound the rounding of a k-term float32 sum of products (Higham);
two sides that each stay within gamma(k) * sum|terms| of the exact value differ by at most twice that.
"""
from __future__ import annotations

import math
from functools import partial

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch

from jax_reference.models import as_typed_key, simple_es_tree_key
from jax_reference.noiser import EggRoll, es_grads, fullrank_noise, lowrank_factors, lowrank_sigma
from spec.lm import BLOCK, LM_PRESETS, TOP, lm_tree
from spec.tree import ES_MAP, Leaf, make_tree, nest, slice_index
from spec.tree_knobs import TREE_CHOICES, TreeKnobs
from torch_impl.tree import es as lm_es, lm
from torch_impl import random as rnd
from torch_impl.keys import run_keys
from torch_impl.tree.keys import LEAF_ORDERS, STACK_KEYS, TREE_GENERATORS, es_leaf_keys, init_lm
from torch_impl.tree.noise import (EMBEDDINGS, FROZEN_LEAVES, TMM_LAYOUTS, dense, make_plan, per_member,
                                   sample)
from tests.trainer_cli import BAD_LM_TRAINER_ARGV

U = 2.0 ** -24


def gamma(k: int) -> float:
    return k * U / (1 - k * U)


# ----------------------------------------------------------------------------- a random tree, two sizes
def random_tree(d: int, L: int):
    """Declared out of sorted order; stacked mm/tmm/param (one on two scan axes), plain mm/tmm, emb, excluded."""
    return make_tree([
        Leaf("zeta.w", (L, d + 3, d), "mm", (0,)),
        Leaf("alpha", (L, d), "param", (0,)),
        Leaf("mid.t", (d, d + 5), "tmm"),
        Leaf("beta", (2, L, d), "param", (0, 1)),
        Leaf("emb", (11, d), "embedding"),
        Leaf("ex", (d,), "excluded"),
        Leaf("mid.m", (d + 1, d), "mm"),
        Leaf("stack.t", (L, d, 2 * d), "tmm", (0,)),
    ])


SIZES = [(4, 2), (7, 3)]


def get(tree, path: str):
    for part in path.split("."):
        tree = tree[part]
    return tree


def jax_tree_side(tree, seed: int, rng: np.random.Generator):
    """Random params (numpy, fresh normals), JAX pytrees of them, their scan and es maps, and JAX's key tree."""
    flat = {leaf.path: rng.standard_normal(leaf.shape).astype(np.float32) for leaf in tree.leaves}
    params = nest({p: jnp.asarray(v) for p, v in flat.items()})
    scan_map = nest({leaf.path: leaf.scan_axes for leaf in tree.leaves})
    es_map = nest({leaf.path: ES_MAP[leaf.cls] for leaf in tree.leaves})
    es_key = jax.random.split(jax.random.key(seed), 3)[1]
    keys = simple_es_tree_key(params, es_key, scan_map)
    return flat, params, scan_map, es_map, keys


def jax_key_words(keys, path: str) -> np.ndarray:
    return np.asarray(jax.random.key_data(get(keys, path)))


def frozen_params(rank: int, noise_reuse: int, freeze_nonlora: bool, group_size: int = 0) -> dict:
    return {"group_size": group_size, "freeze_nonlora": freeze_nonlora, "noise_reuse": noise_reuse, "rank": rank,
            "use_batched_update": False}


def jax_member_factors(frozen, sigma, param_slice, key, epoch: int, pop: int):
    """EggRoll.lowrank_factors for members 0..pop-1 at epoch: A (pop, a, r), B (pop, b, r)."""
    base = lowrank_sigma({"sigma": sigma}, frozen)
    its = (jnp.full((pop,), epoch, jnp.int32), jnp.arange(pop, dtype=jnp.int32))
    f = jax.vmap(partial(lowrank_factors, frozen), in_axes=(None, 0, None, None))
    A, B = f(base, its, jnp.asarray(param_slice), key)
    return np.asarray(A), np.asarray(B)


def jax_member_fullrank(frozen, sigma, param_slice, key, epoch: int, pop: int):
    its = (jnp.full((pop,), epoch, jnp.int32), jnp.arange(pop, dtype=jnp.int32))
    f = jax.vmap(partial(fullrank_noise, frozen), in_axes=(None, 0, None, None))
    return np.asarray(f(sigma, its, jnp.asarray(param_slice), key))


def slice_of(arr, idx):
    for i in idx:
        arr = arr[i]
    return arr


# ----------------------------------------------------------------------------- keys
@pytest.mark.parametrize("d,L", SIZES)
def test_es_keys_per_leaf_and_slice_are_jaxs_on_a_random_tree(d, L):
    tree = random_tree(d, L)
    seed = 11 + d
    _, _, _, _, keys = jax_tree_side(tree, seed, np.random.default_rng(d))
    ours = es_leaf_keys(tree, run_keys(seed).es)
    for leaf in tree.leaves:
        assert ours[leaf.path].shape == (*leaf.stack_shape, 2)
        np.testing.assert_array_equal(rnd.to_uint32(ours[leaf.path]), jax_key_words(keys, leaf.path), leaf.path)


@pytest.mark.parametrize("preset", ["selftest", "quick"])
def test_es_keys_of_the_lm_tree_are_simple_es_tree_key(preset):
    cfg = LM_PRESETS[preset]
    tree = lm_tree(cfg)
    params = nest({leaf.path: jnp.zeros(leaf.shape) for leaf in tree.leaves})
    scan_map = nest({leaf.path: leaf.scan_axes for leaf in tree.leaves})
    keys = simple_es_tree_key(params, jax.random.split(jax.random.key(5), 3)[1], scan_map)
    ours = es_leaf_keys(tree, run_keys(5).es)
    for leaf in tree.leaves:
        np.testing.assert_array_equal(rnd.to_uint32(ours[leaf.path]), jax_key_words(keys, leaf.path), leaf.path)


# ----------------------------------------------------------------------------- noise
@pytest.mark.parametrize("d,L,noise_reuse", [(4, 2, 1), (7, 3, 2)])
def test_every_leaf_and_slices_noise_is_eggrolls(d, L, noise_reuse):
    """Factors and full-rank noise of every member, slice and leaf at several epochs, bit for bit."""
    tree, pop, rank, sigma, seed = random_tree(d, L), 6, 3, 0.05, 2 + d
    flat, _, _, _, keys = jax_tree_side(tree, seed, np.random.default_rng(d))
    frozen = frozen_params(rank, noise_reuse, freeze_nonlora=False)
    plan = make_plan(tree, TreeKnobs(), pop, rank, noise_reuse, freeze_nonlora=False)
    sources = TREE_GENERATORS["jax"].sources(tree, seed, "sorted", "split")
    for epoch in (0, 3):
        noise = per_member(sample(plan, sources, epoch, sigma))
        for leaf in tree.of_class("mm", "tmm", "param"):
            for idx in slice_index(leaf):
                key = as_typed_key(slice_of(jax_key_words(keys, leaf.path), idx))
                value = slice_of(flat[leaf.path], idx)
                at = (slice(None), *idx)
                if leaf.cls == "param":
                    want = jax_member_fullrank(frozen, sigma, value, key, epoch, pop)
                    np.testing.assert_array_equal(noise.eps[leaf.path][at].numpy(), want, f"{leaf.path}{idx}")
                else:
                    A, B = jax_member_factors(frozen, sigma, value, key, epoch, pop)
                    np.testing.assert_array_equal(noise.A[leaf.path][at].numpy(), A, f"{leaf.path}{idx} A")
                    np.testing.assert_array_equal(noise.B[leaf.path][at].numpy(), B, f"{leaf.path}{idx} B")
        assert set(noise.A) == {leaf.path for leaf in tree.of_class("mm", "tmm")}
        assert set(noise.eps) == {leaf.path for leaf in tree.of_class("param")}


# ----------------------------------------------------------------------------- products
def product_bound(x, W_used, inner, outer):
    """2 (gamma(n) |x||W| + gamma(n + r) (|x||inner|)|outer|^T + u |sum|): both sides' rounding of plain + low."""
    plain = np.abs(x) @ np.abs(W_used)
    low = (np.abs(x) @ np.abs(inner)) @ np.abs(outer).T
    n, r = x.shape[-1], inner.shape[-1]
    return 2 * (gamma(n) * plain + gamma(n + r) * low + U * (plain + low))


@pytest.mark.parametrize("d,L", SIZES)
def test_mm_and_tmm_products_are_do_mm_and_do_Tmm_within_float32(d, L):
    tree, pop, rank, sigma, seed, T = random_tree(d, L), 6, 3, 0.5, 4, 5
    rng = np.random.default_rng(100 + d)
    flat, _, _, _, keys = jax_tree_side(tree, seed, rng)
    frozen = frozen_params(rank, 1, freeze_nonlora=True)
    plan = make_plan(tree, TreeKnobs(), pop, rank, 1, True)
    noise = sample(plan, TREE_GENERATORS["jax"].sources(tree, seed, "sorted", "split"), 1, sigma)
    pm = per_member(noise)
    member = lm.Member(noise, pop, "cpu")
    its = (jnp.full((pop,), 1, jnp.int32), jnp.arange(pop, dtype=jnp.int32))
    for path, l, form in (("zeta.w", 1, "mm"), ("mid.m", None, "mm"), ("mid.t", None, "tmm"),
                          ("stack.t", L - 1, "tmm")):
        leaf = tree.leaf(path)
        W = flat[path] if l is None else flat[path][l]
        op = EggRoll.do_mm if form == "mm" else EggRoll.do_Tmm
        x = rng.standard_normal((pop, T, W.shape[1] if form == "mm" else W.shape[0])).astype(np.float32)
        key = as_typed_key(jax_key_words(keys, path) if l is None else jax_key_words(keys, path)[l])
        want = np.asarray(jax.vmap(lambda it, xx: op(frozen, {"sigma": sigma}, jnp.asarray(W), key, it, xx))(its, x))
        got = lm._linear(member, path, torch.from_numpy(W), torch.from_numpy(x), l, form).numpy()
        A = pm.A[path].numpy() if l is None else pm.A[path][:, l].numpy()
        B = pm.B[path].numpy() if l is None else pm.B[path][:, l].numpy()
        for m in range(pop):
            inner, outer = (B[m], A[m]) if form == "mm" else (A[m], B[m])
            bound = product_bound(x[m], W.T if form == "mm" else W, inner, outer)
            assert np.all(np.abs(got[m] - want[m]) <= bound), (path, m, np.abs(got[m] - want[m]).max())
        assert leaf.cls == form


# ----------------------------------------------------------------------------- shaping and gradients
@pytest.mark.parametrize("pop,group_size", [(16, 4), (24, 0), (24, 6)])
def test_group_shaping_is_convert_fitnesses(pop, group_size):
    """(f - m_g) / sqrt(var + 1e-5): the mean and variance sums of N terms each err by gamma(N) relative to
    their |terms|; the shaped value by at most gamma(2N + 8) * 4 * (max|f| / s + 1) (both sides)."""
    f = np.random.default_rng(pop + group_size).standard_normal(pop).astype(np.float32) * 3 + 1
    want = np.asarray(EggRoll.convert_fitnesses({"group_size": group_size}, {}, jnp.asarray(f)))
    got = lm_es.GROUP_FITNESS["global_var"](torch.from_numpy(f), group_size).numpy()
    s = math.sqrt(float(np.var(f.astype(np.float64))) + 1e-5)
    assert np.max(np.abs(got - want)) <= 2 * gamma(2 * pop + 8) * 4 * (np.abs(f).max() / s + 1)


@pytest.mark.parametrize("d,L,freeze", [(4, 2, False), (7, 3, True)])
def test_gradients_per_leaf_are_es_grads(d, L, freeze):
    """g per leaf against jax_reference.noiser.es_grads. Bounds: the einsum sums N r products
    |f A B| (gamma(N r) relative to sum|f A B| / N, both sides, + the division's u); the mean sums N |f eps|."""
    tree, pop, rank, sigma, seed, epoch = random_tree(d, L), 8, 2, 0.1, 9, 2
    rng = np.random.default_rng(7 * d)
    flat, params, _, es_map, keys = jax_tree_side(tree, seed, rng)
    f = rng.standard_normal(pop).astype(np.float32)
    frozen = frozen_params(rank, 1, freeze)
    its = (jnp.full((pop,), epoch, jnp.int32), jnp.arange(pop, dtype=jnp.int32))
    want = es_grads(frozen, {"sigma": sigma}, params, keys, jnp.asarray(f), its, es_map)
    plan = make_plan(tree, TreeKnobs(), pop, rank, 1, freeze)
    noise = sample(plan, TREE_GENERATORS["jax"].sources(tree, seed, "sorted", "split"), epoch, sigma)
    got = lm_es.leaf_gradients(tree, noise, torch.from_numpy(f))
    pm = per_member(noise)
    # sum_n |f_n| |A_n| |B_n|^T / N and mean_n |f_n eps_n|: the same estimator on absolute values
    scale = lm_es.leaf_gradients(tree, pm._replace(A={p: a.abs() for p, a in pm.A.items()},
                                                   B={p: b.abs() for p, b in pm.B.items()},
                                                   eps={p: e.abs() for p, e in pm.eps.items()}),
                                 torch.from_numpy(np.abs(f)))
    for leaf in tree.leaves:
        w, g = np.asarray(get(want, leaf.path)), got[leaf.path].numpy()
        assert g.shape == leaf.shape
        if leaf.path in pm.A or leaf.path in pm.eps:
            terms = pop * rank if leaf.path in pm.A else pop
            bound = 2 * (gamma(terms) + U) * scale[leaf.path].numpy() * (1 + gamma(terms + 2))
            assert np.all(np.abs(g - w) <= bound), (leaf.path, np.abs(g - w).max())
            assert np.abs(w).max() > 0, leaf.path
        else:
            np.testing.assert_array_equal(g, np.zeros(leaf.shape))
            np.testing.assert_array_equal(w, np.zeros(leaf.shape))


# ----------------------------------------------------------------------------- knobs
def test_every_tree_knob_resolves_through_a_table_with_exactly_its_values():
    """Like test_layering's check for the CartPole knobs: one table per tree knob, keyed by its values in order."""
    tables = {"rng": TREE_GENERATORS, "stack_keys": STACK_KEYS, "tmm_layout": TMM_LAYOUTS,
              "frozen_leaves": FROZEN_LEAVES, "group_fitness": lm_es.GROUP_FITNESS, "embedding": EMBEDDINGS,
              "leaf_order": LEAF_ORDERS}
    assert set(tables) == set(TREE_CHOICES)
    for knob, table in tables.items():
        assert tuple(table) == TREE_CHOICES[knob], knob


def knob_noise(tree, knobs: TreeKnobs, seed=3, pop=4, rank=2, epoch=1, freeze=True):
    plan = make_plan(tree, knobs, pop, rank, 1, freeze)
    sources = plan.generator.sources(tree, seed, knobs.leaf_order, knobs.stack_keys)
    return per_member(sample(plan, sources, epoch, 0.1)), sources


@pytest.mark.parametrize("d,L", SIZES)
def test_stack_keys_shared_gives_every_slice_the_same_noise(d, L):
    tree = random_tree(d, L)
    for rng in TREE_CHOICES["rng"]:
        ref, _ = knob_noise(tree, TreeKnobs(rng=rng), freeze=False)
        shared, keys = knob_noise(tree, TreeKnobs(rng=rng, stack_keys="shared"), freeze=False)
        for path, t in {**shared.A, **shared.eps}.items():
            leaf = tree.leaf(path)
            if not leaf.stack_shape:
                np.testing.assert_array_equal(t, {**ref.A, **ref.eps}[path])      # unstacked leaves unchanged
                continue
            flat = t.reshape(t.shape[0], leaf.n_slices, -1)
            assert all(torch.equal(flat[:, 0], flat[:, i]) for i in range(leaf.n_slices)), path
            ref_flat = {**ref.A, **ref.eps}[path].reshape(t.shape[0], leaf.n_slices, -1)
            assert not torch.equal(ref_flat[:, 0], ref_flat[:, 1]), path
            if rng == "jax":   # the leaf's own key, split(es_key, n)[i], for every slice
                leaf_key = rnd.split(run_keys(3).es, len(tree.leaves))[tree.paths.index(path)]
                assert (keys[path].reshape(-1, 2) == leaf_key).all(), path


@pytest.mark.parametrize("d,L", SIZES)
def test_tmm_layout_transposed_factors_the_transpose_as_an_mm(d, L):
    """transposed: the (in, out) weight's factors are EggRoll's lowrank_factors of its transpose (out, in)."""
    tree, pop, rank, sigma, seed, epoch = random_tree(d, L), 4, 2, 0.1, 3, 1
    flat, _, _, _, keys = jax_tree_side(tree, seed, np.random.default_rng(d))
    stored, _ = knob_noise(tree, TreeKnobs(), seed, pop, rank, epoch)
    moved, _ = knob_noise(tree, TreeKnobs(tmm_layout="transposed"), seed, pop, rank, epoch)
    frozen = frozen_params(rank, 1, True)
    leaf = tree.leaf("mid.t")
    A, B = jax_member_factors(frozen, sigma, flat["mid.t"].T, as_typed_key(jax_key_words(keys, "mid.t")), epoch, pop)
    np.testing.assert_array_equal(moved.A["mid.t"].numpy(), A)                           # (pop, out, r)
    np.testing.assert_array_equal(moved.B["mid.t"].numpy(), B)                           # (pop, in, r)
    assert dense(moved, leaf).shape == dense(stored, leaf).shape == (pop, *leaf.shape)
    assert not torch.allclose(dense(moved, leaf), dense(stored, leaf))
    for path in moved.A:                                                                  # nothing else moves
        if tree.leaf(path).cls != "tmm":
            assert torch.equal(moved.A[path], stored.A[path]) and torch.equal(moved.B[path], stored.B[path])


def test_frozen_leaves_perturbed_perturbs_and_updates_params_despite_freeze_nonlora():
    tree, pop, seed = random_tree(4, 2), 6, 1
    f = torch.from_numpy(np.random.default_rng(4).standard_normal(pop).astype(np.float32))
    frozen, _ = knob_noise(tree, TreeKnobs(), seed, pop, freeze=True)
    loose, _ = knob_noise(tree, TreeKnobs(frozen_leaves="perturbed"), seed, pop, freeze=True)
    reference, _ = knob_noise(tree, TreeKnobs(), seed, pop, freeze=False)
    assert frozen.eps == {} and set(loose.eps) == {leaf.path for leaf in tree.of_class("param")}
    for path in loose.eps:                          # the noise freeze_nonlora=False would give
        assert torch.equal(loose.eps[path], reference.eps[path])
    g_frozen, g_loose = lm_es.leaf_gradients(tree, frozen, f), lm_es.leaf_gradients(tree, loose, f)
    for leaf in tree.leaves:
        if leaf.cls == "param":
            assert not g_frozen[leaf.path].any() and g_loose[leaf.path].abs().max() > 0
        else:
            assert torch.equal(g_frozen[leaf.path], g_loose[leaf.path])


@pytest.mark.parametrize("d,L", SIZES)
def test_embedding_lowrank_perturbs_and_updates_the_table_like_an_mm(d, L):
    tree, pop, rank, sigma, seed, epoch = random_tree(d, L), 4, 2, 0.1, 6, 2
    flat, _, _, _, keys = jax_tree_side(tree, seed, np.random.default_rng(d + 1))
    off, _ = knob_noise(tree, TreeKnobs(), seed, pop, rank, epoch)
    on, _ = knob_noise(tree, TreeKnobs(embedding="lowrank"), seed, pop, rank, epoch)
    assert "emb" not in off.A
    A, B = jax_member_factors(frozen_params(rank, 1, True), sigma, flat["emb"],
                              as_typed_key(jax_key_words(keys, "emb")), epoch, pop)
    np.testing.assert_array_equal(on.A["emb"].numpy(), A)                                # (pop, V, r)
    np.testing.assert_array_equal(on.B["emb"].numpy(), B)                                # (pop, d, r)
    f = torch.from_numpy(np.random.default_rng(0).standard_normal(pop).astype(np.float32))
    assert not lm_es.leaf_gradients(tree, off, f)["emb"].any()
    assert lm_es.leaf_gradients(tree, on, f)["emb"].abs().max() > 0
    # the lookup: embed[x] + A[x] @ B.T per member, the same as a row of the dense perturbation
    x = torch.from_numpy(np.random.default_rng(1).integers(0, 11, (pop, 5)))
    table = torch.from_numpy(flat["emb"])
    got = lm.Member(on, pop, "cpu").embed("emb", table, x)
    want = table[x] + torch.stack([dense(on, tree.leaf("emb"))[m][x[m]] for m in range(pop)])
    assert torch.allclose(got, want, rtol=0, atol=4 * gamma(rank) * float((table.abs().max() + 1)))


@pytest.mark.parametrize("d,L", SIZES)
def test_leaf_order_insertion_hands_keys_out_in_declaration_order(d, L):
    tree = random_tree(d, L)
    es_key = run_keys(8).es
    split = rnd.split(es_key, len(tree.leaves))
    inserted = es_leaf_keys(tree, es_key, "insertion")
    moved = 0
    for leaf in tree.leaves:
        expected = split[tree.declared.index(leaf.path)]
        for n in leaf.stack_shape:                                      # slice (0, ..., 0)
            expected = rnd.split(expected, n)[0]
        assert torch.equal(inserted[leaf.path].reshape(-1, 2)[0], expected), leaf.path
        moved += tree.declared.index(leaf.path) != tree.paths.index(leaf.path)
    assert moved >= 2     # the test tree declares out of sorted order


@pytest.mark.parametrize("pop,group_size", [(16, 4), (24, 6)])
def test_group_var_divides_each_group_by_its_own_spread(pop, group_size):
    f = torch.from_numpy((np.random.default_rng(pop).standard_normal(pop) *
                          np.repeat(np.arange(1, pop // group_size + 1), group_size)).astype(np.float32))
    own = lm_es.GROUP_FITNESS["group_var"](f, group_size).view(-1, group_size)
    ref = lm_es.GROUP_FITNESS["global_var"](f, group_size).view(-1, group_size)
    groups = f.view(-1, group_size).double()
    want = (groups - groups.mean(1, keepdim=True)) / torch.sqrt(groups.var(1, correction=0, keepdim=True) + 1e-5)
    assert torch.allclose(own.double(), want, rtol=0, atol=gamma(4 * group_size + 8) * 8 * float(want.abs().max()))
    assert not torch.allclose(own, ref)
    assert torch.equal(lm_es.GROUP_FITNESS["group_var"](f, 0), lm_es.GROUP_FITNESS["global_var"](f, 0))


def test_rng_torch_is_deterministic_and_not_jaxs():
    tree = random_tree(4, 2)
    a, _ = knob_noise(tree, TreeKnobs(rng="torch"))
    b, _ = knob_noise(tree, TreeKnobs(rng="torch"))
    j, _ = knob_noise(tree, TreeKnobs())
    for path in a.A:
        assert torch.equal(a.A[path], b.A[path]) and not torch.equal(a.A[path], j.A[path])
        assert torch.equal(a.A[path][0], -a.A[path][1]) and torch.equal(a.B[path][0], a.B[path][1])  # a pair


# ----------------------------------------------------------------------------- the LM
@pytest.mark.parametrize("preset", ["selftest", "quick"])
def test_lm_init_is_the_spec_plan_drawn_with_jax(preset):
    """init_plan's keys and float32 scales written out in JAX here: bit for bit."""
    cfg, seed = LM_PRESETS[preset], 4
    model_key = jax.random.split(jax.random.key(seed), 3)[0]
    top = dict(zip(TOP, jax.random.split(model_key, len(TOP))))
    blocks = jax.vmap(lambda k: jax.random.split(k, len(BLOCK)))(jax.random.split(top["blocks"], cfg.layers))
    ours = init_lm(cfg, seed)
    scale = lambda n: 1 / jnp.sqrt(n)                                                       # noqa: E731
    d, h = cfg.d_model, cfg.d_hidden
    want = {"embed": jax.random.normal(top["embed"], (256, d)) * scale(256),
            "head": jax.random.normal(top["head"], (256, d)) * scale(d),
            "ln_f": jnp.ones(d)}
    draw = lambda j, shape, s: jax.vmap(lambda k: jax.random.normal(k, shape) * s)(blocks[:, j])   # noqa: E731
    want |= {"blocks.wz": draw(2, (d, d), scale(d)), "blocks.wh": draw(4, (d, d), scale(d)),
             "blocks.up": draw(6, (d, h), scale(d)), "blocks.down": draw(7, (d, h), scale(h)),
             "blocks.h0": draw(8, (d,), 0.1), "blocks.ln1": jnp.ones((cfg.layers, d)),
             "blocks.ln2": jnp.ones((cfg.layers, d)), "blocks.bz": jnp.zeros((cfg.layers, d)),
             "blocks.shift": jnp.stack([jnp.ones((cfg.layers, d)), jnp.zeros((cfg.layers, d))], axis=1)}
    assert set(want) == set(ours)
    for path, w in want.items():
        assert ours[path].dtype == torch.float32
        np.testing.assert_array_equal(ours[path].numpy(), np.asarray(w), path)


def lm_members_by_hand(params, tokens, noise, m):
    """One member's score written out loop by loop from spec/lm.py's formula in float64 (a reading check)."""
    P = {k: v.double() for k, v in params.items()}
    pm = per_member(noise) if noise is not None else None

    def mm(path, W, x, l=None, tmm=False):
        out = x @ (W if tmm else W.T)
        if pm is not None and path in pm.A:
            A = (pm.A[path][m] if l is None else pm.A[path][m, l]).double()
            B = (pm.B[path][m] if l is None else pm.B[path][m, l]).double()
            out = out + ((x @ A) @ B.T if tmm else (x @ B) @ A.T)
        return out

    rms = lambda v: v / torch.sqrt((v * v).mean(-1, keepdim=True) + 1e-5)               # noqa: E731
    x = tokens[m].long()
    e = P["embed"][x[:-1]]
    for l in range(P["blocks.wz"].shape[0]):
        u = rms(e) * P["blocks.ln1"][l]
        up = torch.cat([torch.zeros_like(u[:1]), u[:-1]])
        s = P["blocks.shift"][l][0] * u + P["blocks.shift"][l][1] * up
        z = torch.sigmoid(mm("blocks.wz", P["blocks.wz"][l], s, l) + P["blocks.bz"][l])
        c = mm("blocks.wh", P["blocks.wh"][l], s, l)
        h, hs = P["blocks.h0"][l], []
        for t in range(len(s)):
            h = h + z[t] * (c[t] - h)
            hs.append(h)
        e = e + torch.stack(hs)
        v = rms(e) * P["blocks.ln2"][l]
        e = e + mm("blocks.down", P["blocks.down"][l], torch.relu(mm("blocks.up", P["blocks.up"][l], v, l, True)), l)
    logits = mm("head", P["head"], rms(e) * P["ln_f"])
    return float(torch.log_softmax(logits, -1)[torch.arange(len(x) - 1), x[1:]].mean() / math.log(2))


@pytest.mark.parametrize("preset", ["selftest", "quick"])
def test_lm_forward_is_the_spec_formula(preset):
    """The batched forward against the formula member by member in float64: float32 rounding only (1e-4 relative
    is far above the float32 error of a depth-L network of these sizes and far below any misread term)."""
    cfg = LM_PRESETS[preset]
    es = lm_es.make(cfg)
    state = lm_es.init(es, 2)
    tokens = torch.from_numpy(np.random.default_rng(3).integers(0, 256, (cfg.pop, cfg.seq_len + 1)))
    noise, _ = lm_es.ask(es, state)
    scores, inter = lm.forward(state.params, tokens, noise, intermediates=True)
    for m in (0, 1, cfg.pop - 1):
        assert abs(float(scores[m]) - lm_members_by_hand(state.params, tokens, noise, m)) <= 1e-4 * abs(float(scores[m]))
    names = ["embed"] + [f"blocks.{l}.{n}" for l in range(cfg.layers) for n in
                         ("ln1", "shift", "wz", "bz", "wh", "h0", "ln2", "up", "down", "out")] + ["ln_f", "head", "score"]
    assert list(inter) == names
    assert not torch.equal(scores[0], scores[1])                     # the pair's members differ
    off = lm.forward(state.params, tokens)
    assert abs(float(off[0]) - lm_members_by_hand(state.params, tokens, None, 0)) <= 1e-4 * abs(float(off[0]))


def test_a_few_lm_epochs_run_and_change_the_trained_leaves_only():
    cfg = LM_PRESETS["selftest"]
    es = lm_es.make(cfg)
    state = lm_es.init(es, 0)
    tokens = torch.from_numpy(np.random.default_rng(0).integers(0, 256, (cfg.pop, cfg.seq_len + 1)))
    start = dict(state.params)
    for _ in range(2):
        noise, state = lm_es.ask(es, state)
        state, info = lm_es.tell(es, state, noise, lm.forward(state.params, tokens, noise))
    assert state.epoch == 2
    for leaf in es.tree.leaves:
        moved = not torch.equal(start[leaf.path], state.params[leaf.path])
        assert moved == (leaf.cls in ("mm", "tmm")), leaf.path      # freeze_nonlora: params, embed, h0 stay


# ----------------------------------------------------------------------------- the command line
@pytest.mark.parametrize("argv,words", BAD_LM_TRAINER_ARGV + [
    (["--task", "lm", "--torch", "stack_keys=maybe"], "allowed: split, shared"),
    (["--task", "lm", "--torch", "antithetic=off"], "unknown knob"),
    (["--preset", "selftest"], "not a CartPole preset"),
])
def test_bad_lm_input_exits_2_before_any_work(argv, words, capsys):
    from torch_impl.__main__ import main

    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    assert exit_info.value.code == 2
    assert words in capsys.readouterr().err


def test_an_empty_corpus_exits_2(tmp_path, capsys):
    from torch_impl.__main__ import main

    empty = tmp_path / "empty.txt"
    empty.write_bytes(b"")
    with pytest.raises(SystemExit) as exit_info:
        main(["--task", "lm", "--corpus", str(empty)])
    assert exit_info.value.code == 2 and "empty" in capsys.readouterr().err


def test_the_trainer_runs_on_a_random_corpus(tmp_path, capsys):
    pytest.importorskip("rollout.corpus")
    from torch_impl.__main__ import main

    text = tmp_path / "bytes.txt"
    text.write_bytes(np.random.default_rng(0).integers(0, 256, 4000).astype(np.uint8).tobytes())
    assert main(["--task", "lm", "--preset", "selftest", "--epochs", "2", "--corpus", str(text)]) == 0
    out = capsys.readouterr().out
    assert "epoch     1/2" in out and "validation" in out
