"""Integer EGGROLL (nano-egg's QEggRoll and EGG model): configuration, presets, tree and the exact integer math.

Read from ESHyperscale/nano-egg `run.py` at commit a04bab2 (GPL-3.0; facts only, no code copied). Every side
(jax_reference.int8, the torch int8 port, the C side) computes exactly what is written here, bit for bit: integer
arithmetic has no rounding, so the bar is equality.

Numbers
    Values are int8 with FIXED_POINT = 4 fractional bits (16 = 1.0), clipped to [-127, 127] (MAX); products and
    sums are int32 and wrap like int32 (XLA wraps; the C side compiles with -fwrapv). `>>` on a signed value is
    an arithmetic shift, i.e. floor(v / 2^k) (-1 >> 4 = -1), and `//` is floor division (-1 // 16 = -1).
    clip(v) = min(max(v, -127), 127). clipped_add(a, b, ...) = clip(a + b + ... in int32), as int8.

Keys (jax.random, threefry2x32, jax_threefry_partitionable on)
    master = key(seed); model_key = fold_in(master, 0); es_key = fold_in(master, 1); fold_in(master, 2) is
    derived by nano-egg as a data key and never used (the data layout below draws nothing).
    The noise table's key is the master key itself (nano-egg's noise_seed = seed).
    Leaf keys: simple_es_tree_key(params, es_key, scan_map): leaf i of JAX's flatten order (`int8_tree(cfg)`,
    dict keys sorted as strings at every level) gets split(es_key, 13)[i]; a `blocks.*` leaf (scanned on axis 0)
    is split again, slice l getting split(k, n_layer)[l] (recursive_scan_split).

The noise table and its windows
    TABLE = int8(normal(master, (2^30,)) * 16): the float32 normal times 16 (exact), converted to int8 by
    truncation toward zero (astype); over all 2^23 inputs the entries lie in [-86, 83]. Element j of a partitionable
    threefry draw is the normal of bits(j) = y0 ^ y1 of threefry2x32(key words; 0, j) and depends on j alone,
    and a normal depends only on bits >> 9; so TABLE[j] = LUT[bits(j) >> 9] with LUT the 2^23 int8 values
    (8 MiB), and no side ever builds the 1 GiB table.
    A member is thread t in 0..pop-1; its pair is p = t >> 1 and its sign s = +1 for even t, -1 for odd t.
    The leaf (or slice) with key k at epoch e, true_epoch te = 0 if noise_reuse == 0 else e // noise_reuse:
        start = (key_data(fold_in(k, te))[0] ^ h(p)) & (2^30 - 1)
        h(x)  = ((x >> 16) ^ x) * 0x45d9f3b                       in int32, wrapping (`h`)
        W(n)  = TABLE[c : c + n], c = min(start, 2^30 - n)        dynamic_slice clamps the start; no wrap
    Low rank (rank r = 1), leaf stored (a, b) (mm: (out, in); the embedding: (vocab, d)): n = (a + b) r,
        B = W[:b r] as (b, r) (B first), A = s * W[b r:] as (a, r)     (the sign on A, before any shift)
    Full rank (a `param` leaf of m elements, shape S): n = 2 m, E = s * (W[0::2] * W[1::2]) as int32, shape S.

Ops (x, y int8 vectors; acc int32; ss = sigma_shift; noise off: the bracketed noise terms are absent)
    mm(W (out, in), x (in,))  = clip((x W^T [+ ((x B) A^T) >> (4 + ss)]) // (16 * isqrt(in)))
                                (`out_divisor(in)`; a power of 2 for `in` a power of 4, so a shift there)
    emb(E (vocab, d), tok)    = E[tok] [then clip(E[tok] + ((A[tok] B^T) >> (4 + ss)))]
    param(P)                  = P [then clip(P + (E >> (4 + ss)))]
    ln(x; w = param(weight))  = DIV[m][x * w] with m = max(sum |x|, 1) // d (d = n_embd), the numerator read as
                                int16 (its uint16 view indexes the table; |x w| <= 127^2 never wraps) and
                                DIV[m][v] = clip(v // m) for m >= 1; row 0 is XLA's integer division by zero
                                after jnp.floor_divide's sign fix-up: DIV[0][0] = -1, DIV[0][v != 0] = -2.
                                No centring: an L1 mean (m <= 127, so only rows 0..127 are read).
    gru(x, s)   f  = clipped_add(mm(Wf, x), mm(Uf, s), param(bf))     (nano-egg's sigmoid is the identity)
                g  = ((f + 127) * s) >> 8                            (int32, then int8: always in range)
                c  = clipped_add(mm(Wh, x), mm(Uh, g), param(bh))    (tanh: the identity)
                s' = s + (((f + 127) * (c - s)) >> 8)                (cast to int8 and added in int8, both
                                                                      wrapping; the exact s' lies in
                                                                      [-127, 127], so the wrap never shows)
                returns (s', s')
    mlp(v)      = mm(W1, mm(W0, v)), W0 (4d, d), W1 (d, 4d), no bias, no activation (the identity at a04bab2)
    layer(x, s) = y = clipped_add(gru(ln1(x), s)[0], x); out = clipped_add(mlp(ln2(y)), y); new state s'
    model(tok, S) = logits = mm(head, ln_out(x_L)) with x_0 = emb(tok), x_{l+1}, S'[l] = layer_l(x_l, S[l])
    The state S (n_layer, d) int8 is set to 0 before a token whose input byte is 0 (state_reset on_zero).

Loss (FBIT = 4: 1/16 bit)
    EXP2[i] = int32(2^(i / 16) * 16) for i in 0..255 (float64, truncated); LOG2[k] = int32(log2((k + 1) / 16) * 16)
    for k in 0..2^28 - 1 (float64, truncated toward zero; sides compute the entries they need, `log2_entry`).
    ll(logits, target) = z[target] - LOG2[sum_v EXP2[z_v] - 1], z = logits + 128 in [1, 255]; the sum is below
    256 * EXP2[255] < 2^28. A member's score = the sum of ll over its T tokens (int32, 1/16 bits);
    train bits/byte = -mean(scores) / (16 T).

ES step (fast_fitness on: the only setting nano-egg can run, see Int8Config)
    fitness f_k = sign(score_2k - score_2k+1) as int8, k = 0..pop/2 - 1.
    Per leaf (each slice of a stacked leaf on its own key), with the even threads' (+) noise of pair k:
        Z = sum_k f_k A_k B_k^T (int32; use_clt off: sign(A_k) sign(B_k)^T)        low rank and the embedding
        Z = sum_k f_k E_k                (use_clt off: sign(E_k))                   full rank
        P' = clip(P if |Z| * 16 < thr_e * isqrt(pop / 2) * (256 if use_clt else 1) else P + (+1 if Z > 0 else -1))
    so at thr_e = 0 every entry moves, and an entry with Z = 0 goes DOWN by 1 (the threshold-0 quirk).
    thr_e = int32(ndtri(1 - alpha_e / 2) * 16) (truncated), alpha_e = 1 / ((2^alpha - 1) * e / decay + 1) when
    alpha > 1 (1 at epoch 0, so thr_0 = 0; 2^-alpha at e = decay, and on toward 0 after), else alpha_e = alpha.

Data (the project's corpus in place of minipile; numpy helpers in rollout/int8_data.py)
    nano-egg stores each document as byte 0 followed by its UTF-8 bytes, documents concatenated. The project's
    shipped corpus (rollout/data/corpus.txt, split 90/10 by rollout.corpus) holds no byte 0; each part is taken
    as ONE document: stream = [0] + part. (So the state reset at byte 0 fires at the start of a part only.)
    Train: ns = pop // group_size sequences; segments = (len(stream) - ns) // (T ns); each sequence holds
    segments * T + 1 bytes: rows = stream[:ns (segments T + 1)] as (ns, segments T + 1). At epoch e every row
    reads bytes [(e % segments) T, (e % segments) T + T + 1) (T inputs and their next-byte targets) and member i
    reads row i // group_size. Each member's recurrent state carries over from one epoch to the next (nano-egg
    passes the states back in), starting at zero.
    Validation (noise off): the validation stream cut into val_rows rows of L = len // val_rows bytes (the tail
    dropped), each scored from a zero state; val bits/byte = -sum(scores) / (16 val_rows (L - 1)), measured
    after the update of every epoch e with (e + 1) % validate_every == 0 (nano-egg: e % 10 == 9), and (the project's
    addition, as the float LM does) after the last epoch.

Init (model_key): split(model_key, 3) -> emb, blocks, head keys; layer l's key split(blocks key, n_layer)[l] ->
split(., 2) -> att, mlp keys; att: split(att key, 4) -> Wf, Uf, Wh, Uh; mlp: split(mlp key, 2) -> W0, W1.
A matrix is round(normal(key, stored shape) * 16) as int8 (round half to even); biases 0; ln weights 16.
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from statistics import NormalDist

from spec.tree import Leaf, Tree, make_tree

# The originals, and the commits the conformance tests check (tests/jax_reference/test_int8_nano_egg.py, tests/c_int8/test_egg_c_conformance.py)
NANO_EGG_ORIGINAL = ("ESHyperscale/nano-egg", "run.py", "a04bab2")
EGG_C_ORIGINAL = ("ljubomirj/egg.c", "full_trained_egg-cpumulti.c", "fdef754f69436737d220c2d9b72e2d6485e4654b")

FIXED_POINT = 4                  # int8 values carry 4 fractional bits: 16 is 1.0
MAX = 127                        # clip bound: values live in [-127, 127]
LOGMAX = 7                       # (f + 127) * v >> (LOGMAX + 1): the GRU's gate in [0, 254] / 256
VOCAB = 256                      # bytes
FBIT = 4                         # the loss tables' fractional bits: 1/16 bit
TABLE_BITS = 30
TABLE_SIZE = 2 ** TABLE_BITS     # the noise table's length
TABLE_MASK = TABLE_SIZE - 1
LUT_BITS = 23                    # a float32 normal depends on the top 23 bits of its 32 random bits
HASH_MULT = 0x45D9F3B            # h(x) = ((x >> 16) ^ x) * HASH_MULT in int32
LOG2_TABLE_SIZE = 2 ** 28        # nano-egg's LOG2TABLE length (sum of EXP2 over 256 logits < 2^28)
SIGMA_SHIFT_RANGE = (0, 27)      # noise shifts right by 4 + sigma_shift, which must be a valid int32 shift

# nano-egg's model, leaf by leaf: path -> (stored shape as a function of (d, vocab), class, stacked on the layers).
# Classes as spec.tree names them; QEggRoll's es_map: param 0 (full-rank noise), mm 1 and embedding 2 (both
# low-rank noise and the low-rank vote: QEggRoll perturbs and updates its embedding, unlike the float EggRoll).
LEAF_CLASSES = {"blocks.att.Uf": "mm", "blocks.att.Uh": "mm", "blocks.att.Wf": "mm", "blocks.att.Wh": "mm",
                "blocks.att.bf": "param", "blocks.att.bh": "param", "blocks.ln1.weight": "param",
                "blocks.ln2.weight": "param", "blocks.mlp.0.weight": "mm", "blocks.mlp.1.weight": "mm",
                "emb": "embedding", "head": "mm", "ln_out.weight": "param"}


def _is_power_of_4(n: int) -> bool:
    return n >= 1 and n & (n - 1) == 0 and (n.bit_length() - 1) % 2 == 0


@dataclass(frozen=True)
class Int8Config:
    """Hyper-parameters of one integer EGGROLL run, nano-egg's `Args` by their meaning (single device).

    pop is nano-egg's total_parallel_generations; validate_every and val_rows are its validate_every and
    validation_batch_size; tokens_per_update is T. noise_reuse 0 keeps epoch 0's noise for ever. Not modelled:
    nano-egg's dtype other than int8 and num_perturbations != 0 (thread ids taken modulo it).
    """

    n_embd: int = 16
    n_layer: int = 1
    vocab: int = VOCAB
    pop: int = 64
    group_size: int = 2
    tokens_per_update: int = 16
    sigma_shift: int = 4
    alpha: float = 4.0
    alpha_decay_timestep: int = 1000
    noise_reuse: int = 1
    rank: int = 1
    use_clt: bool = True
    fast_fitness: bool = True
    epochs: int = 100
    validate_every: int = 10
    val_rows: int = 16

    def __post_init__(self) -> None:
        for name in ("n_layer", "pop", "group_size", "tokens_per_update", "alpha_decay_timestep", "epochs",
                     "validate_every", "val_rows"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
        if not isinstance(self.n_embd, int) or not _is_power_of_4(self.n_embd) or self.n_embd < 4:
            lower = 4 ** max(1, (max(int(self.n_embd), 1).bit_length() - 1) // 2)
            raise ValueError(
                f"n_embd (--hidden) {self.n_embd!r} is not a power of 4: every matrix product divides by "
                f"16 * int(sqrt(in)) with in = n_embd or 4 * n_embd, which must be a power of 2 (a shift) on every "
                f"side; use a power of 4 >= 4 such as {lower} or {lower * 4}")
        if self.vocab != VOCAB:
            raise ValueError(f"vocab must be {VOCAB} (the model reads and predicts bytes), got {self.vocab}")
        if self.pop % 2:
            raise ValueError(f"pop {self.pop} is odd but members pair antithetically (2k, 2k+1); use an even "
                             f"population such as {self.pop + 1}")
        divisors = ", ".join([str(g) for g in range(2, self.pop + 1, 2) if self.pop % g == 0][:4])
        if self.pop % self.group_size:
            raise ValueError(f"group_size {self.group_size} does not divide the population {self.pop}: member i "
                             f"reads sequence i // group_size; use an even divisor of {self.pop} such as {divisors}")
        if self.group_size % 2:
            raise ValueError(f"group_size {self.group_size} is odd: an antithetic pair (2k, 2k+1) must read the "
                             f"same bytes for sign(s_2k - s_2k+1) to compare the two noise signs; use an even "
                             f"divisor of {self.pop} such as {divisors}")
        lo, hi = SIGMA_SHIFT_RANGE
        if not isinstance(self.sigma_shift, int) or not lo <= self.sigma_shift <= hi:
            raise ValueError(
                f"sigma_shift {self.sigma_shift!r} is out of range: use an integer in [{lo}, {hi}]. The noise "
                f"term is shifted right by 4 + sigma_shift, which must be a valid int32 shift (0..31; C's >> is "
                f"undefined beyond) and at least 4, the fixed point, so that sigma = 2^-sigma_shift <= 1 "
                f"(nano-egg's default is 4)")
        if self.rank != 1:
            raise ValueError(f"rank must be 1, got {self.rank}: nano-egg's low-rank vote is written for rank 1 "
                             f"(its own TODO) and egg.c is rank 1")
        if not self.fast_fitness:
            raise ValueError("fast_fitness must be True: nano-egg's fast_fitness=False update names an undefined "
                             "variable (`dt`) and cannot run, so there is no behaviour to reproduce")
        if not (isinstance(self.alpha, (int, float)) and math.isfinite(self.alpha) and self.alpha > 0):
            raise ValueError(f"alpha must be a finite number > 0 (> 1: the decaying schedule; <= 1: a constant "
                             f"two-sided tail probability), got {self.alpha!r}")
        if not isinstance(self.noise_reuse, int) or self.noise_reuse < 0:
            raise ValueError(f"noise_reuse must be an integer >= 0 (0: epoch 0's noise for ever; k: fresh noise "
                             f"every k epochs), got {self.noise_reuse!r}")

    @property
    def n_sequences(self) -> int:
        """Training sequences (rows of the train stream): pop // group_size."""
        return self.pop // self.group_size

    @property
    def pairs(self) -> int:
        return self.pop // 2

    def replace(self, **changes) -> "Int8Config":
        return dataclasses.replace(self, **changes)


INT8_PRESETS: dict[str, Int8Config] = {
    "selftest": Int8Config(n_embd=4, n_layer=1, pop=8, tokens_per_update=8, epochs=4, validate_every=2, val_rows=4),
    "quick": Int8Config(n_embd=16, n_layer=2, pop=32, tokens_per_update=16, epochs=20, validate_every=10,
                        val_rows=8),
    # about a minute of one core in JAX: seed 0 trains from 8.46 bits/byte (epoch 0) to validation 4.58 after
    # 800 epochs (thr 0 -> 42; about 1% of the entries move per epoch at the end). alpha_decay_timestep 100:
    # nano-egg's 1000 is sized for runs of 1000 epochs and more.
    "cpu": Int8Config(n_embd=64, n_layer=2, pop=256, tokens_per_update=32, epochs=800, validate_every=50,
                      alpha_decay_timestep=100, val_rows=16),
    # nano-egg's own defaults on one device (1024 generations, 6 x 256, T 100): documentation, not a CPU run
    "nano-egg": Int8Config(n_embd=256, n_layer=6, pop=1024, tokens_per_update=100, epochs=1000,
                           validate_every=10, val_rows=1024),
}
INT8_PRESET_NOTES = {
    "selftest": "unit tests: d 4, 1 layer, pop 8, T 8",
    "quick": "the parity suite's size: d 16, 2 layers, pop 32, T 16",
    "cpu": "d 64, 2 layers, pop 256, T 32, 800 epochs: about a minute of one core in JAX",
    "nano-egg": "nano-egg's defaults (6 x 256, pop 1024, T 100): a GPU run",
}


def int8_tree(cfg: Int8Config) -> Tree:
    """nano-egg's parameter tree for cfg: 13 leaves (flatten order = ES key order), blocks stacked on axis 0."""
    d, L = cfg.n_embd, cfg.n_layer
    shapes = {"blocks.att.Uf": (d, d), "blocks.att.Uh": (d, d), "blocks.att.Wf": (d, d), "blocks.att.Wh": (d, d),
              "blocks.att.bf": (d,), "blocks.att.bh": (d,), "blocks.ln1.weight": (d,), "blocks.ln2.weight": (d,),
              "blocks.mlp.0.weight": (4 * d, d), "blocks.mlp.1.weight": (d, 4 * d), "emb": (cfg.vocab, d),
              "head": (cfg.vocab, d), "ln_out.weight": (d,)}
    leaves = [Leaf(path, ((L,) + shape) if path.startswith("blocks.") else shape, LEAF_CLASSES[path],
                   (0,) if path.startswith("blocks.") else ()) for path, shape in shapes.items()]
    return make_tree(leaves)


# ----------------------------------------------------------------------------- scalar statements of the math
def wrap_int32(v: int) -> int:
    """v reduced to int32 two's complement (what int32 arithmetic wraps to)."""
    return ((v + 2 ** 31) % 2 ** 32) - 2 ** 31


def h(x: int) -> int:
    """nano-egg's pair hash ((x >> 16) ^ x) * 0x45d9f3b in wrapping int32 (x an int32 pair index)."""
    x = wrap_int32(x)
    return wrap_int32(((x >> 16) ^ x) * HASH_MULT)


def window_start(key_word0: int, pair: int) -> int:
    """(key_data(fold_in(leaf_key, true_epoch))[0] ^ h(pair)) & (2^30 - 1): the unclamped start in [0, 2^30)."""
    return (key_word0 ^ (h(pair) & 0xFFFFFFFF)) & TABLE_MASK


def clamp_start(start: int, n: int, size: int = TABLE_SIZE) -> int:
    """dynamic_slice's clamp: a window of n entries of a table of `size` starts at min(max(start, 0), size - n)."""
    if not 1 <= n <= size:
        raise ValueError(f"a window holds 1..{size} entries, got {n}")
    return min(max(start, 0), size - n)


def true_epoch(epoch: int, noise_reuse: int) -> int:
    """The epoch the noise is drawn for: 0 if noise_reuse == 0 else epoch // noise_reuse."""
    return 0 if noise_reuse == 0 else epoch // noise_reuse


def lowrank_window(shape: tuple[int, int], rank: int = 1) -> int:
    """Entries a low-rank leaf stored (a, b) reads: (a + b) * rank (B's b * rank first, then A's a * rank)."""
    a, b = shape
    return (a + b) * rank


def fullrank_window(size: int) -> int:
    """Entries a full-rank leaf of `size` elements reads: 2 * size (element i is W[2i] * W[2i + 1])."""
    return 2 * size


def noise_shift(sigma_shift: int) -> int:
    """The perturbation's right shift: FIXED_POINT + sigma_shift."""
    return FIXED_POINT + sigma_shift


def out_divisor(in_dim: int) -> int:
    """mm's floor divisor 16 * int(sqrt(in)) (nano-egg: 2^FIXED_POINT * int(np.sqrt(in)))."""
    return (2 ** FIXED_POINT) * math.isqrt(in_dim)


def out_shift(in_dim: int) -> int:
    """log2(out_divisor(in)) for `in` a power of 4; ValueError otherwise (the divisor is then no shift)."""
    div = out_divisor(in_dim)
    if not _is_power_of_4(in_dim):
        raise ValueError(f"in = {in_dim} is not a power of 4: 16 * int(sqrt(in)) = {div} is not a power of 2")
    return div.bit_length() - 1


def clip(v: int) -> int:
    return min(max(v, -MAX), MAX)


def ln_divide(numerator: int, m: int) -> int:
    """DIV[m][numerator]: clip(numerator // m) for m >= 1; row 0 as XLA divides by zero: -1 for 0, -2 otherwise.

    numerator is read as int16 first (the table is indexed by its uint16 view)."""
    v = ((numerator + 2 ** 15) % 2 ** 16) - 2 ** 15
    if m == 0:
        return -1 if v == 0 else -2
    return clip(v // m)


def alpha_at(epoch: int, alpha: float, decay: int) -> float:
    """alpha_e = 1 / ((2^alpha - 1) * (e / decay) + 1) when alpha > 1, else alpha (float64, numpy's order)."""
    if alpha > 1.0:
        return 1.0 / ((math.exp2(alpha) - 1.0) * (epoch / decay) + 1.0)
    return float(alpha)


def threshold_at(epoch: int, alpha: float, decay: int) -> int:
    """thr_e = int32(ndtri(1 - alpha_e / 2) * 16), truncated toward zero (0 at epoch 0 when alpha > 1)."""
    return int(NormalDist().inv_cdf(1.0 - alpha_at(epoch, alpha, decay) / 2.0) * (2 ** FBIT))


def thresholds(cfg: Int8Config) -> tuple[int, ...]:
    """thr_e for e = 0..epochs-1."""
    return tuple(threshold_at(e, cfg.alpha, cfg.alpha_decay_timestep) for e in range(cfg.epochs))


def vote_bound(threshold: int, pairs: int, use_clt: bool = True) -> int:
    """The right side of the vote test |Z| * 16 < thr * isqrt(pairs) * (256 if use_clt else 1)."""
    return threshold * math.isqrt(pairs) * ((4 ** FIXED_POINT) if use_clt else 1)


def vote(param: int, z: int, threshold: int, pairs: int, use_clt: bool = True) -> int:
    """One entry's update: unchanged if |Z| * 16 < vote_bound, else +1 (Z > 0) or -1 (Z <= 0), clipped."""
    if abs(z) * (2 ** FIXED_POINT) < vote_bound(threshold, pairs, use_clt):
        return clip(param)
    return clip(param + 1 if z > 0 else param - 1)


def exp2_table() -> tuple[int, ...]:
    """EXP2[i] = int(2^(i / 16) * 16), i = 0..255 (float64, truncated)."""
    return tuple(int(math.exp2(i / 2 ** FBIT) * 2 ** FBIT) for i in range(256))


def _log2_thresholds() -> tuple[tuple[int, ...], ...]:
    """T[e][f] = the least n with 16 log2(n) >= 16 e + f (f = 0..15), i.e. n^16 >= 2^(16 e + f), exactly."""
    rows = []
    for e in range(29):
        row = []
        for f in range(16):
            lo, hi = 2 ** e, 2 ** (e + 1)          # n in [2^e, 2^(e+1)]: bisect on n^16 >= 2^(16e + f)
            while lo < hi:
                mid = (lo + hi) // 2
                if mid ** 16 >= 2 ** (16 * e + f):
                    hi = mid
                else:
                    lo = mid + 1
            row.append(lo)
        rows.append(tuple(row))
    return tuple(rows)


LOG2_THRESHOLDS = _log2_thresholds()


def floor_16log2(n: int) -> int:
    """floor(16 * log2(n)) for n >= 1, exactly (integer thresholds, no floating point)."""
    if n < 1:
        raise ValueError(f"log2 needs n >= 1, got {n}")
    e = n.bit_length() - 1
    return 16 * e + sum(1 for f in range(1, 16) if n >= LOG2_THRESHOLDS[e][f])


def log2_entry(k: int) -> int:
    """LOG2[k] = int32(log2((k + 1) / 16) * 16) (float64, truncated toward zero), for 0 <= k < 2^28.

    In reals that is 16 log2(k + 1) - 64 truncated: floor for k + 1 >= 16 or k + 1 a power of 2, else
    ceil = floor + 1 (negative values). Equal to numpy's float64 formula at every entry: the two could part only
    where 16 log2(n) lies within a few ulp of an integer, i.e. at n = T[e][f] - 1 and T[e][f], which the tests
    check against numpy one by one.
    """
    if not 0 <= k < LOG2_TABLE_SIZE:
        raise ValueError(f"LOG2 index {k} is outside [0, 2^28)")
    n = k + 1
    m = floor_16log2(n)
    exact = n & (n - 1) == 0
    return m - 64 if (n >= 16 or exact) else m - 63


def bits_per_byte(score_sum: int, tokens: int) -> float:
    """-score / (16 * tokens): a summed log2-likelihood in 1/16 bit as bits per byte."""
    return -score_sum / ((2 ** FBIT) * tokens)


# ----------------------------------------------------------------------------- the command line (`--task int8`)
# flag dest -> Int8Config field: the shared override flags (spec.cli, spec.lm_run) that mean something here.
INT8_FLAGS = {"pop": "pop", "hidden": "n_embd", "layers": "n_layer", "rank": "rank", "group_size": "group_size",
              "noise_reuse": "noise_reuse", "epochs": "epochs", "sigma_shift": "sigma_shift", "alpha": "alpha",
              "tokens": "tokens_per_update"}
# the int8 task's own flags (dest -> spelling), refused by the other tasks
INT8_ONLY = {"sigma_shift": "--sigma-shift", "alpha": "--alpha", "tokens": "--tokens"}
# shared flags that mean nothing for the integer run (dest -> spelling)
NOT_INT8 = {"sigma": "--sigma", "lr": "--lr", "sigma_decay": "--sigma-decay", "lr_decay": "--lr-decay",
            "activation": "--activation", "optimizer": "--optimizer", "max_steps": "--max-steps",
            "exact_graph": "--exact-graph"}


def add_int8_arguments(parser) -> None:
    """--sigma-shift, --alpha, --tokens (the int8 task's own flags)."""
    parser.add_argument("--sigma-shift", type=int, help="--task int8: noise shift (sigma = 2^-s; default 4)")
    parser.add_argument("--alpha", type=float, help="--task int8: vote schedule alpha (default 4)")
    parser.add_argument("--tokens", type=int, help="--task int8: tokens per member per epoch (T)")


def int8_config(args) -> Int8Config:
    """Int8Config from --preset (default cpu) and the explicit flags; ValueError on an unknown preset, a flag that
    does not apply or bad values (Int8Config's own checks)."""
    preset = args.preset or "cpu"
    if preset not in INT8_PRESETS:
        raise ValueError(f"--preset {preset} is not an int8 preset; --task int8 takes {', '.join(INT8_PRESETS)}")
    given = [spelling for dest, spelling in NOT_INT8.items() if getattr(args, dest, None) not in (None, False)]
    if given:
        raise ValueError(f"{', '.join(given)} {'does' if len(given) == 1 else 'do'} not apply to --task int8")
    return INT8_PRESETS[preset].replace(**{field: getattr(args, dest) for dest, field in INT8_FLAGS.items()
                                           if getattr(args, dest, None) is not None})
