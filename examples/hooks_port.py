"""An object-oriented torch EGGROLL port: an `nn.Module` MLP and an ES strategy that perturbs its
`nn.Linear` layers through forward hooks (the style of the published CartPole benchmark's torch port).

It is faithful to the JAX reference in everything but the generator: interleaved antithetic pairs,
one (in + out, r) draw per pair with B first and +-sigma/sqrt(r) on A, bias noise +-sigma * eps from
the same per-leaf scheme, the same noise in every epoch (noise_reuse = 0), fitness shaped as
(f - mean) / sqrt(var + 1e-5), gradients in the reference's convention, SGD on -(g * sqrt(N)),
sigma x0.999 per epoch. Its noise comes from torch generators seeded per (seed, leaf, generation),
so it does not draw JAX's numbers. `examples/hooks_adapter.py` puts it behind the parity protocol.
"""
from __future__ import annotations

import contextlib
import math
from typing import Iterator

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

LN_EPS = 1e-5        # the reference's parameter-free layer norm
FITNESS_EPS = 1e-5   # the reference's (f - mean) / sqrt(var + 1e-5)
INIT_SEED, ACTION_SEED = 99991, 1   # generator seed offsets: init and actions never share a noise leaf's stream


class MLP(nn.Module):
    """Linear layers with relu(layer_norm(x)) (the reference's `pqn`) between them, not after the last."""

    def __init__(self, sizes: list[int], seed: int | None = None):
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(i, o) for i, o in zip(sizes[:-1], sizes[1:]))
        if seed is not None:
            self.reset_parameters(seed)

    @torch.no_grad()
    def reset_parameters(self, seed: int) -> None:
        """The reference's recipe from a torch generator: weight normal / sqrt(in), bias zero."""
        gen = torch.Generator().manual_seed(int(seed) + INIT_SEED)
        for layer in self.layers:
            fan_in = layer.weight.shape[1]
            layer.weight.copy_(torch.randn(layer.weight.shape, generator=gen) / math.sqrt(fan_in))
            layer.bias.zero_()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for t, layer in enumerate(self.layers):
            x = layer(x)
            if t < len(self.layers) - 1:
                x = F.relu(F.layer_norm(x, x.shape[-1:], eps=LN_EPS))
        return x


def shape_fitness(f: torch.Tensor, group_size: int = 0) -> torch.Tensor:
    """(f - mean) / sqrt(var + 1e-5) with ddof 0; groups subtract their own mean, the global variance divides."""
    if not torch.isfinite(f).all():
        raise ValueError(f"fitness must be finite; got NaN or inf at members {torch.nonzero(~torch.isfinite(f)).flatten().tolist()}")
    centred = (f.reshape(-1, group_size) - f.reshape(-1, group_size).mean(1, keepdim=True)).reshape(-1) \
        if group_size else f - f.mean()
    return centred / torch.sqrt(f.var(correction=0) + FITNESS_EPS)


class EggrollStrategy:
    """Low-rank antithetic ES over every `nn.Linear` of `model`, applied through forward hooks.

    `sample(epoch)` draws the population's noise, keyed by parameter name: weight -> (A (m, out, r),
    B (m, in, r)), bias -> eps (m, out); inside `with strategy.perturbed(noise):` a forward of a batch
    whose row i (or slice i of an (m, batch, in) input) belongs to member i runs the perturbed model.
    """

    def __init__(self, model: nn.Module, pop: int, rank: int = 4, sigma: float = 0.2, lr: float = 0.1,
                 seed: int = 0, sigma_decay: float = 0.999, noise_reuse: int = 0):
        if pop % 2:
            raise ValueError(f"population {pop} is odd; antithetic pairs need an even population (e.g. {pop + 1})")
        if rank < 1:
            raise ValueError(f"rank must be >= 1, got {rank}")
        self.model, self.pop, self.rank, self.sigma, self.lr = model, pop, rank, sigma, lr
        self.seed, self.sigma_decay, self.noise_reuse = seed, sigma_decay, noise_reuse
        self.linears = {name: m for name, m in model.named_modules() if isinstance(m, nn.Linear)}
        self.leaf_ids = {name: i for i, (name, _) in enumerate(model.named_parameters())}
        self._active: dict[nn.Module, tuple] | None = None
        self._hooks = [m.register_forward_hook(self._hook) for m in self.linears.values()]

    @staticmethod
    def _param(module_name: str, leaf: str) -> str:
        return f"{module_name}.{leaf}" if module_name else leaf

    def sigma_at(self, epoch: int) -> float:
        return float(np.float32(self.sigma * self.sigma_decay ** epoch))

    def _draw(self, name: str, generation: int, shape: tuple[int, ...]) -> torch.Tensor:
        """(pop / 2, *shape): one standard-normal block per antithetic pair, from this leaf's own generator."""
        gen = torch.Generator().manual_seed(self.seed + 10007 * self.leaf_ids[name] + 7919 * generation)
        return torch.randn((self.pop // 2, *shape), generator=gen)

    def sample(self, epoch: int, sigma: float | None = None, members: torch.Tensor | None = None) -> dict:
        """Noise of `members` (default: all) at `epoch`: member 2p gets pair p with +, member 2p+1 with -."""
        sigma = self.sigma_at(epoch) if sigma is None else sigma
        members = torch.arange(self.pop) if members is None else torch.as_tensor(members)
        generation = 0 if self.noise_reuse == 0 else epoch // self.noise_reuse
        sign = torch.where(members % 2 == 0, 1.0, -1.0)                                   # (m,)
        sigma32 = torch.tensor(sigma, dtype=torch.float32)
        a_scale = sign * (sigma32 / torch.sqrt(torch.tensor(float(self.rank))))
        noise = {}
        for module_name, layer in self.linears.items():
            out_dim, in_dim = layer.weight.shape
            w, b = self._param(module_name, "weight"), self._param(module_name, "bias")
            z = self._draw(w, generation, (in_dim + out_dim, self.rank))[members // 2]     # (m, in + out, r)
            noise[w] = (z[:, in_dim:] * a_scale[:, None, None], z[:, :in_dim])
            if layer.bias is not None:
                noise[b] = self._draw(b, generation, (out_dim,))[members // 2] * (sign * sigma32)[:, None]
        return noise

    def _hook(self, module: nn.Module, inputs: tuple, output: torch.Tensor) -> torch.Tensor | None:
        """output + x @ B_i @ A_i^T (+ eps_i) for the member each row belongs to."""
        if self._active is None or module not in self._active:
            return None
        (A, B), eps = self._active[module]
        x = inputs[0]
        xb = x.unsqueeze(1) if x.dim() == 2 else x                                          # (m, batch, in)
        delta = (xb @ B) @ A.transpose(1, 2)                                                # (m, batch, out)
        if eps is not None:
            delta = delta + eps.unsqueeze(1)
        return output + (delta.squeeze(1) if x.dim() == 2 else delta)

    @contextlib.contextmanager
    def perturbed(self, noise: dict) -> Iterator[None]:
        """Forwards inside the block run member i with its noise (weights' (A, B), biases' eps where given)."""
        self._active = {m: (noise[self._param(n, "weight")], noise.get(self._param(n, "bias")))
                        for n, m in self.linears.items() if self._param(n, "weight") in noise}
        try:
            yield
        finally:
            self._active = None

    def gradient(self, noise: dict, shaped: torch.Tensor) -> dict[str, torch.Tensor]:
        """Ascent direction before sqrt(N): einsum('nir,njr->ij', f A, B) / N; mean(f eps); zeros elsewhere."""
        n = shaped.shape[0]
        grads = {}
        for name, p in self.model.named_parameters():
            if name not in noise:
                grads[name] = torch.zeros_like(p)
            elif isinstance(noise[name], tuple):
                A, B = noise[name]
                grads[name] = torch.einsum("nir,njr->ij", shaped[:, None, None] * A, B) / n
            else:
                grads[name] = (shaped[:, None] * noise[name]).mean(0)
        return grads

    @torch.no_grad()
    def update(self, noise: dict, shaped: torch.Tensor) -> None:
        """One plain SGD step (torch.optim.SGD's p -= lr * grad, without importing torch.optim's compiler
        machinery) on the descent gradient -(g * sqrt(N)): the params move by +lr * sqrt(N) * g."""
        grads = self.gradient(noise, shaped)
        root_n = torch.sqrt(torch.tensor(float(shaped.shape[0])))
        for name, p in self.model.named_parameters():
            p.add_(-(grads[name] * root_n), alpha=-self.lr)

    def step(self, noise: dict, fitness: torch.Tensor, group_size: int = 0) -> None:
        """One ES epoch from raw returns: shape them, then update."""
        self.update(noise, shape_fitness(fitness, group_size))


def train(seed: int = 0, pop: int = 256, hidden: int = 64, layers: int = 3, epochs: int = 50,
          rank: int = 4, sigma: float = 0.2, lr: float = 0.1) -> list[float]:
    """Train CartPole-v1 (the project's shared environment); returns each epoch's mean return."""
    from rollout import cartpole, episodes

    model = MLP([4] + [hidden] * (layers - 1) + [2], seed=seed)
    es = EggrollStrategy(model, pop, rank, sigma, lr, seed=seed)
    actions = torch.Generator().manual_seed(seed + ACTION_SEED)
    history = []
    for epoch in range(epochs):
        noise = es.sample(epoch)
        uniforms = torch.rand((cartpole.MAX_STEPS, pop), generator=actions).numpy()

        @torch.no_grad()
        def policy(obs: np.ndarray) -> np.ndarray:
            with es.perturbed(noise):
                return model(torch.from_numpy(obs)).numpy()

        result = episodes.run_episodes(policy, cartpole.reset(seed + epoch + np.arange(pop)), uniforms)
        es.step(noise, torch.from_numpy(result.returns))
        history.append(float(result.returns.mean()))
    return history


if __name__ == "__main__":
    for e, mean_return in enumerate(train(epochs=20, pop=64)):
        print(f"epoch {e:3d}  mean return {mean_return:6.1f}")
