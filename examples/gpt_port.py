"""A small GPT trained by EGGROLL in torch, written as a port would be: the model `examples/gpt_adapter.py` wraps for
`python -m parity check --task tree --port examples.gpt_adapter:GPTAdapter`.

The model is nanoGPT's shape: token and position embeddings, `n_layer` pre-norm blocks (layer norm, causal
self-attention with q, k, v and output projections, layer norm, a GELU MLP) stacked on a leading axis, a final layer
norm and an untied head. Weights are stored as nanoGPT's nn.Linear keeps them, (out, in) and used as x @ W.T (class
mm), except the MLP's up projection, stored (in, out) as GPT-2's Conv1D and used as x @ W (class tmm). Layer norm
weights and biases are full-rank leaves (class param); the embeddings are lookup tables (class embedding).

EGGROLL: every member i perturbs each mm / tmm slice by A_i B_i^T (rank r, A already times +-sigma/sqrt(r), B
standard normal), drawn with JAX's keys through torch_impl's tree noise (the key scheme of spec/tree.py: leaf i of
JAX's flatten order gets split(es_key, n_leaves)[i], a stacked leaf one key per slice, pair p's draw
normal(fold_in(fold_in(k, generation), p), (a + b, r)), members 2p and 2p + 1 with + and -). Param leaves are frozen
(freeze_nonlora, as upstream's LLM runs) unless the port is built with freeze_nonlora=False, and then get eps *
+-sigma. The fitness is shaped with group means and the global variance, the gradient is einsum(f A, B) / N per
slice, and the step is optax's sgd on -(g sqrt(N)): params + lr sqrt(N) g.

The port takes spec.tree_knobs.TreeKnobs so that the suite's self-tests can drift it one knob at a time (the knobs
resolve in torch_impl's tables: one place per side); the defaults are the reference's behaviour.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from spec.tree import ESSettings, Leaf, Tree, make_tree
from spec.tree_knobs import TreeKnobs
from torch_impl.tree.es import GROUP_FITNESS, leaf_gradients
from torch_impl.tree.noise import TreeNoise, make_plan, per_member, sample

Params = dict[str, torch.Tensor]


@dataclass(frozen=True)
class GPTConfig:
    """The model's size: vocabulary, context, blocks, heads, width and the MLP's width ratio."""

    vocab: int = 64
    block_size: int = 8
    n_layer: int = 2
    n_head: int = 2
    n_embd: int = 16
    mlp_ratio: int = 4


@dataclass(frozen=True)
class ESConfig(ESSettings):
    """The EGGROLL run's settings (what the adapter declares to the suite): spec.tree's, this example's own sigma,
    learning rate and a new draw every second epoch."""

    sigma: float = 0.05
    lr: float = 0.02
    noise_reuse: int = 2


INIT_STD = 0.02     # nanoGPT's normal init of every Linear and Embedding; c_proj's is scaled by 1 / sqrt(2 n_layer)


def gpt_tree(cfg: GPTConfig) -> Tree:
    """The GPT's leaves in declaration order; blocks stacked on axis 0 (scan axes (0,))."""
    d, h, L = cfg.n_embd, cfg.n_embd * cfg.mlp_ratio, cfg.n_layer
    block = {"ln_1.weight": ((d,), "param"), "ln_1.bias": ((d,), "param"),
             "attn.q": ((d, d), "mm"), "attn.k": ((d, d), "mm"), "attn.v": ((d, d), "mm"), "attn.o": ((d, d), "mm"),
             "ln_2.weight": ((d,), "param"), "ln_2.bias": ((d,), "param"),
             "mlp.c_fc": ((d, h), "tmm"), "mlp.c_proj": ((d, h), "mm")}
    leaves = [Leaf("wte", (cfg.vocab, d), "embedding"), Leaf("wpe", (cfg.block_size, d), "embedding")]
    leaves += [Leaf(f"blocks.{name}", (L,) + shape, cls, (0,)) for name, (shape, cls) in block.items()]
    leaves += [Leaf("ln_f.weight", (d,), "param"), Leaf("ln_f.bias", (d,), "param"),
               Leaf("lm_head", (cfg.vocab, d), "mm")]
    return make_tree(leaves)


def init_laws(cfg: GPTConfig) -> dict[str, object]:
    """nanoGPT's init, as laws: normal(0, 0.02) for weights and embeddings (c_proj 0.02 / sqrt(2 L)), layer norm
    weights ones and biases zeros."""
    laws: dict[str, object] = {}
    for leaf in gpt_tree(cfg).leaves:
        if leaf.cls == "param":
            laws[leaf.path] = "ones" if leaf.path.endswith("weight") else "zeros"
        else:
            laws[leaf.path] = ("normal", INIT_STD / (math.sqrt(2 * cfg.n_layer) if "c_proj" in leaf.path else 1))
    return laws


def init_params(cfg: GPTConfig, seed: int) -> Params:
    """Initial params from the port's own torch generator (seeded by the run seed), by init_laws."""
    gen = torch.Generator().manual_seed(int(seed))
    params = {}
    for leaf in gpt_tree(cfg).leaves:
        law = init_laws(cfg)[leaf.path]
        if isinstance(law, tuple):
            params[leaf.path] = torch.randn(leaf.shape, generator=gen) * law[1]
        else:
            params[leaf.path] = (torch.ones if law == "ones" else torch.zeros)(leaf.shape)
    return params


# ----------------------------------------------------------------------------- the perturbed products
def lowrank(x: torch.Tensor, inner: torch.Tensor, outer: torch.Tensor) -> torch.Tensor:
    """(x @ inner) @ outer^T per member: x (m, *rows, n), inner (m, n, r), outer (m, out, r) -> (m, *rows, out)."""
    flat = x.reshape(x.shape[0], -1, x.shape[-1])
    out = torch.bmm(torch.bmm(flat, inner), outer.transpose(1, 2))
    return out.reshape(*x.shape[:-1], outer.shape[1])


def linear(x: torch.Tensor, W: torch.Tensor, A: torch.Tensor | None, B: torch.Tensor | None) -> torch.Tensor:
    """nn.Linear's x @ W^T for W (out, in), plus each member's (x @ B) @ A^T (A (m, out, r), B (m, in, r))."""
    plain = x @ W.T
    return plain if A is None else plain + lowrank(x, B, A)


def conv1d(x: torch.Tensor, W: torch.Tensor, A: torch.Tensor | None, B: torch.Tensor | None) -> torch.Tensor:
    """GPT-2's Conv1D x @ W for W stored (in, out), plus each member's (x @ A) @ B^T (A (m, in, r), B (m, out, r))."""
    plain = x @ W
    return plain if A is None else plain + lowrank(x, A, B)


# ----------------------------------------------------------------------------- EGGROLL
class TreeES:
    """EGGROLL on a declared tree (plain tensors): noise, fitness shaping, the gradient and the sgd step; a model's
    ES (EggrollGPT here, examples/cnn_port.py's Eggroll) adds its perturbed forward."""

    def __init__(self, tree: Tree, es: ESConfig = ESConfig(), knobs: TreeKnobs = TreeKnobs()):
        self.tree, self.es, self.knobs = tree, es, knobs
        self.plan = make_plan(tree, knobs, es.pop, es.rank, es.noise_reuse, es.freeze_nonlora)

    def sample(self, seed: int, epoch: int) -> TreeNoise:
        """Every member's noise at `epoch` (one row per member, signs applied)."""
        sources = self.plan.generator.sources(self.tree, seed, self.knobs.leaf_order, self.knobs.stack_keys)
        return per_member(sample(self.plan, sources, epoch, self.es.sigma))

    def shape_fitness(self, f: torch.Tensor) -> torch.Tensor:
        return GROUP_FITNESS[self.knobs.group_fitness](f, self.es.group_size)

    def gradients(self, noise: TreeNoise, shaped: torch.Tensor) -> Params:
        return leaf_gradients(self.tree, noise, shaped)

    def step(self, params: Params, grads: Params) -> Params:
        """optax.sgd(lr) on -(g sqrt(N)), applied: params + lr sqrt(N) g (float32 as optax)."""
        scale = torch.tensor(self.es.lr, dtype=torch.float32) * torch.sqrt(torch.tensor(float(self.es.pop)))
        return {k: p + scale * grads[k] for k, p in params.items()}


class EggrollGPT(TreeES):
    """The GPT's ES: TreeES's noise, shaping, gradient and step, and the perturbed forward (plain tensors)."""

    linear = staticmethod(linear)       # the forward's products (a subclass may bring its own): every mm,
    conv1d = staticmethod(conv1d)       # every tmm,
    project = staticmethod(linear)      # and attention's q, k and v

    def __init__(self, model: GPTConfig = GPTConfig(), es: ESConfig = ESConfig(), knobs: TreeKnobs = TreeKnobs()):
        self.model = model
        super().__init__(gpt_tree(model), es, knobs)

    # ------------------------------------------------------------------ the forward (members batched)
    def _weight(self, noise: TreeNoise | None, path: str, W: torch.Tensor, l: int | None):
        """(W, A, B) of one slice; A, B None when unperturbed (a tmm factored transposed gives its (B, A))."""
        if noise is None or path not in noise.A:
            return W, None, None
        A, B = noise.A[path], noise.B[path]
        A, B = (A, B) if l is None else (A[:, l], B[:, l])
        return (W, B, A) if noise.roles[path].transposed else (W, A, B)

    def _param(self, noise: TreeNoise | None, path: str, value: torch.Tensor, l: int | None) -> torch.Tensor:
        """A full-rank leaf per member (m, 1, 1, *shape) when perturbed, else as stored."""
        if noise is None or path not in noise.eps:
            return value
        eps = noise.eps[path] if l is None else noise.eps[path][:, l]
        return (value + eps)[:, None, None]

    def _norm(self, noise, params: Params, name: str, x: torch.Tensor, l: int | None) -> torch.Tensor:
        at = (lambda t: t) if l is None else (lambda t: t[l])
        w = self._param(noise, f"{name}.weight", at(params[f"{name}.weight"]), l)
        b = self._param(noise, f"{name}.bias", at(params[f"{name}.bias"]), l)
        return torch.nn.functional.layer_norm(x, x.shape[-1:]) * w + b

    def _attention(self, noise, params: Params, x: torch.Tensor, l: int) -> torch.Tensor:
        m, batch, T, d = x.shape
        heads = lambda t: t.view(m, batch, T, self.model.n_head, -1).transpose(2, 3)         # noqa: E731
        q, k, v = (heads(self.project(x, *self._weight(noise, f"blocks.attn.{n}", params[f"blocks.attn.{n}"][l], l)))
                   for n in ("q", "k", "v"))
        y = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        y = y.transpose(2, 3).reshape(m, batch, T, d)
        return self.linear(y, *self._weight(noise, "blocks.attn.o", params["blocks.attn.o"][l], l))

    def _mlp(self, noise, params: Params, x: torch.Tensor, l: int) -> torch.Tensor:
        c_fc = self._weight(noise, "blocks.mlp.c_fc", params["blocks.mlp.c_fc"][l], l)
        up = self.conv1d(x, *c_fc)          # x W + (x A) B^T; factored transposed, _weight hands (B, A): x W + (x B) A^T
        W = params["blocks.mlp.c_proj"][l]
        return self.linear(torch.nn.functional.gelu(up), *self._weight(noise, "blocks.mlp.c_proj", W, l))

    def _embed(self, noise, params: Params, path: str, idx: torch.Tensor) -> torch.Tensor:
        """table[idx], plus each member's A[idx] @ B^T when the table is perturbed (knob embedding=lowrank); idx
        (m, ..., T) -> (m, ..., T, d)."""
        e = params[path][idx]
        if noise is None or path not in noise.A:
            return e
        A, B = noise.A[path], noise.B[path]                                      # (m, V, r), (m, d, r)
        members = torch.arange(A.shape[0]).view(-1, *([1] * (idx.dim() - 1)))
        Bt = B.transpose(1, 2).reshape(A.shape[0], *([1] * (idx.dim() - 2)), B.shape[2], B.shape[1])   # (m, .., r, d)
        return e + A[members, idx] @ Bt

    def logits(self, params: Params, noise: TreeNoise | None, idx: torch.Tensor) -> torch.Tensor:
        """(m, batch, T, vocab) logits of tokens idx (m, batch, T), member i on its own noise (None: off)."""
        m, T = idx.shape[0], idx.shape[-1]
        positions = torch.arange(T).expand(m, 1, T)
        x = self._embed(noise, params, "wte", idx) + self._embed(noise, params, "wpe", positions)
        for l in range(self.model.n_layer):
            x = x + self._attention(noise, params, self._norm(noise, params, "blocks.ln_1", x, l), l)
            x = x + self._mlp(noise, params, self._norm(noise, params, "blocks.ln_2", x, l), l)
        x = self._norm(noise, params, "ln_f", x, None)
        return self.linear(x, *self._weight(noise, "lm_head", params["lm_head"], None))

    def fitness(self, params: Params, noise: TreeNoise | None, idx: torch.Tensor) -> torch.Tensor:
        """Each member's mean log-likelihood of the next token (m,), on tokens idx (m, batch, T + 1)."""
        logp = torch.log_softmax(self.logits(params, noise, idx[..., :-1]), dim=-1)
        return logp.gather(-1, idx[..., 1:, None]).squeeze(-1).mean(dim=(1, 2))
