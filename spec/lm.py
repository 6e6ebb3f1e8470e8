"""The byte-level recurrent language model both sides train: its configuration, presets, tree, init and math.

Structure (nano-egg's, in float32): an embedding, `layers` scanned blocks of (RMS norm, token shift, a
minGRU-style cell, RMS norm, an MLP), a final RMS norm and a head. Every leaf class is used: `mm` (wz, wh, down,
head), `tmm` (up, stored (in, out)), `param` vectors (ln1, ln2, bz, ln_f) and a `param` matrix per slice
(shift, (2, d)), an `embedding` (embed) and an `excluded` leaf (h0, the cell's initial state); the blocks are
one scanned stack (axis 0 of every `blocks.*` leaf).

One member's score on a window of T + 1 bytes x_0..x_T (both sides compute exactly this, in float32):
    e_t   = embed[x_t]                                         t = 0..T-1, (T, d)
    for l in 0..L-1 (the scanned blocks; leaf[l] is slice l, perturbed with slice l's key):
        u_t  = rms(e_t) * ln1[l]                                rms(v) = v / sqrt(mean(v * v) + 1e-5)
        s_t  = shift[l][0] * u_t + shift[l][1] * u_{t-1}        u_{-1} = 0
        z_t  = sigmoid(mm(wz[l], s_t) + bz[l])                  mm(W, x) = x @ W.T (+ its low-rank noise)
        c_t  = mm(wh[l], s_t)
        h_t  = h_{t-1} + z_t * (c_t - h_{t-1})                  h_{-1} = h0[l] (excluded: as stored, never noised)
        e_t  = e_t + h_t
        v_t  = rms(e_t) * ln2[l]
        e_t  = e_t + mm(down[l], relu(tmm(up[l], v_t)))         tmm(W, x) = x @ W (+ its low-rank noise)
    y_t   = rms(e_t) * ln_f
    logits_t = mm(head, y_t)                                   (T, 256)
    score = mean_t log_softmax(logits_t)[x_{t+1}] / float32(ln 2)   log2-likelihood per byte (fitness: higher is better)
Bits per byte = -score. Validation is scored with noise off (the mean of -score over the validation windows).

Readings, as upstream's modules do it (jax_reference/lm/model.py): ln1, ln2, ln_f, shift and bz go through the noiser's
full-rank rule (`get_noisy_standard`: perturbed only when freeze_nonlora is off); wz, wh, down, head through `do_mm`
and up through `do_Tmm`; embed through `do_emb` and h0 read directly (upstream reads its excluded leaves as stored),
so neither is ever perturbed. The recurrence runs sequentially over t, in the formula's order of operations.
log_softmax(v) = (v - max v) - log(sum(exp(v - max v))) (jax.nn.log_softmax); float32(ln 2) = 0.6931472.

Data (`rollout.corpus`, numpy only): the shipped corpus `rollout/data/corpus.txt` (project-written, CC0) read as
bytes (uint8) and split at cut = int(0.9 * n) into train = bytes[:cut] and validation = bytes[cut:]. A window is
T + 1 consecutive bytes (T scored tokens and their targets). At epoch e (the 0-based training epoch, not
noise_reuse's true epoch) stream j is the train window starting at
`np.random.default_rng([seed, e]).integers(0, len(train) - T, n_streams)[j]` (so every window lies inside train);
n_streams = pop // group_size, or 1 when group_size is 0. Member i reads stream i // group_size (group_size 0:
stream 0 for the whole population), so a group shares a stream. Validation: `val_windows` windows starting at
`np.linspace(0, len(val) - T - 1, val_windows).astype(int64)`, the same every evaluation, scored with noise off.
A corpus path that is missing, empty, or too short for one window in both parts is refused (ValueError).

Init (`init_plan`): the model's declaration order (`lm_tree(cfg).declared`) is also its key order, in upstream's
module style: `split(model_key, 4)` gives embed, blocks, ln_f, head their keys; block l's key is
`split(blocks key, L)[l]` and its leaves take `split(block key, 9)[j]` in declaration order. A normal leaf is
`normal(key, stored slice shape) * (1 / sqrt(fan_in))` with the scale in float32 arithmetic as upstream's
`1 / jnp.sqrt(in_dim)` (sqrt rounded to float32, then the reciprocal rounded), fan_in = in (mm: shape[1]; tmm
and embedding: shape[0]); h0 is `normal(key, (d,)) * float32(0.1)`; ln weights are ones, bz zeros, shift rows
(1, 0).
"""
from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass
from typing import NamedTuple

from spec.tree import Leaf, Tree, check_es_settings, make_tree

VOCAB = 256              # bytes
RMS_EPS = 1e-5
H0_SCALE = 0.1


@dataclass(frozen=True)
class LMConfig:
    """Hyper-parameters of one LM ES run (the model's size, the population and the ES settings)."""

    d_model: int = 32
    layers: int = 2
    d_hidden: int = 64
    seq_len: int = 32           # T: tokens each member scores per epoch
    pop: int = 128
    group_size: int = 8         # members per stream; the fitness is shaped with group means, global variance
    rank: int = 4
    sigma: float = 0.02
    lr: float = 0.01
    epochs: int = 300
    noise_reuse: int = 1        # fresh noise every epoch (upstream's LLM runs)
    freeze_nonlora: bool = True  # upstream's LLM default: full-rank leaves neither perturbed nor updated
    optimizer: str = "sgd"
    val_windows: int = 64       # validation windows of seq_len + 1 bytes, evenly spaced
    eval_every: int = 25        # epochs between validation measurements

    def __post_init__(self) -> None:
        for name in ("d_model", "layers", "d_hidden", "seq_len", "pop", "rank", "epochs", "val_windows",
                     "eval_every"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        check_es_settings(self.pop, self.group_size, self.rank, self.noise_reuse, self.sigma, self.lr)

    @property
    def n_streams(self) -> int:
        return self.pop // self.group_size if self.group_size else 1

    @property
    def tree(self) -> Tree:
        """The LM's tree at this size (lm_tree): what the tree suite's checks read, as from a spec.tree.TreeRun."""
        return lm_tree(self)

    def replace(self, **changes) -> "LMConfig":
        return dataclasses.replace(self, **changes)


LM_PRESETS: dict[str, LMConfig] = {
    "selftest": LMConfig(d_model=8, layers=2, d_hidden=16, seq_len=8, pop=8, group_size=4, rank=2, epochs=3,
                         val_windows=4, eval_every=1),
    "quick": LMConfig(d_model=16, layers=3, d_hidden=24, seq_len=12, pop=16, group_size=4, rank=2, epochs=4,
                      val_windows=8, eval_every=2),
    # sigma 0.05, lr 0.5: calibrated on the shipped corpus (a step moves a weight by about lr * sigma^2 * sqrt(pop)
    # times the normalised ES gradient, so the defaults 0.02/0.01 barely move it); val ~9.0 -> ~4.3 bits/byte by
    # epoch 170, ~3.8 by epoch 1000 (seeds 0-3); lr 2 or sigma 0.1 plateau higher (~4.0-4.1).
    "cpu": LMConfig(sigma=0.05, lr=0.5, epochs=1000, eval_every=50),
}
LM_PRESET_NOTES = {
    "selftest": "the suite's self-tests: d 8, 2 blocks, pop 8",
    "quick": "make parity's LM size: d 16, 3 blocks, pop 16",
    "cpu": "the LM gap study: d 32, 2 blocks, pop 128, T 32, 1000 epochs; about 15 s of one core in JAX, 21 s in torch",
}

# Declaration order: the model's registration order (also its init key order). Top level, then one block.
TOP = ("embed", "blocks", "ln_f", "head")
BLOCK = ("ln1", "shift", "wz", "bz", "wh", "ln2", "up", "down", "h0")


@functools.lru_cache(maxsize=32)
def lm_tree(cfg: LMConfig) -> Tree:
    """The LM's leaves (declared in registration order; `Tree.leaves` is JAX's flatten order)."""
    d, h, L = cfg.d_model, cfg.d_hidden, cfg.layers
    block = {"ln1": ((d,), "param"), "shift": ((2, d), "param"), "wz": ((d, d), "mm"), "bz": ((d,), "param"),
             "wh": ((d, d), "mm"), "ln2": ((d,), "param"), "up": ((d, h), "tmm"), "down": ((d, h), "mm"),
             "h0": ((d,), "excluded")}
    leaves = [Leaf("embed", (VOCAB, d), "embedding")]
    leaves += [Leaf(f"blocks.{name}", (L,) + block[name][0], block[name][1], (0,)) for name in BLOCK]
    leaves += [Leaf("ln_f", (d,), "param"), Leaf("head", (VOCAB, d), "mm")]
    return make_tree(leaves)


class InitRule(NamedTuple):
    """How one leaf is initialised: its key path (split indices, see the module docstring) and its value."""

    top: int               # index into split(model_key, 4)
    block: int | None      # index into split(block key, 9) for a stacked leaf, else None
    kind: str              # "normal" (normal * 1/sqrt(fan_in)), "h0" (normal * 0.1), "ones", "zeros", "shift"
    fan_in: int            # for "normal": the scale is 1 / sqrt(fan_in) in float32 arithmetic; 0 otherwise


def init_plan(cfg: LMConfig) -> dict[str, InitRule]:
    """path -> InitRule, for every leaf of lm_tree(cfg)."""
    d, h = cfg.d_model, cfg.d_hidden
    block = {"ln1": ("ones", 0), "shift": ("shift", 0), "wz": ("normal", d), "bz": ("zeros", 0),
             "wh": ("normal", d), "ln2": ("ones", 0), "up": ("normal", d), "down": ("normal", h), "h0": ("h0", 0)}
    plan = {"embed": InitRule(0, None, "normal", VOCAB), "ln_f": InitRule(2, None, "ones", 0),
            "head": InitRule(3, None, "normal", d)}
    for j, name in enumerate(BLOCK):
        plan[f"blocks.{name}"] = InitRule(1, j, *block[name])
    return plan


# Intermediates of one member's forward, in forward order, each named after the leaf whose op produced it, so the
# first entry where two sides part names the block and leaf (jax_reference.lm.model documents each entry's formula):
# embed (T, d); per block l: ln1 u, shift s, wz mm(wz, s) before bz, bz z, wh c, h0 the states h, ln2 v, up tmm(up, v)
# before the relu, down its mm, out e after the block; ln_f y; head logits (T, 256); score ().
BLOCK_INTERMEDIATES = ("ln1", "shift", "wz", "bz", "wh", "h0", "ln2", "up", "down", "out")


def intermediate_names(layers: int) -> list[str]:
    """["embed", "blocks.0.ln1", ..., "blocks.{L-1}.out", "ln_f", "head", "score"]: the forward's order."""
    return (["embed"] + [f"blocks.{l}.{name}" for l in range(layers) for name in BLOCK_INTERMEDIATES]
            + ["ln_f", "head", "score"])


def intermediate_leaf(name: str) -> tuple[str, int | None]:
    """An intermediate's (leaf path, block index or None): "blocks.1.wz" -> ("blocks.wz", 1); "blocks.1.out" ->
    ("blocks", 1) (the block as a whole); "head" -> ("head", None); "score" -> ("score", None)."""
    parts = name.split(".")
    if parts[0] == "blocks":
        if len(parts) != 3 or parts[2] not in BLOCK_INTERMEDIATES or not parts[1].isdigit():
            raise ValueError(f"intermediate {name!r} is not blocks.<l>.<one of {', '.join(BLOCK_INTERMEDIATES)}>")
        return ("blocks" if parts[2] == "out" else f"blocks.{parts[2]}"), int(parts[1])
    if name not in ("embed", "ln_f", "head", "score"):
        raise ValueError(f"unknown intermediate {name!r}; known: embed, blocks.<l>.<entry>, ln_f, head, score")
    return name, None
