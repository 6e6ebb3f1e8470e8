"""parity.mlp.numpy_reference equals the JAX reference (parity.mlp.reference.ReferencePort) within float32 bounds.

Fresh random inputs every run (the seed is in each failure message), two sizes. Each bound is one side's float32
error bound from parity.core.tolerances, taken twice (both sides round)."""
from __future__ import annotations

import numpy as np
import pytest

from parity.mlp import numpy_reference as npr
from parity.core.tolerances import (ForwardBound, bias_grad_bound, linear_bound, shaping_bound, update_bound,
                                    weight_grad_bound)
from spec.config import Config
from spec.knobs import CHOICES, RunSettings
from spec.layout import param_shapes

pytest.importorskip("jax")
from parity.mlp.reference import ReferencePort  # noqa: E402

SIZES = [Config(pop=32, hidden=8, rank=4), Config(pop=64, hidden=16, rank=2, layers=2)]


class Fresh:
    """A numpy Generator from fresh entropy that remembers its seed (for the failure message)."""

    def __init__(self):
        self.seed_used = int(np.random.SeedSequence().entropy % (2 ** 32))
        self._gen = np.random.default_rng(self.seed_used)

    def __getattr__(self, name):
        return getattr(self._gen, name)


@pytest.fixture
def rng():
    return Fresh()


def _ratio(a, b, bound) -> float:
    diff = np.abs(np.asarray(a, np.float64) - np.asarray(b, np.float64))
    return float(np.max(np.where(diff > 0, diff / np.maximum(bound, 1e-300), 0.0)))


def _inputs(cfg: Config, rng, run: RunSettings | None = None):
    ref = ReferencePort(cfg, run)
    shapes = param_shapes(cfg.sizes)
    seed = int(rng.integers(2 ** 32))
    params = {k: (v if k.endswith(".weight") else 0.1 * rng.standard_normal(v.shape).astype(np.float32))
              for k, v in ref.init_params(shapes, seed).items()}
    noise = ref.noise(shapes, seed, int(rng.integers(100)), np.arange(cfg.pop), cfg.pop, cfg.sigma, cfg.rank)
    return ref, shapes, params, noise


@pytest.mark.parametrize("cfg", SIZES, ids=lambda c: f"pop{c.pop}-h{c.hidden}")
def test_shape_fitness(cfg, rng):
    ref = ReferencePort(cfg)
    for f in (rng.standard_normal(cfg.pop), 500 * rng.random(cfg.pop), np.full(cfg.pop, 7.0)):
        f = f.astype(np.float32)
        ratio = _ratio(npr.shape_fitness(f), ref.shape_fitness(f), 2 * shaping_bound(f))
        assert ratio <= 1, f"seed {rng.seed_used}: shaping off by {ratio} x its bound"
    f = rng.standard_normal(cfg.pop).astype(np.float32)
    grouped = npr.shape_fitness(f, 8)
    assert np.allclose(grouped, ref.shape_fitness(f, 8), rtol=0, atol=2 * float(np.max(shaping_bound(f))) + 1e-6)


@pytest.mark.parametrize("cfg", SIZES, ids=lambda c: f"pop{c.pop}-h{c.hidden}")
def test_perturbed_linear(cfg, rng):
    ref = ReferencePort(cfg)
    m, out_dim, in_dim = 5, cfg.hidden, int(rng.integers(3, 40))
    W = rng.standard_normal((out_dim, in_dim)).astype(np.float32)
    A = (0.1 * rng.standard_normal((m, out_dim, cfg.rank))).astype(np.float32)
    B = rng.standard_normal((m, in_dim, cfg.rank)).astype(np.float32)
    x = rng.standard_normal((m, 3, in_dim)).astype(np.float32)
    ratio = _ratio(npr.perturbed_linear(W, A, B, x), ref.perturbed_linear(W, A, B, x), 2 * linear_bound(W, A, B, x))
    assert ratio <= 1, f"seed {rng.seed_used}: product off by {ratio} x its bound"


@pytest.mark.parametrize("activation", CHOICES["activation"])
@pytest.mark.parametrize("cfg", SIZES, ids=lambda c: f"pop{c.pop}-h{c.hidden}")
def test_forward(cfg, activation, rng):
    ref, shapes, params, noise = _inputs(cfg, rng, RunSettings(activation=activation))
    x = (rng.standard_normal((cfg.pop, 4)) * [1.0, 0.5, 0.1, 0.5]).astype(np.float32)
    for given in (None, noise):
        _, bound = ForwardBound(params, given, activation)(x)
        ratio = _ratio(npr.forward(params, given, x, activation), ref.forward(params, given, x), 2 * bound)
        assert ratio <= 1, f"seed {rng.seed_used}: {activation} forward off by {ratio} x its bound"


@pytest.mark.parametrize("cfg", SIZES, ids=lambda c: f"pop{c.pop}-h{c.hidden}")
def test_gradient(cfg, rng):
    ref, shapes, _, noise = _inputs(cfg, rng)
    shaped = npr.shape_fitness(rng.standard_normal(cfg.pop).astype(np.float32))
    ours, theirs = npr.gradient(noise, shaped), ref.gradient(noise, shaped, cfg.sigma)
    assert set(ours) == set(theirs) == set(shapes)
    for name in shapes:
        bound = (weight_grad_bound(shaped, *noise[name]) if name.endswith(".weight")
                 else bias_grad_bound(shaped, noise[name]))
        ratio = _ratio(ours[name], theirs[name], 2 * bound)
        assert ratio <= 1, f"seed {rng.seed_used}: gradient of {name} off by {ratio} x its bound"
    no_bias = {k: v for k, v in noise.items() if k.endswith(".weight")}
    assert all(not np.any(g) for k, g in npr.gradient(no_bias, shaped).items() if k.endswith(".bias"))


@pytest.mark.parametrize("optimizer", npr.OPTIMIZERS)
@pytest.mark.parametrize("cfg", SIZES, ids=lambda c: f"pop{c.pop}-h{c.hidden}")
def test_optimizer_chain(cfg, optimizer, rng):
    """Four steps with the lr schedule, on gradients of the scale ES gives, from the same parameters: each side's
    step bound (u |p| + gamma_24 |update|) accumulated, twice; the adam moments equal within their own rounding."""
    run = RunSettings(optimizer=optimizer, lr_decay=0.9)
    ref, shapes, params, _ = _inputs(cfg, rng, run)
    ours_ref = npr.NumpyReference(cfg, run)
    mine, theirs = dict(params), dict(params)
    s_mine, s_theirs = ours_ref.optimizer_init(params), ref.optimizer_init(params)
    allowed = {k: np.zeros(v.shape) for k, v in params.items()}
    for epoch in range(4):
        grads = {k: (0.05 * rng.standard_normal(v)).astype(np.float32) for k, v in shapes.items()}
        before = dict(theirs)
        mine, s_mine = ours_ref.optimizer_apply(mine, s_mine, grads, cfg.pop, epoch)
        theirs, s_theirs = ref.optimizer_apply(theirs, s_theirs, grads, cfg.pop, epoch)
        for k in params:
            allowed[k] = allowed[k] + 2 * update_bound(theirs[k], theirs[k].astype(np.float64) - before[k])
            ratio = _ratio(mine[k], theirs[k], allowed[k])
            assert ratio <= 1, f"seed {rng.seed_used}: {optimizer} epoch {epoch} {k} off by {ratio} x its bound"
        moved = sum(float(np.abs(theirs[k].astype(np.float64) - before[k]).max()) for k in params)
        assert moved > 0, "the reference did not move: the comparison would be empty"


@pytest.mark.parametrize("n", [7, 300])
def test_actions_equal(n, rng):
    ref = ReferencePort(Config())
    logits = rng.standard_normal((n, 2)).astype(np.float32) * 3
    u = rng.random(n).astype(np.float32)
    assert np.array_equal(npr.NumpyReference(Config()).actions(logits, u), ref.actions(logits, u))


def test_schedules_equal():
    run = RunSettings(lr_decay=0.97, sigma_decay=0.995)
    ref, ours = ReferencePort(Config(), run), npr.NumpyReference(Config(), run)
    assert [ours.sigma_at(e) for e in (0, 1, 7, 500)] == [ref.sigma_at(e) for e in (0, 1, 7, 500)]
    assert [ours.lr_at(e) for e in (0, 1, 7, 500)] == [ref.lr_at(e) for e in (0, 1, 7, 500)]


def test_unknown_names_refused():
    with pytest.raises(ValueError, match="unknown optimizer"):
        npr.optimizer_init("lion", {})
    with pytest.raises(ValueError, match="unknown activation"):
        npr.forward({"0.weight": np.zeros((2, 4), np.float32), "0.bias": np.zeros(2, np.float32)}, None,
                    np.zeros((1, 4), np.float32), "gelu")


# ---------------------------------------------------------------- draws: bit for bit
def test_generator_bit_for_bit(rng):
    import jax

    from parity.core import numpy_random as nr
    for seed in (0, int(rng.integers(2 ** 32)), 2 ** 32 - 1):
        k, jk = nr.key(seed), jax.random.key(seed)
        assert np.array_equal(nr.split(k, 5), np.asarray(jax.random.key_data(jax.random.split(jk, 5))))
        d = int(rng.integers(2 ** 32))
        assert np.array_equal(nr.fold_in(k, d), np.asarray(jax.random.key_data(jax.random.fold_in(jk, d))))
        shape = (int(rng.integers(1, 300)), int(rng.integers(1, 9)))
        assert np.array_equal(nr.normal(k, shape), np.asarray(jax.random.normal(jk, shape))), f"seed {seed}"
        assert np.array_equal(nr.uniform(k, shape), np.asarray(jax.random.uniform(jk, shape))), f"seed {seed}"


@pytest.mark.parametrize("noise_reuse", [0, 3])
@pytest.mark.parametrize("cfg", SIZES, ids=lambda c: f"pop{c.pop}-h{c.hidden}")
def test_draws_bit_for_bit(cfg, noise_reuse, rng):
    """noise (weights and biases, both signs, epochs and noise_reuse), init and action uniforms: equal bytes."""
    run = RunSettings(noise_reuse=noise_reuse)
    ref, ours = ReferencePort(cfg, run), npr.NumpyReference(cfg, run)
    shapes = param_shapes(cfg.sizes)
    seed, epoch = int(rng.integers(2 ** 32)), int(rng.integers(10))
    members = rng.permutation(cfg.pop)[:cfg.pop // 2]
    sigma = float(rng.uniform(0.01, 1))
    mine, theirs = (side.noise(shapes, seed, epoch, members, cfg.pop, sigma, cfg.rank) for side in (ours, ref))
    assert set(mine) == set(theirs)
    for name in shapes:
        for a, b in zip(*((v if isinstance(v, tuple) else (v,)) for v in (mine[name], theirs[name]))):
            assert a.dtype == b.dtype and np.array_equal(a, b), f"seed {seed} epoch {epoch}: {name} differs"
    for name, value in ours.init_params(shapes, seed).items():
        assert np.array_equal(value, ref.init_params(shapes, seed)[name]), f"seed {seed}: init of {name}"
    assert np.array_equal(ours.action_uniforms(seed, epoch, cfg.pop), ref.action_uniforms(seed, epoch, cfg.pop))


@pytest.mark.parametrize("cfg", SIZES, ids=lambda c: f"pop{c.pop}-h{c.hidden}")
def test_es_loop(cfg, rng):
    """es_init / es_ask / es_tell / es_params over three epochs on fresh fitness: the asked noise bit for bit; the
    parameters within the sum over epochs of each side's step bound plus lr sqrt(N) times the gradient's bound
    (fitness shaping's error included). Noise and fitness do not depend on the parameters, so errors only add up."""
    from parity.core.tolerances import gamma

    run = RunSettings(sigma_decay=0.99, lr_decay=0.95)
    ref, shapes, params, _ = _inputs(cfg, rng, run)
    ours = npr.NumpyReference(cfg, run)
    seed = int(rng.integers(2 ** 32))
    s_ours, s_ref = ours.es_init(params, seed), ref.es_init(params, seed)
    allowed = {k: np.zeros(v) for k, v in shapes.items()}
    for epoch in range(3):
        n_ours, n_ref = ours.es_ask(s_ours, epoch), ref.es_ask(s_ref, epoch)
        for name in shapes:
            for a, b in zip(*((v if isinstance(v, tuple) else (v,)) for v in (n_ours[name], n_ref[name]))):
                assert np.array_equal(a, b), f"seed {rng.seed_used}: es_ask noise of {name} at epoch {epoch}"
        fitness = (100 * rng.random(cfg.pop)).astype(np.float32)
        before = ref.es_params(s_ref)
        s_ours, s_ref = ours.es_tell(s_ours, n_ours, fitness, epoch), ref.es_tell(s_ref, n_ref, fitness, epoch)
        mine, theirs = ours.es_params(s_ours), ref.es_params(s_ref)
        shaped, f_err = npr.shape_fitness(fitness), 2 * shaping_bound(fitness)
        step = ref.lr_at(epoch) * np.sqrt(cfg.pop) * (1 + gamma(2))
        for k in shapes:
            g_err = (weight_grad_bound(shaped, *n_ref[k], f_err) if k.endswith(".weight")
                     else bias_grad_bound(shaped, n_ref[k], f_err))
            allowed[k] = allowed[k] + 2 * update_bound(theirs[k], theirs[k].astype(np.float64) - before[k]) \
                + step * 2 * g_err
            ratio = _ratio(mine[k], theirs[k], allowed[k])
            assert ratio <= 1, f"seed {rng.seed_used}: epoch {epoch} {k} off by {ratio} x its bound"
