"""examples/instep_port.py behind the parity protocol: a port that keeps no factors and draws its noise inside step().

    python -m parity check --port examples.instep_adapter:adapter

Two patterns make such a port checkable (docs/ports.md "Ports that draw their noise inside step()"):
- dense noise: the port materialises E = A B^T per member, so the adapter declares `dense_noise = True` and every
  noise dict it gives or takes holds E (m, out, in) for a weight;
- the port's noise-drawing method, replaced on the instance: `es_tell` makes `perturbations()` return the noise
  the suite hands in, so the port's own `step()` runs on it; `noise`/`es_ask` call that method to see what the
  step would draw, inside `torch.random.fork_rng()` so that a port drawing from torch's global generator is left
  where it was (this one re-seeds its own generator, so peeking is harmless anyway).
"""
import contextlib

import torch

from examples.hooks_port import MLP, shape_fitness
from examples.instep_port import DenseES


def to_port(tree):    # protocol names "0.weight" -> the module's "layers.0.weight"; numpy -> torch
    return {f"layers.{k}": torch.tensor(v) for k, v in tree.items()}


def from_port(tree, rows=slice(None)):  # and back (copies: the port updates its tensors in place)
    return {k.removeprefix("layers."): v[rows].detach().numpy().copy() for k, v in tree.items()}


def model_for(shapes, params=None):   # the port's MLP for the suite's shapes ("{t}.weight": (out, in))
    dims = [shapes[f"{t}.weight"] for t in range(sum(k.endswith(".weight") for k in shapes))]
    model = MLP([dims[0][1]] + [out for out, _ in dims]).requires_grad_(False)
    if params is not None:
        model.load_state_dict(to_port(params))
    return model


def peek(es):
    """The noise es.step() would draw now, the port's generators left as they were."""
    with torch.random.fork_rng():
        return es.perturbations()


@contextlib.contextmanager
def given_noise(es, noise):
    """Inside the block the port's step draws `noise` (torch, port names) instead of its own."""
    es.perturbations = lambda: noise       # an instance attribute hides the class's method
    try:
        yield
    finally:
        del es.perturbations


class InStepAdapter:
    name = "examples.instep_port (dense perturbations, noise drawn inside step)"
    jax_compatible_rng = False    # torch's generator: the suite compares its noise in distribution
    dense_noise = True            # weight noise is E (m, out, in): the port keeps no factors

    def __init__(self, cfg):
        self.cfg = cfg

    def noise(self, shapes, seed, epoch, members, pop, sigma, rank):
        es = DenseES(model_for(shapes), pop, rank, sigma, seed=seed, sigma_decay=1.0)   # at the sigma asked for
        es.epoch = epoch
        return from_port(peek(es), torch.tensor(members))

    def perturbed_linear(self, W, E, x):
        return torch.bmm(torch.tensor(x), (torch.tensor(W) + torch.tensor(E)).transpose(1, 2)).numpy()

    def shape_fitness(self, f, group_size=0):
        return shape_fitness(torch.tensor(f), group_size).numpy()

    def gradient(self, noise, shaped, sigma):
        shapes = {k: v.shape[1:] for k, v in noise.items() if k.endswith(".weight")}
        return from_port(DenseES(model_for(shapes), 2).gradient(to_port(noise), torch.tensor(shaped)))

    # ---- optional: the model and the training loop (no init_params or optimizer_step: those checks are skipped)
    def forward(self, params, noise, x):
        es = DenseES(model_for({k: v.shape for k, v in params.items()}, params), 2)
        with torch.no_grad():
            return es.forward(torch.tensor(x), None if noise is None else to_port(noise)).numpy()

    def es_init(self, params, seed):
        c = self.cfg
        return DenseES(model_for({k: v.shape for k, v in params.items()}, params), c.pop, c.rank, c.sigma, c.lr, seed)

    def es_ask(self, es, epoch):
        assert es.epoch == epoch, (es.epoch, epoch)
        return from_port(peek(es))

    def es_tell(self, es, noise, fitness, epoch):
        with given_noise(es, to_port(noise)):
            es.step(lambda policy: torch.tensor(fitness))    # the suite's returns for the population
        return es

    def es_params(self, es):
        return from_port(dict(es.model.named_parameters()))


adapter = InStepAdapter
