"""Tree adapters for the LM suite's self-tests: the worked example drifted through its knobs, and adapters whose
tree declaration cannot be right (each must exit 2 before any check runs, saying what would be right)."""
from __future__ import annotations

import numpy as np

from examples.lm_adapter import LMAdapter
from spec.lm import lm_tree
from spec.tree_knobs import TreeKnobs


def SharedStackKeys(cfg):
    """Every slice of a stacked leaf drawn from the leaf's own key (knob stack_keys=shared)."""
    return LMAdapter(cfg, TreeKnobs(stack_keys="shared"))


class ByClasses(LMAdapter):
    """The faithful port, its tree given as leaf_classes + scan_axes (read with init_params' shapes)."""

    def __init__(self, cfg):
        super().__init__(cfg)
        tree = self.tree
        del self.tree
        self.leaf_classes = {leaf.path: leaf.cls for leaf in tree.leaves}
        self.scan_axes = {leaf.path: leaf.scan_axes for leaf in tree.leaves if leaf.scan_axes}


class UnknownClass(ByClasses):
    def __init__(self, cfg):
        super().__init__(cfg)
        self.leaf_classes["blocks.up"] = "lora"


class ScanAxisOutOfRange(ByClasses):
    def __init__(self, cfg):
        super().__init__(cfg)
        self.scan_axes["blocks.wz"] = (3,)


class TreeNotParams(LMAdapter):
    """Declares the LM's tree but its init_params stores the head transposed."""

    def init_params(self, seed):
        params = super().init_params(seed)
        params["head"] = np.ascontiguousarray(params["head"].T)
        return params


class NoTree(LMAdapter):
    def __init__(self, cfg):
        super().__init__(cfg)
        del self.tree


class OtherModel(LMAdapter):
    """A consistent declaration, but not the LM's: one block fewer."""

    def __init__(self, cfg):
        super().__init__(cfg)
        self.tree = lm_tree(cfg.replace(layers=cfg.layers + 1))

    def init_params(self, seed):
        return {p: np.zeros(s, np.float32) for p, s in self.tree.shapes.items()}


class ScoresPerToken(LMAdapter):
    """forward returns (m, T) scores, not one per member (breaks the protocol mid-run: exit 2)."""

    def forward(self, params, noise, tokens, intermediates=False):
        out = super().forward(params, noise, tokens, intermediates)
        scores = out[0] if intermediates else out
        per_token = np.repeat(scores[:, None], tokens.shape[1] - 1, axis=1)
        return (per_token, out[1]) if intermediates else per_token


class TrainsAtTwiceTheRate(LMAdapter):
    """Its own training loop (es_tell) steps twice as far as its update(): only the trajectory sees it."""

    def es_tell(self, state, noise, scores, epoch):
        new = super().es_tell(state, noise, scores, epoch)
        return new._replace(params={k: 2 * new.params[k] - state.params[k] for k in new.params})
