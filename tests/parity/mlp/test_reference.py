"""The suite's reference side equals jax_reference's own paths (noise, forward, gradient, ES step)."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jax_reference import population as P
from jax_reference.models import MLP, simple_es_tree_key
from jax_reference.noiser import EggRoll, es_grads
from parity.core.platform import enable_compile_cache
from parity.mlp.reference import ReferencePort
from parity.mlp.suite import param_shapes
from parity.core.tolerances import ForwardBound, bias_grad_bound, weight_grad_bound
from spec.config import Config
from spec.knobs import RunSettings

enable_compile_cache()   # the reference's eager paths compile per shape: seconds each, kept on disk


def _reference_run(cfg: Config, seed: int, noise_reuse: int = 0):
    init = MLP.rand_init(jax.random.split(jax.random.key(seed), 3)[0], 4, 2, [cfg.hidden] * (cfg.layers - 1),
                         True, "pqn", jnp.float32)
    keys = simple_es_tree_key(init.params, jax.random.split(jax.random.key(seed), 3)[1], init.scan_map)
    frozen, nparams = EggRoll.init_noiser(init.params, cfg.sigma, cfg.lr, rank=cfg.rank, noise_reuse=noise_reuse)
    return init, keys, frozen, nparams


@pytest.mark.parametrize("hidden,pop,epoch,noise_reuse", [(8, 8, 0, 0), (8, 8, 5, 2)])
def test_noise_and_init_equal_population_noise(hidden, pop, epoch, noise_reuse):
    cfg = Config(pop=pop, hidden=hidden)
    init, keys, frozen, nparams = _reference_run(cfg, 3, noise_reuse)
    want = P.population_noise(frozen, nparams, init.params, keys, init.es_map, epoch, pop)
    ref = ReferencePort(cfg, RunSettings(noise_reuse=noise_reuse))
    got = ref.noise(param_shapes(cfg), 3, epoch, np.arange(pop), pop, cfg.sigma, cfg.rank)
    for name in want.A:
        np.testing.assert_array_equal(got[name][0], want.A[name])
        np.testing.assert_array_equal(got[name][1], want.B[name])
    for name in want.bias:
        np.testing.assert_array_equal(got[name], want.bias[name])
    # a subset of members is the same rows
    part = ref.noise(param_shapes(cfg), 3, epoch, np.array([pop - 1, 1]), pop, cfg.sigma, cfg.rank)
    np.testing.assert_array_equal(part["0.weight"][1], want.B["0.weight"][[pop - 1, 1]])
    flat = P.params_to_flat(init.params)
    for name, value in ref.init_params(param_shapes(cfg), 3).items():
        np.testing.assert_array_equal(value, flat[name])


@pytest.mark.parametrize("hidden,pop", [(8, 8)])
def test_forward_and_gradient_match_the_noisers_own(hidden, pop):
    cfg = Config(pop=pop, hidden=hidden)
    init, keys, frozen, nparams = _reference_run(cfg, 1)
    ref = ReferencePort(cfg)
    shapes = param_shapes(cfg)
    params = ref.init_params(shapes, 1)
    noise = ref.noise(shapes, 1, 0, np.arange(pop), pop, cfg.sigma, cfg.rank)
    x = np.random.default_rng(hidden).standard_normal((pop, 4)).astype(np.float32)
    own = np.asarray(P.make_population_forward(init.frozen_params, frozen)(nparams, init.params, keys, 0, jnp.asarray(x)))
    got = ref.forward(params, noise, x)
    exact, bound = ForwardBound(params, noise, "pqn")(x)
    assert np.all(np.abs(got - own) <= 2 * bound)
    assert np.all(np.abs(got - exact) <= bound)

    shaped = ref.shape_fitness(np.random.default_rng(pop).standard_normal(pop).astype(np.float32))
    iterinfos = (jnp.zeros(pop, jnp.int32), jnp.arange(pop, dtype=jnp.int32))
    want = P.params_to_flat(es_grads(frozen, nparams, init.params, keys, jnp.asarray(shaped), iterinfos, init.es_map))
    got = ref.gradient(noise, shaped, cfg.sigma)
    for name in shapes:
        b = (weight_grad_bound(shaped, *noise[name]) if name.endswith("weight")
             else bias_grad_bound(shaped, noise[name]))
        assert np.all(np.abs(got[name] - want[name]) <= 2 * b)


def test_es_tell_is_do_updates_and_optimizer_apply_is_sgd():
    cfg = Config(pop=8, hidden=8)
    ref = ReferencePort(cfg)
    shapes = param_shapes(cfg)
    params = ref.init_params(shapes, 0)
    f = np.random.default_rng(0).standard_normal(8).astype(np.float32)
    state = ref.es_tell(ref.es_init(params, 0), None, f, 0)
    stepped = ref.es_params(state)
    noise = ref.es_ask(ref.es_init(params, 0), 0)
    shaped = ref.shape_fitness(f)
    grads = ref.gradient(noise, shaped, ref.sigma_at(0))
    manual, _ = ref.optimizer_apply(params, ref.optimizer_init(params), grads, 8, 0)
    for name in shapes:
        expected = params[name].astype(np.float64) + cfg.lr * np.sqrt(8) * grads[name]
        scale = np.abs(params[name]) + cfg.lr * np.sqrt(8) * np.abs(grads[name]) + 1e-12
        assert np.all(np.abs(manual[name] - expected) <= 4e-7 * scale)
        bound = cfg.lr * np.sqrt(8) * 2 * (weight_grad_bound(shaped, *noise[name]) if name.endswith("weight")
                                           else bias_grad_bound(shaped, noise[name])) + 4e-7 * scale
        assert np.all(np.abs(stepped[name] - manual[name]) <= bound)


def test_action_uniforms_are_unit_interval_and_per_epoch():
    ref = ReferencePort(Config(pop=8, hidden=8))
    u0, u1 = ref.action_uniforms(0, 0, 8), ref.action_uniforms(0, 1, 8)
    assert u0.shape == (500, 8) and u0.dtype == np.float32
    assert 0 <= u0.min() and u0.max() < 1 and not np.array_equal(u0, u1)


@pytest.mark.parametrize("pop", [8, 16])
def test_rejects_nonfinite_reports_that_the_reference_accepts_like_upstream(pop, monkeypatch):
    cfg = Config(pop=pop, hidden=8)
    ref = ReferencePort(cfg)
    shapes = param_shapes(cfg)
    noise = ref.noise(shapes, 0, 0, np.arange(pop), pop, cfg.sigma, cfg.rank)
    f = np.random.default_rng(pop).standard_normal(pop).astype(np.float32)
    for value in (np.nan, np.inf, -np.inf):
        bad = f.copy()
        bad[pop // 2] = value
        assert ref.rejects_nonfinite(noise, bad, shapes) is None
    # what it reports is what do_updates does: a do_updates that raises is reported with its message
    def raising(*args):
        raise ValueError("no NaN here")

    monkeypatch.setattr(EggRoll, "do_updates", raising)
    assert ref.rejects_nonfinite(noise, bad, shapes) == "ValueError: no NaN here"
