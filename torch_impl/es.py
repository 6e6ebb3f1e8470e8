"""EGGROLL as an evosax-style ask/tell pair over a state that is plain data."""
from __future__ import annotations

from typing import Any, Mapping, NamedTuple

import torch

from torch_impl.config import Config, check_pairing, schedule
from torch_impl.fitness import check_fitness, shape_fitness
from torch_impl.gradient import es_gradient
from torch_impl.knobs import Knobs
from torch_impl.model import init_params
from torch_impl.noise import Noise, sample_noise
from torch_impl.optim import apply_updates, make_optimizer


class ESState(NamedTuple):
    params: dict[str, torch.Tensor]
    opt_state: Any
    epoch: int


def sigma_at(cfg: Config, knobs: Knobs, epoch: int) -> float:
    """sigma_e = float32(sigma * sigma_decay ** e), returned as the float32 value in a Python float."""
    return float(torch.tensor(schedule(cfg.sigma, knobs.sigma_decay, epoch), dtype=torch.float32))


def lr_at(cfg: Config, knobs: Knobs, epoch: int) -> float:
    """lr_e = float32(lr * lr_decay ** e)."""
    return float(torch.tensor(schedule(cfg.lr, knobs.lr_decay, epoch), dtype=torch.float32))


def init_state(cfg: Config, knobs: Knobs, seed: int, device: str | torch.device = "cpu",
               params: dict[str, torch.Tensor] | None = None) -> ESState:
    """Epoch 0: initial params (or the given ones) and a fresh optimizer state."""
    check_pairing(cfg.pop, knobs.antithetic)
    params = init_params(cfg, knobs, seed, device) if params is None else params
    return ESState(params, make_optimizer(knobs.optimizer).init(params), 0)


def ask(state: ESState, cfg: Config, knobs: Knobs, seed: int | Mapping[str, torch.Tensor],
        device: str | torch.device = "cpu", cache: dict | None = None) -> Noise:
    """The population's noise for this epoch (seed: run seed, or a key tree for rng=jax; cache: see sample_noise)."""
    return sample_noise(state.params, cfg, knobs, seed, state.epoch, sigma_at(cfg, knobs, state.epoch), device, cache)


def tell(state: ESState, noise: Noise, fitness: torch.Tensor, cfg: Config, knobs: Knobs) -> tuple[ESState, dict]:
    """One ES step from the members' raw fitness (pop,): shape, estimate, optimizer step."""
    fitness = torch.as_tensor(fitness)
    check_fitness(fitness, cfg.pop)
    device = next(iter(state.params.values())).device
    fitness = fitness.to(device=device, dtype=torch.float32)
    sigma, lr = sigma_at(cfg, knobs, state.epoch), lr_at(cfg, knobs, state.epoch)
    shaped = shape_fitness(fitness, knobs.fitness, cfg.group_size)
    grads = es_gradient(noise, shaped, sigma, knobs, state.params)
    # The reference hands the optimizer -(g * sqrt(N)), sqrt in float32.
    root_n = torch.sqrt(torch.tensor(float(cfg.pop), dtype=torch.float32, device=device))
    descent = {k: -(g * root_n) for k, g in grads.items()}
    updates, opt_state = make_optimizer(knobs.optimizer).update(descent, state.opt_state, state.params, lr)
    params = apply_updates(state.params, updates)
    info = {
        "shaped": shaped,
        "grads": grads,
        "updates": updates,
        "grad_norm": {k: float(torch.linalg.vector_norm(g)) for k, g in grads.items()},
        "sigma": sigma,
        "lr": lr,
    }
    return ESState(params, opt_state, state.epoch + 1), info

