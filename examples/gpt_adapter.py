"""The worked example of the tree suite on a port's own tree: a small GPT (examples/gpt_port.py) behind the tree
protocol (parity/tree/adapter.py).

    python -m parity check --task tree --port examples.gpt_adapter:GPTAdapter       # 2 x 16, vocabulary 64
    python -m parity check --task tree --port examples.gpt_adapter:gpt2_small       # GPT-2 small's shapes, 163M

The sizes by name (GPT_SIZES; each a factory of this module, pop 16 as the example): `GPTAdapter` (2 blocks x 16
wide, 8,480 parameters), `gpt_4x128` (vocabulary 256, 0.86M), `gpt_6x384` (vocabulary 1,024, 11.5M) and
`gpt2_small` (12 x 768, vocabulary 50,257, context 1,024: GPT-2 small's shapes, 163M parameters with the head untied
as here, 124M tied as GPT-2's). `python -m bench --tree-sizes ...` times the tree suite on each (docs/studies.md).

The adapter declares the tree (`tree`) and the run's settings (rank, sigma, lr, group_size, noise_reuse,
freeze_nonlora, and the init laws), and converts at the boundary (numpy float32 in and out); each protocol method is
one call of the port:

    noise          -> EggrollGPT.sample(seed, epoch)        (its rows for `members`; factors as (A, B))
    perturbed_mm   -> gpt_port.linear(x, W, A, B)           nn.Linear's x @ W.T + (x @ B) @ A.T
    perturbed_tmm  -> gpt_port.conv1d(x, W, A, B)           Conv1D's x @ W + (x @ A) @ B.T
    shape_fitness  -> EggrollGPT.shape_fitness(f)
    gradient       -> EggrollGPT.gradients(noise, shaped)
    init_params    -> gpt_port.init_params(cfg, seed)
    update         -> EggrollGPT.step(params, EggrollGPT.gradients(noise, shaped))
    es_ask/es_tell -> sample, then shape_fitness, gradients and step on the scores the suite gives
    batch          -> random tokens (2, T), the same for every member
    population_forward -> EggrollGPT.logits(params, noise, tokens)   each member's logits on its own noise
    plain_forward  -> EggrollGPT.logits(params, None, tokens)        no noise, in the parameters' dtype

The forward check (parity/tree/forward.py) compares each member's population logits with the plain GPT's at
theta + E_i. `GPTAdapter(knobs)` takes
spec.tree_knobs.TreeKnobs so the self-tests can drift the port one knob at a time (tests/parity/tree/test_check.py).
"""
from __future__ import annotations

import dataclasses
import math

import numpy as np
import torch

from examples import gpt_port
from examples.gpt_port import EggrollGPT, ESConfig, GPTConfig
from spec.tree_knobs import TreeKnobs
from torch_impl.tree.noise import TreeNoise


def _np(t: torch.Tensor) -> np.ndarray:
    return t.detach().cpu().numpy().astype(np.float32, copy=False)


def _t(a) -> torch.Tensor:
    """A tensor of its own (the suite's arrays may be read-only)."""
    return torch.from_numpy(np.array(a, np.float32))


class GPTAdapter:
    """examples/gpt_port.py's GPT and its EGGROLL behind the tree protocol."""

    def __init__(self, knobs: TreeKnobs = TreeKnobs(), model: GPTConfig = GPTConfig(), **settings):
        es = dataclasses.replace(ESConfig(), **settings)       # e.g. GPTAdapter(pop=8, freeze_nonlora=False)
        self.port = EggrollGPT(model, es, knobs)
        self.tree = self.port.tree
        self.init_laws = gpt_port.init_laws(self.port.model)
        self.name = "examples.gpt_adapter (nanoGPT-style GPT)" + ("" if knobs == TreeKnobs() else f" {knobs}")
        self.jax_compatible_rng = knobs.rng != "torch"    # JAX's numbers (torch_impl.random): compared draw by draw
        vars(self).update(dataclasses.asdict(es))          # pop, rank, sigma, lr, group_size, noise_reuse, ...

    # ------------------------------------------------------------------ the boundary
    def _to_protocol(self, noise: TreeNoise, members) -> dict:
        idx = torch.as_tensor(np.asarray(members, np.int64))
        out = {}
        for path, A in noise.A.items():
            A, B = A[idx], noise.B[path][idx]
            out[path] = (_np(B), _np(A)) if noise.roles[path].transposed else (_np(A), _np(B))
        out.update({path: _np(eps[idx]) for path, eps in noise.eps.items()})   # leading stack: stored layout
        return out

    def _from_protocol(self, noise: dict) -> TreeNoise:
        roles, A, B, eps = self.port.plan.roles, {}, {}, {}
        for path, value in noise.items():
            if isinstance(value, tuple):
                a, b = (_t(v) for v in value)
                A[path], B[path] = (b, a) if roles[path].transposed else (a, b)
            else:
                eps[path] = _t(value)
        return TreeNoise(A, B, eps, roles, None)

    # ------------------------------------------------------------------ required
    def noise(self, seed, epoch, members, pop, sigma, rank):
        if (pop, rank, sigma) != (self.pop, self.rank, self.sigma):
            raise ValueError(f"this port runs pop {self.pop}, rank {self.rank}, sigma {self.sigma} (its declared "
                             f"settings); asked for {pop}, {rank}, {sigma}")
        with torch.inference_mode():
            return self._to_protocol(self.port.sample(seed, epoch), members)

    def perturbed_mm(self, W, A, B, x):
        with torch.inference_mode():
            return _np(gpt_port.linear(_t(x), _t(W), _t(A), _t(B)))

    def perturbed_tmm(self, W, A, B, x):
        with torch.inference_mode():
            return _np(gpt_port.conv1d(_t(x), _t(W), _t(A), _t(B)))

    def shape_fitness(self, f, group_size):
        with torch.inference_mode():
            return _np(self.port.shape_fitness(_t(f)))

    def gradient(self, noise, shaped, sigma):
        with torch.inference_mode():
            return {k: _np(v) for k, v in self.port.gradients(self._from_protocol(noise), _t(shaped)).items()}

    # ------------------------------------------------------------------ optional
    def init_params(self, seed):
        return {k: _np(v) for k, v in gpt_port.init_params(self.port.model, seed).items()}

    def update(self, params, noise, shaped, sigma, lr):
        with torch.inference_mode():
            grads = self.port.gradients(self._from_protocol(noise), _t(shaped))
            return {k: _np(v) for k, v in self.port.step({k: _t(v) for k, v in params.items()}, grads).items()}

    # a training run driven by the suite (state: (params, seed)); the port's forward would give the scores
    def es_init(self, params, seed):
        return {k: _t(v) for k, v in params.items()}, int(seed)

    def es_ask(self, state, epoch):
        with torch.inference_mode():
            return self._to_protocol(self.port.sample(state[1], epoch), np.arange(self.port.es.pop))

    def es_tell(self, state, noise, scores, epoch):
        with torch.inference_mode():
            grads = self.port.gradients(self._from_protocol(noise), self.port.shape_fitness(_t(scores)))
            return self.port.step(state[0], grads), state[1]

    def es_params(self, state):
        return {k: _np(v) for k, v in state[0].items()}

    # the model, for the forward check: each member's logits against the plain GPT at theta + E_i
    def batch(self, seed):
        """Random tokens (2, T), T = min(block_size, 16): the same for every member, short enough that a GPT-2-sized
        population's logits stay small."""
        model, gen = self.port.model, torch.Generator().manual_seed(seed)
        return torch.randint(0, model.vocab, (2, min(model.block_size, 16)), generator=gen).numpy()

    def population_forward(self, params, noise, batch):
        """EggrollGPT.logits on the members' noise: (m, 2, T, vocab)."""
        with torch.inference_mode():
            noise = self._from_protocol(noise)
            m = next(iter({**noise.A, **noise.eps}.values())).shape[0]
            return _np(self.port.logits({k: _t(v) for k, v in params.items()}, noise,
                                        torch.from_numpy(batch).expand(m, *batch.shape)))

    def plain_forward(self, params, batch):
        """The same GPT with no noise, in the parameters' dtype (float64 parameters: a float64 evaluation)."""
        with torch.inference_mode():
            return self.port.logits({k: torch.from_numpy(np.array(v)) for k, v in params.items()}, None,
                                    torch.from_numpy(batch)[None])[0].numpy()

# ----------------------------------------------------------------------------- the sizes by name
GPT_SIZES: dict[str, GPTConfig] = {
    "GPTAdapter": GPTConfig(),
    "gpt_4x128": GPTConfig(vocab=256, block_size=64, n_layer=4, n_head=4, n_embd=128),
    "gpt_6x384": GPTConfig(vocab=1024, block_size=256, n_layer=6, n_head=6, n_embd=384),
    "gpt2_small": GPTConfig(vocab=50257, block_size=1024, n_layer=12, n_head=12, n_embd=768),
}


def n_params(cfg: GPTConfig) -> int:
    """The GPT's parameter count (every leaf of gpt_tree(cfg))."""
    return sum(math.prod(leaf.shape) for leaf in gpt_port.gpt_tree(cfg).leaves)


def gpt_4x128() -> GPTAdapter:
    """4 blocks x 128 wide, vocabulary 256, context 64 (862,464 parameters)."""
    return GPTAdapter(model=GPT_SIZES["gpt_4x128"])


def gpt_6x384() -> GPTAdapter:
    """6 blocks x 384 wide, vocabulary 1,024, context 256 (11,511,552 parameters)."""
    return GPTAdapter(model=GPT_SIZES["gpt_6x384"])


def gpt2_small() -> GPTAdapter:
    """GPT-2 small's shapes: 12 blocks x 768 wide, 12 heads, vocabulary 50,257, context 1,024 (162,954,240 parameters:
    the head is untied here; 124M with it tied, as GPT-2's)."""
    return GPTAdapter(model=GPT_SIZES["gpt2_small"])
