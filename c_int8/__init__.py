"""Integer EGGROLL in C (nano-egg semantics; spec/int8.py states every op), called through ctypes with numpy arrays.

`egg_int8.c` is the project's own C99 code, built by `make setup` (`python -m c_int8.build`) with the system C
compiler into build/c_int8/; `load()` builds it on first use when the library is missing or stale and raises
CUnavailable (with the reason) when there is no compiler or the build fails, so callers and tests can skip.

The pieces are jax_reference.int8's: threefry2x32 and the key scheme (fold_in, split, the leaves' ES keys), window
starts (h() wrapping, dynamic_slice's clamp) and entries, the ops (mm, emb, param, ln with the DIVISION rule and its
row 0, GRU, MLP, clipped adds), the loss (EXP2, LOG2 entries), a member's forward over T tokens with every
intermediate (the state reset at byte 0), fitness signs, votes Z, the +-1 update (threshold, threshold-0 quirk) and
one ES epoch over the whole population (the loop over members runs in C).

The 2^23-entry int8 normal look-up (int8(normal * 16) for every bits >> 9) is passed in by the caller
(jax_reference.int8.model.normal_lut(), or int8 of torch_impl.random.normal_table() * 16): computing JAX's float32 normal
bit for bit in C would need XLA's erfinv polynomial step by step; a standalone C build would need that port.
nano-egg's init, round(normal * 16), reads a second 2^23 look-up the same way (`init_params`; the caller passes the
rounded values, e.g. np.round(torch_impl.random.normal_table() * 16)).

egg.c's departures are mode bits, one per knob of spec/int8_knobs.py (which states each; `MODE_BITS`;
`Int8C(..., knobs=Int8Knobs | {knob: value} | profile name)`); every other aspect stays nano-egg's. Under
int8_noise=xorshift the run's seed is xorshift's base (egg.c: time(NULL)). Under evolving=matrices a frozen leaf's
noise is zero (never read); with int8_noise=xorshift as well no table noise is drawn and `lut` may be None.

egg.c's run itself (ljubomirj/egg.c full_trained_egg-cpumulti.c's main; tests/c_int8/test_egg_c_conformance.py builds that
file and checks `train_egg_c` against it step by step, bit for bit) needs two more pieces, functions, not knobs:
- its init, `xorshift_init_params(cfg, seed=42)`: one xorshift32 stream from 42 (fixed, not the run's seed), each
  value sign(bit 0) * bits 1..5 as the noise's, filling the embedding (256 x d), the head (256 x d), then per layer
  Wf, Uf, Wh, Uh (d x d), mlp.0 (4d x d), mlp.1 (d x 4d), all row-major; biases 0, norm weights 16;
- its data layout (rollout.int8_data.egg_c_*): the data file's bytes as they are; at step s pair p reads
  T + 1 bytes from (s T + p (length // (pop / 2))) % (length - T), both of its members the same bytes, each member's
  state carried from step to step; egg.c runs (length - 1) // T steps. Every 10th step it also prints the loss
  of the unperturbed model on data[s T : s T + T + 1] from a state of its own carried between those steps
  (`train_egg_c` reports it as main_loss).
`train_egg_c(cfg, base, data)` runs that loop with the knobs of profile egg.c-cpumulti; base is egg.c's time(NULL).
Not modelled: egg.c's sampling (sample_model: rand() seeded by time(NULL); it prints text and changes nothing).
"""
from __future__ import annotations

import ctypes
import math
from dataclasses import dataclass
from typing import Callable

import numpy as np

import cbuild
from spec.int8 import LUT_BITS, TABLE_SIZE, VOCAB, Int8Config, int8_tree
from spec.int8_knobs import ALL_INT8_KNOBS, Int8Knobs, as_int8_knobs

N_STACKED = 10                       # the first 10 leaves of the flatten order are the stacked `blocks.*` ones
BLOCK_TRACE = ("ln1", "f", "gated", "cand", "state", "att", "ln2", "mlp.0", "mlp", "out")
MAX_D = 256                          # the C forward's fixed buffers: d <= 256, n_layer * d <= 16384


# knob -> the C mode bit (the knobs, their values and meanings: spec.int8_knobs)
MODE_BITS: dict[str, int] = {"int8_noise": 1, "vote_threshold": 2, "evolving": 4, "out_shift": 8, "ln_division": 16,
                             "log2": 32, "state_reset": 64, "gate_clip": 128, "mlp": 256}
assert set(MODE_BITS) == set(ALL_INT8_KNOBS)


def egg_mode(knobs: Int8Knobs | dict | str | None) -> int:
    """The C mode bits for Int8Knobs, {knob: value} or a profile name (spec.int8_knobs.INT8_PROFILES); None or {}:
    nano-egg. Int8KnobError (a ValueError) for an unknown knob, value or profile."""
    knobs = as_int8_knobs(knobs)
    return sum(bit for knob, bit in MODE_BITS.items() if knobs.is_egg_c(knob))


def table_free(knobs: Int8Knobs | dict | str | None) -> bool:
    """True where no leaf draws noise from the normal table: int8_noise=xorshift (matrices) with evolving=matrices
    (the other leaves frozen, their noise never drawn)."""
    knobs = as_int8_knobs(knobs)
    return knobs.is_egg_c("int8_noise") and knobs.is_egg_c("evolving")


def unpack(cfg: Int8Config, flat: np.ndarray) -> dict:
    """A flat buffer in flatten order (int8 params or int32 votes) as {path: array of the leaf's shape}."""
    tree, out, at = int8_tree(cfg), {}, 0
    for path in tree.paths:
        shape = tuple(tree.shapes[path])
        size = math.prod(shape)
        out[path] = flat[at:at + size].reshape(shape).copy()
        at += size
    if at != flat.size:
        raise ValueError(f"the buffer holds {flat.size} entries; the tree has {at}")
    return out


class CUnavailable(RuntimeError):
    """The C side cannot be used here: no compiler, or the build failed (the message says which, and why)."""


_I8, _I32, _U32 = np.int8, np.int32, np.uint32
_P = ctypes.c_void_p
_SIGNATURES = {
    "egg_threefry2x32": (None, [ctypes.c_uint32, ctypes.c_uint32, _P, _P, _P, _P, ctypes.c_int64]),
    "egg_pair_hash": (ctypes.c_int32, [ctypes.c_int32]),
    "egg_window_start": (ctypes.c_uint32, [ctypes.c_uint32, ctypes.c_int32]),
    "egg_clamp_start": (ctypes.c_uint32, [ctypes.c_uint32, ctypes.c_int64]),
    "egg_table_entries": (None, [_P, _P, _P, ctypes.c_int64, _P]),
    "egg_window": (None, [_P, _P, ctypes.c_uint32, ctypes.c_int64, _P]),
    "egg_out_divisor": (ctypes.c_int32, [ctypes.c_int32]),
    "egg_ln_divide": (ctypes.c_int32, [ctypes.c_int32, ctypes.c_int32]),
    "egg_exp2_entry": (ctypes.c_int32, [ctypes.c_int32]),
    "egg_log2_threshold": (ctypes.c_int32, [ctypes.c_int32, ctypes.c_int32]),
    "egg_log2_entry": (ctypes.c_int32, [ctypes.c_int32]),
    "egg_log_likelihood": (ctypes.c_int32, [_P, ctypes.c_int32]),
    "egg_param_count": (ctypes.c_int64, [_P]),
    "egg_noise_count": (ctypes.c_int64, [_P]),
    "egg_key_count": (ctypes.c_int64, [_P]),
    "egg_window_starts": (None, [_P, _P, ctypes.c_int32, ctypes.c_int32, _P]),
    "egg_member_noise": (None, [_P, _P, _P, _P, ctypes.c_int32, ctypes.c_int32, _P]),
    "egg_mm": (None, [_P, ctypes.c_int32, ctypes.c_int32, _P, _P, _P, ctypes.c_int32, _P]),
    "egg_emb": (None, [_P, ctypes.c_int32, ctypes.c_int32, _P, _P, ctypes.c_int32, _P]),
    "egg_param": (None, [_P, ctypes.c_int32, _P, ctypes.c_int32, _P]),
    "egg_ln": (None, [_P, _P, ctypes.c_int32, _P]),
    "egg_ln_trunc": (None, [_P, _P, ctypes.c_int32, _P]),
    "egg_log2_mitchell": (ctypes.c_int32, [ctypes.c_int32]),
    "egg_log_likelihood_mitchell": (ctypes.c_int32, [_P, ctypes.c_int32]),
    "egg_xorshift_seed": (ctypes.c_uint32, [ctypes.c_uint32, ctypes.c_int32, ctypes.c_int32, ctypes.c_int32,
                                            ctypes.c_int32]),
    "egg_apply_votes_mode": (None, [_P, _P, _P, ctypes.c_int32, ctypes.c_int32, _P]),
    "egg_xorshift_init": (None, [_P, ctypes.c_uint32, _P]),
    "egg_clipped_add": (None, [_P, _P, _P, ctypes.c_int64, _P]),
    "egg_op_mm": (None, [_P, _P, _P, ctypes.c_int32, ctypes.c_int32, _P, _P]),
    "egg_op_param": (None, [_P, _P, _P, ctypes.c_int32, ctypes.c_int32, _P]),
    "egg_op_ln": (None, [_P, _P, _P, ctypes.c_int32, ctypes.c_int32, _P, _P]),
    "egg_op_emb": (None, [_P, _P, _P, ctypes.c_int32, _P]),
    "egg_op_gru": (None, [_P, _P, _P, ctypes.c_int32, _P, _P, _P]),
    "egg_op_mlp": (None, [_P, _P, _P, ctypes.c_int32, _P, _P]),
    "egg_trace_width": (ctypes.c_int64, [_P]),
    "egg_member": (ctypes.c_int32, [_P, _P, _P, _P, _P, ctypes.c_int32, ctypes.c_int32, ctypes.c_int32, _P,
                                    ctypes.c_int32, _P, _P]),
    "egg_population_scores": (None, [_P, _P, _P, _P, _P, ctypes.c_int32, ctypes.c_int32, _P, ctypes.c_int32, _P,
                                     _P]),
    "egg_validation_scores": (None, [_P, _P, ctypes.c_int32, _P, ctypes.c_int32, _P]),
    "egg_fitness": (None, [_P, ctypes.c_int32, _P]),
    "egg_votes": (None, [_P, _P, _P, _P, ctypes.c_int32, _P, ctypes.c_int32, _P]),
    "egg_apply_votes": (None, [_P, _P, ctypes.c_int64, ctypes.c_int32, ctypes.c_int32, ctypes.c_int32, _P]),
    "egg_epoch": (None, [_P, _P, _P, _P, _P, ctypes.c_int32, ctypes.c_int32, ctypes.c_int32, _P, ctypes.c_int32,
                         _P, _P, _P, _P, _P]),
}


# load(cc=None, lib_dir=None): the library (built first if missing or stale), CUnavailable with the reason if it
# cannot be had; unavailable_reason(cc=None, lib_dir=None): None when it loads, else why not (a skip message)
load, unavailable_reason = cbuild.loader("c_int8.build", _SIGNATURES, "C side", CUnavailable)


def _arr(value, dtype) -> np.ndarray:
    return np.ascontiguousarray(np.asarray(value), dtype=dtype)


def _tokens(tokens) -> np.ndarray:
    """Bytes as int32, checked: the C forward indexes the embedding with them."""
    tokens = _arr(tokens, _I32)
    if tokens.size and (tokens.min() < 0 or tokens.max() >= VOCAB):
        raise ValueError(f"tokens are bytes in [0, {VOCAB - 1}], got values in [{tokens.min()}, {tokens.max()}]")
    return tokens


def _ptr(array: np.ndarray | None):
    return None if array is None else array.ctypes.data_as(_P)


# ----------------------------------------------------------------------------- threefry, keys, windows
def threefry2x32(k0: int, k1: int, x0, x1) -> tuple[np.ndarray, np.ndarray]:
    """(y0, y1) = threefry2x32((k0, k1); x0, x1) elementwise (20 rounds), uint32."""
    x0, x1 = np.broadcast_arrays(_arr(x0, _U32), _arr(x1, _U32))
    x0, x1 = _arr(x0, _U32), _arr(x1, _U32)
    y0, y1 = np.empty_like(x0), np.empty_like(x1)
    load().egg_threefry2x32(int(k0), int(k1), _ptr(x0), _ptr(x1), _ptr(y0), _ptr(y1), x0.size)
    return y0, y1


def fold_in(key_words, data: int) -> np.ndarray:
    """key_data(fold_in(key, data)) = threefry(key; 0, data) as (2,) uint32 (jax_threefry_partitionable)."""
    y0, y1 = threefry2x32(key_words[0], key_words[1], [0], [data & 0xFFFFFFFF])
    return np.array([y0[0], y1[0]], _U32)


def split(key_words, n: int) -> np.ndarray:
    """key_data(split(key, n)): (n, 2) uint32, row i = threefry(key; 0, i) (partitionable threefry)."""
    y0, y1 = threefry2x32(key_words[0], key_words[1], np.zeros(n, _U32), np.arange(n, dtype=_U32))
    return np.stack([y0, y1], axis=1)


def table_key(seed: int) -> np.ndarray:
    """key_data(key(seed)) = (0, seed)."""
    return np.array([0, seed], _U32)


def leaf_keys(cfg: Int8Config, seed: int) -> np.ndarray:
    """The leaves' ES keys in the C side's order (flatten order; a stacked leaf's n_layer slices in turn):
    leaf i gets split(es_key, 13)[i], es_key = fold_in(key(seed), 1); slice l of a stacked leaf split(., L)[l]."""
    es_key = fold_in(table_key(seed), 1)
    per_leaf = split(es_key, len(int8_tree(cfg).paths))
    rows = []
    for i, words in enumerate(per_leaf):
        rows.extend(split(words, cfg.n_layer) if i < N_STACKED else [words])
    return np.ascontiguousarray(np.array(rows, _U32))


def pair_hash(pairs) -> np.ndarray:
    """h(x) = ((x >> 16) ^ x) * 0x45d9f3b in int32 (wrapping), as uint32 bits."""
    lib = load()
    return np.array([lib.egg_pair_hash(int(p)) & 0xFFFFFFFF for p in np.ravel(_arr(pairs, _I32))],
                    _U32).reshape(np.shape(pairs))


def window_start(word0: int, pair: int) -> int:
    """(word0 ^ h(pair)) & (2^30 - 1): the unclamped start."""
    return int(load().egg_window_start(int(word0) & 0xFFFFFFFF, int(pair)))


def clamp_start(start: int, n: int) -> int:
    """min(start, 2^30 - n): dynamic_slice's clamp."""
    return int(load().egg_clamp_start(int(start) & 0xFFFFFFFF, int(n)))


def _check_lut(lut) -> np.ndarray:
    lut = _arr(lut, _I8)
    if lut.shape != (2 ** LUT_BITS,):
        raise ValueError(f"the normal look-up must be (2^{LUT_BITS},) int8, got {lut.shape}")
    return lut


def table_entries(lut, key_words, counters) -> np.ndarray:
    """TABLE[j] = LUT[bits(j) >> 9] for uint32 counters j (any shape)."""
    lut, counters = _check_lut(lut), _arr(counters, _U32)
    out = np.empty(counters.shape, _I8)
    load().egg_table_entries(_ptr(lut), _ptr(_arr(key_words, _U32)), _ptr(counters), counters.size, _ptr(out))
    return out


def window(lut, key_words, start: int, n: int) -> np.ndarray:
    """TABLE[c : c + n], c = min(start, 2^30 - n): (n,) int8."""
    if not 1 <= n <= TABLE_SIZE:
        raise ValueError(f"a window holds 1..2^30 entries, got {n}")
    lut = _check_lut(lut)
    out = np.empty(n, _I8)
    load().egg_window(_ptr(lut), _ptr(_arr(key_words, _U32)), int(start) & 0xFFFFFFFF, n, _ptr(out))
    return out


# ----------------------------------------------------------------------------- scalar ops and tables
def mm(W, x, A=None, B=None, sigma_shift: int = 4) -> np.ndarray:
    """clip((x W^T [+ ((x B) A^T) >> (4 + ss)]) // (16 isqrt(in))): W (out, in), x (in,), A (out,), B (in,)."""
    W, x = _arr(W, _I8), _arr(x, _I8)
    out = np.empty(W.shape[0], _I8)
    A = None if A is None else _arr(np.ravel(A), _I32)
    B = None if B is None else _arr(np.ravel(B), _I32)
    load().egg_mm(_ptr(W), W.shape[0], W.shape[1], _ptr(x), _ptr(A), _ptr(B), sigma_shift, _ptr(out))
    return out


def emb(E, tok: int, A=None, B=None, sigma_shift: int = 4) -> np.ndarray:
    """E[tok] [then clip(E[tok] + ((A[tok] B^T) >> (4 + ss)))]: E (vocab, d)."""
    E = _arr(E, _I8)
    out = np.empty(E.shape[1], _I8)
    A = None if A is None else _arr(np.ravel(A), _I32)
    B = None if B is None else _arr(np.ravel(B), _I32)
    load().egg_emb(_ptr(E), E.shape[1], int(tok), _ptr(A), _ptr(B), sigma_shift, _ptr(out))
    return out


def param(P, E=None, sigma_shift: int = 4) -> np.ndarray:
    """P [then clip(P + (E >> (4 + ss)))]."""
    P = _arr(P, _I8)
    out = np.empty_like(P)
    E = None if E is None else _arr(E, _I32)
    load().egg_param(_ptr(P), P.size, _ptr(E), sigma_shift, _ptr(out))
    return out


def ln(x, w, trunc: bool = False) -> np.ndarray:
    """DIV[max(sum |x|, 1) // d][x * w] (trunc: egg.c's truncating division, a zero mean taken as 1)."""
    x, w = _arr(x, _I8), _arr(w, _I8)
    out = np.empty_like(x)
    (load().egg_ln_trunc if trunc else load().egg_ln)(_ptr(x), _ptr(w), x.size, _ptr(out))
    return out


def log2_mitchell(x: int) -> int:
    """egg.c's log2_fixed: 16 k + linear 4-bit mantissa - 64 (0 for x <= 0)."""
    return int(load().egg_log2_mitchell(int(x)))


def xorshift_seed(base: int, epoch: int, pair: int, path: str, layer: int, cfg: Int8Config) -> int:
    """egg.c's seed of a matrix's noise: (base ^ epoch * 0x9e3779b9) + pair + 100 layer + k (the head: + 999)."""
    return int(load().egg_xorshift_seed(base & 0xFFFFFFFF, epoch, pair, int8_tree(cfg).paths.index(path), layer))


def ln_divide(numerator, m) -> np.ndarray:
    """DIVISION[m][numerator] elementwise (row 0: -1 for 0, -2 otherwise)."""
    lib = load()
    v, m = np.broadcast_arrays(_arr(numerator, np.int64), _arr(m, np.int64))
    flat = [lib.egg_ln_divide(int(a) & 0xFFFF if a >= 0 else int(a), int(b)) for a, b in zip(v.ravel(), m.ravel())]
    return np.array(flat, _I8).reshape(v.shape)


def clipped_add(a, b, c=None) -> np.ndarray:
    """clip(a + b [+ c]) in int32, as int8."""
    a, b = _arr(a, _I8), _arr(b, _I8)
    c = None if c is None else _arr(c, _I8)
    out = np.empty_like(a)
    load().egg_clipped_add(_ptr(a), _ptr(b), _ptr(c), a.size, _ptr(out))
    return out


def out_divisor(in_dim: int) -> int:
    return int(load().egg_out_divisor(in_dim))


def exp2_table() -> np.ndarray:
    lib = load()
    return np.array([lib.egg_exp2_entry(i) for i in range(256)], _I32)


def log2_thresholds() -> np.ndarray:
    lib = load()
    return np.array([[lib.egg_log2_threshold(e, f) for f in range(16)] for e in range(29)], np.int64)


def log2_entries(k) -> np.ndarray:
    """LOG2[k] for int k in [0, 2^28)."""
    lib = load()
    k = _arr(k, np.int64)
    if k.size and (k.min() < 0 or k.max() >= 2 ** 28):
        raise ValueError("LOG2 indices lie in [0, 2^28)")
    return np.array([lib.egg_log2_entry(int(v)) for v in k.ravel()], _I32).reshape(k.shape)


def log_likelihood(logits, target: int, mitchell: bool = False) -> int:
    """z[target] - LOG2[sum EXP2[z] - 1], z = logits + 128 (mitchell: z[target] - log2_mitchell(sum EXP2[z]))."""
    fn = load().egg_log_likelihood_mitchell if mitchell else load().egg_log_likelihood
    return int(fn(_ptr(_arr(logits, _I8)), int(target)))


def fitness(scores) -> np.ndarray:
    """sign(s_2k - s_2k+1) as int8, (pop / 2,)."""
    scores = _arr(scores, _I32)
    out = np.empty(scores.size // 2, _I8)
    load().egg_fitness(_ptr(scores), scores.size, _ptr(out))
    return out


def apply_votes(P, Z, threshold: int, pairs: int, use_clt: bool = True) -> np.ndarray:
    """+-1 where |Z| * 16 >= thr * isqrt(pairs) * (256 if use_clt else 1) (Z = 0 moves down), clipped."""
    P, Z = _arr(P, _I8), _arr(Z, _I32)
    out = np.empty_like(P)
    load().egg_apply_votes(_ptr(P), _ptr(Z), P.size, int(threshold), int(pairs), int(use_clt), _ptr(out))
    return out


# ----------------------------------------------------------------------------- the model
@dataclass
class EpochResult:
    scores: np.ndarray          # (pop,) int32
    states: np.ndarray          # (pop, n_layer, d) int8, after the epoch
    fitness: np.ndarray         # (pop / 2,) int8
    votes: dict                 # {path: Z int32, the leaf's shape}
    params: dict                # {path: int8}, after the update


class Int8C:
    """The C side for one configuration and seed: keys derived here, the normal look-up given (see the module).

    Parameters are {path: int8 array} in spec.int8.int8_tree's paths and shapes (stacked leaves (n_layer, ...)).
    knobs: egg.c's departures to switch on ({knob: value} or "egg.c"; see the module); the seed is xorshift's base.
    lut may be None where no leaf draws table noise (int8_noise=xorshift with evolving=matrices)."""

    def __init__(self, cfg: Int8Config, seed: int, lut, knobs: dict | str | None = None):
        if cfg.n_embd > MAX_D or cfg.n_layer * cfg.n_embd > 64 * MAX_D:
            raise ValueError(f"the C side holds d <= {MAX_D} and n_layer * d <= {64 * MAX_D}")
        self.lib = load()
        self.config, self.seed = cfg, seed
        self.mode = egg_mode(knobs)
        if lut is None and not table_free(knobs):
            raise ValueError("the normal look-up is needed: only int8_noise=xorshift with evolving=matrices draws "
                             "no table noise")
        self.lut = None if lut is None else _check_lut(lut)
        self.tree = int8_tree(cfg)
        self.paths = list(self.tree.paths)
        self.tkey = table_key(seed)
        self.keys = leaf_keys(cfg, seed)
        self.cfg = _cfg_words(cfg, knobs, seed)
        self.n_params = int(self.lib.egg_param_count(_ptr(self.cfg)))
        self.n_noise = int(self.lib.egg_noise_count(_ptr(self.cfg)))
        assert int(self.lib.egg_key_count(_ptr(self.cfg))) == len(self.keys)
        assert self.n_params == sum(math.prod(self.tree.shapes[p]) for p in self.paths)
        self.width = int(self.lib.egg_trace_width(_ptr(self.cfg)))

    # layout
    def _stack(self, path: str) -> int:
        return self.config.n_layer if self.paths.index(path) < N_STACKED else 1

    def pack(self, params: dict) -> np.ndarray:
        """{path: int8} -> the flat int8 buffer (flatten order)."""
        parts = []
        for path in self.paths:
            value = np.asarray(params[path])
            if value.shape != tuple(self.tree.shapes[path]):
                raise ValueError(f"{path}: shape {value.shape}, the tree says {self.tree.shapes[path]}")
            parts.append(_arr(value, _I8).ravel())
        return np.ascontiguousarray(np.concatenate(parts))

    def unpack(self, flat: np.ndarray) -> dict:
        return unpack(self.config, flat)

    # noise and windows
    def noise_buffer(self, epoch: int, thread: int) -> np.ndarray:
        out = np.empty(self.n_noise, _I32)
        self.lib.egg_member_noise(_ptr(self.cfg), _ptr(self.lut), _ptr(self.tkey), _ptr(self.keys), epoch, thread,
                                  _ptr(out))
        return out

    def member_noise(self, epoch: int, thread: int) -> dict:
        """{path: (A, B)} (low rank: A (a, 1) signed, B (b, 1)) or {path: E} (full rank, int32), slices stacked."""
        flat, at, out = self.noise_buffer(epoch, thread), 0, {}
        for path in self.paths:
            n_sl = self._stack(path)
            shape = tuple(self.tree.shapes[path])[1:] if self.paths.index(path) < N_STACKED else \
                tuple(self.tree.shapes[path])
            if len(shape) == 1:
                size = shape[0]
                block = flat[at:at + size * n_sl].reshape((n_sl, size))
                value = block if self.paths.index(path) < N_STACKED else block[0]
            else:
                a, b = shape
                block = flat[at:at + (a + b) * n_sl].reshape((n_sl, a + b))
                A, B = block[:, :a, None], block[:, a:, None]
                value = (A, B) if self.paths.index(path) < N_STACKED else (A[0], B[0])
                size = a + b
            out[path] = value
            at += size * n_sl
        return out

    def window_starts(self, epoch: int, thread_ids) -> dict:
        """{path: (m, *stack) uint32}: every member's clamped window start per leaf."""
        thread_ids = list(np.ravel(thread_ids))
        rows = np.empty((len(thread_ids), len(self.keys)), _U32)
        for r, t in enumerate(thread_ids):
            self.lib.egg_window_starts(_ptr(self.cfg), _ptr(self.keys), int(epoch), int(t), _ptr(rows[r]))
        out, at = {}, 0
        for i, path in enumerate(self.paths):
            n_sl = self._stack(path)
            out[path] = rows[:, at:at + n_sl] if i < N_STACKED else rows[:, at]
            at += n_sl
        return out

    # model-level ops (noise: a noise_buffer or None for noise off)
    def _leaf(self, path: str) -> int:
        return self.paths.index(path)

    def op_mm(self, flat, path: str, layer: int, x, noise=None) -> np.ndarray:
        x = _arr(x, _I8)
        rows = self.tree.shapes[path][-2]
        out = np.empty(rows, _I8)
        self.lib.egg_op_mm(_ptr(self.cfg), _ptr(flat), _ptr(noise), self._leaf(path), layer, _ptr(x), _ptr(out))
        return out

    def op_param(self, flat, path: str, layer: int, noise=None) -> np.ndarray:
        out = np.empty(self.tree.shapes[path][-1], _I8)
        self.lib.egg_op_param(_ptr(self.cfg), _ptr(flat), _ptr(noise), self._leaf(path), layer, _ptr(out))
        return out

    def op_ln(self, flat, path: str, layer: int, x, noise=None) -> np.ndarray:
        x = _arr(x, _I8)
        out = np.empty_like(x)
        self.lib.egg_op_ln(_ptr(self.cfg), _ptr(flat), _ptr(noise), self._leaf(path), layer, _ptr(x), _ptr(out))
        return out

    def op_emb(self, flat, tok: int, noise=None) -> np.ndarray:
        out = np.empty(self.config.n_embd, _I8)
        self.lib.egg_op_emb(_ptr(self.cfg), _ptr(flat), _ptr(noise), int(tok), _ptr(out))
        return out

    def op_gru(self, flat, layer: int, x, state, noise=None) -> dict:
        """{f, gated, cand, state}: nano-egg's GRU on layer `layer` (x: ln1's output)."""
        d = self.config.n_embd
        out = np.empty(4 * d, _I8)
        self.lib.egg_op_gru(_ptr(self.cfg), _ptr(flat), _ptr(noise), layer, _ptr(_arr(x, _I8)),
                            _ptr(_arr(state, _I8)), _ptr(out))
        return dict(zip(("f", "gated", "cand", "state"), out.reshape(4, d)))

    def op_mlp(self, flat, layer: int, x, noise=None) -> tuple[np.ndarray, np.ndarray]:
        """(hidden (4d,), out (d,))."""
        d = self.config.n_embd
        out = np.empty(5 * d, _I8)
        self.lib.egg_op_mlp(_ptr(self.cfg), _ptr(flat), _ptr(noise), layer, _ptr(_arr(x, _I8)), _ptr(out))
        return out[:4 * d], out[4 * d:]

    # the forward
    def trace_names(self) -> list[str]:
        return (["emb"] + [f"blocks.{l}.{n}" for l in range(self.config.n_layer) for n in BLOCK_TRACE]
                + ["ln_out", "logits", "ll"])

    def member_trace(self, params: dict, epoch: int, thread: int, tokens, state, noise: bool = True):
        """(trace {name: (T, ...)}, final state (L, d), score): member `thread` over tokens (T + 1,) from state."""
        tokens = _tokens(tokens)
        T = tokens.size - 1
        S = _arr(state, _I8).copy()
        trace = np.empty((T, self.width), _I32)
        score = self.lib.egg_member(_ptr(self.cfg), _ptr(self.lut), _ptr(self.tkey), _ptr(self.keys),
                                    _ptr(self.pack(params)), epoch, thread, int(noise), _ptr(tokens), T, _ptr(S),
                                    _ptr(trace))
        d, out, at = self.config.n_embd, {}, 0
        for name in self.trace_names():
            n = 4 * d if name.endswith("mlp.0") else VOCAB if name == "logits" else 1 if name == "ll" else d
            out[name] = trace[:, at:at + n].astype(_I32 if name == "ll" else _I8)
            if name == "ll":
                out[name] = out[name][:, 0]
            at += n
        return out, S, int(score)

    def population_scores(self, params: dict, epoch: int, tokens, states) -> tuple[np.ndarray, np.ndarray]:
        """(scores (pop,) int32, states after): member m is thread m on tokens[m] (T + 1,)."""
        tokens = _tokens(tokens)
        states = _arr(states, _I8).copy()
        scores = np.empty(tokens.shape[0], _I32)
        self.lib.egg_population_scores(_ptr(self.cfg), _ptr(self.lut), _ptr(self.tkey), _ptr(self.keys),
                                       _ptr(self.pack(params)), epoch, tokens.shape[0], _ptr(tokens),
                                       tokens.shape[1] - 1, _ptr(states), _ptr(scores))
        return scores, states

    def validation_scores(self, params: dict, rows) -> np.ndarray:
        rows = _tokens(rows)
        out = np.empty(rows.shape[0], _I32)
        self.lib.egg_validation_scores(_ptr(self.cfg), _ptr(self.pack(params)), rows.shape[0], _ptr(rows),
                                       rows.shape[1], _ptr(out))
        return out

    # votes and the update
    def votes(self, fitnesses, epoch: int) -> dict:
        """{path: Z int32 (the leaf's shape)}: sum_k f_k N_k with thread 2k's noise."""
        f = _arr(fitnesses, _I8)
        Z = np.empty(self.n_params, _I32)
        self.lib.egg_votes(_ptr(self.cfg), _ptr(self.lut), _ptr(self.tkey), _ptr(self.keys), epoch, _ptr(f), f.size,
                           _ptr(Z))
        return self.unpack(Z)

    def apply_votes(self, params: dict, votes: dict, threshold: int, pairs: int) -> dict:
        """The update under this side's knobs (frozen leaves kept; fixed160 or the z-test)."""
        out = np.empty(self.n_params, _I8)
        self.lib.egg_apply_votes_mode(_ptr(self.cfg), _ptr(self.pack(params)), _ptr(self.pack_votes(votes)),
                                      int(threshold), int(pairs), _ptr(out))
        return self.unpack(out)

    def update(self, params: dict, scores, epoch: int, threshold: int) -> dict:
        f = fitness(scores)
        return self.apply_votes(params, self.votes(f, epoch), threshold, f.size)

    def pack_votes(self, votes: dict) -> np.ndarray:
        return np.ascontiguousarray(np.concatenate([_arr(votes[p], _I32).ravel() for p in self.paths]))

    def epoch(self, params: dict, epoch: int, threshold: int, tokens, states) -> EpochResult:
        """One ES epoch in one C call: scores, fitness, votes and the update over the whole population."""
        tokens = _tokens(tokens)
        pop, T = tokens.shape[0], tokens.shape[1] - 1
        states = _arr(states, _I8).copy()
        scores, f = np.empty(pop, _I32), np.empty(pop // 2, _I8)
        Z, new = np.empty(self.n_params, _I32), np.empty(self.n_params, _I8)
        self.lib.egg_epoch(_ptr(self.cfg), _ptr(self.lut), _ptr(self.tkey), _ptr(self.keys), _ptr(self.pack(params)),
                           epoch, int(threshold), pop, _ptr(tokens), T, _ptr(states), _ptr(scores), _ptr(f), _ptr(Z),
                           _ptr(new))
        return EpochResult(scores, states, f, self.unpack(Z), self.unpack(new))


def init_params(cfg: Int8Config, seed: int, init_lut) -> dict:
    """nano-egg's init from the seed, {path: int8}: a matrix is round(normal(key, shape) * 16), read as
    init_lut[bits(j) >> 9] with bits(j) = y0 ^ y1 of threefry(key; 0, j) (init_lut: the 2^23 values of
    round(normal * 16), half to even, passed in like the noise look-up); biases 0, norm weights 16.
    Keys: model_key = fold_in(key(seed), 0); split(model_key, 3) -> emb, blocks, head; layer l: split(blocks, L)[l]
    -> split(., 2) -> att, mlp; att: split(., 4) -> Wf, Uf, Wh, Uh; mlp: split(., 2) -> mlp.0, mlp.1."""
    init_lut = _check_lut(init_lut)
    d, L = cfg.n_embd, cfg.n_layer

    def draw(key, shape):
        n = math.prod(shape)
        y0, y1 = threefry2x32(key[0], key[1], np.zeros(n, _U32), np.arange(n, dtype=_U32))
        return init_lut[(y0 ^ y1) >> np.uint32(32 - LUT_BITS)].reshape(shape)

    k_emb, k_blocks, k_head = split(fold_in(table_key(seed), 0), 3)
    mats: dict[str, list] = {name: [] for name in ("Wf", "Uf", "Wh", "Uh", "mlp.0", "mlp.1")}
    for layer_key in split(k_blocks, L):
        att, mlp = split(layer_key, 2)
        for name, key in zip(("Wf", "Uf", "Wh", "Uh"), split(att, 4)):
            mats[name].append(draw(key, (d, d)))
        k0, k1 = split(mlp, 2)
        mats["mlp.0"].append(draw(k0, (4 * d, d)))
        mats["mlp.1"].append(draw(k1, (d, 4 * d)))
    params = {f"blocks.att.{n}": np.stack(mats[n]) for n in ("Uf", "Uh", "Wf", "Wh")}
    params.update({"blocks.att.bf": np.zeros((L, d), _I8), "blocks.att.bh": np.zeros((L, d), _I8),
                   "blocks.ln1.weight": np.full((L, d), 16, _I8), "blocks.ln2.weight": np.full((L, d), 16, _I8),
                   "blocks.mlp.0.weight": np.stack(mats["mlp.0"]), "blocks.mlp.1.weight": np.stack(mats["mlp.1"]),
                   "emb": draw(k_emb, (VOCAB, d)), "head": draw(k_head, (VOCAB, d)),
                   "ln_out.weight": np.full(d, 16, _I8)})
    return {path: params[path] for path in int8_tree(cfg).paths}


def train_epochs(cfg: Int8Config, seed: int, lut, params: dict, epochs: int | None = None, corpus=None,
                 observe: Callable | None = None, knobs: dict | str | None = None) -> dict:
    """cfg.epochs (or `epochs`) ES epochs on the corpus as jax_reference.int8.train lays it out, from params
    (nano-egg's init, given); observe(epoch, EpochResult) sees each. The final params."""
    from rollout.corpus import load_corpus
    from rollout.int8_data import epoch_tokens, int8_streams, segment_offset, stream_layout, train_rows
    from spec.int8 import thresholds

    corpus = load_corpus() if corpus is None else corpus
    train_stream, _ = int8_streams(corpus)
    layout = stream_layout(len(train_stream), cfg)
    rows = train_rows(train_stream, layout.n_sequences, layout.segments, cfg.tokens_per_update)
    side = Int8C(cfg, seed, lut, knobs)
    thr = thresholds(cfg)
    states = np.zeros((cfg.pop, cfg.n_layer, cfg.n_embd), _I8)
    for e in range(cfg.epochs if epochs is None else epochs):
        tokens = epoch_tokens(rows, segment_offset(e, layout, cfg.tokens_per_update), cfg.tokens_per_update, cfg.pop,
                              cfg.group_size)
        result = side.epoch(params, e, thr[e], tokens, states)
        params, states = result.params, result.states
        if observe is not None:
            observe(e, result)
    return params


# ----------------------------------------------------------------------------- egg.c's own run
EGG_C_INIT_SEED = 42                 # egg.c's init_rng: fixed, whatever the run's time(NULL) base


def _cfg_words(cfg: Int8Config, knobs=None, base: int = 0) -> np.ndarray:
    """The C side's cfg words [d, L, sigma_shift, noise_reuse, use_clt, mode, base (int32 bits)]."""
    return np.array([cfg.n_embd, cfg.n_layer, cfg.sigma_shift, cfg.noise_reuse, int(cfg.use_clt), egg_mode(knobs),
                     int(np.array(base & 0xFFFFFFFF, np.uint32).view(_I32))], _I32)


def xorshift_init_params(cfg: Int8Config, seed: int = EGG_C_INIT_SEED) -> dict:
    """egg.c's init, {path: int8}: one xorshift32 stream from `seed` (egg.c: 42) filling the embedding, the head,
    then per layer Wf, Uf, Wh, Uh, mlp.0, mlp.1 (row-major; each value sign(bit 0) * bits 1..5, in [-31, 31]);
    biases 0, norm weights 16 (see the module)."""
    words = _cfg_words(cfg)
    flat = np.empty(int(load().egg_param_count(_ptr(words))), _I8)
    load().egg_xorshift_init(_ptr(words), seed & 0xFFFFFFFF, _ptr(flat))
    return unpack(cfg, flat)


def train_egg_c(cfg: Int8Config, base: int, data, steps: int | None = None, observe: Callable | None = None,
                knobs: Int8Knobs | dict | str = "egg.c-cpumulti", lut=None, params: dict | None = None) -> dict:
    """egg.c's training loop (full_trained_egg-cpumulti.c's main, see the module) over `data` (the data file's
    bytes): `steps` steps (default all of egg.c's (length - 1) // T) from xorshift_init_params (or `params`), step s
    with step seed base ^ (s * 0x9e3779b9) (base: egg.c's time(NULL)), pair p on rollout.int8_data's egg.c layout,
    member states carried. observe(step, EpochResult, main_loss) sees each step; main_loss is egg.c's printed
    noise-off loss (-score, 1/16 bits summed over T) at every 10th step, else None. The final params.

    cfg supplies d, n_layer, pop, T (tokens_per_update) and sigma_shift (egg.c's SIGMA_SHIFT; use_clt True); the
    update is knobs' (egg.c-cpumulti: fixed160, so no schedule); lut only where the knobs draw table noise."""
    from rollout.int8_data import egg_c_main_tokens, egg_c_max_steps, egg_c_step_tokens
    from spec.int8 import threshold_at

    data = np.asarray(data, dtype=np.uint8)
    T = cfg.tokens_per_update
    most = egg_c_max_steps(len(data), T)
    steps = most if steps is None else steps
    if not 0 <= steps <= most:
        raise ValueError(f"egg.c runs (length - 1) // T = {most} steps over {len(data)} bytes; asked for {steps}")
    side = Int8C(cfg, base, lut, knobs)
    params = xorshift_init_params(cfg) if params is None else params
    states = np.zeros((cfg.pop, cfg.n_layer, cfg.n_embd), _I8)
    main_state = np.zeros((cfg.n_layer, cfg.n_embd), _I8)
    for step in range(steps):
        main_loss = None
        if step % 10 == 0:
            _, main_state, score = side.member_trace(params, step, 0, egg_c_main_tokens(data, step, T), main_state,
                                                     noise=False)
            main_loss = -score
        thr = threshold_at(step, cfg.alpha, cfg.alpha_decay_timestep)
        result = side.epoch(params, step, thr, egg_c_step_tokens(data, step, cfg.pop, T), states)
        params, states = result.params, result.states
        if observe is not None:
            observe(step, result, main_loss)
    return params
