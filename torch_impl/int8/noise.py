"""nano-egg's integer noise in torch (spec/int8.py, "The noise table and its windows"), bit for bit.

The table TABLE = int8(normal(key(seed), 2^30) * 16) is never built. Element j of JAX's partitionable draw is
the normal of bits(j) = y0 ^ y1 of threefry2x32(key(seed) words; 0, j), and a normal depends on bits >> 9 only, so
    TABLE[j] = LUT[bits(j) >> 9],   LUT = int8(torch_impl.random.normal_table() * 16)   (2^23 entries, 8 MiB)
with threefry from torch_impl.random (the project's JAX-compatible generator: its words are jax.random's, and
normal_table() holds JAX's float32 normal of every 23-bit pattern). int8 conversion truncates toward zero in
torch as in JAX's astype (the values lie in [-86, 83], far from int8's bounds).

Windows: the leaf (or slice) with key k at epoch e reads, for pair p,
    start = (key_data(fold_in(k, te))[0] ^ h(p)) & (2^30 - 1),  h(x) = ((x >> 16) ^ x) * 0x45d9f3b in int32
    c = min(start, 2^30 - n)  (dynamic_slice's clamp, no wrap),  W = TABLE[c : c + n]
h runs in torch int32, whose multiplication wraps like XLA's; the xor and mask run on the uint32 bits in int64.

`population_noise` draws one epoch's noise for the whole population in one call: every leaf's and slice's
windows for every pair are gathered as counters into one flat tensor, hashed by one threefry pass (in cache-sized
blocks), looked up in the LUT and cut back into factors. The Python loop over the 13 leaves only builds counter
index tensors (the leaves' window lengths differ); no loop runs over members, pairs or slices. Noise is kept per
PAIR (members 2p and 2p + 1 read the same window); `member_*` helpers apply the member's sign.
    low rank, slice stored (a, b):  B = W[:b] (b,), A = W[b:] (a,)        (rank 1; B first; sign goes on A)
    full rank, slice of shape S:    E = W[0::2] * W[1::2] as int32, shape S (sign goes on E)
"""
from __future__ import annotations

import functools
import math
from typing import NamedTuple

import torch

from spec.int8 import FIXED_POINT, HASH_MULT, LUT_BITS, TABLE_MASK, TABLE_SIZE, Int8Config, int8_tree
from spec.int8_knobs import NANO_EGG, Int8Knobs, evolves, table_noise
from spec.tree import Leaf, Tree
from torch_impl import random as rnd
from torch_impl.random import eager as random_eager
from torch_impl.int8 import xorshift
from torch_impl.tree.keys import es_leaf_keys

_MASK32 = 0xFFFFFFFF
_BLOCK = 1 << 16             # counters hashed per block (stays in cache, as torch_impl.random's blocks do)


# ----------------------------------------------------------------------------- keys
class Int8Keys(NamedTuple):
    master: torch.Tensor     # key(seed), (2,) int64 words: also the noise table's key (nano-egg's noise_seed)
    model: torch.Tensor      # fold_in(master, 0)
    es: torch.Tensor         # fold_in(master, 1)


def run_keys(seed: int) -> Int8Keys:
    """master = key(seed), model_key = fold_in(master, 0), es_key = fold_in(master, 1)."""
    master = rnd.key(seed)
    return Int8Keys(master, rnd.fold_in(master, 0), rnd.fold_in(master, 1))


def leaf_keys(cfg: Int8Config, seed: int) -> dict[str, torch.Tensor]:
    """path -> ES key (*stack, 2): split(es_key, 13)[i] in JAX's flatten order, blocks split per layer."""
    return es_leaf_keys(int8_tree(cfg), run_keys(seed).es, "sorted", "split")


# ----------------------------------------------------------------------------- the table, entry by entry
@functools.lru_cache(maxsize=None)
def _lut(device: str, backend: str) -> torch.Tensor:
    return (rnd.normal_table(device, backend) * (2 ** FIXED_POINT)).to(torch.int8)


def normal_lut(device: str | torch.device = "cpu", backend: str = "cpu") -> torch.Tensor:
    """(2^23,) int8: int8(normal * 16) of every 23-bit pattern bits >> 9, with the normals JAX draws on `backend`
    ("cpu" or "gpu"; 8 MiB; the normals table is built once)."""
    return _lut(str(torch.device(device)), backend)


def table_bits(seed: int, counters: torch.Tensor) -> torch.Tensor:
    """bits(j) = y0 ^ y1 of threefry2x32(key(seed) words; 0, j) as int32 bit patterns, for counters j < 2^31."""
    words = rnd.key(seed, device=counters.device).to(torch.int32)       # (0, seed) as int32 bit patterns
    k0, k1 = words[0], words[1]
    flat = counters.reshape(-1).to(torch.int32)
    out = torch.empty_like(flat)
    for s in range(0, flat.numel(), _BLOCK):
        x1 = flat[s:s + _BLOCK].clone()
        x0 = torch.zeros_like(x1)
        random_eager._rounds_(x0, x1, k0, k1)   # the project's threefry2x32 rounds, in place (int32, wrapping)
        out[s:s + _BLOCK] = x0.bitwise_xor_(x1)
    return out.reshape(counters.shape)


def table_entries(seed: int, counters: torch.Tensor, lut: torch.Tensor | None = None) -> torch.Tensor:
    """TABLE[j] = LUT[bits(j) >> 9] (logical shift) for counters j in [0, 2^30): int8 of counters' shape. On CUDA the
    hash and the look-up are one fused Triton kernel where Triton is installed (torch_impl.random's triton backend), the same
    entries."""
    lut = normal_lut(counters.device) if lut is None else lut
    fused = rnd.lut_at(rnd.key(seed), counters, lut)
    if fused is not None:
        return fused
    index = (table_bits(seed, counters).to(torch.int64) & _MASK32) >> (32 - LUT_BITS)
    return lut[index]


# ----------------------------------------------------------------------------- starts
def pair_hash(pairs: torch.Tensor) -> torch.Tensor:
    """h(x) = ((x >> 16) ^ x) * 0x45d9f3b in wrapping int32 (x read as int32), returned as uint32 bits in int64."""
    x = torch.as_tensor(pairs).to(torch.int64).bitwise_and(_MASK32).to(torch.int32)   # int32 two's complement
    h = ((x >> 16) ^ x) * torch.tensor(HASH_MULT, dtype=torch.int32, device=x.device)  # int32 multiply wraps
    return h.to(torch.int64) & _MASK32


def true_epoch(epoch: int, noise_reuse: int) -> int:
    return 0 if noise_reuse == 0 else epoch // noise_reuse


def key_words0(keys: torch.Tensor, true_ep: int) -> torch.Tensor:
    """key_data(fold_in(k, true_epoch))[0] for keys (*stack, 2): (*stack,) int64."""
    return rnd.fold_in(keys, true_ep)[..., 0]


def window_length(leaf: Leaf, rank: int = 1) -> int:
    """Entries one slice of the leaf reads: (a + b) r for a low-rank slice (a, b), 2 * size for full rank."""
    if leaf.cls == "param":
        return 2 * math.prod(leaf.slice_shape)
    a, b = leaf.slice_shape
    return (a + b) * rank


def clamped_starts(word0: torch.Tensor, pairs: torch.Tensor, n: int) -> torch.Tensor:
    """min((word0 ^ h(p)) & (2^30 - 1), 2^30 - n) for every pair and key: (P, *word0.shape) int64."""
    h = pair_hash(pairs).to(word0.device)
    start = (word0.unsqueeze(0) ^ h.view(-1, *[1] * word0.dim())) & TABLE_MASK
    return torch.clamp_max(start, TABLE_SIZE - n)


def window_starts(tree: Tree, keys: dict[str, torch.Tensor], epoch: int, thread_ids, noise_reuse: int,
                  rank: int = 1) -> dict[str, torch.Tensor]:
    """Each member's clamped start per leaf (slices stacked): {path: (m, *stack) int64} (jax window_starts)."""
    threads = torch.as_tensor(thread_ids, dtype=torch.int64)
    te = true_epoch(epoch, noise_reuse)
    return {leaf.path: clamped_starts(key_words0(keys[leaf.path], te), threads >> 1, window_length(leaf, rank))
            for leaf in tree.leaves}


# ----------------------------------------------------------------------------- the population's noise
class PairNoise(NamedTuple):
    """One epoch's noise per pair: A, B {path: (P, *stack, a) / (P, *stack, b) int8} for low-rank leaves
    (the embedding included), E {path: (P, *stack, *S) int32} for full-rank leaves; no sign applied."""

    A: dict
    B: dict
    E: dict
    pairs: int


def pair_windows(tree: Tree, keys: dict[str, torch.Tensor], seed: int, epoch: int, pairs: torch.Tensor,
                 noise_reuse: int, rank: int = 1, lut: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
    """{path: (P, *stack, n) int8}: every leaf's windows for the given pairs, hashed in one threefry pass."""
    te = true_epoch(epoch, noise_reuse)
    device = next(iter(keys.values())).device
    counters, cuts = [], []
    if not tree.leaves:
        return {}
    for leaf in tree.leaves:                      # shapes differ per leaf: only index tensors are built here
        n = window_length(leaf, rank)
        c = clamped_starts(key_words0(keys[leaf.path], te), pairs, n)           # (P, *stack)
        counters.append((c.unsqueeze(-1) + torch.arange(n, device=device)).reshape(-1))
        cuts.append((leaf, tuple(c.shape) + (n,)))
    entries = table_entries(seed, torch.cat(counters), lut)
    out, at = {}, 0
    for leaf, shape in cuts:
        size = math.prod(shape)
        out[leaf.path] = entries[at:at + size].view(shape)
        at += size
    return out


def population_noise(tree: Tree, keys: dict[str, torch.Tensor], seed: int, epoch: int, n_pairs: int,
                     noise_reuse: int, rank: int = 1, lut: torch.Tensor | None = None,
                     knobs: Int8Knobs = NANO_EGG) -> PairNoise:
    """PairNoise of pairs 0..n_pairs-1 at epoch (the members 2p, 2p + 1 share pair p's windows).

    knobs: a leaf that does not evolve (evolving=matrices) gets no entry; a matrix under int8_noise=xorshift gets
    egg.c's xorshift factors (torch_impl.int8.xorshift, seeded from the run's seed and the raw epoch)."""
    if rank != 1:
        raise ValueError(f"rank must be 1 (nano-egg's integer noiser), got {rank}")
    noised = [leaf for leaf in tree.leaves if evolves(leaf.cls, knobs)]
    table_leaves = tuple(leaf for leaf in noised if table_noise(leaf.cls, knobs))
    from_table = Tree(table_leaves, tuple(leaf.path for leaf in table_leaves))
    pairs = torch.arange(n_pairs)
    windows = pair_windows(from_table, keys, seed, epoch, pairs, noise_reuse, rank, lut)
    A, B, E = {}, {}, {}
    for leaf in noised:
        if leaf.path not in windows:                          # egg.c's xorshift matrix
            a, b = leaf.slice_shape
            A[leaf.path], B[leaf.path] = xorshift.factors(
                leaf.path, a, b, seed, epoch, pairs.to(next(iter(keys.values())).device),
                leaf.shape[0] if leaf.scan_axes else None)
            continue
        w = windows[leaf.path]
        if leaf.cls == "param":
            w = w.to(torch.int32)
            E[leaf.path] = (w[..., 0::2] * w[..., 1::2]).view(w.shape[:-1] + tuple(leaf.slice_shape))
        else:
            a, b = leaf.slice_shape
            B[leaf.path], A[leaf.path] = w[..., :b], w[..., b:]
    return PairNoise(A, B, E, n_pairs)


def member_signs(pop: int, device=None) -> torch.Tensor:
    """(pop,) int32: +1 for even threads, -1 for odd."""
    return 1 - 2 * (torch.arange(pop, device=device, dtype=torch.int32) % 2)


def member_view(noise: PairNoise, pop: int) -> PairNoise:
    """The same noise per member (pop rows): A and E times the member's sign (int8 A stays exact: |A| <= 86)."""
    index = torch.arange(pop) >> 1
    sign = member_signs(pop)

    def signed(t: torch.Tensor) -> torch.Tensor:
        t = t[index.to(t.device)]
        return t * sign.to(t.device, t.dtype).view(-1, *[1] * (t.dim() - 1))
    return PairNoise({k: signed(v) for k, v in noise.A.items()}, {k: v[index.to(v.device)] for k, v in noise.B.items()},
                     {k: signed(v) for k, v in noise.E.items()}, noise.pairs)
