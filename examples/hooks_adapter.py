"""examples/hooks_port.py behind the parity suite's port protocol (see parity/mlp/adapter.py).

    python -m parity check --port examples.hooks_adapter:adapter

`adapter` is a class: the suite calls it with the run's Config (pop, rank, sigma, lr, group_size).
"""
import torch

from examples.hooks_port import MLP, EggrollStrategy, shape_fitness
from rollout.episodes import sample_actions


def to_port(tree):    # protocol names "0.weight" -> the module's "layers.0.weight"; numpy -> torch
    return {f"layers.{k}": tuple(map(torch.tensor, v)) if isinstance(v, tuple) else torch.tensor(v)
            for k, v in tree.items()}


def from_port(tree):  # and back (copies: the port updates its tensors in place)
    return {k.removeprefix("layers."): tuple(t.numpy().copy() for t in v) if isinstance(v, tuple)
            else v.detach().numpy().copy() for k, v in tree.items()}


def mlp(shapes, seed=None, params=None):   # the port's model for the suite's shapes ("{t}.weight": (out, in))
    dims = [shapes[f"{t}.weight"] for t in range(sum(k.endswith(".weight") for k in shapes))]
    model = MLP([dims[0][1]] + [out for out, _ in dims], seed).requires_grad_(False)
    if params is not None:
        model.load_state_dict(to_port(params))
    return model


class HooksAdapter:
    name = "examples.hooks_port (nn.Module + forward hooks)"
    jax_compatible_rng = False    # torch generators: the suite compares its noise in distribution

    def __init__(self, cfg):
        self.cfg = cfg

    def noise(self, shapes, seed, epoch, members, pop, sigma, rank):
        es = EggrollStrategy(mlp(shapes), pop, rank, sigma, seed=seed)
        return from_port(es.sample(epoch, sigma, torch.tensor(members)))

    def perturbed_linear(self, W, A, B, x):
        layer = torch.nn.Linear(W.shape[1], W.shape[0]).requires_grad_(False)
        layer.weight.copy_(torch.tensor(W))
        layer.bias.zero_()
        with EggrollStrategy(layer, pop=2).perturbed({"weight": (torch.tensor(A), torch.tensor(B))}):
            return layer(torch.tensor(x)).numpy()

    def shape_fitness(self, f, group_size=0):
        return shape_fitness(torch.tensor(f), group_size).numpy()

    def gradient(self, noise, shaped, sigma):
        shapes = {k: (v[0].shape[1], v[1].shape[1]) for k, v in noise.items() if isinstance(v, tuple)}
        return from_port(EggrollStrategy(mlp(shapes), pop=2).gradient(to_port(noise), torch.tensor(shaped)))

    # ---- optional: the full model, its init, the optimizer, the training loop's ES step
    def forward(self, params, noise, x):
        model = mlp({k: v.shape for k, v in params.items()}, params=params)
        with EggrollStrategy(model, pop=2).perturbed(to_port(noise or {})):
            return model(torch.tensor(x)).numpy()

    def init_params(self, shapes, seed):
        return from_port(mlp(shapes, seed).state_dict())

    def optimizer_init(self, params):
        return None      # plain SGD keeps no state

    def optimizer_step(self, params, state, noise, shaped, sigma, epoch):
        model = mlp({k: v.shape for k, v in params.items()}, params=params)
        EggrollStrategy(model, len(shaped), lr=self.cfg.lr).update(to_port(noise), torch.tensor(shaped))
        return from_port(model.state_dict()), state

    def es_init(self, params, seed):
        model = mlp({k: v.shape for k, v in params.items()}, params=params)
        c = self.cfg
        return EggrollStrategy(model, c.pop, c.rank, c.sigma, c.lr, seed=seed)

    def es_ask(self, es, epoch):
        return from_port(es.sample(epoch))

    def es_tell(self, es, noise, fitness, epoch):
        es.step(to_port(noise), torch.tensor(fitness), self.cfg.group_size)
        return es

    def es_params(self, es):
        return from_port(es.model.state_dict())

    def actions(self, logits, u):   # the port rolls out with rollout.episodes.run_episodes: inverse-CDF sampling
        return sample_actions(logits, u)


adapter = HooksAdapter
