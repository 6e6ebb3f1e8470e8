"""The torch EGGROLL (rng=jax, every knob at the reference) against the JAX reference package.

Exact where the computation is the same sequence of float32 operations (init, keys, noise factors,
uniforms); within float32 rounding bounds, stated at each check, where the two sides may order or
fuse operations differently (products, fitness shaping, gradients, optimizer steps).
"""
import math

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
import torch

from jax_reference.models import MLP, simple_es_tree_key
from jax_reference.noiser import EggRoll, convert_fitnesses, es_grads
from jax_reference.population import (flat_to_params, make_population_forward, params_to_flat,
                                      population_iterinfos, population_noise)
from torch_impl import es, model, optim
from torch_impl import random as rnd
from spec.config import Config
from torch_impl.fitness import shape_fitness
from torch_impl.gradient import es_gradient
from spec.knobs import Knobs
from spec.layout import leaf_names
from tests.helpers import noise_of
from torch_impl.keys import GENERATORS, es_tree_keys
from torch_impl.noise import per_member

U = 2.0 ** -24


def gamma(k: int) -> float:
    return k * U / (1 - k * U)


def jax_side(cfg: Config, seed: int, activation="pqn", noise_reuse=0, sigma=None, solver=None):
    """The reference's init, key tree and noiser for `cfg` and `seed` (DESIGN.md's key scheme)."""
    model_key, es_key, _ = jax.random.split(jax.random.key(seed), 3)
    init = MLP.rand_init(model_key, 4, 2, [cfg.hidden] * (cfg.layers - 1), True, activation, jnp.float32)
    keys = simple_es_tree_key(init.params, es_key, init.scan_map)
    frozen, noiser_params = EggRoll.init_noiser(init.params, cfg.sigma if sigma is None else sigma, cfg.lr,
                                                rank=cfg.rank, noise_reuse=noise_reuse, solver=solver)
    return init, keys, frozen, noiser_params


# Two shapes keep JAX's compile time down (its eager ops and jits are cached by shape across tests):
# SMALL has rank 4 on a 4-input and on a 2-output layer; ELEVEN has layer "10" sorting before "2".
SMALL = Config(pop=8, rank=4, hidden=16, layers=3, sigma=0.2, lr=0.1)
ELEVEN = Config(pop=4, rank=1, hidden=3, layers=11, sigma=0.7)


def as_np(d):
    return {k: np.asarray(v) for k, v in d.items()}


@pytest.mark.parametrize("cfg,seed", [(SMALL, 0), (ELEVEN, 123456)])
def test_init_and_key_tree_equal_the_reference(cfg, seed):
    layers = cfg.layers
    init, keys, _, _ = jax_side(cfg, seed)
    ours = model.init_params(cfg.sizes, "jax", GENERATORS["jax"], seed)
    theirs = params_to_flat(init.params)
    assert list(theirs) == leaf_names(layers)                       # "10" sorts before "2"
    for name, value in theirs.items():
        assert np.array_equal(ours[name].numpy(), value), name      # bit for bit
    ours_keys = es_tree_keys(seed, leaf_names(layers))
    for name, key in params_to_flat(jax.tree.map(jax.random.key_data, keys)).items():
        assert np.array_equal(rnd.to_uint32(ours_keys[name]), key), name


@pytest.mark.parametrize("cfg,epoch,noise_reuse,sigma", [
    (SMALL, 5, 0, 0.13),      # epoch 5 uses generation 0
    (SMALL, 5, 2, 0.2),       # generation 2 (the eleven-layer key tree is checked leaf by leaf above)
])
def test_noise_equals_population_noise(cfg, epoch, noise_reuse, sigma):
    pop = cfg.pop
    init, keys, frozen, noiser_params = jax_side(cfg, 42, noise_reuse=noise_reuse, sigma=sigma)
    theirs = population_noise(frozen, noiser_params, init.params, keys, init.es_map, epoch, pop)
    params = model.init_params(cfg.sizes, "jax", GENERATORS["jax"], 42)
    ours = per_member(noise_of(params, cfg, Knobs(noise_reuse=noise_reuse), 42, epoch, sigma))
    for mine, ref in ((ours.A, theirs.A), (ours.B, theirs.B), (ours.bias, theirs.bias)):
        assert set(mine) == set(ref)
        for name in ref:
            assert np.array_equal(mine[name].numpy(), ref[name]), name   # bit for bit


@pytest.mark.parametrize("seed,epoch,pop", [(3, 17, 6)])
def test_action_uniforms_equal_jax(seed, epoch, pop):
    action_key = jax.random.split(jax.random.key(seed), 3)[2]
    ref = np.asarray(jax.random.uniform(jax.random.fold_in(action_key, epoch), (500, pop)))
    assert np.array_equal(GENERATORS["jax"].action_uniforms(seed, epoch, pop), ref)


def forward_error_bound(params, noise, x, activation):
    """First-order bound on |float32 forward - exact| per output, for either side's float32 arithmetic.

    Per layer: the products' rounding gamma_{in+r+3} * (|h||W|^T + (|h||B|)|A|^T + |b| + |bias noise|)
    plus the input error carried by (|W| + |A||B|^T); tanh adds 8 ULP (XLA's and torch's approximations)
    and is 1-Lipschitz, relu is exact and 1-Lipschitz; pqn's layer norm carries an input error e as
    (2 + |y|) max(e) / s and adds gamma_{2n+8} (max|x| + |x - mean|) / s (see test_torch_impl).
    """
    n_layers = model.n_layers_of(params)
    noise = per_member(noise)                     # the bound is per member
    h = x.double().unsqueeze(1)
    err = torch.zeros_like(h)
    for t in range(n_layers):
        W, b = params[f"{t}.weight"].double(), params[f"{t}.bias"].double()
        A, B, bn = noise.A[f"{t}.weight"].double(), noise.B[f"{t}.weight"].double(), noise.bias[f"{t}.bias"].double()
        pre = h @ W.T + (h @ B) @ A.transpose(1, 2) + (b + bn)[:, None]
        habs = h.abs() + err
        mag = habs @ W.abs().T + (habs @ B.abs()) @ A.abs().transpose(1, 2) + (b.abs() + bn.abs())[:, None]
        carried = err @ W.abs().T + (err @ B.abs()) @ A.abs().transpose(1, 2)
        err = gamma(W.shape[1] + B.shape[-1] + 3) * mag + carried
        if t == n_layers - 1:
            return pre.squeeze(1), err.squeeze(1)
        if activation == "tanh":
            h = torch.tanh(pre)
            err = err + 8 * U * h.abs()
        elif activation == "relu":
            h = torch.relu(pre)
        else:
            n = pre.shape[-1]
            mean = pre.mean(-1, keepdim=True)
            s = torch.sqrt(pre.var(-1, unbiased=False, keepdim=True) + 1e-5)
            y = (pre - mean) / s
            h = torch.relu(y)
            err = ((2 + y.abs()) * err.amax(-1, keepdim=True) / s
                   + gamma(2 * n + 8) * (pre.abs().amax(-1, keepdim=True) + (pre - mean).abs()) / s)


def test_population_forward_matches_reference():
    """Both sides lie within the float32 bound of the exact output, so they differ by at most twice it.

    pqn only (the reference's activation; one jit compile): tanh and relu are checked against float64
    in test_torch_impl.
    """
    cfg, pop, activation = SMALL, SMALL.pop, "pqn"
    init, keys, frozen, noiser_params = jax_side(cfg, 9, activation=activation)
    # Non-zero biases on both sides: the reference's init has zero biases.
    params = model.init_params(cfg.sizes, "jax", GENERATORS["jax"], 9)
    g = torch.Generator().manual_seed(1)
    params = {k: (v + 0.2 * torch.randn(v.shape, generator=g)) if k.endswith("bias") else v for k, v in params.items()}
    jparams = flat_to_params({k: v.numpy() for k, v in params.items()})
    x = torch.randn(pop, 4, generator=g)
    theirs = np.asarray(make_population_forward(init.frozen_params, frozen)(noiser_params, jparams, keys, 3, jnp.asarray(x.numpy())))
    noise = noise_of(params, cfg, Knobs(activation=activation), 9, 3, cfg.sigma)
    with torch.inference_mode():
        ours = model.forward(params, x, noise, activation)
    _, bound = forward_error_bound(params, noise, x, activation)
    diff = (ours.double() - torch.tensor(theirs, dtype=torch.float64)).abs()
    assert (diff <= 2 * bound * (1 + 1e-3)).all(), float((diff / bound).max())


def _shaping_bound(f64):
    """As in test_torch_impl: gamma_{n+4} (M/s)(1 + 4 (M/s)^2) per side."""
    ratio = f64.abs().max() / f64.std(unbiased=False)
    return gamma(f64.numel() + 4) * ratio * (1 + 4 * ratio ** 2)


@pytest.mark.parametrize("n,group_size", [(64, 0), (64, 8)])
def test_fitness_shaping_matches_convert_fitnesses(n, group_size):
    f = 100 + 40 * torch.randn(n, generator=torch.Generator().manual_seed(n + group_size))
    frozen = {"group_size": group_size}
    theirs = np.asarray(convert_fitnesses(frozen, {}, jnp.asarray(f.numpy())))
    ours = shape_fitness(f, "jax", group_size)
    assert (ours.double() - torch.from_numpy(theirs).double()).abs().max() <= 2 * _shaping_bound(f.double())


def test_gradients_and_sgd_step_match_do_updates():
    """Same shaped fitness into both: g within 2 gamma_{Nr+2} sum|f A B|/N; the sgd step then within a few u."""
    cfg, pop, rank = SMALL, SMALL.pop, SMALL.rank
    init, keys, frozen, noiser_params = jax_side(cfg, 5)
    f = torch.randn(pop, generator=torch.Generator().manual_seed(pop))
    iterinfos = population_iterinfos(4, pop)
    theirs = params_to_flat(es_grads(frozen, noiser_params, init.params, keys, jnp.asarray(f.numpy()), iterinfos, init.es_map))
    params = model.init_params(cfg.sizes, "jax", GENERATORS["jax"], 5)
    noise = noise_of(params, cfg, Knobs(), 5, 4, 0.2)
    ours = es_gradient(noise, f, 0.2, params)     # grouped: summed per antithetic pair
    members = per_member(noise)                            # the bounds are per member
    f64 = f.double()
    for name, ref in theirs.items():
        if name in noise.A:
            mag = torch.einsum("n,nir,njr->ij", f64.abs(), members.A[name].double().abs(), members.B[name].double().abs()) / pop
            bound = 2 * gamma(pop * rank + 2) * mag
        else:
            bound = 2 * gamma(pop + 2) * (f64.abs()[:, None] * members.bias[name].double().abs()).mean(0)
        assert ((ours[name].double() - torch.from_numpy(ref).double()).abs() <= bound).all(), name
    # One whole step: tell (shaping inside) against do_updates (optax.sgd) fed those shaped values.
    strategy = es.make(cfg, Knobs(sigma_decay=1.0))                        # the noiser holds sigma 0.2
    state = es.init(strategy, 5)._replace(epoch=4)
    with torch.no_grad():
        new, info = es.tell(strategy, state, noise, f)
    shaped = info["shaped"]
    assert torch.equal(shaped, shape_fitness(f, "jax"))
    _, new_params = EggRoll.do_updates(frozen, noiser_params, init.params, keys, jnp.asarray(shaped.numpy()),
                                       iterinfos, init.es_map)
    for name, ref in params_to_flat(new_params).items():
        g = info["grads"][name].double()
        if name in noise.A:
            mag = torch.einsum("n,nir,njr->ij", shaped.double().abs(), members.A[name].double().abs(),
                               members.B[name].double().abs()) / pop
            g_bound = 2 * gamma(pop * rank + 2) * mag
        else:
            g_bound = 2 * gamma(pop + 2) * (shaped.double().abs()[:, None] * members.bias[name].double().abs()).mean(0)
        # step = lr * sqrt(N) * g: the gradients' bound, two roundings of the scaling per side, one of the sum.
        mine = new.params[name].double()
        bound = 0.1 * math.sqrt(pop) * (g_bound + 4 * U * g.abs()) + 2 * U * mine.abs()
        assert ((mine - torch.from_numpy(ref).double()).abs() <= bound).all(), name


@pytest.mark.parametrize("name,make", [
    ("sgd", lambda lr: optax.sgd(lr)),
    ("adam", lambda lr: optax.adam(lr)),
    ("adamw", lambda lr: optax.adamw(lr)),
])
def test_optimizers_equal_optax(name, make):
    """Five steps with a decaying lr on fresh gradients.

    Bound per element: lr (|direction| + wd |p|) times rho, rho = 2 sum_steps [16 u + 2 u c1 + u c2] with
    c_i = b_i^t / (1 - b_i^t): about 16 roundings per step on each side, and the bias corrections
    1 - b^t amplify the <= 1 ULP by which the two sides' b^t may differ by c_i (sqrt halves c2).
    Params are kept equal on both sides each step, so the check is of the update rule itself.
    """
    g = torch.Generator().manual_seed(0)
    params = {"0.weight": torch.randn(5, 3, generator=g), "0.bias": torch.randn(5, generator=g)}
    opt = optim.make_optimizer(name)
    tx = optax.inject_hyperparams(make)(lr=0.1)
    state, ostate = opt.init(params), tx.init(as_np(params))
    rho = 0.0
    for step in range(1, 6):
        lr = float(np.float32(0.1 * 0.9 ** (step - 1)))
        grads = {k: torch.randn(v.shape, generator=g) * 10 ** (step - 3) for k, v in params.items()}
        ostate.hyperparams["lr"] = jnp.asarray(lr, dtype=jnp.float32)
        theirs, ostate = tx.update(as_np(grads), ostate, as_np(params))
        ours, state = opt.update(grads, state, params, lr)
        c1, c2 = 0.9 ** step / (1 - 0.9 ** step), 0.999 ** step / (1 - 0.999 ** step)
        rho += 2 * (16 * U + 2 * U * c1 + U * c2) if name != "sgd" else 2 * U
        for k in params:
            ref = torch.from_numpy(np.asarray(theirs[k])).double()
            if name == "sgd":
                scale = lr * grads[k].double().abs()
            else:
                mu_hat = state.mu[k].double() / (1 - 0.9 ** step)
                nu_hat = state.nu[k].double() / (1 - 0.999 ** step)
                direction = mu_hat.abs() / (nu_hat.sqrt() + 1e-8)
                scale = lr * (direction + (1e-4 * params[k].double().abs() if name == "adamw" else 0))
            assert ((ours[k].double() - ref).abs() <= rho * scale).all(), (name, step, k)
        params = optim.apply_updates(params, ours)
