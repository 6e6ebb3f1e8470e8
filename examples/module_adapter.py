"""examples/module_port.py's GPT (a torch nn.Module with EGGROLL in its own layers) behind the tree protocol:

    python -m parity check --task tree --port examples.module_adapter:Adapter

parity.tree.torch_module.ModuleAdapter reads the tree, init_params and plain_forward from the module; this file
says only what is the port's: its noise, its population forward, its fitness shaping, gradient and step, a batch
and one perturbed product. The port draws from torch's generator, so the suite checks its noise in distribution.
"""
from __future__ import annotations

import dataclasses

from examples import module_port as mp
from parity.tree.torch_module import ModuleAdapter, numpy_of, tensors


class Adapter(ModuleAdapter):
    jax_compatible_rng = False

    def __init__(self, config: mp.Config = mp.Config(), es: mp.ES = mp.ES(), model=mp.GPT, eggroll=mp.Eggroll):
        super().__init__(lambda: model(config))
        self.name = f"examples.module_port ({config.n_layer} blocks of {config.n_embd})"
        self.config, self.es = config, eggroll(self.module, es)
        vars(self).update(dataclasses.asdict(es))          # pop, rank, sigma, lr, group_size, noise_reuse, ...

    def batch(self, seed):
        return numpy_of(mp.tokens(seed, self.config))

    def noise(self, seed, epoch, members, pop, sigma, rank):
        return numpy_of(self.es.noise(seed, epoch), rows=members)

    def population_forward(self, params, noise, batch):
        self.load(params)
        return numpy_of(self.es.score(tensors(batch), tensors(noise)))

    def perturbed_mm(self, W, A, B, x):
        layer = mp.EggLinear(W.shape[1], W.shape[0], bias=False)
        layer.weight.data, (layer.A, layer.B) = tensors(W), tensors((A, B))
        return numpy_of(layer(tensors(x)))

    def shape_fitness(self, f, group_size):
        return numpy_of(self.es.shape_fitness(tensors(f)))

    def gradient(self, noise, shaped, sigma):
        return self.full(numpy_of(self.es.gradient(tensors(noise), tensors(shaped))))

    def update(self, params, noise, shaped, sigma, lr):
        return numpy_of(self.es.step(tensors(params), self.es.gradient(tensors(noise), tensors(shaped))))
