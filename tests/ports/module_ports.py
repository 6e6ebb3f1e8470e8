"""The forward bugs of real torch EGGROLL ports, planted one at a time in the worked module example
(examples/module_port.py behind examples/module_adapter.py, the adapter unchanged): each must be caught by the
forward check and named with its leaf, and the layers' products check must say how where it can see it."""
from __future__ import annotations

import dataclasses
from typing import NamedTuple

import torch
from torch.nn import functional as F

from examples import module_port as mp
from examples.module_adapter import Adapter

SMALL = dict(config=mp.Config(vocab=32, block_size=6, n_layer=3, n_head=2, n_embd=8), es=mp.ES(pop=8))


# ----------------------------------------------------------------------------- the bugs
def plain_for_3d(layer: mp.EggLinear, x: torch.Tensor) -> torch.Tensor:
    """The port's own projection helper: a (batch, seq, dim) input goes through the plain weight (the noise is
    skipped), other inputs through the layer."""
    return F.linear(x, layer.weight, layer.bias) if x.dim() == 3 else layer(x)


class QKVHelperAttention(mp.Attention):
    """Attention whose q, k and v go through plain_for_3d: its input is folded to 3-D, so they are never perturbed."""

    def project(self, x3):
        return tuple(plain_for_3d(layer, x3) for layer in (self.q, self.k, self.v))


class QKVHelperBlock(mp.Block):
    attention = QKVHelperAttention


class QKVHelperGPT(mp.GPT):
    block = QKVHelperBlock


class MemberZeroLinear(mp.EggLinear):
    """The base product takes member 0's input for every member."""

    def base(self, x):
        return (x[:1] @ self.weight.T).expand(x.shape[0], -1, -1)


class EinsumLinear(mp.EggLinear):
    """The low-rank term's einsum names x's and B's input index differently: each is summed away on its own."""

    def lowrank(self, x):
        return torch.einsum("mnr,mor->mno", torch.einsum("mni,mjr->mnr", x, self.B), self.A)


class DoubledNoiseLayerNorm(mp.EggLayerNorm):
    """A full-rank leaf's noise applied at twice its scale."""

    def set_population(self, eps_w=None, eps_b=None):
        super().set_population(None if eps_w is None else 2 * eps_w, eps_b)


def with_layers(model: type, swap: dict) -> type:
    """`model` with each layer of a class in `swap` made an instance of its replacement (the same parameters)."""
    class Swapped(model):
        def __init__(self, cfg):
            super().__init__(cfg)
            for module in self.modules():
                if type(module) in swap:
                    module.__class__ = swap[type(module)]
    return Swapped


class HeadNoiseNotInForward(mp.Eggroll):
    """Hands out lm_head's noise (and its gradient uses it) but never sets it on the layer: the forward ignores it."""

    def set_population(self, noise):
        super().set_population(noise)
        self.model.lm_head.set_population(None, None, None)


class DropoutWhileScoring(mp.Eggroll):
    """Scores the population in training mode (a module starts in it): dropout stays on."""

    def score(self, tokens, noise):
        model = self.model
        model.eval = lambda: model          # the port's scoring never leaves training mode
        return super().score(tokens, noise)


class Bug(NamedTuple):
    """A planted bug: what the adapter is built with, the leaf the forward check names and words of its cause, and the
    leaf and words of the layers' products row (parity.tree.layers) that says how ("" where it cannot see it)."""

    settings: dict
    leaf: str
    says: str
    layer: str = ""
    layer_says: str = ""


BUGS = {
    "qkv_helper_3d": Bug(dict(model=QKVHelperGPT), "blocks.0.attn.q.weight", "applies none of its noise",
                         "blocks.0.attn.q.weight", "its module was never called"),
    "member_zero_input": Bug(dict(model=with_layers(mp.GPT, {mp.EggLinear: MemberZeroLinear})),
                             "blocks.0.attn.q.weight", "depends on the other members' inputs",
                             "blocks.0.attn.o.weight", "uses member 0's input for every member"),
    "einsum_sums_apart": Bug(dict(model=with_layers(mp.GPT, {mp.EggLinear: EinsumLinear})), "blocks.0.attn.q.weight",
                             "sums x and B over the input separately", "blocks.0.attn.q.weight",
                             "sums x and the input-side factor over the input separately"),
    "head_noise_not_in_forward": Bug(dict(eggroll=HeadNoiseNotInForward), "lm_head.weight",
                                     "applies none of its noise", "lm_head.weight", "leaves out the low-rank term"),
    "dropout_while_scoring": Bug(dict(eggroll=DropoutWhileScoring), "blocks.0.ln_1.weight", "not deterministic"),
    "full_rank_scale": Bug(dict(model=with_layers(mp.GPT, {mp.EggLayerNorm: DoubledNoiseLayerNorm})),
                           "blocks.0.ln_1.weight", "at 2 times its scale"),
}


def planted(bug: str, size: str) -> Adapter:
    """The worked adapter on a port with one bug, at size "small" (3 blocks of 8, pop 8) or "example" (its own)."""
    kwargs = dict(SMALL) if size == "small" else {}
    if bug == "full_rank_scale":         # the layer norms perturbed: freeze_nonlora off
        kwargs["es"] = dataclasses.replace(kwargs.get("es", mp.ES()), freeze_nonlora=False)
    return Adapter(**kwargs, **BUGS[bug].settings)


def HeadNoiseNotInForward() -> Adapter:
    """The CLI's example of a forward bug (`--port tests.ports.module_ports:HeadNoiseNotInForward`)."""
    return planted("head_noise_not_in_forward", "example")
