"""The functional torch EGGROLL (`torch_impl`) behind the port adapter protocol, configured by Knobs.

Each method converts numpy float32 to tensors on `device`, calls torch_impl exactly as its trainer
does (the strategy `torch_impl.es.make` resolves), and hands numpy back; no method reads a knob the suite
could not observe from outside (the suite diagnoses from observations, as it must for foreign ports).
"""
from __future__ import annotations

from functools import lru_cache

import numpy as np
import torch

from spec.config import OBS_DIM, Config
from spec.knobs import Knobs, drifts
from spec.layout import leaf_names, n_layers_of
from torch_impl import es, model
from torch_impl.fitness import shape_fitness
from torch_impl.gradient import es_gradient
from torch_impl.keys import GENERATORS
from torch_impl.noise import Noise, per_member, sample_noise
from torch_impl.train import ACTIONS, intra_op_threads


def one_thread():
    """The context the suite runs the built-in torch side in: one intra-op thread (its tensors are small)."""
    return intra_op_threads(1)


def _config_for(cfg: Config, shapes) -> Config:
    """cfg with the widths the shapes describe (the suite's shapes follow Config.sizes)."""
    n_layers = n_layers_of(shapes)
    hidden = shapes["0.weight"][0] if n_layers > 1 else cfg.hidden
    if shapes["0.weight"][1] != OBS_DIM:
        raise ValueError(f"torch_impl's MLP takes {OBS_DIM} inputs, the shapes say {shapes['0.weight'][1]}")
    return cfg.replace(layers=n_layers, hidden=hidden)


@lru_cache(maxsize=32)
def _sources(rng: str, seed: int, n_layers: int):
    """The run's per-leaf key sources (the ES key tree under rng=jax), computed once per (seed, layers)."""
    return GENERATORS[rng].leaf_sources(seed, leaf_names(n_layers))


class TorchPort:
    """torch_impl as a port: `TorchPort(cfg, knobs, device)`."""

    def __init__(self, cfg: Config, knobs: Knobs | None = None, device: str = "cpu"):
        self.cfg = cfg
        self.knobs = knobs or Knobs()
        self.device = torch.device(device)
        changed = drifts(self.knobs)
        label = ", ".join(f"{k}={v[1]}" for k, v in changed.items()) or "faithful"
        self.name = f"torch_impl ({label})"
        self.jax_compatible_rng = self.knobs.rng != "torch"            # jax, jax-cpu, jax-gpu: JAX's keys and draws
        self.es = es.make(cfg, self.knobs)

    # ---- conversions
    def _t(self, a) -> torch.Tensor:
        a = np.asarray(a)
        return torch.as_tensor(a if a.flags.writeable else a.copy(), device=self.device)

    def _params(self, params: dict) -> dict[str, torch.Tensor]:
        return {k: self._t(v) for k, v in params.items()}

    def _noise(self, noise: dict | None) -> Noise | None:
        if noise is None:
            return None
        A = {k: self._t(v[0]) for k, v in noise.items() if isinstance(v, tuple)}
        B = {k: self._t(v[1]) for k, v in noise.items() if isinstance(v, tuple)}
        bias = {k: self._t(v) for k, v in noise.items() if not isinstance(v, tuple)}
        return Noise(A, B, bias, bias_in_forward=self.es.plan.bias.in_forward)

    @staticmethod
    def _np_noise(noise: Noise, index: torch.Tensor | None = None) -> dict:
        noise = per_member(noise)     # the protocol hands noise per member; sample_noise may group it by draw
        pick = (lambda t: t) if index is None else (lambda t: t[index])
        out = {k: (pick(noise.A[k]).cpu().numpy(), pick(noise.B[k]).cpu().numpy()) for k in noise.A}
        out.update({k: pick(v).cpu().numpy() for k, v in noise.bias.items()})
        return out

    @staticmethod
    def _np(tree: dict) -> dict:
        return {k: v.detach().cpu().numpy() for k, v in tree.items()}

    # ---- required
    def noise(self, shapes, seed, epoch, members, pop, sigma, rank):
        cfg = _config_for(self.cfg, shapes).replace(pop=int(pop), rank=int(rank))
        plan = es.make(cfg, self.knobs).plan
        sources = _sources(self.knobs.rng, int(seed), cfg.layers)
        with torch.inference_mode():
            noise = sample_noise(plan, sources, dict(shapes), int(epoch), float(sigma), self.device)
        return self._np_noise(noise, torch.as_tensor(np.asarray(members), device=self.device))

    def perturbed_linear(self, W, A, B, x):
        """torch_impl.model.forward's product for one layer (zero bias, no activation after the last layer)."""
        params = {"0.weight": self._t(W), "0.bias": torch.zeros(W.shape[0], device=self.device)}
        noise = Noise({"0.weight": self._t(A)}, {"0.weight": self._t(B)}, {})
        with torch.inference_mode():
            return self._forward_fn(params, self._t(x), noise).cpu().numpy()

    @property
    def _forward_fn(self):
        """torch_impl's forward with this port's activation, matmul_precision and compile knobs."""
        return model.make_forward(self.knobs.activation, self.knobs.matmul_precision, self.knobs.compile)

    def shape_fitness(self, f, group_size=0):
        with torch.inference_mode():
            return shape_fitness(self._t(f), self.knobs.fitness, int(group_size)).cpu().numpy()

    def gradient(self, noise, shaped, sigma):
        tnoise = self._noise(noise)
        params = {}
        for name, (A, B) in ((k, v) for k, v in noise.items() if isinstance(v, tuple)):
            params[name] = torch.zeros(A.shape[1], B.shape[1], device=self.device)
            params[name.replace(".weight", ".bias")] = torch.zeros(A.shape[1], device=self.device)
        with torch.inference_mode():
            return self._np(es_gradient(tnoise, self._t(shaped), float(sigma), params, self.knobs.bias_grad))

    # ---- optional
    def forward(self, params, noise, x):
        tparams, tnoise = self._forward_inputs(params, noise)
        with torch.inference_mode():
            return self._forward_fn(tparams, self._t(x), tnoise).cpu().numpy()

    def _forward_inputs(self, params, noise):
        """params and noise as tensors, converted once per (params, noise) pair (a rollout calls forward per step)."""
        cached = getattr(self, "_inputs", None)
        if cached is not None and cached[0] is params and cached[1] is noise:
            return cached[2], cached[3]
        self._inputs = (params, noise, self._params(params), self._noise(noise))   # holds both: ids stay valid
        return self._inputs[2], self._inputs[3]

    def init_params(self, shapes, seed):
        cfg = _config_for(self.cfg, shapes)
        return self._np(model.init_params(cfg.sizes, self.knobs.init, self.es.plan.generator, int(seed),
                                          self.device))

    def optimizer_init(self, params):
        return self.es.optimizer.init(self._params(params))

    def optimizer_step(self, params, state, noise, shaped, sigma, epoch):
        """es.apply after the port's own gradient: -(g sqrt(N)) to the optimizer at lr_e, applied."""
        tparams = self._params(params)
        shaped_t = self._t(shaped)
        strategy = self.es._replace(cfg=self.es.cfg.replace(pop=int(shaped_t.shape[0])))
        with torch.inference_mode():
            grads = es_gradient(self._noise(noise), shaped_t, float(sigma), tparams, self.knobs.bias_grad)
            es_state = es.ESState(tparams, state, int(epoch), {}, {})
            new, _ = es.apply(strategy, es_state, grads)
            return self._np(new.params), new.opt_state

    def es_init(self, params, seed):
        tparams = self._params(params)
        cfg = _config_for(self.cfg, {k: np.shape(v) for k, v in params.items()})
        strategy = es.make(cfg, self.knobs)
        return {"es": strategy, "state": es.init(strategy, int(seed), self.device, params=tparams)}

    def _at(self, state, epoch: int) -> es.ESState:
        """The state, which must be at `epoch` (the suite asks and tells epochs in order)."""
        if state["state"].epoch != int(epoch):
            raise ValueError(f"the torch state is at epoch {state['state'].epoch}, asked for epoch {epoch}")
        return state["state"]

    def es_ask(self, state, epoch):
        with torch.inference_mode():
            noise, _ = es.ask(state["es"], self._at(state, epoch))
        return self._np_noise(noise)

    def es_tell(self, state, noise, fitness, epoch):
        with torch.inference_mode():
            new, _ = es.tell(state["es"], self._at(state, epoch), self._noise(noise), self._t(fitness))
        return {**state, "state": new}

    def es_params(self, state):
        return self._np(state["state"].params)

    def actions(self, logits, u):
        return ACTIONS[self.knobs.actions](logits, u)

    def action_uniforms(self, seed, epoch, pop):
        return self.es.plan.generator.action_uniforms(int(seed), int(epoch), int(pop))
