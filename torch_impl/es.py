"""EGGROLL as an evosax-style ask/tell over a state that is plain data, its behaviour chosen once by `make`.

    es = make(cfg, knobs)                 # every knob resolved through its table, once
    state = init(es, seed)                # params, optimizer state, epoch, key sources, cached draws
    noise, state = ask(es, state)         # the population's noise for state.epoch
    state, info = tell(es, state, noise, returns)   # shape, estimate (gradient), step (apply)
"""
from __future__ import annotations

from typing import Any, Callable, Mapping, NamedTuple

import torch

from spec.config import Config, schedule
from spec.knobs import Knobs
from spec.layout import leaf_names, n_layers_of
from torch_impl import noise as noise_mod
from torch_impl.fitness import check_fitness, shape_fitness
from torch_impl.gradient import es_gradient
from torch_impl.model import init_params, make_forward
from torch_impl.noise import Noise, NoisePlan
from torch_impl.optim import Optimizer, apply_updates, make_optimizer

Params = dict[str, torch.Tensor]


class ES(NamedTuple):
    """One configuration of the strategy: the run's Config and Knobs with every knob resolved."""

    cfg: Config
    knobs: Knobs
    plan: NoisePlan                                  # rng, antithetic, bias_noise, noise_reuse
    optimizer: Optimizer                             # knob optimizer
    shaping: Callable[[torch.Tensor], torch.Tensor]  # knob fitness (with cfg.group_size): raw -> shaped
    activation: str                                  # knob activation (model.ACTIVATIONS)
    bias_grad: str                                   # knob bias_grad (gradient.BIAS_GRADS)
    forward: Callable                                # forward(params, x, noise): knobs activation,
                                                     # matmul_precision (model.PRECISIONS), compile (COMPILERS)


class ESState(NamedTuple):
    params: Params
    opt_state: Any
    epoch: int
    sources: Mapping[str, object]    # per leaf: where its draws come from (its key under rng=jax)
    draws: Mapping[str, tuple]       # raw draws of the current noise generation, reused while it lasts


def make(cfg: Config, knobs: Knobs) -> ES:
    """Resolve every knob once (evosax's way): nothing inside ask or tell branches on a knob's name."""
    return ES(cfg, knobs, noise_mod.make_plan(cfg.pop, cfg.rank, knobs), make_optimizer(knobs.optimizer),
              lambda f: shape_fitness(f, knobs.fitness, cfg.group_size), knobs.activation, knobs.bias_grad,
              make_forward(knobs.activation, knobs.matmul_precision, knobs.compile))


def sigma_at(es: ES, epoch: int) -> float:
    """sigma_e = float32(sigma * sigma_decay ** e), returned as the float32 value in a Python float."""
    return float(torch.tensor(schedule(es.cfg.sigma, es.knobs.sigma_decay, epoch), dtype=torch.float32))


def lr_at(es: ES, epoch: int) -> float:
    """lr_e = float32(lr * lr_decay ** e)."""
    return float(torch.tensor(schedule(es.cfg.lr, es.knobs.lr_decay, epoch), dtype=torch.float32))


def init(es: ES, seed: int, device: str | torch.device = "cpu", params: Params | None = None) -> ESState:
    """Epoch 0: initial params (or the given ones), a fresh optimizer state, the run's key sources."""
    if params is None:
        params = init_params(es.cfg.sizes, es.knobs.init, es.plan.generator, seed, device)
    sources = es.plan.generator.leaf_sources(seed, leaf_names(n_layers_of(params)))
    return ESState(params, es.optimizer.init(params), 0, sources, {})


def _device(state: ESState) -> torch.device:
    return next(iter(state.params.values())).device


def ask(es: ES, state: ESState) -> tuple[Noise, ESState]:
    """The population's noise for state.epoch; draws of an unchanged generation are reused, not redrawn."""
    shapes = noise_mod.shapes_of(state.params)
    device = _device(state)
    raw = noise_mod.draw(es.plan, state.sources, shapes, state.epoch, device, reuse=state.draws)
    noise = noise_mod.scale(es.plan, raw, shapes, sigma_at(es, state.epoch), device)
    return noise, state._replace(draws=raw)


def gradient(es: ES, state: ESState, noise: Noise, fitness: torch.Tensor) -> tuple[torch.Tensor, Params]:
    """(shaped fitness, gradient estimate) from the members' raw fitness (pop,): the estimate half of tell."""
    fitness = torch.as_tensor(fitness)
    check_fitness(fitness, es.cfg.pop)
    fitness = fitness.to(device=_device(state), dtype=torch.float32)
    shaped = es.shaping(fitness)
    return shaped, es_gradient(noise, shaped, sigma_at(es, state.epoch), state.params, es.bias_grad)


def apply(es: ES, state: ESState, grads: Params) -> tuple[ESState, Params]:
    """The step half of tell: -(g * sqrt(N)) to the optimizer at this epoch's lr, applied; the next epoch's state."""
    # The reference hands the optimizer -(g * sqrt(N)), sqrt in float32.
    root_n = torch.sqrt(torch.tensor(float(es.cfg.pop), dtype=torch.float32, device=_device(state)))
    descent = {k: -(g * root_n) for k, g in grads.items()}
    updates, opt_state = es.optimizer.update(descent, state.opt_state, state.params, lr_at(es, state.epoch))
    params = apply_updates(state.params, updates)
    return state._replace(params=params, opt_state=opt_state, epoch=state.epoch + 1), updates


def tell(es: ES, state: ESState, noise: Noise, fitness: torch.Tensor) -> tuple[ESState, dict]:
    """One ES step from the members' raw fitness (pop,): shape, estimate, optimizer step."""
    shaped, grads = gradient(es, state, noise, fitness)
    new_state, updates = apply(es, state, grads)
    info = {
        "shaped": shaped,
        "grads": grads,
        "updates": updates,
        "grad_norm": {k: float(torch.linalg.vector_norm(g)) for k, g in grads.items()},
        "sigma": sigma_at(es, state.epoch),
        "lr": lr_at(es, state.epoch),
    }
    return new_state, info
