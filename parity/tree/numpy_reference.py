"""The JAX reference's tree math (parity/tree/reference.py) in numpy, for a check replayed from a bundle without JAX:
the noise, shaping, gradient, step and products on any declared tree (cfg: spec.lm.LMConfig or spec.tree.TreeRun), and
the LM's forward.

What only JAX can produce, its normals, comes in through `draws(cfg, seed, epoch, leaf, variant)` (the recorded
tree_reference.draws); everything else is arithmetic: the noise (signs, sigma / sqrt(r), A B^T), shaping, the ES
gradient, the optax-sgd step, the perturbed products and the forward. Each function has tree_reference's signature and
output dtype. Precision: each computes the reference's expression in float64 from the same float32 inputs (factors
scaled in float32 as JAX scales them, W + E rounded once where the reference rounds it) and rounds its outputs once
to float32, so it sits within the reference's own float32 error of the exact value: any bound of parity.tree.check
that admits the JAX reference admits this (tests/parity/tree/test_vectors.py holds each to the check's own bound at two sizes).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

import numpy as np
from scipy.special import expit, log_softmax

from spec.lm import BLOCK_INTERMEDIATES, RMS_EPS, LMConfig
from spec.tree import Leaf, leading_scan

NAME = "numpy reference"
LN2 = float(np.float32(math.log(2.0)))      # the score's divisor as the reference forms it: float32(ln 2)
F32 = np.float32


def true_epoch(epoch: int, noise_reuse: int) -> int:
    """The epoch the noise is drawn for (jax_reference.noiser.true_epoch)."""
    return 0 if noise_reuse == 0 else epoch // noise_reuse


def perturbs(cfg: LMConfig, leaf: Leaf) -> bool:
    """Whether the reference perturbs (and updates) the leaf: low-rank always, param leaves unless freeze_nonlora."""
    return leaf.cls in ("mm", "tmm") or (leaf.cls == "param" and not cfg.freeze_nonlora)


def lowrank_scale(cfg: LMConfig) -> np.float32:
    """sigma / sqrt(r) as the reference computes it: float32(sigma) / float32(sqrt(r))."""
    return F32(cfg.sigma) / np.sqrt(F32(cfg.rank))


def signs(n: int) -> np.ndarray:
    """(n,) float32: +1 for even members, -1 for odd ones (interleaved antithetic pairs)."""
    return np.where(np.arange(n) % 2 == 0, F32(1), F32(-1)).astype(F32)


def _check_layout(leaf: Leaf) -> None:
    if not leading_scan(leaf):
        raise ValueError(f"leaf {leaf.path}: scan axes {leaf.scan_axes}; a stack is the leaf's leading axes in order "
                         f"((0,), (0, 1), ...), as upstream's noiser scans it")


def _bcast(v: np.ndarray, ndim: int) -> np.ndarray:
    return v.reshape(v.shape + (1,) * (ndim - v.ndim))


def factors(cfg: LMConfig, leaf: Leaf, z: np.ndarray, variant: str = "faithful") -> tuple[np.ndarray, np.ndarray]:
    """Every member's float32 factors (A (m, *stack, a, r) scaled by +-sigma/sqrt(r) in float32, B (m, *stack, b, r))
    from pair draws z (pop // 2, *stack, a + b, r): the reference's split B = z[:b], A = z[b:] (tmm_transposed: B
    the first a rows, A the rest, scaled alike), members 2p and 2p+1 sharing pair p's draw."""
    _check_layout(leaf)
    a, b = leaf.factor_dims
    zm = np.repeat(np.asarray(z, F32), 2, axis=0)
    s = _bcast(signs(zm.shape[0]) * lowrank_scale(cfg), zm.ndim)
    if variant == "tmm_transposed":
        return (zm[..., a:, :] * s).astype(F32), zm[..., :a, :]
    return (zm[..., b:, :] * s).astype(F32), zm[..., :b, :]


def eps_noise(cfg: LMConfig, z: np.ndarray) -> np.ndarray:
    """Every member's param-leaf noise, float32: normal * (+-1 * float32(sigma)), as the reference multiplies."""
    zm = np.repeat(np.asarray(z, F32), 2, axis=0)
    return (zm * _bcast(signs(zm.shape[0]) * F32(cfg.sigma), zm.ndim)).astype(F32)


def _outer(A: np.ndarray, B: np.ndarray) -> np.ndarray:
    """A B^T per member and slice, in float64."""
    return np.asarray(A, np.float64) @ np.swapaxes(np.asarray(B, np.float64), -1, -2)


def noise64(cfg: LMConfig, leaf: Leaf, z: np.ndarray, variant: str = "faithful") -> np.ndarray:
    """(pop, *shape) float64 perturbation of one leaf from its pair draws: A B^T of the float32 factors (an N-D mm
    slice's matrix reshaped row-major to the slice), or eps."""
    if leaf.cls in ("mm", "tmm"):
        A, B = factors(cfg, leaf, z, variant)
        d = _outer(B, A) if variant == "tmm_transposed" else _outer(A, B)
        return d.reshape(d.shape[:1] + leaf.shape)
    return eps_noise(cfg, z).astype(np.float64)


# ----------------------------------------------------------------------------- draw-free pieces
def shape(cfg: LMConfig, f: np.ndarray) -> np.ndarray:
    """EggRoll.convert_fitnesses: (f - group mean) / sqrt(global population variance + 1e-5), float32."""
    x = np.asarray(f, F32).astype(np.float64)
    g = cfg.group_size or x.size
    if x.size % g:
        raise ValueError(f"population {x.size} is not a multiple of group_size {g}")
    groups = x.reshape(-1, g)
    return ((groups - groups.mean(1, keepdims=True)) / math.sqrt(x.var() + 1e-5)).ravel().astype(F32)


def update(cfg: LMConfig, params: dict, grads: dict) -> dict[str, np.ndarray]:
    """One optax-sgd step on -(g sqrt(N)) (apply_grads): params + lr sqrt(N) g, every leaf given, float32."""
    step = cfg.lr * math.sqrt(cfg.pop)
    return {k: (np.asarray(v, np.float64) + step * np.asarray(grads[k], np.float64)).astype(F32)
            for k, v in params.items()}


def product(W: np.ndarray, A: np.ndarray, B: np.ndarray, x: np.ndarray, form: str) -> np.ndarray:
    """do_mm's x @ W.T + (x @ B) @ A.T or do_Tmm's x @ W + (x @ A) @ B.T per member, float32."""
    W, A, B, x = (np.asarray(v, np.float64) for v in (W, A, B, x))
    if form == "mm":
        out = x @ W.T + (x @ B) @ np.swapaxes(A, -1, -2)
    else:
        out = x @ W + (x @ A) @ np.swapaxes(B, -1, -2)
    return out.astype(F32)


def _rms(v: np.ndarray) -> np.ndarray:
    return v / np.sqrt(np.mean(v * v, axis=-1, keepdims=True) + RMS_EPS)


def forward(cfg: LMConfig, weights: dict, tokens: np.ndarray) -> tuple[np.ndarray, dict]:
    """(scores (m,), intermediates) of m members, member i on its own float64 weights (weights[path] (m, *shape))
    and tokens[i] (T + 1,): spec.lm's formula, the intermediates named as jax_reference.lm.model's, float32 out."""
    W = {k: np.asarray(v, np.float64) for k, v in weights.items()}
    tokens = np.asarray(tokens).astype(np.int64)
    x, target = tokens[:, :-1], tokens[:, 1:]
    m = tokens.shape[0]
    rows = np.arange(m)[:, None]
    e = W["embed"][rows, x]                                                     # (m, T, d)
    inter = {"embed": e}
    for l in range(cfg.layers):
        w = {name: W[f"blocks.{name}"][:, l] for name in BLOCK_INTERMEDIATES if f"blocks.{name}" in W}
        u = _rms(e) * w["ln1"][:, None]
        u_prev = np.concatenate([np.zeros_like(u[:, :1]), u[:, :-1]], axis=1)
        s = w["shift"][:, None, 0] * u + w["shift"][:, None, 1] * u_prev
        wz_s = np.einsum("mtj,mij->mti", s, w["wz"])
        z = expit(wz_s + w["bz"][:, None])
        c = np.einsum("mtj,mij->mti", s, w["wh"])
        h, hs = w["h0"], []
        for t in range(x.shape[1]):
            h = h + z[:, t] * (c[:, t] - h)
            hs.append(h)
        hs = np.stack(hs, axis=1)
        e = e + hs
        v = _rms(e) * w["ln2"][:, None]
        up = np.einsum("mti,mij->mtj", v, w["up"])
        down = np.einsum("mtj,mij->mti", np.maximum(up, 0.0), w["down"])
        e = e + down
        inter.update({f"blocks.{l}.{k}": val for k, val in
                      (("ln1", u), ("shift", s), ("wz", wz_s), ("bz", z), ("wh", c), ("h0", hs), ("ln2", v),
                       ("up", up), ("down", down), ("out", e))})
    y = _rms(e) * W["ln_f"][:, None]
    logits = np.einsum("mtj,mij->mti", y, W["head"])
    logp = log_softmax(logits, axis=-1)
    score = np.take_along_axis(logp, target[..., None], axis=-1)[..., 0].mean(1) / LN2
    inter.update(ln_f=y, head=logits, score=score)
    return score.astype(F32), {k: v.astype(F32) for k, v in inter.items()}


def _batched(params: dict, m: int) -> dict[str, np.ndarray]:
    return {k: np.broadcast_to(np.asarray(v, np.float64), (m,) + np.shape(v)) for k, v in params.items()}


def scores_dense(cfg: LMConfig, params: dict, dense: dict, tokens: np.ndarray):
    """tree_reference.scores_dense: the noise-off forward on member i's params + dense[path][i] (W + E rounded once
    in float32, as the reference adds them)."""
    weights = _batched(params, np.shape(tokens)[0])
    for k, E in dense.items():
        weights[k] = (np.asarray(params[k], F32)[None] + np.asarray(E, F32)).astype(np.float64)
    return forward(cfg, weights, tokens)


# ----------------------------------------------------------------------------- on the reference's draws
@dataclass(frozen=True)
class NumpyTreeReference:
    """tree_reference's surface in numpy; `draws(cfg, seed, epoch, leaf, variant)` gives JAX's normals (recorded).
    `init` has no numpy form (it is JAX's normals themselves): a replay answers it from the bundle or not at all."""

    draws: Callable

    NAME = NAME
    true_epoch = staticmethod(true_epoch)
    shape = staticmethod(shape)
    update = staticmethod(update)
    product = staticmethod(product)
    scores_dense = staticmethod(scores_dense)

    def _z(self, cfg: LMConfig, seed: int, epoch: int, leaf: Leaf, variant: str) -> np.ndarray:
        return self.draws(cfg, seed, epoch, leaf, "faithful" if variant == "tmm_transposed" else variant)

    def leaf_noise(self, cfg: LMConfig, seed: int, epoch: int, leaf: Leaf, variant: str = "faithful"):
        """Every member's noise of one leaf in the protocol's form, float32 (tree_reference.leaf_noise): the
        factors (A, B) or eps."""
        z = self._z(cfg, seed, epoch, leaf, variant)
        if leaf.cls in ("mm", "tmm"):
            A, B = factors(cfg, leaf, z, variant)
            return (B, A) if variant == "tmm_transposed" else (A, B)
        return eps_noise(cfg, z)

    def dense_noise(self, cfg: LMConfig, seed: int, epoch: int, leaf: Leaf, variant: str = "faithful",
                    block=None) -> np.ndarray:
        """(pop, *shape) float32: each member's perturbation of one leaf (tree_reference.dense_noise), A B^T in
        float64 rounded once; `block` (a parity.tree.blocks.Block): only that block."""
        from parity.tree import blocks
        value = self.leaf_noise(cfg, seed, epoch, leaf, variant)
        return blocks.dense_block(leaf, value, block, np.float64 if leaf.cls in ("mm", "tmm") else None).astype(F32)

    def abs_factors(self, cfg: LMConfig, seed: int, epoch: int, leaf: Leaf) -> tuple[np.ndarray, np.ndarray]:
        """(|A|, |B|) per member, float64, as the reference forms them: float64 draws times the float32
        sigma / sqrt(r), unrounded (tree_reference.abs_factors)."""
        _check_layout(leaf)
        b = leaf.factor_dims[1]
        z = np.repeat(np.asarray(self._z(cfg, seed, epoch, leaf, "faithful"), np.float64), 2, axis=0)
        return np.abs(z[..., b:, :] * float(lowrank_scale(cfg))), np.abs(z[..., :b, :])

    def factors_abs_product(self, cfg: LMConfig, seed: int, epoch: int, leaf: Leaf, block=None) -> np.ndarray:
        """(pop, *shape) float64 |A| |B|^T per member (abs_factors'); `block`: only that block."""
        from parity.tree import blocks
        return blocks.dense_block(leaf, self.abs_factors(cfg, seed, epoch, leaf), block)

    def noise64(self, cfg: LMConfig, seed: int, epoch: int) -> dict[str, np.ndarray]:
        """{path: (pop, *shape) float64} of every leaf the reference perturbs."""
        return {leaf.path: noise64(cfg, leaf, self._z(cfg, seed, epoch, leaf, "faithful"))
                for leaf in cfg.tree.leaves if perturbs(cfg, leaf)}

    def grads(self, cfg: LMConfig, seed: int, epoch: int, shaped: np.ndarray) -> dict[str, np.ndarray]:
        """The noiser's g per leaf: einsum(f A, B) / N in float64 on the float32 factors, one matmul of them
        (parity.tree.blocks.weighted_sum: no (pop, *shape) array), param mean(f eps); rounded once to float32; zero
        where it perturbs nothing."""
        from parity.tree import blocks
        f = np.asarray(shaped, F32).astype(np.float64)
        return {leaf.path: (blocks.weighted_sum(leaf, self.leaf_noise(cfg, seed, epoch, leaf), f) / f.size).astype(F32)
                if perturbs(cfg, leaf) else np.zeros(leaf.shape, F32) for leaf in cfg.tree.leaves}

    def scores(self, cfg: LMConfig, seed: int, params: dict, epoch: int, tokens: np.ndarray, noise: bool):
        """(scores (m,), intermediates) of members 0..m-1 on tokens (m, T + 1), each with its own noise at epoch
        (W + E in float64: the reference's x W^T + (x B) A^T without a rounded sum) or none."""
        m = np.shape(tokens)[0]
        if m > cfg.pop:
            raise ValueError(f"{m} token rows but the population is {cfg.pop}")
        weights = _batched(params, m)
        if noise:
            for path, E in self.noise64(cfg, seed, epoch).items():
                weights[path] = weights[path] + E[:m]
        return forward(cfg, weights, tokens)

    def epoch_step(self, cfg: LMConfig, seed: int, params: dict, epoch: int, tokens: np.ndarray) -> dict:
        """One training epoch: the members' scores, shaped fitness, per-leaf gradient and new params."""
        s, _ = self.scores(cfg, seed, params, epoch, tokens, True)
        shaped = self.shape(cfg, s)
        g = self.grads(cfg, seed, epoch, shaped)
        return {"scores": s, "shaped": shaped, "grads": g, "params": self.update(cfg, params, g)}
