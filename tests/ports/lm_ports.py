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


def by_classes(port) -> None:
    """port's declared `tree` replaced by the same declaration as leaf_classes + scan_axes (the suite then reads the
    shapes from init_params)."""
    tree = port.tree
    del port.tree
    port.leaf_classes = {leaf.path: leaf.cls for leaf in tree.leaves}
    port.scan_axes = {leaf.path: leaf.scan_axes for leaf in tree.leaves if leaf.scan_axes}


class ByClasses(LMAdapter):
    """The faithful port, its tree given as leaf_classes + scan_axes (read with init_params' shapes)."""

    def __init__(self, cfg):
        super().__init__(cfg)
        by_classes(self)


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


# ----------------------------------------------------------------------------- in distribution (rng=torch)
class TorchRng(LMAdapter):
    """The faithful port on torch's generator (jax_compatible_rng False): the base of the drifts below."""

    def __init__(self, cfg, knobs=TreeKnobs()):
        super().__init__(cfg, knobs.replace(rng="torch"))


def _scaled(value, c):
    return (value[0] * np.float32(c), value[1]) if isinstance(value, tuple) else value * np.float32(c)


SCALE = 2.0


class NoiseAtTwiceSigma(TorchRng):
    """Every perturbation twice as large: only the noise's law shows it (gradients, forward and steps are computed on
    the port's own noise, so they agree with the reference's on it)."""

    def noise(self, seed, epoch, members, pop, sigma, rank):
        return {p: _scaled(v, SCALE) for p, v in super().noise(seed, epoch, members, pop, sigma, rank).items()}

    def es_ask(self, state, epoch):
        return {p: _scaled(v, SCALE) for p, v in super().es_ask(state, epoch).items()}


class AskAtTwiceSigma(TorchRng):
    """Its training loop (es_ask) draws at twice the scale of its noise(): only the trajectory's es_ask rows see it."""

    def es_ask(self, state, epoch):
        return {p: _scaled(v, SCALE) for p, v in super().es_ask(state, epoch).items()}


class NoPairs(TorchRng):
    """Member 2k+1 gets member 2k-1's noise, the negation of pair k-1's draw: pairs broken, every draw still +-."""

    def noise(self, seed, epoch, members, pop, sigma, rank):
        def unpair(x):
            x = np.array(x)
            x[1::2] = np.roll(x[1::2], 1, axis=0)
            return x
        out = super().noise(seed, epoch, members, pop, sigma, rank)
        return {p: tuple(map(unpair, v)) if isinstance(v, tuple) else unpair(v) for p, v in out.items()}


class SameNoiseEveryEpoch(TorchRng):
    """Draws once and reuses it every epoch (noise_reuse 0 while the run asks for 1)."""

    def noise(self, seed, epoch, members, pop, sigma, rank):
        return super().noise(seed, 0, members, pop, sigma, rank)


class InitTooWide(TorchRng):
    """Normal leaves drawn at 1.5x their stated scale (deterministic leaves as they should be)."""

    def init_params(self, seed):
        from spec.lm import init_plan
        plan = init_plan(self.cfg)
        return {p: v * np.float32(1.5) if plan[p].kind in ("normal", "h0") else v
                for p, v in super().init_params(seed).items()}


class ForwardIgnoresHeadNoise(TorchRng):
    """The forward leaves the head's low-rank term out (its noise is drawn and used in the update)."""

    def forward(self, params, noise, tokens, intermediates=False):
        return super().forward(params, None if noise is None else {p: v for p, v in noise.items() if p != "head"},
                               tokens, intermediates)


class GradientTwiceAsLarge(TorchRng):
    def gradient(self, noise, shaped, sigma):
        return {p: v * np.float32(2) for p, v in super().gradient(noise, shaped, sigma).items()}
