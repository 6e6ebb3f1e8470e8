"""The triton backend: JAX's bits and normals in one Triton kernel on CUDA, threefry2x32 and the float32 normal fused,
as c_rng does them on the CPU (issue 35): each element goes from its key words and counter to its float in
registers, one launch per draw where the formula (eager.py) issues a hundred kernels.

The normal's steps are spec.jax_rng's own: `kernel_source(backend)` runs spec.jax_rng.normal_of_u (or, for JAX's
GPU normals, normal_of_u_gpu) on symbolic values, each float32 step of the definition becoming one line of the
kernel, so the kernel holds the steps eager.py evaluates, in the same order.
They run in the float64 carrier with every rounding to float32 done on the bits (`_r32`: immune to a compiler folding a
float64 -> float32 -> float64 pair or fusing a multiply and an add; a product of two float32 values is exact in
float64 anyway, so a fused one rounds alike), float64 division and sqrt IEEE-rounded (PTX has no other), and the
constants passed in as float64 (a float literal in a Triton kernel is a float32).
Kinds: "bits" (y0 ^ y1 of threefry(key; hi32(j), lo32(j)) for j < n per key), "normal", "lut_at" (the integer
port's noise table: LUT[bits(j) >> 9] at given counters j under one key) and "normal_of_words" (the normal of given
words, no hash: the tests read all 2^23 mantissas through it), and "member_normal" (the ES noise's draws: member p of
slice s draws normal(fold_in(fold_in(k_s, g), p), n), its two key folds in the kernel too, so an epoch's noise of a
leaf is one launch and no key work on the host). backends.py decides when it runs (CUDA keys, Triton installed, its
first-use self-check passed). TRITON_INTERPRET=1 runs the same kernels on a CPU (tests/torch_impl/random/test_triton.py).
"""
from __future__ import annotations

import functools
import hashlib
import importlib.util
import linecache
from typing import Callable

import torch

from spec import jax_rng as J

__all__ = ["unavailable_reason", "kernel_source", "launch", "KINDS", "BACKENDS"]

KINDS = {"bits": 0, "normal": 1, "lut_at": 2, "normal_of_words": 3, "member_normal": 4}
BACKENDS = ("cpu", "gpu")                 # whose normal: XLA's CPU steps, or its CUDA steps (needs spec.jax_rng's)
BLOCK = 1024


def unavailable_reason() -> str | None:
    """None when the kernel may run in this process (Triton installed), else why not."""
    if importlib.util.find_spec("triton") is None:
        return "triton is not installed"
    return None


# ----------------------------------------------------------------------------- the normal's steps, traced
class _Code:
    """The kernel lines being written while spec.jax_rng's steps run on `_Var`s, and the constants they use."""

    def __init__(self):
        self.lines: list[str] = []
        self.consts: list[float] = []

    def const(self, value: float) -> "_Var":
        value = float(value)
        if value not in self.consts:
            self.consts.append(value)
        return _Var(self, f"c{self.consts.index(value)}")

    def emit(self, expr: str) -> "_Var":
        name = f"v{len(self.lines)}"
        self.lines.append(f"{name} = {expr}")
        return _Var(self, name)


class _Var:
    """A traced float64 (or mask) value of the kernel: arithmetic on it writes a kernel line."""

    def __init__(self, code: _Code, name: str):
        self.code, self.name = code, name

    def _of(self, other) -> str:
        return other.name if isinstance(other, _Var) else self.code.const(other).name

    def _op(self, op: str, other, swap: bool = False) -> "_Var":
        a, b = (self._of(other), self.name) if swap else (self.name, self._of(other))
        return self.code.emit(f"{a} {op} {b}")

    def __add__(self, o): return self._op("+", o)
    def __radd__(self, o): return self._op("+", o, True)
    def __sub__(self, o): return self._op("-", o)
    def __rsub__(self, o): return self._op("-", o, True)
    def __mul__(self, o): return self._op("*", o)
    def __rmul__(self, o): return self._op("*", o, True)
    def __truediv__(self, o): return self._op("/", o)
    def __rtruediv__(self, o): return self._op("/", o, True)
    def __lt__(self, o): return self._op("<", o)
    def __le__(self, o): return self._op("<=", o)
    def __gt__(self, o): return self._op(">", o)
    def __ge__(self, o): return self._op(">=", o)
    def __neg__(self): return self.code.emit(f"-{self.name}")
    def __abs__(self): return self.code.emit(f"tl.abs({self.name})")


def _ops(code: _Code) -> J.Float32Ops:
    where = lambda mask, a, b: code.emit(f"tl.where({mask.name}, {mask._of(a)}, {mask._of(b)})")  # noqa: E731
    return J.Float32Ops(lambda x: code.emit(f"_r32({x.name})"), where, lambda x: code.emit(f"tl.sqrt({x.name})"))


def _xla_log(code: _Code, ops: J.Float32Ops) -> Callable[[_Var], _Var]:
    """eager._xla_log's parts from the float32 bits of y , then spec's log
    steps."""
    def log(y: _Var) -> _Var:
        b = code.emit(f"{y.name}.to(tl.float32).to(tl.int32, bitcast=True)")
        m = code.emit(f"((({b.name} & 0x007FFFFF) | 0x3F000000).to(tl.float32, bitcast=True)).to(tl.float64)")
        below = m < J.LOG_SQRTHF
        e = code.emit(f"tl.where({below.name}, ({b.name} >> 23) - 127, ({b.name} >> 23) - 126).to(tl.float64)")
        t = code.emit(f"tl.where({below.name}, ({m.name} + {m.name}) - {m._of(1.0)}, {m.name} - {m._of(1.0)})")
        return J.log_of_parts(ops, t, e)
    return log


def _nv_parts(code: _Code) -> Callable[[_Var], tuple[_Var, _Var]]:
    """libdevice log1pf's reduction of 1 + x (x a float32 in the float64 carrier): k and 2^-k, from the float64 bits
    of the exact sum (as eager._nv_parts finds them with frexp)."""
    def parts(x: _Var) -> tuple[_Var, _Var]:
        s = code.emit(f"({x._of(1.0)} + {x.name}).to(tl.int64, bitcast=True)")
        mant = code.emit(f"(({s.name} & 0x000FFFFFFFFFFFFF) | 0x3FE0000000000000).to(tl.float64, bitcast=True)")
        k = code.emit(f"(({s.name} >> 52) - 1022 - ({mant.name} < {x._of(0.75)}).to(tl.int64))")
        scale = code.emit(f"((1023 - {k.name}) << 52).to(tl.float64, bitcast=True)")
        return code.emit(f"{k.name}.to(tl.float64)"), scale
    return parts


def _gpu_sqrt(code: _Code, m: _Var) -> Callable[[_Var], _Var]:
    """sqrt.approx.f32 as eager._gpu_sqrt has it: the correctly rounded sqrt moved by spec.jax_rng's offsets,
    read from the table argument by mantissa (tail mantissas only; 0 elsewhere)."""
    def sqrt_approx(w: _Var) -> _Var:
        tail = code.emit(f"tl.where(mi < {J.GPU_TAIL}, mi, tl.maximum(mi - {J.N_MANTISSAS - 2 * J.GPU_TAIL}, 0))")
        moved = code.emit(f"tl.load(table_ptr + {tail.name}, mask=mask & ((mi < {J.GPU_TAIL}) | "
                          f"(mi >= {J.N_MANTISSAS - J.GPU_TAIL})), other=0)")
        root = code.emit(f"tl.sqrt({w.name}).to(tl.float32).to(tl.int32, bitcast=True)")
        return code.emit(f"(({root.name} + {moved.name}).to(tl.float32, bitcast=True)).to(tl.float64)")
    return sqrt_approx


def normal_steps(backend: str) -> tuple[list[str], list[float], str]:
    """(kernel lines, float64 constants, the result's name): spec.jax_rng's normal of `m` (the mantissa as float64,
    `mi` as int) for `backend`, traced."""
    code = _Code()
    ops = _ops(code)
    u = J.u_of_mantissa(_Var(code, "m"))
    if backend == "gpu":
        result = J.normal_of_u_gpu(ops, u, _nv_parts(code), _gpu_sqrt(code, _Var(code, "mi")))
    elif backend == "cpu":
        result = J.normal_of_u(ops, u, _xla_log(code, ops))
    else:
        raise ValueError(f"backend {backend!r}: the kernel knows {', '.join(map(repr, BACKENDS))}")
    return code.lines, code.consts, result.name


# ----------------------------------------------------------------------------- the kernel
_R32 = '''
@triton.jit
def _r32(x):
    """float64 x rounded to the nearest float32 (ties to even), kept in float64: integer rounding of the bits."""
    b = x.to(tl.int64, bitcast=True)
    return ((b + (0x0FFFFFFF + ((b >> 29) & 1))) & -0x20000000).to(tl.float64, bitcast=True)
'''


def _threefry_lines() -> list[str]:
    """threefry2x32 (20 rounds) on uint32 x0, x1 under k0, k1: spec.jax_rng's schedule and rotations."""
    lines = [f"k2 = k0 ^ k1 ^ {J.PARITY32}", "x0 = x0 + k0", "x1 = x1 + k1"]
    ks = ("k0", "k1", "k2")
    for i in range(5):
        for r in J.ROTATIONS[i % 2]:
            lines += ["x0 = x0 + x1", f"x1 = ((x1 << {r}) | (x1 >> {32 - r})) ^ x0"]
        lines += [f"x0 = x0 + {ks[(i + 1) % 3]}", f"x1 = x1 + {ks[(i + 2) % 3]} + {i + 1}"]
    return lines + ["return x0, x1"]


def kernel_source(backend: str = "cpu") -> tuple[str, tuple[float, ...]]:
    """(the kernel module's Python source, its float64 constants) for `backend`'s normal."""
    steps, consts, result = normal_steps(backend)
    ind = lambda lines, n: "\n".join(" " * n + line for line in lines)            # noqa: E731
    loads = [f"c{i} = tl.load(consts_ptr + {i})" for i in range(len(consts))]
    body = f'''import triton
import triton.language as tl

{_R32}

@triton.jit
def _threefry(k0, k1, x0, x1):
{ind(_threefry_lines(), 4)}


@triton.jit
def kernel(keys_ptr, counters_ptr, table_ptr, consts_ptr, out_ptr, total, n, slices, generation, KIND: tl.constexpr,
           BLOCK: tl.constexpr):
    idx = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK).to(tl.int64)
    mask = idx < total
    if KIND == 2:
        row = idx * 0
        col = tl.load(counters_ptr + idx, mask=mask, other=0)
    else:
        row = idx // n
        col = idx - row * n
    if KIND == 4:
        s = row % slices
        p = row // slices
        k0 = tl.load(keys_ptr + 2 * s, mask=mask, other=0).to(tl.uint32)
        k1 = tl.load(keys_ptr + 2 * s + 1, mask=mask, other=0).to(tl.uint32)
        zero = (p * 0).to(tl.uint32)
        k0, k1 = _threefry(k0, k1, zero, (p * 0 + generation).to(tl.uint32))
        k0, k1 = _threefry(k0, k1, zero, p.to(tl.uint32))
    else:
        k0 = tl.load(keys_ptr + 2 * row, mask=mask, other=0).to(tl.uint32)
        k1 = tl.load(keys_ptr + 2 * row + 1, mask=mask, other=0).to(tl.uint32)
    x0, x1 = _threefry(k0, k1, (col >> 32).to(tl.uint32), col.to(tl.uint32))
    words = x0 ^ x1
    if KIND == 3:
        words = tl.load(counters_ptr + idx, mask=mask, other=0).to(tl.uint32)
    if KIND == 0:
        tl.store(out_ptr + idx, words.to(tl.int32, bitcast=True), mask=mask)
    elif KIND == 2:
        tl.store(out_ptr + idx, tl.load(table_ptr + (words >> 9).to(tl.int64), mask=mask, other=0), mask=mask)
    else:
        mi = (words >> 9).to(tl.int64)
        m = mi.to(tl.float64)
{ind(loads, 8)}
{ind(steps, 8)}
        tl.store(out_ptr + idx, {result}.to(tl.float32), mask=mask)
'''
    return body, tuple(consts)


@functools.lru_cache(maxsize=None)
def _kernel(backend: str):
    """The kernel for `backend`, and its constants (the source registered with linecache: Triton reads a kernel's
    source)."""
    source, consts = kernel_source(backend)
    name = f"<torch_impl.random.triton_kernel {backend} {hashlib.sha256(source.encode()).hexdigest()[:12]}>"
    linecache.cache[name] = (len(source), None, source.splitlines(True), name)
    namespace: dict = {"__name__": f"torch_impl.random._triton_kernel_{backend}"}
    exec(compile(source, name, "exec"), namespace)                        # noqa: S102 - our own generated source
    return namespace["kernel"], consts


@functools.lru_cache(maxsize=None)
def _consts(backend: str, device: str) -> torch.Tensor:
    return torch.tensor(_kernel(backend)[1], dtype=torch.float64, device=device)


def _gpu_table(device: str) -> torch.Tensor:
    return torch.tensor(J.gpu_sqrt_offsets(), dtype=torch.int32, device=device)


def launch(kind: str, keys: torch.Tensor, n: int, backend: str = "cpu", counters: torch.Tensor | None = None,
           lut: torch.Tensor | None = None, generation: int = 0, n_draws: int = 0) -> torch.Tensor:
    """One kernel launch: (B, n) int32 words ("bits") or float32 normals ("normal") for keys (B, 2) int64 words;
    ("lut_at") lut[bits(j) >> 9] for counters j (any shape, int64) under one key (1, 2), in lut's dtype;
    ("normal_of_words") the normals of the words in `counters` (int64 holding uint32 values; keys unused);
    ("member_normal") (n_draws, B, n) normals of fold_in(fold_in(keys[s], generation), p) for draw p and slice s."""
    import triton

    kernel, _ = _kernel(backend)
    device = keys.device
    keys = keys.reshape(-1, 2).to(torch.int64).contiguous()
    dummy = torch.zeros(1, dtype=torch.int32, device=device)
    flat, table, rows = dummy, dummy, keys.shape[0] * max(n_draws, 1)
    if kind in ("lut_at", "normal_of_words"):
        flat = counters.reshape(-1).to(torch.int64).contiguous()
        out = torch.empty(flat.shape, dtype=lut.dtype if kind == "lut_at" else torch.float32, device=device)
    else:
        out = torch.empty(rows, n, dtype=torch.int32 if kind == "bits" else torch.float32, device=device)
    if kind == "lut_at":
        table = lut
    elif kind != "bits" and backend == "gpu":
        table = _gpu_table(str(device))
    if out.numel():
        kernel[(triton.cdiv(out.numel(), BLOCK),)](keys, flat, table, _consts(backend, str(device)), out, out.numel(),
                                                   max(n, 1), keys.shape[0], generation, KIND=KINDS[kind],
                                                   BLOCK=BLOCK)
    if kind in ("lut_at", "normal_of_words"):
        return out.reshape(counters.shape)
    return out.view(n_draws, keys.shape[0], n) if kind == "member_normal" else out
