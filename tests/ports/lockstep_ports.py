"""Planted departures of the es_* loop that only several epochs tell apart (issue 53, items 4 and 7): the worked GPT
example (examples.gpt_adapter.GPTAdapter) stepping through torch.optim.SGD with momentum or weight decay, or torch's
Adam, instead of optax.sgd(lr); a loop that reuses noise wrongly at epoch 1 and steps with Adam; a learning rate that
decays on a scaled gradient. Each overrides the es_* methods alone."""
from __future__ import annotations

import math

import numpy as np
import torch

from examples.gpt_adapter import GPTAdapter, _t


class TorchOptimizer(GPTAdapter):
    """es_tell through a torch optimizer (`make(params) -> torch.optim.Optimizer`) over the leaves the reference
    steps, on the loss gradient -(g sqrt(N)), its state carried in es_* state: (params, seed, (tensors, optimizer))."""

    def make(self, params):
        raise NotImplementedError

    def es_init(self, params, seed):
        p, s = super().es_init(params, seed)
        stepped = [leaf.path for leaf in self.tree.leaves
                   if leaf.cls in ("mm", "tmm") or (leaf.cls == "param" and not self.freeze_nonlora)]
        tensors = {k: p[k].clone() for k in stepped}          # the leaves the reference steps, alone
        return p, s, (tensors, self.make(list(tensors.values())))

    def es_ask(self, state, epoch):
        return super().es_ask(state[:2], epoch)

    def es_tell(self, state, noise, scores, epoch):
        params, seed, (tensors, opt) = state
        with torch.inference_mode():
            grads = self.port.gradients(self._from_protocol(noise), self.port.shape_fitness(_t(scores)))
        root = math.sqrt(self.pop)
        with torch.no_grad():
            for k, t in tensors.items():
                t.copy_(params[k])
                t.grad = (-(grads[k].clone() * self.gradient_scale(epoch)) * root).to(torch.float32)
            opt.step()
        return {**params, **{k: t.detach().clone() for k, t in tensors.items()}}, seed, (tensors, opt)

    def gradient_scale(self, epoch):
        return 1.0

    def es_params(self, state):
        return super().es_params(state[:2])


class NesterovWeightDecay(TorchOptimizer):
    """torch.optim.SGD with nesterov momentum 0.1 and weight decay 1e-2: its first step reads as a 1.1x scale."""

    def make(self, params):
        return torch.optim.SGD(params, lr=self.lr, momentum=0.1, nesterov=True, weight_decay=1e-2)


class Momentum09(TorchOptimizer):
    """torch.optim.SGD with momentum 0.9, not nesterov."""

    def make(self, params):
        return torch.optim.SGD(params, lr=self.lr, momentum=0.9)


class WeightDecayOnly(TorchOptimizer):
    """torch.optim.SGD with weight decay 1e-2 and no momentum."""

    def make(self, params):
        return torch.optim.SGD(params, lr=self.lr, weight_decay=1e-2)


class ReusesWronglyAndAdam(TorchOptimizer):
    """Two independent departures: torch's Adam (optax.adam's defaults) for the step, and at epoch 1 a fresh draw
    where the reference reuses epoch 0's (noise_reuse 2)."""

    def make(self, params):
        return torch.optim.Adam(params, lr=self.lr, eps=1e-8)

    def es_ask(self, state, epoch):
        if epoch != 1:
            return super().es_ask(state, epoch)
        fresh = GPTAdapter(self.port.knobs, self.port.model, pop=self.pop, noise_reuse=1)
        return fresh._to_protocol(fresh.port.sample(state[1], epoch), np.arange(self.pop))


class LrDecayOnScaledGradient(TorchOptimizer):
    """Plain sgd on 2x the gradient, its learning rate decayed by 0.9 per epoch."""

    def make(self, params):
        return torch.optim.SGD(params, lr=self.lr)

    def gradient_scale(self, epoch):
        return 2.0 * 0.9 ** epoch


class PlainTorchSGD(TorchOptimizer):
    """torch.optim.SGD(lr) on -(g sqrt(N)): the reference's step, through torch's optimizer (faithful)."""

    def make(self, params):
        return torch.optim.SGD(params, lr=self.lr)


class ScaledGradient(TorchOptimizer):
    """Plain sgd on 2x the gradient at every epoch: a constant scale, named as the scale (no optimizer state)."""

    def make(self, params):
        return torch.optim.SGD(params, lr=self.lr)

    def gradient_scale(self, epoch):
        return 2.0


class OptaxTrace(GPTAdapter):
    """optax.sgd(lr, momentum=0.5)'s trace written out in numpy float32 (trace = g + mu trace; updates = -lr trace on
    the solver input -(g sqrt(N))), its trace carried in es_* state: (params, seed, trace)."""

    MU = np.float32(0.5)

    def es_init(self, params, seed):
        p, s = super().es_init(params, seed)
        return p, s, None

    def es_ask(self, state, epoch):
        return super().es_ask(state[:2], epoch)

    def es_tell(self, state, noise, scores, epoch):
        params, seed, trace = state
        with torch.inference_mode():
            grads = self.port.gradients(self._from_protocol(noise), self.port.shape_fitness(_t(scores)))
        root, lr = np.float32(math.sqrt(self.pop)), np.float32(self.lr)
        g = {k: -(v.numpy().astype(np.float32) * root) for k, v in grads.items() if k in noise}   # perturbed leaves
        trace = g if trace is None else {k: (g[k] + self.MU * trace[k]).astype(np.float32) for k in g}
        new = {k: (_t(params[k].numpy() - lr * trace[k]) if k in trace else params[k]) for k in params}
        return new, seed, trace

    def es_params(self, state):
        return super().es_params(state[:2])
