"""A torch EGGROLL port in the style of the PyPI ones: it keeps no factors and draws its noise inside `step()`.

Each step draws low-rank factors per antithetic pair, materialises every member's perturbation E_i = A_i B_i^T
(and bias noise eps_i), lets the caller evaluate the perturbed MLPs, shapes the returns and moves the parameters
by lr * sqrt(N) * mean(f E). It is faithful to the JAX reference in everything but the generator: interleaved
pairs, +-sigma/sqrt(r) on A, the same noise every epoch (noise_reuse = 0: its generator is re-seeded from the run
seed at every step), (f - mean) / sqrt(var + 1e-5), sigma x0.999 per epoch, plain SGD. There is no `ask`: the
noise exists only inside `step`. `examples/instep_adapter.py` puts it behind the parity protocol.
"""
from __future__ import annotations

import math
from typing import Callable

import torch

from examples.hooks_port import MLP, shape_fitness


class DenseES:
    """ES over every parameter of `model` (an examples.hooks_port.MLP), perturbations materialised per member."""

    def __init__(self, model: MLP, pop: int, rank: int = 4, sigma: float = 0.2, lr: float = 0.1, seed: int = 0,
                 sigma_decay: float = 0.999):
        if pop % 2:
            raise ValueError(f"population {pop} is odd; antithetic pairs need an even population")
        self.model, self.pop, self.rank, self.sigma, self.lr = model, pop, rank, sigma, lr
        self.seed, self.sigma_decay, self.epoch = seed, sigma_decay, 0

    def sigma_at(self, epoch: int) -> float:
        return float(torch.tensor(self.sigma * self.sigma_decay ** epoch, dtype=torch.float32))

    def perturbations(self) -> dict[str, torch.Tensor]:
        """This step's noise: weight -> E (pop, out, in) = A B^T, bias -> eps (pop, out), at this epoch's sigma."""
        gen = torch.Generator().manual_seed(self.seed)          # the same draws every epoch (noise_reuse = 0)
        pair = torch.arange(self.pop) // 2
        sign = torch.where(torch.arange(self.pop) % 2 == 0, 1.0, -1.0)
        sigma = torch.tensor(self.sigma_at(self.epoch), dtype=torch.float32)
        noise = {}
        for name, p in self.model.named_parameters():
            if p.dim() == 2:
                n_out, n_in = p.shape
                z = torch.randn((self.pop // 2, n_in + n_out, self.rank), generator=gen)[pair]
                A = z[:, n_in:] * (sign * sigma / math.sqrt(self.rank))[:, None, None]
                noise[name] = A @ z[:, :n_in].transpose(1, 2)                          # (pop, out, in)
            else:
                noise[name] = torch.randn((self.pop // 2, p.shape[0]), generator=gen)[pair] * (sign * sigma)[:, None]
        return noise

    def forward(self, x: torch.Tensor, noise: dict[str, torch.Tensor] | None = None) -> torch.Tensor:
        """Member i's MLP, W + E_i and b + eps_i materialised, on row i of x (pop, in)."""
        params = dict(self.model.named_parameters())
        n_layers = len(self.model.layers)
        h = x
        for t in range(n_layers):
            W, b = params[f"layers.{t}.weight"], params[f"layers.{t}.bias"]
            if noise is None:
                z = h @ W.T + b
            else:
                W = W + noise[f"layers.{t}.weight"] if f"layers.{t}.weight" in noise else W.expand(h.shape[0], -1, -1)
                z = torch.einsum("moi,mi->mo", W, h) + b + noise.get(f"layers.{t}.bias", 0)
            h = z if t == n_layers - 1 else torch.relu(torch.nn.functional.layer_norm(z, z.shape[-1:], eps=1e-5))
        return h

    def gradient(self, noise: dict[str, torch.Tensor], shaped: torch.Tensor) -> dict[str, torch.Tensor]:
        """Ascent direction before sqrt(N): sum_n f_n E_n / N and mean(f eps); zeros where there is no noise."""
        return {name: (torch.einsum("n,n...->...", shaped, noise[name]) / shaped.shape[0] if name in noise
                       else torch.zeros_like(p)) for name, p in self.model.named_parameters()}

    @torch.no_grad()
    def step(self, evaluate: Callable[[Callable[[torch.Tensor], torch.Tensor]], torch.Tensor]) -> torch.Tensor:
        """One epoch: draw the noise, evaluate(policy) -> returns (pop,), shape them, p += lr sqrt(N) g."""
        noise = self.perturbations()                             # drawn here, inside the step
        returns = evaluate(lambda obs: self.forward(obs, noise))
        grads = self.gradient(noise, shape_fitness(returns))
        root_n = torch.sqrt(torch.tensor(float(self.pop)))
        for name, p in self.model.named_parameters():
            p.add_(grads[name] * root_n, alpha=self.lr)
        self.epoch += 1
        return returns


def train(seed: int = 0, pop: int = 64, hidden: int = 16, epochs: int = 10) -> list[float]:
    """CartPole-v1 for a few epochs (the project's shared environment); each epoch's mean return."""
    import numpy as np

    from rollout import cartpole, episodes

    es = DenseES(MLP([4, hidden, hidden, 2], seed=seed).requires_grad_(False), pop, seed=seed)
    actions = torch.Generator().manual_seed(seed + 1)
    history = []
    for epoch in range(epochs):
        uniforms = torch.rand((cartpole.MAX_STEPS, pop), generator=actions).numpy()

        def evaluate(policy):
            result = episodes.run_episodes(lambda obs: policy(torch.from_numpy(obs)).numpy(),
                                           cartpole.reset(seed + epoch + np.arange(pop)), uniforms)
            return torch.from_numpy(result.returns).float()

        history.append(float(es.step(evaluate).mean()))
    return history
