"""The byte-level LM of spec/lm.py as plain tensors: the whole population's forward in batched calls.

params: {path: float32 tensor} at lm_tree's shapes (blocks stacked on axis 0); noise: a tree.noise.TreeNoise
(None: noise off); tokens (m, T + 1) -> scores (m,), each member's log2-likelihood per byte. Members are
batched in every op (a loop over blocks and over the recurrence's time steps is inherent). The perturbed ops,
float32 in the reference's order of operations:
    mm(W, x)  = x @ W.T + (x @ B) @ A.T        tmm(W, x) = x @ W + (x @ A) @ B.T
    emb(x)    = embed[x]    (embedding=lowrank: embed[x] + A[x] @ B.T)
    param     = param + eps (the member's sign applied; frozen leaves as stored)
A pair's factors are stored once (TreeNoise.signs): the low-rank term is computed for both members with the
pair's factors and multiplied by +-1 afterwards, which is exact (x @ (-A) rounds to -(x @ A)).

Agreement with jax_reference.lm: the same formula and order of operations, but not bit for bit. The matrix
products (torch's CPU GEMM vs XLA's Eigen dot: another summation order), the means (rms, the score's mean over
T) and the transcendental functions (sigmoid, exp and log inside log_softmax: XLA's and torch's float32
implementations differ by a few ULPs) round differently, so the two sides agree within float32 bounds the
parity suite derives, not bit for bit.

Intermediates (`intermediates=True`), keyed as jax_reference.lm's (an insertion-ordered dict in forward order,
each entry named after the leaf whose op produced it, with the member axis first):
    "embed" (m, T, d)   "blocks.{l}.ln1" u   ".shift" s   ".wz" mm(wz, s)   ".bz" z = sigmoid(. + bz)
    ".wh" c   ".h0" h (the states)   ".ln2" v   ".up" tmm(up, v) (before relu)   ".down" (m, T, d)
    ".out" e after block l   "ln_f" y   "head" logits (m, T, 256)   "score" (m,)
"""
from __future__ import annotations

import functools
import math

import torch

from spec.lm import RMS_EPS
from torch_impl.tree.noise import TreeNoise

LN2 = torch.tensor(math.log(2.0), dtype=torch.float32)   # the score divides by float32(ln 2)
Params = dict[str, torch.Tensor]


@functools.lru_cache(maxsize=16)
def _on_device(name: str, device: torch.device, signs: tuple[float, ...] = ()) -> torch.Tensor:
    """A constant made once per device (no host-to-device copy per forward, so a CUDA graph can capture it):
    "ln2" (LN2) or "signs" (the antithetic signs, (1, k, 1, 1))."""
    if name == "ln2":
        return LN2.to(device)
    return torch.tensor(signs, dtype=torch.float32, device=device).view(1, len(signs), 1, 1)


def rms(x: torch.Tensor) -> torch.Tensor:
    """x / sqrt(mean(x * x) + 1e-5) over the last axis."""
    return x / torch.sqrt((x * x).mean(dim=-1, keepdim=True) + RMS_EPS)


class Member:
    """One forward's view of the noise: the factors and noisy params of leaf `path`, slice l, for m members."""

    def __init__(self, noise: TreeNoise | None, m: int, device):
        self.noise = noise
        self.k = 1 if noise is None or noise.signs is None else len(noise.signs)
        if m % self.k:
            raise ValueError(f"{m} members do not fill whole antithetic groups of {self.k}")
        self.signs = None if noise is None or noise.signs is None else \
            _on_device("signs", torch.device(device), tuple(noise.signs))

    def factors(self, path: str, l: int | None):
        """(A, B) of slice l (rows, a, r), (rows, b, r), or None when the leaf is not perturbed."""
        if self.noise is None or path not in self.noise.A:
            return None
        A, B = self.noise.A[path], self.noise.B[path]
        return (A, B) if l is None else (A[:, l], B[:, l])

    def lowrank(self, x: torch.Tensor, inner: torch.Tensor, outer: torch.Tensor) -> torch.Tensor:
        """(x @ inner) @ outer.T per row of factors, x (m, T, n) -> (m, T, out), each member's sign applied."""
        m, T, n = x.shape
        rows = x.reshape(m // self.k, self.k * T, n)
        low = torch.bmm(torch.bmm(rows, inner), outer.transpose(1, 2))          # (rows, k T, out)
        if self.signs is None:
            return low.view(m, T, -1)
        return (low.view(m // self.k, self.k, T, -1) * self.signs).view(m, T, -1)

    def param(self, path: str, value: torch.Tensor, l: int | None = None) -> torch.Tensor:
        """The leaf's value per member (m, 1, *shape) when perturbed (value + eps * sign), else value itself."""
        if self.noise is None or path not in self.noise.eps:
            return value
        eps = self.noise.eps[path] if l is None else self.noise.eps[path][:, l]       # (rows, *shape)
        if self.signs is not None:
            s = self.signs.view(1, self.k, *([1] * (eps.dim() - 1)))
            eps = (eps.unsqueeze(1) * s).flatten(0, 1)
        return (value + eps).unsqueeze(1)

    def embed(self, path: str, table: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        """table[x] (+ A[x] @ B.T per member when the embedding is perturbed); x (m, T) long -> (m, T, d)."""
        e = table[x]
        f = self.factors(path, None)
        if f is None:
            return e
        A, B = f                                                                     # (rows, V, r), (rows, d, r)
        m, T = x.shape
        rows = x.reshape(m // self.k, self.k * T)
        picked = torch.gather(A, 1, rows.unsqueeze(-1).expand(-1, -1, A.shape[-1]))    # (rows, k T, r)
        low = torch.bmm(picked, B.transpose(1, 2))
        low = low.view(m, T, -1) if self.signs is None else (low.view(m // self.k, self.k, T, -1) * self.signs)
        return e + low.reshape(m, T, -1)


def _linear(noise: Member, path: str, W: torch.Tensor, x: torch.Tensor, l: int | None, form: str) -> torch.Tensor:
    """mm (x @ W.T) or tmm (x @ W) of the stored W, plus the member's low-rank term."""
    plain = x @ (W.T if form == "mm" else W)
    f = noise.factors(path, l)
    if f is None:
        return plain
    A, B = f
    return plain + (noise.lowrank(x, B, A) if noise.noise.roles[path].form == "mm" else noise.lowrank(x, A, B))


def recurrence(h0: torch.Tensor, z: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
    """h_t = h_{t-1} + z_t * (c_t - h_{t-1}) from h_{-1} = h0 (d,): z, c (m, T, d) -> h (m, T, d)."""
    h = h0.expand(z.shape[0], -1)
    states = []
    for t in range(z.shape[1]):
        h = h + z[:, t] * (c[:, t] - h)
        states.append(h)
    return torch.stack(states, dim=1)


def block(params: Params, noise: Member, e: torch.Tensor, l: int, inter: dict | None) -> torch.Tensor:
    """Block l: e + h(rms(e) * ln1), then + down(relu(up(rms(.) * ln2))); (m, T, d) -> (m, T, d)."""
    P = lambda name: params[f"blocks.{name}"][l]                                           # noqa: E731
    u = rms(e) * noise.param("blocks.ln1", P("ln1"), l)
    shift = noise.param("blocks.shift", P("shift"), l)                                     # (2, d) or (m, 1, 2, d)
    u_prev = torch.nn.functional.pad(u[:, :-1], (0, 0, 1, 0))                               # u_{-1} = 0
    s = shift[..., 0, :] * u + shift[..., 1, :] * u_prev
    wz_s = _linear(noise, "blocks.wz", P("wz"), s, l, "mm")
    z = torch.sigmoid(wz_s + noise.param("blocks.bz", P("bz"), l))
    c = _linear(noise, "blocks.wh", P("wh"), s, l, "mm")
    h = recurrence(P("h0"), z, c)
    e = e + h
    v = rms(e) * noise.param("blocks.ln2", P("ln2"), l)
    up = _linear(noise, "blocks.up", P("up"), v, l, "tmm")
    down = _linear(noise, "blocks.down", P("down"), torch.relu(up), l, "mm")
    e = e + down
    if inter is not None:
        inter.update({f"blocks.{l}.{k}": t for k, t in (("ln1", u), ("shift", s), ("wz", wz_s), ("bz", z),
                                                          ("wh", c), ("h0", h), ("ln2", v), ("up", up),
                                                          ("down", down), ("out", e))})
    return e


def logits_of(params: Params, x: torch.Tensor, noise: TreeNoise | None = None,
              inter: dict | None = None) -> torch.Tensor:
    """logits (m, T, 256) of bytes x (m, T) long for each member (noise None: the unperturbed model)."""
    member = Member(noise, x.shape[0], x.device)
    e = member.embed("embed", params["embed"], x)
    if inter is not None:
        inter["embed"] = e
    for l in range(params["blocks.wz"].shape[0]):
        e = block(params, member, e, l, inter)
    y = rms(e) * member.param("ln_f", params["ln_f"])
    logits = _linear(member, "head", params["head"], y, None, "mm")
    if inter is not None:
        inter.update(ln_f=y, head=logits)
    return logits


def score_logits(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """mean_t log_softmax(logits_t)[x_{t+1}] / float32(ln 2): (m, T, V), (m, T) -> (m,)."""
    logp = torch.log_softmax(logits, dim=-1)
    return logp.gather(-1, targets.unsqueeze(-1)).squeeze(-1).mean(dim=-1) / _on_device("ln2", logits.device)


def forward(params: Params, tokens: torch.Tensor, noise: TreeNoise | None = None, intermediates: bool = False):
    """Scores (m,) of tokens (m, T + 1) (uint8 or integer): member i perturbed by its noise row (None: off).

    intermediates=True returns (scores, dict) with the module docstring's entries.
    """
    tokens = torch.as_tensor(tokens).to(torch.int64)
    if tokens.dim() != 2 or tokens.shape[1] < 2:
        raise ValueError(f"tokens must be (members, T + 1) with T >= 1, got shape {tuple(tokens.shape)}")
    inter = {} if intermediates else None
    scores = score_logits(logits_of(params, tokens[:, :-1], noise, inter), tokens[:, 1:])
    if not intermediates:
        return scores
    inter["score"] = scores
    return scores, inter


def bits_per_byte(params: Params, windows: torch.Tensor, score=forward) -> float:
    """Mean bits per byte (-score) of the unperturbed model over windows (n, T + 1): noise off. `score`: forward or
    its captured form (torch_impl.cuda_graphs.graphed)."""
    with torch.inference_mode():
        return float(-score(params, windows).mean())
