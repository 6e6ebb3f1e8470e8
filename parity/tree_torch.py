"""torch_impl's tree ES (the byte-level LM) as numpy, configured by TreeKnobs: what the LM suite compares."""
from __future__ import annotations

import numpy as np
import torch

from spec.lm import LMConfig
from spec.tree import Leaf
from spec.tree_knobs import TreeKnobs
from torch_impl import lm, lm_es
from torch_impl.tree_noise import dense, sample


class TorchTree:
    """One configured torch side: init, dense noise per leaf, shaping, scores and gradients."""

    def __init__(self, cfg: LMConfig, knobs: TreeKnobs):
        self.cfg, self.knobs = cfg, knobs
        self.es = lm_es.make(cfg, knobs)
        self.name = "torch_impl" + ("" if knobs == TreeKnobs() else " (" + ", ".join(
            f"{k}={getattr(knobs, k)}" for k in vars(knobs) if getattr(knobs, k) != getattr(TreeKnobs(), k)) + ")")

    def _state(self, seed: int, params: dict | None = None):
        tparams = None if params is None else {k: torch.from_numpy(np.array(v)) for k, v in params.items()}
        return lm_es.init(self.es, seed, "cpu", tparams)

    def init(self, seed: int) -> dict[str, np.ndarray]:
        return {k: v.numpy() for k, v in self._state(seed).params.items()}

    def noise(self, seed: int, epoch: int):
        state = self._state(seed)
        return sample(self.es.plan, state.sources, epoch, self.cfg.sigma)

    def dense_noise(self, seed: int, epoch: int, leaf: Leaf) -> np.ndarray | None:
        """(pop, *shape) perturbation of one leaf, or None when this side does not perturb it."""
        noise = self.noise(seed, epoch)
        if noise.roles[leaf.path].kind == "none":
            return None
        with torch.inference_mode():
            return dense(noise, leaf).numpy()

    def shape(self, f: np.ndarray) -> np.ndarray:
        return self.es.shaping(torch.from_numpy(np.asarray(f, np.float32))).numpy()

    def scores(self, seed: int, params: dict, epoch: int, tokens: np.ndarray, noise: bool):
        state = self._state(seed, params)
        n = sample(self.es.plan, state.sources, epoch, self.cfg.sigma) if noise else None
        with torch.inference_mode():
            s, inter = lm.forward(state.params, torch.from_numpy(tokens.astype(np.int64)), n, intermediates=True)
        return s.numpy(), {k: v.numpy() for k, v in inter.items()}

    def grads(self, seed: int, epoch: int, shaped: np.ndarray) -> dict[str, np.ndarray]:
        noise = self.noise(seed, epoch)
        with torch.inference_mode():
            g = lm_es.leaf_gradients(self.es.tree, noise, torch.from_numpy(np.array(shaped, np.float32)))
        return {k: v.numpy() for k, v in g.items()}
