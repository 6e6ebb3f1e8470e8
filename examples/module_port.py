"""A nanoGPT-style torch port whose EGGROLL lives in its own modules, as most torch ports are written: the model
`examples/module_adapter.py` wraps for `python -m parity check --task tree --port examples.module_adapter:Adapter`.

The model is an `nn.Module` (token and position embeddings, `n_layer` pre-norm blocks of causal self-attention with
q, k, v and output projections and a GELU MLP, a final layer norm, an untied head; nanoGPT's dropout). EGGROLL lives in
two layer types that hold the population's noise as state:

- `EggLinear` (an `nn.Linear`): after `set_population(A, B, bias_eps)` its input carries the members first, as
  (m, ..., in) or folded into the batch (m * k, ..., in), and member i computes x (W + A_i B_i^T)^T + b + eps_i;
- `EggLayerNorm` (an `nn.LayerNorm`): member i's weight and bias are w + eps_i and b + eps'_i.

`Eggroll` is the port's own strategy on its own torch generator: antithetic pairs (members 2k and 2k + 1 with + and
- the same draw), A = sigma / sqrt(r) N(0, 1) and B = N(0, 1) per pair and layer, eps = sigma N(0, 1) for the 1-D
parameters unless freeze_nonlora, a new draw every noise_reuse epochs, fitness shaped with group means and the
global variance, the gradient einsum(f A, B) / N (mean(f eps) for the 1-D parameters), and sgd on -(g sqrt(N)).
`Eggroll.score` is its population forward: `model.eval()`, the population set, the members' logits.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F

from examples.gpt_port import ESConfig, GPTConfig


@dataclass(frozen=True)
class Config(GPTConfig):
    """The model's size (examples.gpt_port's GPTConfig: vocabulary, context, blocks, heads, width, the MLP's ratio)
    and nanoGPT's dropout."""

    dropout: float = 0.1


@dataclass(frozen=True)
class ES(ESConfig):
    """The EGGROLL run's settings (examples.gpt_port's), a new draw every epoch."""

    noise_reuse: int = 1


# ----------------------------------------------------------------------------- the layers with population state
def members_first(x: torch.Tensor, m: int) -> torch.Tensor:
    """(m, rows, features): x's leading axis is the members, or the members folded into the batch (member-major)."""
    return x.reshape(m, -1, x.shape[-1])


class EggLinear(nn.Linear):
    """nn.Linear that, with a population set, adds member i's low-rank term: x W^T + (x B_i) A_i^T + b + eps_i."""

    A: torch.Tensor | None = None          # (m, out, r), already times +-sigma / sqrt(r)
    B: torch.Tensor | None = None          # (m, in, r)
    bias_eps: torch.Tensor | None = None   # (m, out)

    def set_population(self, A=None, B=None, bias_eps=None) -> None:
        self.A, self.B, self.bias_eps = A, B, bias_eps

    def lowrank(self, x: torch.Tensor) -> torch.Tensor:
        """(x B_i) A_i^T per member: x (m, rows, in) -> (m, rows, out)."""
        return torch.bmm(torch.bmm(x, self.B), self.A.transpose(1, 2))

    def base(self, x: torch.Tensor) -> torch.Tensor:
        """x W^T for every member: x (m, rows, in) -> (m, rows, out)."""
        return x @ self.weight.T

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.A is None:
            return super().forward(x)
        xm = members_first(x, self.A.shape[0])
        y = self.base(xm) + self.lowrank(xm)
        if self.bias is not None:
            y = y + (self.bias if self.bias_eps is None else self.bias + self.bias_eps[:, None])
        return y.reshape(*x.shape[:-1], y.shape[-1])


class EggLayerNorm(nn.LayerNorm):
    """nn.LayerNorm whose weight and bias, with a population set, are member i's w + eps_i and b + eps'_i."""

    eps_w: torch.Tensor | None = None      # (m, d)
    eps_b: torch.Tensor | None = None

    def set_population(self, eps_w=None, eps_b=None) -> None:
        self.eps_w, self.eps_b = eps_w, eps_b

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.eps_w is None and self.eps_b is None:
            return super().forward(x)
        m = (self.eps_w if self.eps_w is not None else self.eps_b).shape[0]
        w = self.weight if self.eps_w is None else self.weight + self.eps_w
        b = self.bias if self.eps_b is None else self.bias + self.eps_b
        xm = F.layer_norm(members_first(x, m), x.shape[-1:], eps=self.eps)
        return (xm * w.reshape(-1, 1, x.shape[-1]) + b.reshape(-1, 1, x.shape[-1])).reshape(x.shape)


# ----------------------------------------------------------------------------- the model
class Attention(nn.Module):
    def __init__(self, cfg: Config):
        super().__init__()
        self.n_head = cfg.n_head
        self.q, self.k, self.v, self.o = (EggLinear(cfg.n_embd, cfg.n_embd) for _ in range(4))
        self.dropout = nn.Dropout(cfg.dropout)

    def heads(self, t: torch.Tensor) -> torch.Tensor:
        """(n, T, d) -> (n, heads, T, d / heads)."""
        n, T, d = t.shape
        return t.view(n, T, self.n_head, d // self.n_head).transpose(1, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x (..., T, d): the leading axes (members, batch) folded into one batch axis for attention."""
        T, d = x.shape[-2:]
        x3 = x.reshape(-1, T, d)
        q, k, v = (self.heads(t) for t in self.project(x3))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True,
                                           dropout_p=self.dropout.p if self.training else 0.0)
        y = y.transpose(1, 2).reshape(-1, T, d)
        return self.dropout(self.o(y)).reshape(x.shape)

    def project(self, x3: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """q, k and v of the folded input x3 (n, T, d)."""
        return self.q(x3), self.k(x3), self.v(x3)


class Block(nn.Module):
    attention = Attention

    def __init__(self, cfg: Config):
        super().__init__()
        h = cfg.n_embd * cfg.mlp_ratio
        self.ln_1, self.ln_2 = EggLayerNorm(cfg.n_embd), EggLayerNorm(cfg.n_embd)
        self.attn = self.attention(cfg)
        self.c_fc, self.c_proj = EggLinear(cfg.n_embd, h), EggLinear(h, cfg.n_embd)
        self.dropout = nn.Dropout(cfg.dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x))
        return x + self.dropout(self.c_proj(F.gelu(self.c_fc(self.ln_2(x)))))


class GPT(nn.Module):
    """tokens (batch, T) -> logits (batch, T, vocab); with a population of m set, (m, batch, T, vocab)."""

    block = Block

    def __init__(self, cfg: Config = Config()):
        super().__init__()
        self.cfg = cfg
        self.wte, self.wpe = nn.Embedding(cfg.vocab, cfg.n_embd), nn.Embedding(cfg.block_size, cfg.n_embd)
        self.drop = nn.Dropout(cfg.dropout)
        self.blocks = nn.ModuleList(self.block(cfg) for _ in range(cfg.n_layer))
        self.ln_f = EggLayerNorm(cfg.n_embd)
        self.lm_head = EggLinear(cfg.n_embd, cfg.vocab)
        self.members = 0                      # the population's size while one is set
        for name, p in self.named_parameters():      # nanoGPT's init
            if p.dim() == 2:
                std = 0.02 / (math.sqrt(2 * cfg.n_layer) if name.endswith("c_proj.weight") else 1)
                nn.init.normal_(p, 0.0, std)
            elif name.endswith("bias"):
                nn.init.zeros_(p)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        T = idx.shape[-1]
        x = self.drop(self.wte(idx) + self.wpe(torch.arange(T, device=idx.device)))      # (batch, T, d)
        if self.members:
            x = x.expand(self.members, *x.shape)                                          # (m, batch, T, d)
        for block in self.blocks:
            x = block(x)
        return self.lm_head(self.ln_f(x))


# ----------------------------------------------------------------------------- EGGROLL
Noise = dict[str, object]     # name -> (A (m, a, r), B (m, b, r)) for an EggLinear weight, or eps (m, *shape)


class Eggroll:
    """The port's EGGROLL on a GPT: which parameters it perturbs, its noise, the population forward's state, the
    fitness shaping, the gradient and the step."""

    def __init__(self, model: GPT, es: ES = ES()):
        self.model, self.es = model, es
        owners = dict(model.named_modules())
        self.lowrank = [n for n, _ in model.named_parameters()
                        if n.endswith(".weight") and isinstance(owners[n[:-len(".weight")]], EggLinear)]
        self.fullrank = [] if es.freeze_nonlora else [n for n, p in model.named_parameters() if p.dim() == 1]
        self.owners = owners

    def noise(self, seed: int, epoch: int) -> Noise:
        """Every member's noise at `epoch` (a new draw every noise_reuse epochs), from torch's generator."""
        es, params = self.es, dict(self.model.named_parameters())
        generation = epoch // es.noise_reuse
        out: Noise = {}
        for j, name in enumerate(self.lowrank + self.fullrank):
            gen = torch.Generator().manual_seed(int(np.random.SeedSequence([seed, generation, j]).generate_state(1)[0]))
            shape, half = params[name].shape, es.pop // 2
            signs = torch.tensor([1.0, -1.0]).repeat(half)
            if name in self.lowrank:
                a, b = shape
                A = torch.randn(half, a, es.rank, generator=gen) * (es.sigma / math.sqrt(es.rank))
                B = torch.randn(half, b, es.rank, generator=gen)
                out[name] = (A.repeat_interleave(2, 0) * signs[:, None, None], B.repeat_interleave(2, 0))
            else:
                eps = torch.randn(half, *shape, generator=gen) * es.sigma
                out[name] = eps.repeat_interleave(2, 0) * signs.view(-1, *([1] * len(shape)))
        return out

    def set_population(self, noise: Noise | None) -> None:
        """Hand each layer its members' noise (None: clear it); the model then takes the members first."""
        members = 0
        for name, owner in self.owners.items():
            if isinstance(owner, EggLinear):
                A, B = noise.get(f"{name}.weight", (None, None)) if noise else (None, None)
                owner.set_population(A, B, noise.get(f"{name}.bias") if noise else None)
                members = A.shape[0] if A is not None else members
            elif isinstance(owner, EggLayerNorm):
                owner.set_population(*(noise.get(f"{name}.{p}") if noise else None for p in ("weight", "bias")))
        self.model.members = members if noise else 0

    def score(self, tokens: torch.Tensor, noise: Noise) -> torch.Tensor:
        """The population forward: each member's logits (m, batch, T, vocab) on the same tokens (batch, T), dropout
        off."""
        self.model.eval()
        self.set_population(noise)
        try:
            with torch.no_grad():
                return self.model(tokens)
        finally:
            self.set_population(None)

    def shape_fitness(self, f: torch.Tensor) -> torch.Tensor:
        """(f - its group's mean) / sqrt(var(f) + 1e-5), the variance over the whole population."""
        g = self.es.group_size or f.numel()
        centred = (f.reshape(-1, g) - f.reshape(-1, g).mean(1, keepdim=True)).reshape(-1)
        return centred / torch.sqrt(f.var(correction=0) + 1e-5)

    def gradient(self, noise: Noise, shaped: torch.Tensor) -> dict[str, torch.Tensor]:
        """einsum(f A, B) / N for each low-rank weight, mean(f eps) for each perturbed 1-D parameter."""
        n = shaped.shape[0]
        return {name: (torch.einsum("n,nar,nbr->ab", shaped, *value) / n if isinstance(value, tuple)
                       else torch.einsum("n,n...->...", shaped, value) / n) for name, value in noise.items()}

    def step(self, params: dict[str, torch.Tensor], grads: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """sgd on -(g sqrt(N)): params + lr sqrt(N) g (the parameters it does not perturb unchanged)."""
        scale = self.es.lr * math.sqrt(self.es.pop)
        return {k: p + scale * grads[k] if k in grads else p for k, p in params.items()}


def tokens(seed: int, cfg: Config, batch: int = 2) -> torch.Tensor:
    """A batch of random tokens (batch, block_size) for a seed."""
    return torch.randint(0, cfg.vocab, (batch, cfg.block_size), generator=torch.Generator().manual_seed(seed))
