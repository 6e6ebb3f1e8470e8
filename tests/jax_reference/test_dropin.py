"""jax_reference as a drop-in for upstream's EggRoll: the interface used the way outside code uses it.

Outside code subclasses EggRoll and overrides its hooks, passes one settings dict to every noiser
(extra positional and keyword arguments included), ignores the noiser_params that do_updates
returns (upstream updates the caller's dict in place), and runs the same calls eagerly and under
jit. The expected signatures and behaviours are upstream's (HyperscaleES `hyperscalees.noiser.eggroll`
and `hyperscalees.models.common`), written out here; upstream itself is not imported.
"""
import inspect

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from jax_reference import models
from jax_reference.models import MLP, simple_es_tree_key
from jax_reference.noiser import EggRoll, Noiser, apply_grads, es_grads, get_lora_update_params, \
    get_nonlora_update_params, solver_input
from jax_reference.population import leaf_names, population_iterinfos

U = 2.0 ** -24   # float32 unit roundoff

# Two population sizes and MLP shapes; each new shape costs a compile, so the tests share these.
SIZES = [(8, [5]), (12, [7, 3])]


class Setup:
    """A random (never zero) MLP, its ES keys, fitness and iterinfos for one population size."""

    def __init__(self, seed: int, pop: int, hidden: list[int]):
        rng = np.random.default_rng(seed)
        init = MLP.rand_init(jax.random.key(seed), 4, 2, hidden, True, "pqn", jnp.float32)
        self.params = jax.tree.map(lambda p: jnp.asarray(rng.standard_normal(p.shape, np.float32)), init.params)
        self.es_map = init.es_map
        self.keys = simple_es_tree_key(self.params, jax.random.key(seed + 1), init.scan_map)
        self.f = jnp.asarray(rng.standard_normal(pop).astype(np.float32))
        self.iterinfos = population_iterinfos(int(rng.integers(0, 50)), pop)
        self.pop = pop
        self.frozen, _ = EggRoll.init_noiser(self.params, 0.2, 0.1, rank=2)
        self.jitted_sgd = self.jitted_step(EggRoll, self.frozen)          # compiled once, reused by the tests

    def step(self, noiser, frozen, nparams, f=None):
        """noiser.do_updates on this population (f defaults to the random fitness)."""
        return noiser.do_updates(frozen, nparams, self.params, self.keys, self.f if f is None else f,
                                 self.iterinfos, self.es_map)

    def jitted_step(self, noiser, frozen):
        """jit(nparams, f -> do_updates), frozen_noiser_params closed over as outside code does."""
        return jax.jit(lambda nparams, f: noiser.do_updates(frozen, nparams, self.params, self.keys, f,
                                                            self.iterinfos, self.es_map))


@pytest.fixture(scope="module", params=SIZES, ids=[f"pop{p}" for p, _ in SIZES])
def setup(request):
    pop, hidden = request.param
    return Setup(pop, pop, hidden)


def leaves64(tree) -> list[np.ndarray]:
    return [np.asarray(x, np.float64) for x in jax.tree.leaves(tree)]


def assert_trees_close(got, want, ulps: float = 4):
    """Equal up to a few float32 roundings of the larger magnitude (NaN matches NaN)."""
    for g, w in zip(leaves64(got), leaves64(want)):
        np.testing.assert_allclose(g, w, rtol=ulps * U, atol=ulps * U * np.nanmax(np.abs(w)))


def adam_count(nparams) -> int:
    """The step count in an optax.adam opt_state."""
    states = jax.tree.leaves(nparams["opt_state"], is_leaf=lambda s: isinstance(s, optax.ScaleByAdamState))
    return int(next(s for s in states if isinstance(s, optax.ScaleByAdamState)).count)


# ----------------------------------------------------------------------------- variant noisers, as outside code writes them
class WithSetting(EggRoll):
    """A variant with one setting of its own, given to init_noiser and kept in the frozen params under SETTING."""

    SETTING, DEFAULT = "", 1.0

    @classmethod
    def init_noiser(cls, params, sigma, lr, *args, **kwargs):
        value = kwargs.pop(cls.SETTING, cls.DEFAULT)
        frozen, nparams = super().init_noiser(params, sigma, lr, *args, **kwargs)
        return {**frozen, cls.SETTING: value}, nparams

    @classmethod
    def _do_update(cls, param, base_key, fitnesses, iterinfos, map_classification, sigma, frozen_noiser_params,
                   **kwargs):
        d = super()._do_update(param, base_key, fitnesses, iterinfos, map_classification, sigma, frozen_noiser_params)
        return cls.adjust(d, frozen_noiser_params[cls.SETTING])


class QScaled(WithSetting):
    """A variant with its own setting in init_noiser and its own _do_update: q times EggRoll's solver input."""

    SETTING = "q_multiplier"

    @staticmethod
    def adjust(d, q):
        return d * q


class TrustRegion(WithSetting):
    """A variant that caps each leaf's solver input at norm trust_region_norm."""

    SETTING = "trust_region_norm"

    @staticmethod
    def adjust(d, cap):
        return d * jnp.minimum(1.0, cap / jnp.maximum(jnp.linalg.norm(d), 1e-30))


class Recording(EggRoll):
    """Records which of upstream's two update paths do_updates took."""

    calls: list[str] = []

    @classmethod
    def _do_updates_original(cls, *args):
        cls.calls.append("original")
        return super()._do_updates_original(*args)

    @classmethod
    def _do_updates_batched(cls, *args):
        cls.calls.append("batched")
        return super()._do_updates_batched(*args)


# ----------------------------------------------------------------------------- 1. signatures and extras
P, V, K, VK = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.VAR_POSITIONAL,
               inspect.Parameter.KEYWORD_ONLY, inspect.Parameter.VAR_KEYWORD)
NO = inspect.Parameter.empty
DO_UPDATES = [("frozen_noiser_params", P, NO), ("noiser_params", P, NO), ("params", P, NO), ("base_keys", P, NO),
              ("fitnesses", P, NO), ("iterinfos", P, NO), ("es_map", P, NO)]
NOISY_PRODUCT = [("frozen_noiser_params", P, NO), ("noiser_params", P, NO), ("param", P, NO), ("base_key", P, NO),
                 ("iterinfo", P, NO), ("x", P, NO)]
DRAW = [("frozen_noiser_params", P, NO), ("base_sigma", P, NO), ("iterinfo", P, NO), ("param", P, NO),
        ("key", P, NO)]
INIT_IN_OUT = [("key", P, NO), ("in_dim", P, NO), ("out_dim", P, NO), ("dtype", P, NO), ("*", V, NO), ("**", VK, NO)]

# Upstream's public interface: name -> [(parameter, kind, default)] ("*"/"**" for variadics, whose names do not matter).
UPSTREAM_SIGNATURES = {
    "EggRoll.init_noiser": [("params", P, NO), ("sigma", P, NO), ("lr", P, NO), ("*", V, NO), ("solver", K, None),
                            ("solver_kwargs", K, None), ("group_size", K, 0), ("freeze_nonlora", K, False),
                            ("noise_reuse", K, 0), ("rank", K, 1), ("use_batched_update", K, False),
                            ("**", VK, NO)],
    "Noiser.init_noiser": [("params", P, NO), ("sigma", P, NO), ("lr", P, NO), ("*", V, NO), ("solver", K, None),
                           ("solver_kwargs", K, None), ("**", VK, NO)],
    "EggRoll.do_mm": NOISY_PRODUCT,
    "EggRoll.do_Tmm": NOISY_PRODUCT,
    "EggRoll.do_emb": NOISY_PRODUCT,
    "EggRoll.get_noisy_standard": NOISY_PRODUCT[:-1],
    "EggRoll.convert_fitnesses": [("frozen_noiser_params", P, NO), ("noiser_params", P, NO), ("raw_scores", P, NO),
                                  ("num_episodes_list", P, None)],
    "EggRoll.do_updates": DO_UPDATES,
    "EggRoll._do_updates_original": DO_UPDATES,
    "EggRoll._do_updates_batched": DO_UPDATES,
    "EggRoll._do_update": [("param", P, NO), ("base_key", P, NO), ("fitnesses", P, NO), ("iterinfos", P, NO),
                           ("map_classification", P, NO), ("sigma", P, NO), ("frozen_noiser_params", P, NO),
                           ("**", VK, NO)],
    "get_lora_update_params": DRAW,
    "get_nonlora_update_params": DRAW,
    "models.recursive_scan_split": [("param", P, NO), ("base_key", P, NO), ("scan_tuple", P, NO)],
    "models.simple_es_tree_key": [("params", P, NO), ("base_key", P, NO), ("scan_map", P, NO)],
    "models.merge_inits": [("**", VK, NO)],
    "models.merge_frozen": [("common", P, NO), ("**", VK, NO)],
    "models.call_submodule": [("cls", P, NO), ("name", P, NO), ("common_params", P, NO), ("*", V, NO),
                              ("**", VK, NO)],
    "models.layer_norm": [("x", P, NO), ("eps", P, 1e-5)],
    "models.Parameter.rand_init": [("key", P, NO), ("shape", P, NO), ("scale", P, NO), ("raw_value", P, NO),
                                   ("dtype", P, NO), ("*", V, NO), ("**", VK, NO)],
    "models.MM.rand_init": INIT_IN_OUT,
    "models.TMM.rand_init": INIT_IN_OUT,
    "models.Embedding.rand_init": INIT_IN_OUT,
    "models.Linear.rand_init": INIT_IN_OUT[:3] + [("use_bias", P, NO)] + INIT_IN_OUT[3:],
    "models.MLP.rand_init": INIT_IN_OUT[:3] + [("hidden_dims", P, NO), ("use_bias", P, NO), ("activation", P, NO)]
                            + INIT_IN_OUT[3:],
    "models.Parameter._forward": [("common_params", P, NO), ("*", V, NO), ("**", VK, NO)],
    **{f"models.{m}._forward": [("common_params", P, NO), ("x", P, NO), ("*", V, NO), ("**", VK, NO)]
       for m in ("MM", "TMM", "Embedding", "Linear", "MLP")},
}
NAMESPACE = {"EggRoll": EggRoll, "Noiser": Noiser, "models": models, "get_lora_update_params": get_lora_update_params,
             "get_nonlora_update_params": get_nonlora_update_params}


def described(fn) -> list[tuple]:
    """fn's parameters as (name, kind, default), variadics named "*" and "**"."""
    names = {V: "*", VK: "**"}
    return [(names.get(p.kind, p.name), p.kind, p.default) for p in inspect.signature(fn).parameters.values()]


@pytest.mark.parametrize("name", sorted(UPSTREAM_SIGNATURES))
def test_public_names_have_upstreams_signature(name):
    head, *rest = name.split(".")
    fn = NAMESPACE[head]
    for attr in rest:
        fn = getattr(fn, attr)
    assert described(fn) == UPSTREAM_SIGNATURES[name]


def test_model_constants_and_named_tuples_are_upstreams():
    assert (models.PARAM, models.MM_PARAM, models.EMB_PARAM, models.EXCLUDED) == (0, 1, 2, 3)
    assert models.CommonInit._fields == ("frozen_params", "params", "scan_map", "es_map")
    assert models.CommonParams._fields == ("noiser", "frozen_noiser_params", "noiser_params", "frozen_params",
                                           "params", "es_tree_key", "iterinfo")


def test_an_extra_positional_argument_and_unknown_keywords_are_ignored(setup):
    # upstream: init_noiser(params, sigma, lr, *args, ..., **kwargs): a positional optax.adam lands in
    # *args and the solver stays optax.sgd; unknown keywords land in **kwargs.
    base_frozen, base_state = EggRoll.init_noiser(setup.params, 0.2, 0.1, rank=2)
    frozen, state = EggRoll.init_noiser(setup.params, 0.2, 0.1, optax.adam, "more", rank=2, q_multiplier=3.0,
                                        trust_region_norm=0.5)
    assert {k: v for k, v in frozen.items() if k != "solver"} == {k: v for k, v in base_frozen.items()
                                                                     if k != "solver"}
    assert "q_multiplier" not in frozen and "trust_region_norm" not in frozen
    _, want = setup.step(EggRoll, base_frozen, base_state)
    _, got = setup.step(EggRoll, frozen, state)
    for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))     # the same sgd step, not adam's


@pytest.mark.parametrize("noiser", [Noiser, EggRoll, QScaled, TrustRegion])
def test_one_settings_dict_serves_every_noiser(noiser, setup):
    settings = dict(sigma=0.3, lr=0.05, solver=optax.adam, solver_kwargs={"b1": 0.8}, group_size=0,
                    noise_reuse=3, rank=2, q_multiplier=2.0, trust_region_norm=1.5)
    frozen, nparams = noiser.init_noiser(setup.params, **settings)
    if noiser is Noiser:
        assert (frozen, nparams) == ({}, {})
        return
    assert nparams["sigma"] == 0.3 and frozen["rank"] == 2 and frozen["noise_reuse"] == 3
    _, new = setup.step(noiser, frozen, nparams)
    assert adam_count(nparams) == 1 and all(np.isfinite(x).all() for x in leaves64(new))


# ----------------------------------------------------------------------------- 2. settings upstream accepts
def test_sigma_zero_gives_the_plain_model_and_no_step(setup):
    frozen, nparams = EggRoll.init_noiser(setup.params, 0.0, 0.1, rank=2)
    W, b = setup.params["0"]["weight"], setup.params["0"]["bias"]
    x = jnp.asarray(np.random.default_rng(setup.pop).standard_normal((3, W.shape[1]), np.float32))
    for thread in (0, 1, setup.pop - 1):
        np.testing.assert_array_equal(np.asarray(EggRoll.do_mm(frozen, nparams, W, setup.keys["0"]["weight"],
                                                               (4, thread), x)), np.asarray(x @ W.T))
        np.testing.assert_array_equal(np.asarray(EggRoll.get_noisy_standard(frozen, nparams, b,
                                                                             setup.keys["0"]["bias"], (4, thread))),
                                      np.asarray(b))
    _, new = setup.step(EggRoll, frozen, nparams)
    for a, p in zip(jax.tree.leaves(new), jax.tree.leaves(setup.params)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(p))


@pytest.mark.parametrize("rank", [jnp.int32(2), np.int64(2)], ids=["jnp.int32", "np.int64"])
def test_array_integer_rank_is_the_python_int_rank(rank, setup):
    frozen, nparams = EggRoll.init_noiser(setup.params, 0.2, 0.1, rank=rank)
    frozen_int, nparams_int = EggRoll.init_noiser(setup.params, 0.2, 0.1, rank=int(rank))
    assert frozen["rank"] == int(rank)
    W, key = setup.params["1"]["weight"], setup.keys["1"]["weight"]
    x = jnp.asarray(np.random.default_rng(int(rank)).standard_normal((2, W.shape[1]), np.float32))
    np.testing.assert_array_equal(np.asarray(EggRoll.do_mm(frozen, nparams, W, key, (1, 3), x)),
                                  np.asarray(EggRoll.do_mm(frozen_int, nparams_int, W, key, (1, 3), x)))
    _, got = setup.step(EggRoll, frozen, nparams)
    _, want = setup.step(EggRoll, frozen_int, nparams_int)
    for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


# ----------------------------------------------------------------------------- 3. NaN / inf: no validation, alike in both modes
@pytest.mark.parametrize("value", [np.nan, np.inf, -np.inf], ids=["nan", "+inf", "-inf"])
def test_nonfinite_fitness_flows_through_alike_eagerly_and_under_jit(value, setup):
    f = setup.f.at[3].set(value)
    fresh_state = lambda: EggRoll.init_noiser(setup.params, 0.2, 0.1, rank=2)[1]
    _, eager = setup.step(EggRoll, setup.frozen, fresh_state(), f)              # no error, like upstream
    _, jitted = setup.jitted_sgd(fresh_state(), f)
    for name, e, j in zip(leaf_names(setup.params), leaves64(eager), leaves64(jitted)):
        assert not np.isfinite(e).any(), name          # member 3's fitness reaches every entry of every leaf
        np.testing.assert_array_equal(np.isnan(e), np.isnan(j), err_msg=name)
        np.testing.assert_array_equal(e[~np.isnan(e)], j[~np.isnan(j)], err_msg=name)


def test_do_updates_agrees_eagerly_and_under_jit(setup):
    _, eager = setup.step(EggRoll, setup.frozen, EggRoll.init_noiser(setup.params, 0.2, 0.1, rank=2)[1])
    _, jitted = setup.jitted_sgd(EggRoll.init_noiser(setup.params, 0.2, 0.1, rank=2)[1], setup.f)
    assert_trees_close(jitted, eager)
    # a subclass on the batched path, with adam: the state comes back from jit, and is updated in place eagerly
    frozen, eager_state = QScaled.init_noiser(setup.params, 0.2, 0.1, rank=2, use_batched_update=True,
                                              solver=optax.adam, q_multiplier=1.7)
    jit_state = QScaled.init_noiser(setup.params, 0.2, 0.1, rank=2, solver=optax.adam)[1]
    _, eager = setup.step(QScaled, frozen, eager_state)
    jit_state, jitted = setup.jitted_step(QScaled, frozen)(jit_state, setup.f)
    assert_trees_close(jitted, eager)
    assert adam_count(eager_state) == adam_count(jit_state) == 1


# ----------------------------------------------------------------------------- 4. the caller's state is updated in place
@pytest.mark.parametrize("batched", [False, True])
def test_ignoring_the_returned_state_keeps_the_optimizer_state(batched, setup):
    frozen, nparams = EggRoll.init_noiser(setup.params, 0.2, 0.1, rank=2, solver=optax.adam,
                                          use_batched_update=batched)
    frozen_ret, nparams_ret = EggRoll.init_noiser(setup.params, 0.2, 0.1, rank=2, solver=optax.adam,
                                                  use_batched_update=batched)
    params, params_ret = setup.params, setup.params
    for step in (1, 2):
        returned, params = EggRoll.do_updates(frozen, nparams, params, setup.keys, setup.f, setup.iterinfos,
                                              setup.es_map)                       # returned state ignored below
        assert returned is nparams and adam_count(nparams) == step
        nparams_ret, params_ret = EggRoll.do_updates(frozen_ret, nparams_ret, params_ret, setup.keys, setup.f,
                                                     setup.iterinfos, setup.es_map)
    for a, b in zip(jax.tree.leaves(params), jax.tree.leaves(params_ret)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_apply_grads_updates_the_callers_state(setup):
    frozen, nparams = EggRoll.init_noiser(setup.params, 0.2, 0.1, rank=2, solver=optax.adam)
    grads = es_grads(frozen, nparams, setup.params, setup.keys, setup.f, setup.iterinfos, setup.es_map)
    params = setup.params
    for step in (1, 2):
        returned, params = apply_grads(frozen, nparams, params, grads, setup.pop)
        assert returned is nparams and adam_count(nparams) == step


# ----------------------------------------------------------------------------- 5. subclass hooks
def test_do_update_is_minus_sqrt_n_times_the_leafs_g(setup):
    frozen, nparams = EggRoll.init_noiser(setup.params, 0.25, 0.1, rank=2)
    grads = es_grads(frozen, nparams, setup.params, setup.keys, setup.f, setup.iterinfos, setup.es_map)
    for layer, leaves in setup.params.items():
        for leaf, param in leaves.items():
            got = EggRoll._do_update(param, setup.keys[layer][leaf], setup.f, setup.iterinfos,
                                     setup.es_map[layer][leaf], 0.25, frozen)
            want = solver_input(grads[layer][leaf], setup.pop, param.dtype)
            assert got.dtype == param.dtype and np.abs(np.asarray(got)).min() > 0
            np.testing.assert_array_equal(np.asarray(got), np.asarray(want), err_msg=f"{layer}.{leaf}")


@pytest.mark.parametrize("batched", [False, True])
def test_a_subclass_do_update_drives_do_updates(batched, setup):
    q, lr = 2.5, 0.1
    frozen, nparams = EggRoll.init_noiser(setup.params, 0.2, lr, rank=2, use_batched_update=batched)
    frozen_q, nparams_q = QScaled.init_noiser(setup.params, 0.2, lr, rank=2, use_batched_update=batched,
                                              q_multiplier=q)
    _, plain = setup.step(EggRoll, frozen, nparams)
    _, scaled = setup.step(QScaled, frozen_q, nparams_q)
    for name, p, a, b in zip(leaf_names(setup.params), leaves64(setup.params), leaves64(plain), leaves64(scaled)):
        # sgd: the step is -lr * direction; q times the direction is q times the step, within a few roundings
        assert np.all(np.abs((b - p) - q * (a - p)) <= 4 * U * (np.abs(b) + np.abs(p)) * (1 + q)), name
        assert np.all(np.abs(a - p) > 0), name


@pytest.mark.parametrize("batched", [False, True])
def test_a_trust_region_subclass_caps_each_leafs_step(batched, setup):
    lr = 0.1
    frozen, nparams = EggRoll.init_noiser(setup.params, 0.2, lr, rank=2, use_batched_update=batched)
    _, plain = setup.step(EggRoll, frozen, nparams)
    plain_norms = [np.linalg.norm(a - p) for a, p in zip(leaves64(plain), leaves64(setup.params))]
    cap = 0.5 * min(plain_norms) / lr                                     # below every leaf's own step
    frozen_t, nparams_t = TrustRegion.init_noiser(setup.params, 0.2, lr, rank=2, use_batched_update=batched,
                                                  trust_region_norm=cap)
    _, capped = setup.step(TrustRegion, frozen_t, nparams_t)
    for name, a, p in zip(leaf_names(setup.params), leaves64(capped), leaves64(setup.params)):
        # the capped direction and lr's product are exact to a few ulps; adding to p rounds by u|a| per entry
        allowed = 2 * U * (np.linalg.norm(a) + np.linalg.norm(p)) + 8 * U * lr * cap
        assert abs(np.linalg.norm(a - p) - lr * cap) <= allowed, name


@pytest.mark.parametrize("batched,path", [(False, "original"), (True, "batched")])
def test_do_updates_dispatches_to_the_subclass_path(batched, path, setup):
    Recording.calls.clear()
    frozen, nparams = Recording.init_noiser(setup.params, 0.2, 0.1, rank=2, use_batched_update=batched)
    setup.step(Recording, frozen, nparams)
    assert Recording.calls == [path]


# ----------------------------------------------------------------------------- 6. keyword names
def test_upstream_keyword_names_work_in_calls(setup):
    param = jnp.asarray(np.random.default_rng(setup.pop).standard_normal((3, 6, 4), np.float32))
    keys = models.recursive_scan_split(param=param, base_key=jax.random.key(setup.pop), scan_tuple=(0,))
    np.testing.assert_array_equal(np.asarray(jax.random.key_data(keys)),
                                  np.asarray(jax.random.key_data(jax.random.split(jax.random.key(setup.pop), 3))))
    frozen, nparams = EggRoll.init_noiser(params=setup.params, sigma=0.2, lr=0.1, rank=2)
    W, key = setup.params["0"]["weight"], setup.keys["0"]["weight"]
    x = jnp.asarray(np.random.default_rng(setup.pop + 1).standard_normal((2, W.shape[1]), np.float32))
    by_name = EggRoll.do_mm(frozen_noiser_params=frozen, noiser_params=nparams, param=W, base_key=key,
                            iterinfo=(0, 1), x=x)
    np.testing.assert_array_equal(np.asarray(by_name), np.asarray(EggRoll.do_mm(frozen, nparams, W, key, (0, 1), x)))
    _, by_keyword = EggRoll.do_updates(frozen_noiser_params=frozen, noiser_params=nparams, params=setup.params,
                                       base_keys=setup.keys, fitnesses=setup.f, iterinfos=setup.iterinfos,
                                       es_map=setup.es_map)
    assert all(np.abs(a - p).min() > 0 for a, p in zip(leaves64(by_keyword), leaves64(setup.params)))
