"""Tree adapters for the tree suite's self-tests on a declared tree (examples/gpt_adapter.py's GPT): the worked
example with one protocol method overridden the way ports get it wrong (each drift must be caught and named), and
adapters whose tree or settings cannot be right (each must exit 2 before any check runs, saying what would be)."""
from __future__ import annotations

import math

import numpy as np
import torch

from examples import gpt_port
from examples.gpt_adapter import GPTAdapter
from spec.tree import Leaf, make_tree
from spec.tree_knobs import TreeKnobs
from tests.ports.lm_ports import by_classes
from torch_impl.tree.noise import make_plan


def Small(**settings):
    """The worked example at population 8 (the self-tests' size)."""
    return GPTAdapter(pop=8, **settings)


def TorchRng():
    """The worked example drawing from torch's own generator: checked in distribution."""
    return GPTAdapter(TreeKnobs(rng="torch"), pop=8)


def TorchRngSigmaDecay():
    return SigmaDecay(TreeKnobs(rng="torch"), pop=8)


# ----------------------------------------------------------------------------- one method overridden
class FitnessStd(GPTAdapter):
    """shape_fitness as (f - mean) / std, the commonest way to write it (no epsilon, no groups)."""

    def shape_fitness(self, f, group_size):
        return ((f - f.mean()) / f.std()).astype(np.float32)


class GradientTimesTwo(GPTAdapter):
    """gradient twice the reference's (e.g. the antithetic pair counted twice)."""

    def gradient(self, noise, shaped, sigma):
        return {k: v * 2 for k, v in super().gradient(noise, shaped, sigma).items()}


class GradientTimesN(GPTAdapter):
    """gradient N times the reference's (the mean's / N left out)."""

    def gradient(self, noise, shaped, sigma):
        return {k: v * np.float32(self.pop) for k, v in super().gradient(noise, shaped, sigma).items()}


class UpdateOverN(GPTAdapter):
    """update one N-th of the reference's step (its gradient as the reference's)."""

    def update(self, params, noise, shaped, sigma, lr):
        new = super().update(params, noise, shaped, sigma, lr)
        return {k: (params[k] + (new[k] - params[k]) / np.float32(self.pop)).astype(np.float32) for k in params}


class ProductWithoutLowRank(GPTAdapter):
    """perturbed_mm that drops the low-rank term: nn.Linear on the plain weight."""

    def perturbed_mm(self, W, A, B, x):
        return (x @ W.T).astype(np.float32)


class HalvesPairing(GPTAdapter):
    """noise with member i mirrored by member i + N/2 (the two halves), not by its neighbour."""

    def noise(self, seed, epoch, members, pop, sigma, rank):
        order = np.concatenate([np.arange(0, pop, 2), np.arange(1, pop, 2)])      # halves -> interleaved member
        whole = super().noise(seed, epoch, np.arange(pop), pop, sigma, rank)
        pick = order[np.asarray(members)]
        return {k: tuple(t[pick] for t in v) if isinstance(v, tuple) else v[pick] for k, v in whole.items()}


class NoiseNotOverSqrtRank(GPTAdapter):
    """A scaled by sigma, not sigma / sqrt(r)."""

    def noise(self, seed, epoch, members, pop, sigma, rank):
        out = super().noise(seed, epoch, members, pop, sigma, rank)
        return {k: (v[0] * np.float32(math.sqrt(rank)), v[1]) if isinstance(v, tuple) else v for k, v in out.items()}


class AdamStep(GPTAdapter):
    """update through optax's adam (fresh state: its first step) instead of sgd."""

    def update(self, params, noise, shaped, sigma, lr):
        g = self.gradient(noise, shaped, sigma)
        step = {k: np.float32(lr) * (v * np.float32(math.sqrt(self.pop))) /
                (np.abs(v * np.float32(math.sqrt(self.pop))) + np.float32(1e-8)) for k, v in g.items()}
        return {k: (params[k] + step[k]).astype(np.float32) for k in params}


class LrDecay(GPTAdapter):
    """Its training loop (es_tell) decays the learning rate by 0.9 per epoch."""

    def es_tell(self, state, noise, scores, epoch):
        params, seed = state
        new, _ = super().es_tell(state, noise, scores, epoch)
        return {k: params[k] + (new[k] - params[k]) * 0.9 ** epoch for k in params}, seed


class SigmaDecay(GPTAdapter):
    """Its training loop (es_ask) decays sigma by 0.9 per epoch."""

    def es_ask(self, state, epoch):
        out = super().es_ask(state, epoch)
        f = np.float32(0.9 ** epoch)
        return {k: (v[0] * f, v[1]) if isinstance(v, tuple) else v * f for k, v in out.items()}


class IgnoresNoiseReuse(GPTAdapter):
    """Declares noise_reuse 2 but its training loop draws fresh noise every epoch."""

    def es_ask(self, state, epoch):
        fresh = GPTAdapter(self.port.knobs, self.port.model, pop=self.pop, noise_reuse=1)
        return fresh._to_protocol(fresh.port.sample(state[1], epoch), np.arange(self.pop))


# ----------------------------------------------------------------------------- the product methods a tree needs
class WithoutTmm(GPTAdapter):
    """The worked example with the MLP's up projection declared mm (the same draws, gradient and step at the stored
    shape) and no perturbed_tmm: a tree without tmm leaves needs none."""

    perturbed_tmm = None

    def __init__(self, **settings):
        super().__init__(**settings)
        tree = self.tree
        self.tree = self.port.tree = make_tree([Leaf(leaf.path, leaf.shape, "mm" if leaf.cls == "tmm" else leaf.cls,
                                                     leaf.scan_axes) for leaf in map(tree.leaf, tree.declared)])
        es = self.port.es
        self.port.plan = make_plan(self.tree, self.port.knobs, es.pop, es.rank, es.noise_reuse, es.freeze_nonlora)


class NoTmmMethod(GPTAdapter):
    """The worked example (its MLP's up projection is tmm) without perturbed_tmm."""

    perturbed_tmm = None


# ----------------------------------------------------------------------------- trees that cannot be right
class ByClasses(GPTAdapter):
    """The faithful example, its tree given as leaf_classes + scan_axes (read with init_params' shapes)."""

    def __init__(self):
        super().__init__()
        by_classes(self)


class ParamNotInTree(ByClasses):
    def init_params(self, seed):
        return {**super().init_params(seed), "blocks.attn.bias": np.zeros((2, 16), np.float32)}


class LeafNotInParams(GPTAdapter):
    def init_params(self, seed):
        params = super().init_params(seed)
        del params["lm_head"]
        return params


class UnknownClass(ByClasses):
    def __init__(self):
        super().__init__()
        self.leaf_classes["blocks.attn.q"] = "lora"


class ScanAxisOutOfRange(ByClasses):
    def __init__(self):
        super().__init__()
        self.scan_axes["blocks.attn.q"] = (3,)


class ScanAxisNotLeading(ByClasses):
    """The stack declared on the last axis of a (L, d) vector: not a stack upstream's noiser takes."""

    def __init__(self):
        super().__init__()
        self.scan_axes["blocks.ln_1.weight"] = (1,)


class NotAMatrix(ByClasses):
    """An mm leaf declared without its stack axis: a (L, d, d) slice is not a matrix."""

    def __init__(self):
        super().__init__()
        del self.scan_axes["blocks.attn.q"]


class ClassTypo(ByClasses):
    """leaf_classes names 'blocks.attn.qq' for the parameter 'blocks.attn.q'."""

    def __init__(self):
        super().__init__()
        self.leaf_classes["blocks.attn.qq"] = self.leaf_classes.pop("blocks.attn.q")


class ScanTypo(ByClasses):
    def __init__(self):
        super().__init__()
        self.scan_axes["blocks.attn.qq"] = self.scan_axes.pop("blocks.attn.q")


class LawTypo(GPTAdapter):
    def __init__(self):
        super().__init__()
        self.init_laws["blocks.attn.qq"] = self.init_laws.pop("blocks.attn.q")


class TreeLeafTypo(GPTAdapter):
    """A declared `tree` whose leaf 'blocks.attn.qq' is init_params' 'blocks.attn.q'."""

    def __init__(self):
        super().__init__()
        self.tree = make_tree([Leaf("blocks.attn.qq" if leaf.path == "blocks.attn.q" else leaf.path, leaf.shape,
                                    leaf.cls, leaf.scan_axes) for leaf in self.tree.leaves])


class EmptyTree(GPTAdapter):
    def __init__(self):
        super().__init__()
        self.tree = make_tree([])

    def init_params(self, seed):
        return {}


class TooBig(GPTAdapter):
    """A full-rank leaf of 2048 x 4096, perturbed (freeze_nonlora off): its noise is 2 x 32 MiB per member (two epochs),
    1 GiB at population 16, beside 0.7 GiB that does not grow with it (the parameters' copies, the comparisons'
    blocks); the test gives the machine 1 GiB."""

    def __init__(self):
        super().__init__(freeze_nonlora=False)
        self.tree = make_tree([Leaf("ln", (2048, 4096), "param")])
        self.init_laws = {}

    def init_params(self, seed):
        return {"ln": np.broadcast_to(np.float32(0), (2048, 4096))}     # no memory: a read-only view


class OddPopulation(GPTAdapter):
    def __init__(self):
        super().__init__()
        self.pop = 7


class GradientOfOneLeaf(GPTAdapter):
    """Breaks the protocol mid-run: gradient returns only one leaf."""

    def gradient(self, noise, shaped, sigma):
        return {"lm_head": super().gradient(noise, shaped, sigma)["lm_head"]}


# ----------------------------------------------------------------------------- at population 8 (the bundle tests)
def UpdateOverNSmall():
    return UpdateOverN(pop=8)


def FitnessStdSmall():
    return FitnessStd(pop=8)


def HalvesPairingSmall():
    return HalvesPairing(pop=8)


def IgnoresNoiseReuseSmall():
    return IgnoresNoiseReuse(pop=8)


# ----------------------------------------------------------------------------- forward bugs (the forward check)
def plain_for_4d(x, W, A, B):
    """A projection helper of the port's own: a (members, batch, seq, dim) input goes through the plain weight."""
    return x @ W.T if x.dim() == 4 else gpt_port.linear(x, W, A, B)


def member_zero_linear(x, W, A, B):
    """nn.Linear's product with member 0's input in every member's base product."""
    plain = (x[:1] @ W.T).expand(*x.shape[:-1], W.shape[0])
    return plain if A is None else plain + gpt_port.lowrank(x, B, A)


def einsum_linear(x, W, A, B):
    """The low-rank term's einsum names x's and B's input index differently (each summed on its own)."""
    if A is None:
        return x @ W.T
    return x @ W.T + torch.einsum("m...r,mor->m...o", torch.einsum("m...i,mjr->m...r", x, B), A)


class QKVHelperGPT(gpt_port.EggrollGPT):
    project = staticmethod(plain_for_4d)


class MemberZeroGPT(gpt_port.EggrollGPT):
    linear = staticmethod(member_zero_linear)
    project = staticmethod(member_zero_linear)


class EinsumGPT(gpt_port.EggrollGPT):
    linear = staticmethod(einsum_linear)
    project = staticmethod(einsum_linear)


class HeadNoiseNotInForwardGPT(gpt_port.EggrollGPT):
    """The head's noise is handed out (and its gradient uses it) but the forward uses the plain head."""

    def _weight(self, noise, path, W, l):
        return (W, None, None) if path == "lm_head" else super()._weight(noise, path, W, l)


class DropoutGPT(gpt_port.EggrollGPT):
    """Dropout on the MLP's output, left on while scoring the population (the plain model runs without it)."""

    def _mlp(self, noise, params, x, l):
        return torch.nn.functional.dropout(super()._mlp(noise, params, x, l), 0.1, training=noise is not None)


class DoubledParamNoiseGPT(gpt_port.EggrollGPT):
    """A full-rank leaf's noise applied at twice its scale."""

    def _param(self, noise, path, value, l):
        out = super()._param(noise, path, value, l)
        return out if out is value else 2 * out - value[None, None, None]


def with_port(port_class: type, **settings) -> GPTAdapter:
    """The worked adapter on a GPT whose EGGROLL is `port_class`."""
    adapter = GPTAdapter(**settings)
    adapter.port.__class__ = port_class
    return adapter


# (the port's class, the leaf the forward check must name, words its cause must hold, needs freeze_nonlora off)
FORWARD_BUGS = {
    "qkv_helper_4d": (QKVHelperGPT, "blocks.attn.q[0]", "applies none of its noise", False),
    "member_zero_input": (MemberZeroGPT, "blocks.attn.q[0]", "depends on the other members' inputs", False),
    "einsum_sums_apart": (EinsumGPT, "blocks.attn.q[0]", "sums x and B over the input separately", False),
    "head_noise_not_in_forward": (HeadNoiseNotInForwardGPT, "lm_head", "applies none of its noise", False),
    "dropout_while_scoring": (DropoutGPT, "", "not deterministic", False),
    "full_rank_scale": (DoubledParamNoiseGPT, "blocks.ln_1.weight[0]", "at 2 times its scale", True),
}
