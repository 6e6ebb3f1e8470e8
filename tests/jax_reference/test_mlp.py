"""The JAX reference (jax_reference) against each rule of the reference's described behaviour (DESIGN.md), one rule per test.

Exact checks where our code and the check run the same float32 operations on the same draws (keys,
normals, the ±sigma products); float64 references with float32 rounding bounds (written at each
check) where products and sums are involved.
"""
import math

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from jax_reference.models import (ACTIVATIONS, EMB_PARAM, EXCLUDED, MLP, MM_PARAM, PARAM, TMM, Embedding, Linear,
                                  layer_norm, simple_es_tree_key)
from jax_reference.noiser import EggRoll, es_grads, lowrank_factors, lowrank_sigma, true_epoch
from jax_reference.population import (flat_to_params, leaf_names, make_cached_population_forward, make_forward,
                                      make_population_forward, member_noise_tree, params_to_flat,
                                      population_iterinfos, population_noise)
from torch_impl.keys import true_epoch as torch_true_epoch

U = 2.0 ** -24   # float32 unit roundoff


def gamma(k: int) -> float:
    """Higham's gamma_k = k u / (1 - k u): bound on the relative error of a k-term float32 sum of products."""
    return k * U / (1 - k * U)


def key_data(k) -> np.ndarray:
    return np.asarray(jax.random.key_data(k))


def normal(key, shape) -> np.ndarray:
    return np.asarray(jax.random.normal(key, shape, jnp.float32))


def member_key(k, epoch, thread, noise_reuse):
    """The rule, written out: fold_in(fold_in(k, true_epoch), thread // 2)."""
    te = 0 if noise_reuse == 0 else epoch // noise_reuse
    return jax.random.fold_in(jax.random.fold_in(k, te), thread // 2)


def a_scale(sigma, rank, thread) -> np.float32:
    """±sigma/sqrt(r) in float32: float32(sigma) / float32(sqrt(r)), negated for odd members."""
    s = np.float32(sigma) / np.float32(math.sqrt(rank))
    return np.float32(s if thread % 2 == 0 else -s)


# One standard model for most tests: every new array shape costs JAX a compile of its threefry
# normal (seconds on a busy 2-core machine), so tests share these shapes and vary values instead.
HIDDEN, POP, RANK = [6], 8, 2         # leaves 0.bias (6,), 0.weight (6, 4), 1.bias (2,), 1.weight (2, 6)


def random_tree(names_shapes, seed):
    """A params pytree of random (never zero) float32 values from dotted names."""
    rng = np.random.default_rng(seed)
    return flat_to_params({n: rng.standard_normal(shape).astype(np.float32) for n, shape in names_shapes})


def mlp(seed, hidden=HIDDEN, activation="pqn", perturb=True, in_dim=4, out_dim=2):
    """An MLP init with (optionally) random non-zero biases and weights, so no rule hides behind zeros."""
    init = MLP.rand_init(jax.random.key(seed), in_dim, out_dim, hidden, True, activation, jnp.float32)
    if not perturb:
        return init
    rng = np.random.default_rng(seed)
    params = jax.tree.map(lambda p: jnp.asarray(np.asarray(p) + 0.3 * rng.standard_normal(p.shape, np.float32)),
                          init.params)
    return init._replace(params=params)


# ----------------------------------------------------------------------------- keys
@pytest.mark.parametrize("n_layers", [3, 11])
def test_es_tree_key_gives_leaf_i_split_i_in_flatten_order(n_layers):
    sizes = [4] + [5] * (n_layers - 1) + [2]
    params = random_tree([(f"{t}.{leaf}", (sizes[t + 1], sizes[t]) if leaf == "weight" else (sizes[t + 1],))
                          for t in range(n_layers) for leaf in ("weight", "bias")], n_layers)
    es_key = jax.random.key(1000 + n_layers)
    tree = simple_es_tree_key(params, es_key, jax.tree.map(lambda _: (), params))
    names = leaf_names(params)
    expected_names = sorted(f"{t}.{leaf}" for t in range(n_layers) for leaf in ("bias", "weight"))  # string sort
    assert names == expected_names
    if n_layers == 11:
        assert names[2:4] == ["1.bias", "1.weight"] and names[4] == "10.bias"    # "10" sorts before "2"
    splits = jax.random.split(es_key, 2 * n_layers)
    for i, name in enumerate(names):
        layer, leaf = name.split(".")
        np.testing.assert_array_equal(key_data(tree[layer][leaf]), key_data(splits[i]), err_msg=name)


def test_raw_uint32_keys_give_the_same_tree_as_typed_keys():
    init = mlp(2, perturb=False)
    typed = simple_es_tree_key(init.params, jax.random.key(77), init.scan_map)
    raw = simple_es_tree_key(init.params, jax.random.PRNGKey(77), init.scan_map)
    for a, b in zip(jax.tree.leaves(typed), jax.tree.leaves(raw)):
        np.testing.assert_array_equal(key_data(a), key_data(b))


def test_scanned_axes_split_the_leaf_key_once_more():
    params = random_tree([("stack.w", (3, 6, 4)), ("w", (6, 4))], 5)
    scan_map = {"stack": {"w": (0,)}, "w": ()}
    tree = simple_es_tree_key(params, jax.random.key(50), scan_map)
    leaf_keys = jax.random.split(jax.random.key(50), 2)                 # flatten order: stack.w, w
    assert tree["stack"]["w"].shape == (3,) and tree["w"].shape == ()
    np.testing.assert_array_equal(key_data(tree["stack"]["w"]), key_data(jax.random.split(leaf_keys[0], 3)))
    np.testing.assert_array_equal(key_data(tree["w"]), key_data(leaf_keys[1]))


# ----------------------------------------------------------------------------- noise
@pytest.mark.parametrize("shape,rank,sigma,noise_reuse", [((6, 4), 2, 0.2, 0), ((3, 7), 3, 0.05, 2), ((2, 6), 2, 1.3, 1)])
def test_lowrank_factors_are_one_draw_b_first_then_a_times_sigma_over_sqrt_r(shape, rank, sigma, noise_reuse):
    a, b = shape
    key = jax.random.key(a * 100 + b)
    frozen, nparams = EggRoll.init_noiser({}, sigma, 0.1, rank=rank, noise_reuse=noise_reuse)
    param = jnp.ones(shape, jnp.float32)
    for epoch, thread in [(0, 0), (5, 3), (9, 6)]:
        A, B = lowrank_factors(frozen, lowrank_sigma(nparams, frozen), (epoch, thread), param, key)
        z = normal(member_key(key, epoch, thread, noise_reuse), (a + b, rank))
        np.testing.assert_array_equal(np.asarray(B), z[:b])                                # B = Z[:b]
        np.testing.assert_array_equal(np.asarray(A), z[b:] * a_scale(sigma, rank, thread))  # A = Z[b:] * s


def test_noise_reuse_zero_gives_the_same_noise_every_epoch():
    init = mlp(4)
    es_tree_key = simple_es_tree_key(init.params, jax.random.key(5), init.scan_map)
    frozen, nparams = EggRoll.init_noiser(init.params, 0.3, 0.1, rank=RANK, noise_reuse=0)
    first = population_noise(frozen, nparams, init.params, es_tree_key, init.es_map, 0, POP)
    for epoch in (1, 7, 1234):
        later = population_noise(frozen, nparams, init.params, es_tree_key, init.es_map, epoch, POP)
        for part in ("A", "B", "bias"):
            for name, value in getattr(first, part).items():
                np.testing.assert_array_equal(getattr(later, part)[name], value, err_msg=f"{part} {name} epoch {epoch}")


def test_noise_reuse_k_changes_the_noise_only_at_multiples_of_k():
    init = mlp(6)
    es_tree_key = simple_es_tree_key(init.params, jax.random.key(6), init.scan_map)
    frozen, nparams = EggRoll.init_noiser(init.params, 0.3, 0.1, rank=RANK, noise_reuse=3)
    draws = [population_noise(frozen, nparams, init.params, es_tree_key, init.es_map, e, POP) for e in range(7)]
    for e in range(1, 7):
        same = np.array_equal(draws[e].B["0.weight"], draws[e - 1].B["0.weight"])
        assert same == (e % 3 != 0), f"epoch {e}: noise {'kept' if same else 'changed'}"
        bias_same = np.array_equal(draws[e].bias["1.bias"], draws[e - 1].bias["1.bias"])
        assert bias_same == (e % 3 != 0)
    # and the key is fold_in(k, epoch // 3): epoch 5 uses true epoch 1
    z = normal(member_key(es_tree_key["1"]["weight"], 5, 2, 3), (2 + 6, RANK))
    np.testing.assert_array_equal(draws[5].B["1.weight"][2], z[:6])


@pytest.mark.parametrize("noise_reuse", [2, 3, 7])
def test_true_epoch_takes_epoch_then_noise_reuse_like_the_torch_side(noise_reuse):
    epochs = np.random.default_rng(noise_reuse).integers(1, 10_000, size=20)
    for e in epochs:
        assert true_epoch(int(e), noise_reuse) == torch_true_epoch(int(e), noise_reuse) == int(e) // noise_reuse
        assert true_epoch(int(e), 0) == torch_true_epoch(int(e), 0) == 0          # noise_reuse 0: epoch 0 forever


@pytest.mark.parametrize("seed,sigma", [(4, 0.25), (10, 1.5)])
def test_pair_members_share_the_draw_with_opposite_signs(seed, sigma):
    init = mlp(seed)
    es_tree_key = simple_es_tree_key(init.params, jax.random.key(seed), init.scan_map)
    frozen, nparams = EggRoll.init_noiser(init.params, sigma, 0.1, rank=RANK)
    noise = population_noise(frozen, nparams, init.params, es_tree_key, init.es_map, 2, POP)
    for name in noise.A:
        A, B = noise.A[name], noise.B[name]
        np.testing.assert_array_equal(A[0::2], -A[1::2])        # member 2p+1 = mirror of 2p
        np.testing.assert_array_equal(B[0::2], B[1::2])
        assert not np.array_equal(A[0], A[2]) and not np.array_equal(B[0], B[2])   # pairs differ
    for name, eps in noise.bias.items():
        np.testing.assert_array_equal(eps[0::2], -eps[1::2])
        assert not np.array_equal(eps[0], eps[2])


def test_population_noise_is_the_noisers_draw_for_every_member():
    init = mlp(8)
    es_tree_key = simple_es_tree_key(init.params, jax.random.key(8), init.scan_map)
    sigma, rank, epoch, pop = 0.15, RANK, 4, POP
    frozen, nparams = EggRoll.init_noiser(init.params, sigma, 0.1, rank=rank, noise_reuse=3)
    noise = population_noise(frozen, nparams, init.params, es_tree_key, init.es_map, epoch, pop)
    assert sorted(noise.A) == ["0.weight", "1.weight"] and sorted(noise.bias) == ["0.bias", "1.bias"]
    for t in range(pop):
        for layer in ("0", "1"):
            W = init.params[layer]["weight"]
            out, inp = W.shape
            z = normal(member_key(es_tree_key[layer]["weight"], epoch, t, 3), (out + inp, rank))
            np.testing.assert_array_equal(noise.B[f"{layer}.weight"][t], z[:inp])
            np.testing.assert_array_equal(noise.A[f"{layer}.weight"][t], z[inp:] * a_scale(sigma, rank, t))
            eps = normal(member_key(es_tree_key[layer]["bias"], epoch, t, 3), (out,))
            s = np.float32(sigma if t % 2 == 0 else -sigma)                     # no sqrt(r) on biases
            np.testing.assert_array_equal(noise.bias[f"{layer}.bias"][t], eps * s)


def test_freeze_nonlora_gives_zero_bias_noise_and_plain_biases():
    init = mlp(9)
    es_tree_key = simple_es_tree_key(init.params, jax.random.key(9), init.scan_map)
    frozen, nparams = EggRoll.init_noiser(init.params, 0.3, 0.1, rank=RANK, freeze_nonlora=True)
    noise = population_noise(frozen, nparams, init.params, es_tree_key, init.es_map, 0, POP)
    assert all(np.all(v == 0) and v.shape == (POP,) + init.params[k[0]]["bias"].shape for k, v in noise.bias.items())
    b = init.params["0"]["bias"]
    assert EggRoll.get_noisy_standard(frozen, nparams, b, es_tree_key["0"]["bias"], (0, 1)) is b


@pytest.mark.parametrize("shape", [(6,), (3, 4)])
def test_get_noisy_standard_adds_sigma_times_eps(shape):
    rng = np.random.default_rng(len(shape))
    param = jnp.asarray(rng.standard_normal(shape, np.float32))
    key = jax.random.key(31)
    frozen, nparams = EggRoll.init_noiser({}, 0.4, 0.1, rank=4, noise_reuse=2)
    for epoch, thread in [(0, 0), (3, 5)]:
        got = np.asarray(EggRoll.get_noisy_standard(frozen, nparams, param, key, (epoch, thread)))
        eps = normal(member_key(key, epoch, thread, 2), shape)
        s = np.float32(0.4 if thread % 2 == 0 else -0.4)
        np.testing.assert_array_equal(got, np.asarray(param) + eps * s)   # eager: multiply, then add, in float32
    assert EggRoll.get_noisy_standard(frozen, nparams, param, key, None) is param


# ----------------------------------------------------------------------------- perturbed products
def _f64(x):
    return np.asarray(x, np.float64)


@pytest.mark.parametrize("out_dim,in_dim,rank,batch", [(6, 4, 2, 3), (2, 6, 2, 5), (5, 3, 1, 4)])
def test_do_mm_is_xWT_plus_xBAT_within_float32_rounding(out_dim, in_dim, rank, batch):
    rng = np.random.default_rng(out_dim * in_dim)
    W = jnp.asarray(rng.standard_normal((out_dim, in_dim), np.float32))
    x = jnp.asarray(rng.standard_normal((batch, in_dim), np.float32))
    key = jax.random.key(in_dim)
    frozen, nparams = EggRoll.init_noiser({}, 0.3, 0.1, rank=rank)
    for thread in (0, 1, 4):
        got = _f64(EggRoll.do_mm(frozen, nparams, W, key, (2, thread), x))
        A, B = lowrank_factors(frozen, lowrank_sigma(nparams, frozen), (2, thread), W, key)
        want = _f64(x) @ (_f64(W) + _f64(A) @ _f64(B).T).T                  # materialised, float64
        # Bound: dot products of length in_dim and rank, two additions: gamma_(in+r+2) times the
        # same sums taken over absolute values.
        scale = np.abs(_f64(x)) @ np.abs(_f64(W)).T + (np.abs(_f64(x)) @ np.abs(_f64(B))) @ np.abs(_f64(A)).T
        assert np.all(np.abs(got - want) <= gamma(in_dim + rank + 2) * scale)
    np.testing.assert_array_equal(np.asarray(EggRoll.do_mm(frozen, nparams, W, key, None, x)), np.asarray(x @ W.T))


@pytest.mark.parametrize("in_dim,out_dim,rank", [(4, 6, 2), (3, 5, 1)])
def test_do_Tmm_is_xW_plus_xABT_for_a_weight_stored_in_out(in_dim, out_dim, rank):
    rng = np.random.default_rng(in_dim + out_dim)
    W = jnp.asarray(rng.standard_normal((in_dim, out_dim), np.float32))
    x = jnp.asarray(rng.standard_normal((3, in_dim), np.float32))
    key = jax.random.key(2 * in_dim)
    frozen, nparams = EggRoll.init_noiser({}, 0.3, 0.1, rank=rank)
    got = _f64(EggRoll.do_Tmm(frozen, nparams, W, key, (0, 3), x))
    z = normal(member_key(key, 0, 3, 0), (in_dim + out_dim, rank))         # a = in_dim, b = out_dim
    A, B = z[out_dim:] * a_scale(0.3, rank, 3), z[:out_dim]
    want = _f64(x) @ (_f64(W) + _f64(A) @ _f64(B).T)
    scale = np.abs(_f64(x)) @ np.abs(_f64(W)) + (np.abs(_f64(x)) @ np.abs(_f64(A))) @ np.abs(_f64(B)).T
    assert np.all(np.abs(got - want) <= gamma(in_dim + rank + 2) * scale)
    np.testing.assert_array_equal(np.asarray(EggRoll.do_Tmm(frozen, nparams, W, key, None, x)), np.asarray(x @ W))


def test_tmm_init_and_embedding_lookup_without_noise():
    t = TMM.rand_init(jax.random.key(3), 6, 4, jnp.float32)
    assert t.params.shape == (6, 4) and t.es_map == MM_PARAM
    e = Embedding.rand_init(jax.random.key(4), 6, 4, jnp.float32)
    frozen, nparams = EggRoll.init_noiser({}, 0.3, 0.1)
    idx = jnp.array([3, 0, 5])
    got = EggRoll.do_emb(frozen, nparams, e.params, jax.random.key(0), (0, 1), idx)
    np.testing.assert_array_equal(np.asarray(got), np.asarray(e.params)[[3, 0, 5]])
    assert e.es_map == EMB_PARAM


# ----------------------------------------------------------------------------- fitness shaping
@pytest.mark.parametrize("n,loc,spread", [(6, 100, 30), (32, 100, 30), (16, 0, 1e-3)])   # last: eps 1e-5 > var
def test_convert_fitnesses_whole_population(n, loc, spread):
    f = np.random.default_rng(n).normal(loc, spread, n).astype(np.float32)
    frozen, nparams = EggRoll.init_noiser({}, 0.3, 0.1)
    got = np.asarray(EggRoll.convert_fitnesses(frozen, nparams, jnp.asarray(f)))
    f64 = f.astype(np.float64)
    want = (f64 - f64.mean()) / np.sqrt(f64.var() + 1e-5)                    # ddof 0, eps inside the root
    # float32 mean/var of n terms: errors of a few gamma_n * |f|, relative to the spread they divide by.
    assert np.allclose(got, want, rtol=0, atol=4 * gamma(n) * np.abs(f64).max() / f64.std() + 4 * U)
    assert not np.allclose(got, (f64 - f64.mean()) / f64.std(ddof=1), rtol=0, atol=1e-3)   # not ddof 1


def test_convert_fitnesses_groups_use_group_means_and_the_global_variance():
    rng = np.random.default_rng(3)
    f = np.concatenate([rng.normal(0, 1, 4), rng.normal(50, 20, 4), rng.normal(-9, 5, 4)]).astype(np.float32)
    frozen, nparams = EggRoll.init_noiser({}, 0.3, 0.1, group_size=4)
    got = np.asarray(EggRoll.convert_fitnesses(frozen, nparams, jnp.asarray(f)))
    g = f.astype(np.float64).reshape(3, 4)
    want = ((g - g.mean(axis=1, keepdims=True)) / np.sqrt(f.astype(np.float64).var() + 1e-5)).ravel()
    assert np.allclose(got, want, rtol=0, atol=8 * gamma(12) * np.abs(f).max() / f.std() + 4 * U)
    per_group = ((g - g.mean(axis=1, keepdims=True)) / np.sqrt(g.var(axis=1, keepdims=True) + 1e-5)).ravel()
    assert not np.allclose(got, per_group, atol=1e-2)                        # not the groups' own variance
    with pytest.raises(ValueError, match="group_size"):
        EggRoll.convert_fitnesses({"group_size": 5}, nparams, jnp.asarray(f))


# ----------------------------------------------------------------------------- updates
def _setup(seed, hidden=HIDDEN, pop=POP, rank=RANK, sigma=0.2, lr=0.1, **kw):
    init = mlp(seed, hidden)
    es_tree_key = simple_es_tree_key(init.params, jax.random.key(seed + 1), init.scan_map)
    frozen, nparams = EggRoll.init_noiser(init.params, sigma, lr, rank=rank, **kw)
    f = jnp.asarray(np.random.default_rng(seed).standard_normal(pop).astype(np.float32))
    return init, es_tree_key, frozen, nparams, f


@pytest.mark.parametrize("seed,epoch", [(8, 0), (14, 3)])
def test_es_grads_are_einsum_over_n_and_mean_f_eps_sigma(seed, epoch):
    pop = POP
    init, keys, frozen, nparams, f = _setup(seed, noise_reuse=2)
    grads = es_grads(frozen, nparams, init.params, keys, f, population_iterinfos(epoch, pop), init.es_map)
    noise = population_noise(frozen, nparams, init.params, keys, init.es_map, epoch, pop)
    f64 = _f64(f)
    for name, A in noise.A.items():
        layer = name.split(".")[0]
        want = np.einsum("nir,njr->ij", f64[:, None, None] * _f64(A), _f64(noise.B[name])) / pop
        scale = np.einsum("nir,njr->ij", np.abs(f64)[:, None, None] * np.abs(_f64(A)), np.abs(_f64(noise.B[name]))) / pop
        assert np.all(np.abs(_f64(grads[layer]["weight"]) - want) <= gamma(pop * RANK + 3) * scale), name
    for name, eps in noise.bias.items():
        layer = name.split(".")[0]
        want = (f64[:, None] * _f64(eps)).mean(axis=0)
        scale = (np.abs(f64)[:, None] * np.abs(_f64(eps))).mean(axis=0)
        assert np.all(np.abs(_f64(grads[layer]["bias"]) - want) <= gamma(pop + 3) * scale), name


@pytest.mark.parametrize("seed,lr", [(8, 0.1), (20, 0.03)])
def test_sgd_step_moves_params_by_plus_lr_sqrt_n_g(seed, lr):
    pop = POP
    init, keys, frozen, nparams, f = _setup(100 + seed, lr=lr)
    iterinfos = population_iterinfos(1, pop)
    grads = es_grads(frozen, nparams, init.params, keys, f, iterinfos, init.es_map)
    new_nparams, new = EggRoll.do_updates(frozen, nparams, init.params, keys, f, iterinfos, init.es_map)
    assert new_nparams is nparams and set(new_nparams) == {"sigma", "opt_state"}    # updated in place, as upstream
    for p_old, p_new, g in zip(jax.tree.leaves(init.params), jax.tree.leaves(new), jax.tree.leaves(grads)):
        step = lr * math.sqrt(pop) * _f64(g)
        # -(g*sqrt N) rounded, times -lr rounded, added to p rounded: 3 roundings of these magnitudes.
        tol = 3 * U * (np.abs(step) + np.abs(_f64(p_new)))
        assert np.all(np.abs(_f64(p_new) - (_f64(p_old) + step)) <= tol)
        assert np.any(step != 0)


@pytest.mark.parametrize("solver", ["adam", "adamw"])
def test_adam_and_adamw_run_through_optax_with_their_defaults(solver):
    pop, lr = POP, 0.01
    init, keys, frozen, nparams, f = _setup(7, lr=lr, solver=getattr(optax, solver))
    iterinfos = population_iterinfos(0, pop)
    grads = es_grads(frozen, nparams, init.params, keys, f, iterinfos, init.es_map)
    _, new = EggRoll.do_updates(frozen, nparams, init.params, keys, f, iterinfos, init.es_map)
    wd = 1e-4 if solver == "adamw" else 0.0                                  # optax.adamw's default weight decay
    for p_old, p_new, g in zip(jax.tree.leaves(init.params), jax.tree.leaves(new), jax.tree.leaves(grads)):
        d = -_f64(g) * math.sqrt(pop)                                        # what the solver is handed
        # First Adam step: m_hat = d, v_hat = d^2, update = -lr * d / (|d| + 1e-8) (- lr * wd * p for adamw).
        want = _f64(p_old) - lr * d / (np.abs(d) + 1e-8) - lr * wd * _f64(p_old)
        # optax works in float32: its bias corrections (1 - b2 as float32(0.001) vs 1 - float32(0.999))
        # differ by 1.3e-5 relative, i.e. 6.5e-6 on the step after the square root; 2e-5 * lr covers
        # it, plus a few roundings of p. A wrong sign or scale moves p by ~lr.
        assert np.allclose(_f64(p_new), want, rtol=0, atol=2e-5 * lr + 4 * U * np.abs(_f64(p_old)))


def test_batched_update_equals_the_per_leaf_update():
    # two (6, 4) weights share a bucket, and so do two (6,) biases
    params = random_tree([("a.w", (6, 4)), ("b.w", (6, 4)), ("a.b", (6,)), ("b.b", (6,))], 21)
    es_map = jax.tree_util.tree_map_with_path(lambda p, _: MM_PARAM if p[-1].key == "w" else PARAM, params)
    keys = simple_es_tree_key(params, jax.random.key(21), jax.tree.map(lambda _: (), params))
    f = jnp.asarray(np.random.default_rng(21).standard_normal(POP).astype(np.float32))
    frozen, nparams = EggRoll.init_noiser(params, 0.2, 0.1, rank=RANK)
    frozen_b, nparams_b = EggRoll.init_noiser(params, 0.2, 0.1, rank=RANK, use_batched_update=True)
    iterinfos = population_iterinfos(2, POP)
    _, per_leaf = EggRoll.do_updates(frozen, nparams, params, keys, f, iterinfos, es_map)
    _, batched = EggRoll.do_updates(frozen_b, nparams_b, params, keys, f, iterinfos, es_map)
    for name, p, a, b in zip(leaf_names(params), jax.tree.leaves(params), jax.tree.leaves(per_leaf),
                             jax.tree.leaves(batched)):
        # Same noise, same sums; vmapping may only change how XLA orders a sum: a few ulps of the step.
        step = np.abs(_f64(a) - _f64(p))
        assert np.all(step > 0), name
        assert np.all(np.abs(_f64(a) - _f64(b)) <= 4 * U * (np.abs(_f64(a)) + step)), name


def test_embedding_and_excluded_leaves_are_neither_perturbed_nor_updated():
    rng = np.random.default_rng(4)
    params = {k: jnp.asarray(rng.standard_normal((6, 4), np.float32)) for k in ("emb", "ex", "w")}
    es_map = {"emb": EMB_PARAM, "ex": EXCLUDED, "w": MM_PARAM}
    keys = simple_es_tree_key(params, jax.random.key(4), {k: () for k in params})
    f = jnp.asarray(rng.standard_normal(POP).astype(np.float32))
    for batched in (False, True):
        # (the batched path's MM bucket is compared with the per-leaf path in the test above)
        leaves = ("emb", "ex", "w") if not batched else ("emb", "ex")
        sub = {k: params[k] for k in leaves}
        frozen, nparams = EggRoll.init_noiser(sub, 0.2, 0.5, rank=2, use_batched_update=batched)
        _, new = EggRoll.do_updates(frozen, nparams, sub, {k: keys[k] for k in leaves}, f,
                                    population_iterinfos(0, POP), {k: es_map[k] for k in leaves})
        np.testing.assert_array_equal(np.asarray(new["emb"]), np.asarray(params["emb"]))
        np.testing.assert_array_equal(np.asarray(new["ex"]), np.asarray(params["ex"]))
        if not batched:
            assert not np.array_equal(np.asarray(new["w"]), np.asarray(params["w"]))


def test_freeze_nonlora_leaves_biases_in_place_and_still_moves_weights():
    init, keys, frozen, nparams, f = _setup(5, freeze_nonlora=True)
    _, new = EggRoll.do_updates(frozen, nparams, init.params, keys, f, population_iterinfos(0, POP), init.es_map)
    for layer in ("0", "1"):
        np.testing.assert_array_equal(np.asarray(new[layer]["bias"]), np.asarray(init.params[layer]["bias"]))
        assert not np.array_equal(np.asarray(new[layer]["weight"]), np.asarray(init.params[layer]["weight"]))


# ----------------------------------------------------------------------------- models
@pytest.mark.parametrize("hidden,activation", [([6], "pqn"), ([6, 6], "silu")])
def test_mlp_init_normal_over_sqrt_in_zero_bias_one_key_per_layer(hidden, activation):
    model_key = jax.random.key(len(hidden) * 10 + 1)
    init = MLP.rand_init(model_key, 4, 2, hidden, True, activation, jnp.float32)
    sizes = [4] + hidden + [2]
    layer_keys = jax.random.split(model_key, len(sizes) - 1)
    assert init.frozen_params == {"activation": activation}
    for t in range(len(sizes) - 1):
        inp, out = sizes[t], sizes[t + 1]
        want = normal(layer_keys[t], (out, inp)) * np.float32(np.float32(1) / np.float32(math.sqrt(inp)))
        np.testing.assert_array_equal(np.asarray(init.params[str(t)]["weight"]), want)
        np.testing.assert_array_equal(np.asarray(init.params[str(t)]["bias"]), np.zeros(out, np.float32))
        assert init.es_map[str(t)] == {"weight": MM_PARAM, "bias": PARAM}
        assert init.scan_map[str(t)] == {"weight": (), "bias": ()}
    with pytest.raises(ValueError, match="unknown activation"):
        MLP.rand_init(model_key, 4, 2, hidden, True, "gelu", jnp.float32)
    no_bias = Linear.rand_init(model_key, 3, 2, False, jnp.float32)
    assert set(no_bias.params) == {"weight"}


@pytest.mark.parametrize("width", [5, 64])
def test_activations(width):
    x = np.random.default_rng(width).normal(1.0, 3.0, (4, width)).astype(np.float32)
    x64 = x.astype(np.float64)
    ln = (x64 - x64.mean(-1, keepdims=True)) / np.sqrt(x64.var(-1, keepdims=True) + 1e-5)   # population var
    # mean, var over `width` terms then a divide: a few gamma_width relative to |x - mean| / std.
    tol = 8 * gamma(width) * (np.abs(x64).max() / x64.std(-1, keepdims=True) + 1)
    assert np.all(np.abs(np.asarray(layer_norm(jnp.asarray(x))) - ln) <= tol)
    assert np.all(np.abs(np.asarray(ACTIVATIONS["pqn"](jnp.asarray(x))) - np.maximum(ln, 0)) <= tol)
    np.testing.assert_array_equal(np.asarray(ACTIVATIONS["relu"](jnp.asarray(x))), np.maximum(x, 0))
    silu = x64 / (1 + np.exp(-x64))
    assert np.allclose(np.asarray(ACTIVATIONS["silu"](jnp.asarray(x))), silu, rtol=8 * U, atol=8 * U)


@pytest.mark.parametrize("hidden,activation", [([6], "pqn"), ([6, 6], "tanh")])
def test_plain_forward_is_the_layers_with_activations_between(hidden, activation):
    init = mlp(3, hidden, activation)
    frozen, nparams = EggRoll.init_noiser(init.params, 0.2, 0.1)
    x = np.random.default_rng(0).standard_normal((5, 4)).astype(np.float32)
    got = np.asarray(make_forward(init.frozen_params, frozen)(nparams, init.params, jnp.asarray(x)))
    h = x.astype(np.float64)
    n = len(hidden) + 1
    for t in range(n):
        h = h @ _f64(init.params[str(t)]["weight"]).T + _f64(init.params[str(t)]["bias"])
        if t < n - 1:
            if activation == "pqn":
                h = np.maximum((h - h.mean(-1, keepdims=True)) / np.sqrt(h.var(-1, keepdims=True) + 1e-5), 0)
            else:
                h = np.tanh(h)
    # Each layer's rounding is amplified by at most the next layers' gains; 1e-5 relative is
    # ~100 ulps: far above float32 rounding here, far below any rule breaking (O(1) changes).
    assert np.allclose(got, h, rtol=1e-5, atol=1e-5)


# ----------------------------------------------------------------------------- population forwards
@pytest.fixture(scope="module")
def forwards():
    """The jitted population forwards of the standard model, compiled once for the module."""
    init = mlp(0)
    frozen, _ = EggRoll.init_noiser(init.params, 0.2, 0.1, rank=RANK, noise_reuse=2)
    return (frozen, make_population_forward(init.frozen_params, frozen),
            make_cached_population_forward(init.frozen_params, frozen), make_forward(init.frozen_params, frozen))


@pytest.mark.parametrize("seed,epoch,sigma", [(6, 0, 0.17), (10, 3, 0.9)])
def test_population_forwards_give_member_i_the_noise_of_thread_i(forwards, seed, epoch, sigma):
    frozen, direct_fn, cached_fn, plain_fn = forwards
    init = mlp(seed)
    keys = simple_es_tree_key(init.params, jax.random.key(seed + 1), init.scan_map)
    nparams = {**EggRoll.init_noiser(init.params, 0.2, 0.1, rank=RANK)[1], "sigma": jnp.float32(sigma)}
    x = np.random.default_rng(seed).standard_normal((POP, 4)).astype(np.float32)
    direct = np.asarray(direct_fn(nparams, init.params, keys, epoch, x))
    noise_tree = member_noise_tree(frozen, nparams, init.params, keys, init.es_map, epoch, POP)
    cached = np.asarray(cached_fn(nparams, init.params, noise_tree, x))
    noise = population_noise(frozen, nparams, init.params, keys, init.es_map, epoch, POP)
    assert direct.shape == cached.shape == (POP, 2)
    # member t by hand in float64: every layer perturbed by thread t's factors and bias noise
    h = _f64(x)
    for layer in ("0", "1"):
        W, b = _f64(init.params[layer]["weight"]), _f64(init.params[layer]["bias"])
        A, B, eps = (_f64(noise.A[f"{layer}.weight"]), _f64(noise.B[f"{layer}.weight"]),
                     _f64(noise.bias[f"{layer}.bias"]))
        h = h @ W.T + np.einsum("ti,tir,tor->to", h, B, A) + b + eps
        if layer == "0":
            h = np.maximum((h - h.mean(-1, keepdims=True)) / np.sqrt(h.var(-1, keepdims=True) + 1e-5), 0)
    # Float32 rounding, amplified by the layer norm's 1/std and the next layer's gain: 1e-5 is ~100
    # ulps, far below what a wrong member, layer or sign would change (O(sigma)).
    assert np.allclose(direct, h, rtol=1e-5, atol=1e-5)
    assert np.allclose(cached, h, rtol=1e-5, atol=1e-5)
    # and each member's noise is its own: every row differs from the unperturbed forward
    plain = np.asarray(plain_fn(nparams, init.params, x))
    assert np.all(np.abs(direct - plain).max(axis=1) > 1e-3)


def test_params_flat_round_trip_and_names():
    params = random_tree([(f"{t}.{leaf}", (3, 3) if leaf == "weight" else (3,)) for t in range(11)
                          for leaf in ("weight", "bias")], 12)
    flat = params_to_flat(params)
    assert list(flat) == leaf_names(params) and list(flat)[:5] == ["0.bias", "0.weight", "1.bias", "1.weight", "10.bias"]
    back = flat_to_params(flat)
    assert jax.tree.structure(back) == jax.tree.structure(params)
    for a, b in zip(jax.tree.leaves(back), jax.tree.leaves(params)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    with pytest.raises(ValueError, match="duplicate|nests"):
        flat_to_params({"0.weight": np.ones(2), "0.weight.x": np.ones(2)})


# ----------------------------------------------------------------------------- bad input
def test_input_upstream_also_rejects_gets_a_clear_error():
    # What EggRoll accepts is upstream's business (tests/jax_reference/test_dropin.py); what both
    # reject gets a message naming the problem: population shapes (es_grads) and es_map classes.
    init, keys, frozen, nparams, f = _setup(2)
    with pytest.raises(ValueError, match="must have shape"):
        es_grads(frozen, nparams, init.params, keys, f, population_iterinfos(0, POP - 2), init.es_map)
    with pytest.raises(ValueError, match="1-D array"):
        es_grads(frozen, nparams, init.params, keys, f[None], population_iterinfos(0, POP), init.es_map)
    with pytest.raises(ValueError, match="es_map value"):
        EggRoll.do_updates(frozen, nparams, init.params, keys, f, population_iterinfos(0, POP),
                           jax.tree.map(lambda _: 7, init.es_map))
