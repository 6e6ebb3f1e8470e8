"""The PyPI ports' adapters (ports/) against the installed packages and against EGGROLL's formulas.

Each test needs its package and is skipped, saying which, when it is absent (`make ports` installs them all).
Inputs are fresh random numbers at two sizes; every comparison can fail (an adapter that reads the wrong draw,
sign, layout or scale, or computes anything itself, breaks one)."""
from __future__ import annotations

import importlib
import math

import numpy as np
import pytest

from tests.ports_installed import needs as needs_package

from spec.config import Config
from spec.layout import param_shapes

CFGS = [Config(pop=8, hidden=8, layers=3, rank=4, sigma=0.2, lr=0.1),
        Config(pop=16, hidden=16, layers=2, rank=2, sigma=0.05, lr=0.3)]
IDS = ["pop8-3x8-r4", "pop16-2x16-r2"]
# spec, import name, pairing layout the code reads (halves / interleaved / off), noise reuse (epochs per draw)
FACTOR_PORTS = [("ports.torcheggroll:adapter", "torcheggroll", "halves", 1),
                ("ports.hyperfunc:model_path", "hyperfunc", "halves", 1),
                ("ports.hyperfunc:lora_path", "hyperfunc", "interleaved", 1),
                ("ports.eggroll_trainer:adapter", "eggroll_trainer", "off", 1),
                ("ports.eggroll_trainer:antithetic", "eggroll_trainer", "interleaved", 2)]


def needs(module: str):
    return needs_package(module)


def load(spec: str, cfg: Config):
    module, attr = spec.split(":")
    return getattr(importlib.import_module(module), attr)(cfg)


def factor_params():
    return [pytest.param(spec, layout, reuse, cfg, marks=needs(mod), id=f"{spec.split(':')[-1]}-{mod}-{cid}")
            for spec, mod, layout, reuse in FACTOR_PORTS for cfg, cid in zip(CFGS, IDS)]


def rng():
    return np.random.default_rng()


def pqn(h):
    mu = h.mean(-1, keepdims=True)
    return np.maximum((h - mu) / np.sqrt(((h - mu) ** 2).mean(-1, keepdims=True) + 1e-5), 0)


def forward64(params, noise, x):
    n = sum(k.endswith(".weight") for k in params)
    h = x.astype(np.float64)
    for t in range(n):
        z = h @ params[f"{t}.weight"].T.astype(np.float64) + params[f"{t}.bias"]
        if noise is not None:
            A, B = noise[f"{t}.weight"]
            z = z + np.einsum("mi,mir,mor->mo", h, B.astype(np.float64), A.astype(np.float64))
            z = z + noise.get(f"{t}.bias", 0)
        h = pqn(z) if t < n - 1 else z
    return h


def weight_grad(shaped, A, B):
    return np.einsum("nir,njr->ij", shaped[:, None, None].astype(np.float64) * A, B) / len(shaped)


def mirrors(noise, layout: str) -> bool:
    A = noise["0.weight"][0]
    n = A.shape[0]
    if layout == "halves":
        return np.array_equal(A[n // 2:], -A[:n // 2])
    if layout == "interleaved":
        return np.array_equal(A[1::2], -A[0::2])
    return not np.allclose(A[1::2], -A[0::2]) and not np.allclose(A[n // 2:], -A[:n // 2])


# ---------------------------------------------------------------- noise: the package's own, as factors
def package_dense(spec: str, cfg: Config, shapes, epoch: int) -> dict:
    """Each leaf's dense per-member perturbation (pop, *shape) straight from the package, for one epoch."""
    import torch

    from ports import _torch as T
    if spec.startswith("ports.torcheggroll") or spec.endswith("model_path"):
        adapter = load(spec, cfg)
        _, es = adapter._es(shapes, cfg.pop, cfg.sigma, rank=cfg.rank)
        es.epoch = epoch
        return {k: v.numpy() for k, v in es._generate_all_noise().items()}
    if spec.endswith("lora_path"):
        from ports.hyperfunc import optimiser
        opt = optimiser(cfg.pop, cfg.sigma, cfg.lr, cfg.rank)
        order = T.module_order(shapes)
        return {name: np.stack([opt._generate_hp_noise(torch.zeros(shapes[name]), i, j, epoch,
                                                       noise_rank=cfg.rank if len(shapes[name]) == 2 else None).numpy()
                                for i in range(cfg.pop)]) for j, name in enumerate(order)}
    adapter = load(spec, cfg)
    tr = adapter._trainer(shapes, cfg.pop, cfg.sigma, cfg.lr)
    base = dict(tr.model.named_parameters())
    return {k: np.stack([(tr._apply_perturbations(i, epoch)[k] - base[k]).detach().numpy() for i in range(cfg.pop)])
            for k in base}


@pytest.mark.parametrize("spec,layout,reuse,cfg", factor_params())
def test_noise_factors_are_the_packages_own_perturbations(spec, layout, reuse, cfg):
    adapter, shapes = load(spec, cfg), param_shapes(cfg.sizes)
    epoch = int(rng().integers(0, 50)) * 2          # even: a reuse-2 port's draw spans epochs e and e + 1
    noise = adapter.noise(shapes, 0, epoch, np.arange(cfg.pop), cfg.pop, cfg.sigma, cfg.rank)
    dense = package_dense(spec, cfg, shapes, epoch)
    for name, E in dense.items():
        got = noise[name][0] @ np.swapaxes(noise[name][1], 1, 2) if name.endswith(".weight") else noise[name]
        assert got.dtype == np.float32 and got.shape == E.shape
        np.testing.assert_allclose(got, E, rtol=1e-5, atol=1e-6, err_msg=name)
    assert mirrors(noise, layout)
    subset = np.sort(rng().choice(cfg.pop, 3, replace=False))
    picked = adapter.noise(shapes, 0, epoch, subset, cfg.pop, cfg.sigma, cfg.rank)
    assert np.array_equal(picked["1.weight"][1], noise["1.weight"][1][subset])
    later = adapter.noise(shapes, 0, epoch + reuse, np.arange(cfg.pop), cfg.pop, cfg.sigma, cfg.rank)
    same = adapter.noise(shapes, 0, epoch + reuse - 1, np.arange(cfg.pop), cfg.pop, cfg.sigma, cfg.rank)
    assert not np.array_equal(later["0.weight"][1], noise["0.weight"][1])
    assert np.array_equal(same["0.weight"][1], noise["0.weight"][1])


@pytest.mark.parametrize("spec,layout,reuse,cfg", factor_params())
def test_the_math_is_eggrolls_on_fresh_inputs(spec, layout, reuse, cfg):
    """perturbed_linear, gradient, forward and optimizer_step against the reference's formulas (float64)."""
    adapter, shapes, r = load(spec, cfg), param_shapes(cfg.sizes), rng()
    m, (o, i) = 6, (int(r.integers(2, 9)), int(r.integers(2, 9)))
    W = r.standard_normal((o, i)).astype(np.float32)
    A = (r.standard_normal((m, o, cfg.rank)) * 0.1).astype(np.float32)
    B = r.standard_normal((m, i, cfg.rank)).astype(np.float32)
    x = r.standard_normal((m, 3, i)).astype(np.float32)
    np.testing.assert_allclose(adapter.perturbed_linear(W, A, B, x), x @ W.T + (x @ B) @ np.swapaxes(A, 1, 2),
                               rtol=1e-5, atol=1e-5)
    noise = adapter.noise(shapes, 0, 0, np.arange(cfg.pop), cfg.pop, cfg.sigma, cfg.rank)
    shaped = r.standard_normal(cfg.pop).astype(np.float32)
    grads = adapter.gradient(noise, shaped, cfg.sigma)
    for name, v in noise.items():
        want = weight_grad(shaped, *v) if isinstance(v, tuple) else (shaped[:, None] * v).mean(0)
        np.testing.assert_allclose(grads[name], want, rtol=1e-4, atol=1e-6, err_msg=name)
    params = adapter.init_params(shapes, int(r.integers(0, 1000)))
    xs = r.standard_normal((cfg.pop, 4)).astype(np.float32)
    np.testing.assert_allclose(adapter.forward(params, noise, xs), forward64(params, noise, xs), rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(adapter.forward(params, None, xs[:3]), forward64(params, None, xs[:3]), atol=1e-4)
    stepped, _ = adapter.optimizer_step(params, adapter.optimizer_init(params), noise, shaped, cfg.sigma, 0)
    for name in shapes:
        np.testing.assert_allclose(stepped[name] - params[name], cfg.lr * math.sqrt(cfg.pop) * grads[name],
                                   rtol=1e-4, atol=1e-6, err_msg=name)


def shaping_read_in_the_code(spec: str, f: np.ndarray, group: int) -> np.ndarray:
    """What each package's code computes (torch, float32), as read: torcheggroll es.py:696-704, hyperfunc
    es.py:198-206, eggroll-trainer eggroll.py:254-278."""
    import torch
    t = torch.tensor(f)
    if "eggroll_trainer" in spec:
        g = t.view(-1, group or len(f))
        return ((g - g.mean(1, keepdim=True)) / (g.std(1, keepdim=True) + 1e-8)).view(-1).numpy()
    std = t.std()
    return ((t - t.mean()) / std if std > 1e-8 else t - t.mean()).numpy()


@pytest.mark.parametrize("spec,layout,reuse,cfg", factor_params())
def test_shape_fitness_is_the_packages_own_to_the_bit(spec, layout, reuse, cfg):
    adapter, r = load(spec, cfg), rng()
    for f in (r.standard_normal(cfg.pop).astype(np.float32), r.integers(8, 60, cfg.pop).astype(np.float32),
              np.full(cfg.pop, 37.0, np.float32)):
        assert np.array_equal(adapter.shape_fitness(f, 0), shaping_read_in_the_code(spec, f, 0))
    if "eggroll_trainer" in spec:
        f = r.standard_normal(cfg.pop).astype(np.float32)
        assert np.array_equal(adapter.shape_fitness(f, 4), shaping_read_in_the_code(spec, f, 4))
    else:
        with pytest.raises(NotImplementedError):
            adapter.shape_fitness(np.ones(cfg.pop, np.float32), 4)


@pytest.mark.parametrize("spec,layout,reuse,cfg", factor_params())
def test_the_training_loop_asks_its_own_noise_and_tells_on_the_noise_given(spec, layout, reuse, cfg):
    adapter, shapes, r = load(spec, cfg), param_shapes(cfg.sizes), rng()
    params = adapter.init_params(shapes, 3)
    state = adapter.es_init(params, 3)
    asked = adapter.es_ask(state, 0)
    own = adapter.noise(shapes, 3, 0, np.arange(cfg.pop), cfg.pop, cfg.sigma, cfg.rank)
    assert all(np.array_equal(asked[k][0], own[k][0]) if isinstance(own[k], tuple) else np.array_equal(asked[k], own[k])
               for k in own)
    returns = r.integers(8, 200, cfg.pop).astype(np.float32)
    state = adapter.es_tell(state, asked, returns, 0)
    after = adapter.es_params(state)
    grads = adapter.gradient(asked, adapter.shape_fitness(returns, 0), cfg.sigma)
    for name in shapes:
        np.testing.assert_allclose(after[name] - params[name], cfg.lr * math.sqrt(cfg.pop) * grads[name], rtol=1e-4,
                                   atol=1e-6, err_msg=name)
    told = {k: tuple(np.ascontiguousarray(x[::-1]) for x in v) if isinstance(v, tuple) else v[::-1].copy()
            for k, v in adapter.es_ask(state, 1).items()}          # not what it drew: it must use these
    state = adapter.es_tell(state, told, returns, 1)
    grads = adapter.gradient(told, adapter.shape_fitness(returns, 0), cfg.sigma)
    for name in shapes:
        np.testing.assert_allclose(adapter.es_params(state)[name] - after[name],
                                   cfg.lr * math.sqrt(cfg.pop) * grads[name], rtol=1e-4, atol=1e-6, err_msg=name)


@needs("hyperfunc")
@pytest.mark.parametrize("cfg", CFGS, ids=IDS)
def test_hyperfunc_vmapped_forward_is_its_population_evaluation(cfg):
    """The LoRA path's forward (fn_sync under vmap) equals evaluate_population's run(), member by member."""
    import torch

    from ports import _torch as T
    from ports import hyperfunc as hf
    r, shapes = rng(), param_shapes(cfg.sizes)
    params = {k: r.standard_normal(s).astype(np.float32) for k, s in shapes.items()}
    system = hf.mlp_system(shapes, params, cfg.rank, "pqn")
    noise = {k: torch.tensor(r.standard_normal((5,) + s).astype(np.float32) * 0.1) for k, s in shapes.items()}
    cands, x = hf.candidates(system, noise), T.tensor(r.standard_normal((5, 4)))
    torch.testing.assert_close(system.run_batched(x, cands), hf.evaluate_members(system, cands, x), rtol=1e-5,
                               atol=1e-5)


# ---------------------------------------------------------------- eggroll-es: dense, full-rank noise
@needs("eggroll")
@pytest.mark.parametrize("cfg", CFGS, ids=IDS)
def test_eggroll_es_noise_is_full_rank_and_cannot_be_given_as_factors(cfg):
    from ports.eggroll_es import perturbations
    adapter, shapes = load("ports.eggroll_es:adapter", cfg), param_shapes(cfg.sizes)
    with pytest.raises(NotImplementedError, match="full-rank"):
        adapter.noise(shapes, 0, 0, np.arange(cfg.pop), cfg.pop, cfg.sigma, cfg.rank)
    dense = perturbations(shapes, cfg.pop, cfg.sigma, cfg.rank, seed=int(rng().integers(0, 1000)))
    leaf = max((k for k in shapes if k.endswith(".weight")), key=lambda k: min(shapes[k]))
    E = dense[leaf]
    assert E.shape == (cfg.pop,) + shapes[leaf]
    assert np.array_equal(E[1::2], -E[0::2])                               # each draw, then its mirror
    assert np.linalg.matrix_rank(E[0].astype(np.float64)) == min(E.shape[1:]) > cfg.rank


@needs("eggroll")
@pytest.mark.parametrize("cfg", CFGS, ids=IDS)
def test_eggroll_es_math_on_fresh_inputs(cfg):
    adapter, shapes, r = load("ports.eggroll_es:adapter", cfg), param_shapes(cfg.sizes), rng()
    noise = {k: ((r.standard_normal((cfg.pop, s[0], cfg.rank)) * 0.1).astype(np.float32),
                 r.standard_normal((cfg.pop, s[1], cfg.rank)).astype(np.float32)) if len(s) == 2
             else (r.standard_normal((cfg.pop,) + s) * cfg.sigma).astype(np.float32) for k, s in shapes.items()}
    shaped = r.standard_normal(cfg.pop).astype(np.float32)
    grads = adapter.gradient(noise, shaped, cfg.sigma)
    scale = 1 / (cfg.sigma * math.sqrt(cfg.pop))       # its sum(f E) / (n sigma), before the reference's sqrt(N)
    np.testing.assert_allclose(grads["0.weight"], scale * weight_grad(shaped, *noise["0.weight"]), rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(grads["0.bias"], scale * (shaped[:, None] * noise["0.bias"]).mean(0), rtol=1e-4,
                               atol=1e-6)
    f = r.standard_normal(cfg.pop).astype(np.float32)
    np.testing.assert_allclose(adapter.shape_fitness(f), np.argsort(np.argsort(f)) / (cfg.pop - 1) - 0.5, atol=1e-6)
    params = adapter.init_params(shapes, 1)
    xs = r.standard_normal((cfg.pop, 4)).astype(np.float32)
    np.testing.assert_allclose(adapter.forward(params, noise, xs), forward64(params, noise, xs), rtol=1e-4, atol=1e-4)
