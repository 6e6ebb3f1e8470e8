"""nano-egg's EGG model in torch (spec/int8.py, "Ops"), the whole population at once, bit for bit.

Storage is int8, arithmetic int32, as spec.int8 states. How each rule is kept in torch:
- Matrix products (x W^T, the votes): torch's int8 @ int8 would wrap in int8, so no product is taken in int8.
  Where it is exact (probed once per shape and device: `_int8_gemm_exact`), int8 operands go to torch._int_mm, int8 x
  int8 with int32 accumulation: on a CPU directly (4-10x faster than the int64 GEMM here), on CUDA (tensor cores)
  through `int_mm_padded`, which meets cuBLASLt's shape rules with zero padding (rows > 16, sizes multiples of 8,
  the weight column-major). Otherwise operands are cast to int64 and the int64 product is reduced to int32 (CPU).
  All are exact: every term is an integer of magnitude <= 127 * 127 (the votes: 86 * 86), so an int64 sum of fewer
  than 2^40 of them never overflows, and an int32 sum of fewer than 133,000 never wraps; reducing the exact sum mod
  2^32 (int64 -> int32 keeps the low 32 bits) gives what XLA's wrapping int32 accumulation gives, whatever the order
  of summation (integer sums are associative). No float32 is involved (a float32 product would round above 2^24).
  CUDA has no int64 GEMM, so there the other products (the votes, a shape the probe refuses) run as float64 GEMMs:
  exact too, since every partial sum is an integer below 127^2 * in < 2^53 (for int8 operands whatever in < 2^39;
  other operands are checked by `_check_exact_f64`, which reads their largest value on the host).
  mm's divisor 16 isqrt(in) is a power of 2 for in a power of 4 (the config insists), and there floor division is
  the arithmetic shift by its log2.
- The rank-1 noise term ((x . B_m) A_m) and every elementwise step run in torch int32, whose products and sums wrap
  mod 2^32 (two's complement) exactly as XLA's int32 arithmetic does, so they agree even where a value would wrap;
  for in <= 1024 (nano-egg's largest, 4 * 256) nothing wraps at all: |(x . B) A| <= 127 * 86 * in * 86 < 2^31.
- `>>` on signed int32 tensors is an arithmetic shift (floor), `torch.div(.., rounding_mode="floor")` a floor
  division (both checked on negatives in tests/torch_impl/test_int8.py); clips are explicit clamps to [-127, 127].
- Layer norm row 0 is built by hand: DIV[0][0] = -1, DIV[0][v != 0] = -2 (XLA's division by zero).
Population batching: x is (P, ...) with one row per member; the shared weight W multiplies all rows in one GEMM;
the member's low-rank noise (rank 1) adds ((x . B_m) A_m) >> (4 + ss) row by row as a broadcast product.
"""
from __future__ import annotations

import functools
from typing import NamedTuple

import torch

from spec.int8 import (FIXED_POINT, LOG2_THRESHOLDS, LOGMAX, MAX, Int8Config, exp2_table, noise_shift,
                       out_divisor)
from spec.int8_knobs import NANO_EGG, Int8Knobs
from torch_impl import random as rnd
from torch_impl.int8.noise import PairNoise, run_keys

I8, I16, I32, I64 = torch.int8, torch.int16, torch.int32, torch.int64
_F64_EXACT = 2 ** 53


# ----------------------------------------------------------------------------- integer helpers
def clip8(v: torch.Tensor) -> torch.Tensor:
    """clip(v, -127, 127) as int8."""
    return torch.clamp(v, -MAX, MAX).to(I8)


def clipped_add(*values: torch.Tensor) -> torch.Tensor:
    """clip(sum in int32) as int8."""
    total = values[0].to(I32)
    for v in values[1:]:
        total = total + v.to(I32)
    return clip8(total)


def floor_div(v: torch.Tensor, d) -> torch.Tensor:
    return torch.div(v, d, rounding_mode="floor")


def _check_exact_f64(a: torch.Tensor, b: torch.Tensor) -> None:
    bound = int(a.abs().max()) * int(b.abs().max()) * a.shape[-1] if a.numel() and b.numel() else 0
    if bound >= _F64_EXACT:
        raise ValueError(f"a float64 product of these integers could round (bound {bound} >= 2^53)")


INT_MM_MIN_ROWS, INT_MM_MULTIPLE = 17, 8      # CUDA's torch._int_mm: rows > 16, inner and output sizes multiples of 8


def int_mm_padded(a: torch.Tensor, b: torch.Tensor, mm=None) -> torch.Tensor:
    """a @ b, int8 (m, k) @ (k, n) -> int32 (m, n), through torch._int_mm under CUDA's shape rules: rows padded to
    at least 17, k and n to multiples of 8, with zero rows and columns (a zero term changes no integer sum), and b
    handed column-major (cuBLASLt's int8 layout). `mm`: the product (default torch._int_mm; tests pass a stand-in
    that checks the rules)."""
    mm = torch._int_mm if mm is None else mm
    (m, k), n = a.shape, b.shape[1]
    rows, inner, cols = max(m, INT_MM_MIN_ROWS), -(-k // INT_MM_MULTIPLE) * INT_MM_MULTIPLE, \
        -(-n // INT_MM_MULTIPLE) * INT_MM_MULTIPLE
    if (rows, inner) != (m, k) or not a.is_contiguous():
        a = torch.nn.functional.pad(a, (0, inner - k, 0, rows - m)).contiguous()
    if (inner, cols) != (k, n) or b.stride() != (1, k):
        b = torch.nn.functional.pad(b.T, (0, inner - k, 0, cols - n)).contiguous().T     # (inner, cols), column-major
    out = mm(a, b)
    return out if (rows, cols) == (m, n) else out[:m, :n]


# device type -> the int8 GEMM tried there (each shape probed once before use: `_int8_gemm_exact`)
INT8_GEMMS = {"cpu": lambda a, b: torch._int_mm(a, b), "cuda": int_mm_padded}
_INT8_GEMM_EXACT: dict[tuple[str, int, int, int], bool] = {}


def _int8_gemm_exact(m: int, k: int, n: int, device: torch.device = torch.device("cpu")) -> bool:
    """Whether the device's int8 GEMM (INT8_GEMMS) is exact for (m, k) @ (k, n), probed once per shape and device
    with extreme operands (+-127 everywhere, and mixed signs) against an exact product (int64 on a CPU, float64
    elsewhere: below 2^53). A kernel that saturates an int16 pair sum (AVX2 vpmaddubsw without VNNI) fails the probe;
    one that accumulates in int32 (VNNI, tensor cores) is exact (module docstring)."""
    shape = (device.type, m, k, n)
    if shape not in _INT8_GEMM_EXACT:
        gemm = INT8_GEMMS.get(device.type)
        ok = gemm is not None and hasattr(torch, "_int_mm") and k < 133_000
        wide = I64 if device.type == "cpu" else torch.float64
        pattern = torch.tensor([127, -127, 127, 127, -127, -127, 127, -127], dtype=I8, device=device)
        mixed = (pattern.repeat(m * k // 8 + 1)[:m * k].view(m, k),
                 pattern.flip(0).repeat(k * n // 8 + 1)[:k * n].view(n, k).T)
        cases = [(torch.full((m, k), u, dtype=I8, device=device), torch.full((n, k), v, dtype=I8, device=device).T)
                 for u, v in ((127, 127), (127, -127), (-127, -127))] + [mixed]
        for a, b in cases if ok else []:
            try:
                ok = ok and torch.equal(gemm(a, b).to(wide), a.to(wide) @ b.to(wide))
            except RuntimeError:
                ok = False
        _INT8_GEMM_EXACT[shape] = ok
    return _INT8_GEMM_EXACT[shape]


def int_matmul(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """a @ b for integer tensors, exact, wrapped to int32 as XLA's int32 dot (see the module docstring)."""
    if a.dtype == I8 and b.dtype == I8 and a.dim() == 2 and _int8_gemm_exact(a.shape[0], a.shape[1], b.shape[1],
                                                                             a.device):
        return INT8_GEMMS[a.device.type](a, b)
    if a.device.type == "cpu":
        return torch.matmul(a.to(I64), b.to(I64)).to(I32)
    if not (a.dtype == I8 and b.dtype == I8):       # int8 sums stay below 2^53 for any k < 2^39: no check needed
        _check_exact_f64(a, b)
    return torch.matmul(a.to(torch.float64), b.to(torch.float64)).to(I64).to(I32)


def ln_divide(numerator: torch.Tensor, m: torch.Tensor) -> torch.Tensor:
    """DIV[m][v]: clip(int16(v) // m) for m >= 1; row 0 -1 for v = 0, else -2 (m broadcast against v)."""
    v = numerator.to(I16).to(I32)                  # the table is indexed by the numerator's int16 bits
    m = m.to(I32)
    q = floor_div(v, torch.clamp_min(m, 1))
    row0 = -1 - (v != 0).to(I32)                   # -1 for v = 0, -2 otherwise
    return clip8(torch.where(m == 0, row0, q))


EXP2 = torch.tensor(exp2_table(), dtype=I64)
_LOG2_T = torch.tensor(LOG2_THRESHOLDS, dtype=I64)                  # (29, 16)


@functools.lru_cache(maxsize=16)
def _table(name: str, device: torch.device) -> torch.Tensor:
    """EXP2 or _LOG2_T on `device`, copied once (no host-to-device copy per token, so a CUDA graph can capture it)."""
    return {"exp2": EXP2, "log2": _LOG2_T}[name].to(device)


def log2_entries(k: torch.Tensor) -> torch.Tensor:
    """LOG2[k] = int32(log2((k + 1) / 16) * 16) for k in [0, 2^28), exactly (integer thresholds; spec.log2_entry)."""
    n = k.to(I64) + 1
    e = torch.frexp(n.to(torch.float64))[1].to(I64) - 1         # floor(log2 n), exact for n < 2^53
    thr = _table("log2", n.device)[e]                           # (..., 16)
    m = 16 * e + (n.unsqueeze(-1) >= thr[..., 1:]).sum(-1)
    exact = (n & (n - 1)) == 0
    return torch.where((n >= 16) | exact, m - 64, m - 63).to(I32)


def log2_mitchell(x: torch.Tensor) -> torch.Tensor:
    """egg.c's log2 (log2=mitchell): 16 k + the 4 mantissa bits below the leading one k (linear), - 64; 0 for x <= 0."""
    x = x.to(I64)
    k = torch.frexp(torch.clamp_min(x, 1).to(torch.float64))[1].to(I64) - 1          # floor(log2 x), exact
    rest = x - (1 << k)
    frac = torch.where(k >= 4, rest >> torch.clamp_min(k - 4, 0), rest << torch.clamp_min(4 - k, 0))
    return torch.where(x > 0, 16 * k + frac - 64, torch.zeros_like(x))


def log_likelihood(logits: torch.Tensor, targets: torch.Tensor, knobs: Int8Knobs = NANO_EGG) -> torch.Tensor:
    """ll = z[target] - LOG2[sum_v EXP2[z_v] - 1], z = logits + 128 (1/16 bit), rows of logits (..., 256): int32.
    log2=mitchell: z[target] - log2_mitchell(sum_v EXP2[z_v])."""
    z = logits.to(I64) + 128
    total = torch.take(_table("exp2", z.device), z).sum(-1)
    picked = torch.gather(z, -1, targets.to(I64).unsqueeze(-1)).squeeze(-1)
    log2 = log2_mitchell(total) if knobs.log2 == "mitchell" else log2_entries(total - 1).to(I64)
    return (picked - log2).to(I32)


# ----------------------------------------------------------------------------- the ops, population batched
class LowRank(NamedTuple):
    A: torch.Tensor          # (P, a) int8 with the member's sign
    B: torch.Tensor          # (P, b) int8


def mm_divisor(in_dim: int, d: int | None, knobs: Int8Knobs = NANO_EGG) -> int:
    """mm's floor divisor: 16 isqrt(in) (nano-egg); out_shift=fixed: 2^9 for in = 4 d, else 2^8 (egg.c)."""
    if knobs.out_shift == "fixed":
        if d is None:
            raise ValueError("out_shift=fixed needs the model width d (egg.c shifts by 9 where in = 4 d, else 8)")
        return 1 << 9 if in_dim == 4 * d else 1 << 8
    return out_divisor(in_dim)


def mm(W: torch.Tensor, x: torch.Tensor, noise: LowRank | None, sigma_shift: int, knobs: Int8Knobs = NANO_EGG,
       d: int | None = None) -> torch.Tensor:
    """clip((x W^T [+ ((x B) A^T) >> (4 + ss)]) // divisor): x (P, in) int8, W (out, in) -> (P, out) int8 (divisor:
    mm_divisor; d the model width, needed under out_shift=fixed)."""
    acc = int_matmul(x, W.T)
    if noise is not None:
        xb = (x.to(I32) * noise.B.to(I32)).sum(-1, dtype=I32)                  # (P,) (x B) in int32
        pert = xb.unsqueeze(-1) * noise.A.to(I32)                               # ((x B) A^T) in int32
        acc = acc + (pert >> noise_shift(sigma_shift))
    div = mm_divisor(W.shape[-1], d, knobs)
    if div & (div - 1) == 0:                       # a power of 2 (in a power of 4): floor(v / 2^k) = v >> k
        return clip8(acc >> (div.bit_length() - 1))
    return clip8(floor_div(acc, div))


def emb(E: torch.Tensor, tok: torch.Tensor, noise: LowRank | None, sigma_shift: int) -> torch.Tensor:
    """E[tok] [then clip(E[tok] + ((A[tok] B^T) >> (4 + ss)))]: tok (P,) -> (P, d) int8."""
    row = torch.index_select(E, 0, tok.to(I64))
    if noise is None:
        return row
    a_tok = torch.gather(noise.A, 1, tok.to(I64).unsqueeze(-1)).to(I32)       # (P, 1)
    pert = a_tok * noise.B.to(I32)                                              # |.| <= 86^2: no wrap
    return clip8(row.to(I32) + (pert >> noise_shift(sigma_shift)))


def param(P: torch.Tensor, E: torch.Tensor | None, sigma_shift: int) -> torch.Tensor:
    """P [then clip(P + (E >> (4 + ss)))] ((P,) + shape when noised, else the shared P)."""
    if E is None:
        return P
    return clip8(P.to(I32) + (E >> noise_shift(sigma_shift)))


def ln(x: torch.Tensor, w: torch.Tensor, knobs: Int8Knobs = NANO_EGG) -> torch.Tensor:
    """DIV[max(sum |x|, 1) // d][x * w] over the last axis: x (P, d) int8, w (P, d) or (d,) int8.
    ln_division=trunc (egg.c): clip((x w) / m) truncating, a zero m taken as 1."""
    d = x.shape[-1]
    m = floor_div(torch.clamp_min(x.to(I32).abs().sum(-1, dtype=I32), 1), d).unsqueeze(-1)
    if knobs.ln_division == "trunc":
        return clip8(torch.div(x.to(I32) * w.to(I32), torch.clamp_min(m, 1), rounding_mode="trunc"))
    return ln_divide(x.to(I32) * w.to(I32), m)


# ----------------------------------------------------------------------------- the model
# One member's intermediates per token, in forward order (jax_reference.int8's names): per block l,
# "blocks.{l}.{name}" for name in BLOCK_TRACE.
BLOCK_TRACE = ("ln1", "f", "gated", "cand", "state", "att", "ln2", "mlp.0", "mlp", "out")


def trace_names(n_layer: int) -> list[str]:
    """["emb", "blocks.0.ln1", ..., "blocks.{L-1}.out", "ln_out", "logits", "ll"]: the forward's order."""
    return ["emb"] + [f"blocks.{l}.{name}" for l in range(n_layer) for name in BLOCK_TRACE] + ["ln_out", "logits", "ll"]


def _lr(noise: PairNoise | None, path: str, l: int | None) -> LowRank | None:
    if noise is None or path not in noise.A:              # noise off, or a leaf that does not evolve
        return None
    A, B = noise.A[path], noise.B[path]
    return LowRank(A, B) if l is None else LowRank(A[:, l], B[:, l])


def _full(noise: PairNoise | None, path: str, l: int | None):
    if noise is None or path not in noise.E:
        return None
    return noise.E[path] if l is None else noise.E[path][:, l]


def gru(params: dict, noise, l: int, x: torch.Tensor, state: torch.Tensor, ss: int, inter: dict | None,
        knobs: Int8Knobs = NANO_EGG):
    """nano-egg's integer GRU (sigmoid and tanh the identity); returns the new state (P, d) int8.
    gate_clip=nested (egg.c cpumulti): a gate is clip(clip(W x + U s) + bias)."""
    d = x.shape[-1]
    g = lambda name: params[f"blocks.att.{name}"][l]
    mmn = lambda name, v: mm(g(name), v, _lr(noise, f"blocks.att.{name}", l), ss, knobs, d)
    par = lambda name: param(g(name), _full(noise, f"blocks.att.{name}", l), ss)
    gate_sum = ((lambda a, b, bias: clipped_add(clipped_add(a, b), bias)) if knobs.gate_clip == "nested"
                else clipped_add)
    f = gate_sum(mmn("Wf", x), mmn("Uf", state), par("bf"))
    gate = f.to(I32) + MAX                                                       # [0, 254]
    gated = ((gate * state.to(I32)) >> (LOGMAX + 1)).to(I8)
    cand = gate_sum(mmn("Wh", x), mmn("Uh", gated), par("bh"))
    step = ((gate * (cand.to(I32) - state.to(I32))) >> (LOGMAX + 1)).to(I8)
    new = state + step                                                           # int8 add, wrapping (never shows)
    if inter is not None:
        inter.update(f=f, gated=gated, cand=cand, state=new)
    return new


def layer(params: dict, noise, l: int, x: torch.Tensor, state: torch.Tensor, ss: int, inter: dict | None,
          knobs: Int8Knobs = NANO_EGG):
    """ln1 -> gru (+ residual) -> ln2 -> mlp (+ residual): (out, new state). mlp=off (egg.c cpumulti): the block's
    output is the GRU's residual sum, ln2 and the MLP traced as zeros."""
    d = x.shape[-1]
    lnw = lambda name: param(params[f"blocks.{name}.weight"][l], _full(noise, f"blocks.{name}.weight", l), ss)
    u = ln(x, lnw("ln1"), knobs)
    new_state = gru(params, noise, l, u, state, ss, inter, knobs)
    y = clipped_add(new_state, x)
    if knobs.mlp == "off":
        v, hidden, m, out = torch.zeros_like(y), y.new_zeros(y.shape[:-1] + (4 * d,)), torch.zeros_like(y), y
    else:
        v = ln(y, lnw("ln2"), knobs)
        hidden = mm(params["blocks.mlp.0.weight"][l], v, _lr(noise, "blocks.mlp.0.weight", l), ss, knobs, d)
        m = mm(params["blocks.mlp.1.weight"][l], hidden, _lr(noise, "blocks.mlp.1.weight", l), ss, knobs, d)
        out = clipped_add(m, y)
    if inter is not None:
        inter.update({"ln1": u, "att": y, "ln2": v, "mlp.0": hidden, "mlp": m, "out": out})
    return out, new_state


def forward(params: dict, noise: PairNoise | None, tok: torch.Tensor, state: torch.Tensor, ss: int,
            trace: dict | None = None, knobs: Int8Knobs = NANO_EGG):
    """(logits (P, 256) int8, new state (P, L, d)) for one input byte per member; noise per member or None.

    trace, if given, receives this token's intermediates under spec names (emb, blocks.{l}.{name}, ln_out)."""
    x = emb(params["emb"], tok, _lr(noise, "emb", None), ss)
    if trace is not None:
        trace["emb"] = x
    states = []
    for l in range(params["blocks.att.bf"].shape[0]):
        inter = {} if trace is not None else None
        x, s = layer(params, noise, l, x, state[:, l], ss, inter, knobs)
        states.append(s)
        if trace is not None:
            trace.update({f"blocks.{l}.{k}": v for k, v in inter.items()})
    y = ln(x, param(params["ln_out.weight"], _full(noise, "ln_out.weight", None), ss), knobs)
    logits = mm(params["head"], y, _lr(noise, "head", None), ss, knobs, x.shape[-1])
    if trace is not None:
        trace["ln_out"] = y
    return logits, torch.stack(states, dim=1)


def scores(params: dict, noise: PairNoise | None, tokens: torch.Tensor, state: torch.Tensor, ss: int,
           trace: bool = False, knobs: Int8Knobs = NANO_EGG):
    """(scores (P,) int32, final state (P, L, d) int8[, trace {name: (P, T, ...)}]) over tokens (P, T + 1).

    Each member's state is zeroed before an input byte 0 (state_reset=never: never); scores sum ll over the T
    tokens in int32."""
    tokens = tokens.to(I64)
    if noise is not None:                          # widen the factors once, not in every op of every token
        noise = PairNoise({k: v.to(I32) for k, v in noise.A.items()}, {k: v.to(I32) for k, v in noise.B.items()},
                          noise.E, noise.pairs)
    total = torch.zeros(tokens.shape[0], dtype=I32, device=tokens.device)
    steps = []
    for t in range(tokens.shape[1] - 1):
        inp = tokens[:, t]
        if knobs.state_reset == "on_zero":
            state = torch.where((inp == 0).view(-1, 1, 1), torch.zeros_like(state), state)
        inter = {} if trace else None
        logits, state = forward(params, noise, inp, state, ss, inter, knobs)
        ll = log_likelihood(logits, tokens[:, t + 1], knobs)
        total = total + ll
        if trace:
            inter.update(logits=logits, ll=ll)
            steps.append(inter)
    if not trace:
        return total, state
    names = trace_names(state.shape[1])
    return total, state, {k: torch.stack([s[k] for s in steps], dim=1) for k in names}


# ----------------------------------------------------------------------------- init
def _int8_normal(key: torch.Tensor, shape, backend: str = "cpu") -> torch.Tensor:
    """round(normal(key, shape) * 16) as int8 (torch.round: half to even, as jnp.round)."""
    return torch.round(rnd.normal(key, shape, backend=backend) * (2 ** FIXED_POINT)).to(I8)


def init_params(cfg: Int8Config, seed: int, device: str | torch.device = "cpu",
                backend: str = "cpu") -> dict[str, torch.Tensor]:
    """nano-egg's init from model_key = fold_in(key(seed), 0): {path: int8 tensor at the tree's stacked shape}, with
    the normals JAX draws on `backend` ("cpu" or "gpu")."""
    d, L, V = cfg.n_embd, cfg.n_layer, cfg.vocab
    k_emb, k_blocks, k_head = rnd.split(run_keys(seed).model, 3)
    layer_keys = rnd.split(k_blocks, L)                                   # (L, 2)
    att_mlp = rnd.split(layer_keys, 2)                                    # (L, 2, 2)
    att = rnd.split(att_mlp[:, 0], 4)                                     # (L, 4, 2): Wf, Uf, Wh, Uh
    mlp = rnd.split(att_mlp[:, 1], 2)                                     # (L, 2, 2): 0, 1
    p = {f"blocks.att.{name}": _int8_normal(att[:, i], (d, d), backend)
         for i, name in enumerate(("Wf", "Uf", "Wh", "Uh"))}
    p["blocks.mlp.0.weight"] = _int8_normal(mlp[:, 0], (4 * d, d), backend)
    p["blocks.mlp.1.weight"] = _int8_normal(mlp[:, 1], (d, 4 * d), backend)
    for name in ("bf", "bh"):
        p[f"blocks.att.{name}"] = torch.zeros((L, d), dtype=I8)
    for name in ("ln1", "ln2"):
        p[f"blocks.{name}.weight"] = torch.full((L, d), 2 ** FIXED_POINT, dtype=I8)
    p["emb"] = _int8_normal(k_emb, (V, d), backend)
    p["head"] = _int8_normal(k_head, (V, d), backend)
    p["ln_out.weight"] = torch.full((d,), 2 ** FIXED_POINT, dtype=I8)
    return {k: v.contiguous().to(device) for k, v in sorted(p.items())}


def default_state(cfg: Int8Config, rows: int, device: str | torch.device = "cpu") -> torch.Tensor:
    return torch.zeros((rows, cfg.n_layer, cfg.n_embd), dtype=I8, device=device)


__all__ = ["clip8", "clipped_add", "floor_div", "int_matmul", "ln_divide", "log2_entries", "log_likelihood", "mm",
           "emb", "param", "ln", "gru", "layer", "forward", "scores", "init_params", "default_state", "LowRank"]
