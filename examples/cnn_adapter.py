"""examples/cnn_port.py's CNN behind the tree protocol: a conv weight (out, in, kh, kw) declared as an mm leaf
perturbed through its matrix (out, in * kh * kw).

    python -m parity check --task tree --port examples.cnn_adapter:CNNAdapter

parity.tree.torch_module.ModuleAdapter reads the tree from the module (an nn.Conv2d weight is mm with matrix
(out, in * kh * kw) by default: spec.tree.Leaf(path, shape, "mm", matrix=(a, b))), init_params and plain_forward
(F.conv2d with W + E_i, no EGGROLL code); this file hands over the port's noise (factors of the matrix), its
population forward (the conv as the mm of its matrix on im2col patches), the matrix product, fitness shaping,
gradient and step.
"""
from __future__ import annotations

import dataclasses

import numpy as np
import torch

from examples import cnn_port as cp
from parity.tree.torch_module import ModuleAdapter, numpy_of, tensors
from spec.tree_knobs import TreeKnobs


class CNNAdapter(ModuleAdapter):
    jax_compatible_rng = True          # torch_impl's tree noise on JAX's keys: compared draw by draw

    def __init__(self, model: cp.CNNConfig = cp.CNNConfig(), knobs: TreeKnobs = TreeKnobs(), **settings):
        super().__init__(lambda: cp.CNN(model))
        es = dataclasses.replace(cp.ESConfig(), **settings)
        self.config, self.es = model, cp.Eggroll(self.module, self.tree, es, knobs)
        self.name = f"examples.cnn_adapter (CNN {model.in_ch}->{model.width}, {model.kernel}x{model.kernel} convs)"
        vars(self).update(dataclasses.asdict(es))          # pop, rank, sigma, lr, group_size, noise_reuse, ...

    # ---- the boundary: factors as the port holds them, (A (m, a, r), B (m, b, r)) at the declared matrix
    def _protocol(self, noise, members) -> dict:
        idx = torch.as_tensor(np.asarray(members, np.int64))
        out = {p: (numpy_of(A[idx]), numpy_of(noise.B[p][idx])) for p, A in noise.A.items()}
        out.update({p: numpy_of(e[idx]) for p, e in noise.eps.items()})
        return out

    def _noise(self, noise: dict):
        from torch_impl.tree.noise import TreeNoise
        lowrank = {p: tensors(v) for p, v in noise.items() if isinstance(v, tuple)}
        return TreeNoise({p: v[0] for p, v in lowrank.items()}, {p: v[1] for p, v in lowrank.items()},
                         {p: tensors(v) for p, v in noise.items() if not isinstance(v, tuple)}, self.es.plan.roles,
                         None)

    def noise(self, seed, epoch, members, pop, sigma, rank):
        with torch.inference_mode():
            return self._protocol(self.es.sample(seed, epoch), members)

    def perturbed_mm(self, W, A, B, x):
        with torch.inference_mode():
            return numpy_of(cp.linear(*tensors((x, W, A, B))))

    def shape_fitness(self, f, group_size):
        return numpy_of(self.es.shape_fitness(tensors(f)))

    def gradient(self, noise, shaped, sigma):
        return numpy_of(self.es.gradients(self._noise(noise), tensors(shaped)))

    def update(self, params, noise, shaped, sigma, lr):
        return numpy_of(self.es.step(tensors(params), self.es.gradients(self._noise(noise), tensors(shaped))))

    # ---- a training run driven by the suite
    def es_init(self, params, seed):
        return tensors(params), int(seed)

    def es_ask(self, state, epoch):
        return self._protocol(self.es.sample(state[1], epoch), np.arange(self.es.es.pop))

    def es_tell(self, state, noise, scores, epoch):
        shaped = self.es.shape_fitness(tensors(scores))
        return self.es.step(state[0], self.es.gradients(self._noise(noise), shaped)), state[1]

    def es_params(self, state):
        return numpy_of(state[0])

    # ---- the model
    def batch(self, seed):
        return numpy_of(cp.images(seed, self.config))

    def population_forward(self, params, noise, batch):
        self.load(params)
        return numpy_of(self.es.score(tensors(batch), {p: tensors(v) for p, v in noise.items()}))


SMALL = dict(model=cp.CNNConfig(in_ch=2, image=6, width=4, classes=3), pop=8)


def small() -> CNNAdapter:
    """The small size (2 -> 4 channels, 6 x 6 images, pop 8)."""
    return CNNAdapter(**SMALL)


class TorchRng(CNNAdapter):
    """The same port on torch's generator (torch_impl's tree noise, knob rng=torch): checked in distribution."""

    jax_compatible_rng = False

    def __init__(self, model: cp.CNNConfig = cp.CNNConfig(), **settings):
        super().__init__(model, TreeKnobs(rng="torch"), **settings)
