"""The generator's backends as one table, with one rule that picks one per draw, one switch, one status and one
first-use self-check.

The table, in the order the rule tries it (every backend gives the formula's bits):
  c        CPU keys, the project's C generator loaded (native.py over c_rng): bits, normals, fold_in's hash
  triton   CUDA keys, Triton installed (triton_kernel.py): bits, normals, the ES's member normals, one launch each
  table    normals only, any device: all 2^23 normals of a backend looked up by bits >> 9 (eager.py), for draws of
           TABLE_MIN_DRAWS or more, or any once that table is built, or when the caller asks (table=True)
  formula  everything, any device: eager.py's torch, the definition the others are checked against
The rule: the first backend that does the kind on the keys' device, can run in this process, takes the request and
passed its self-check; the formula when none does. The switch, env TORCH_IMPL_RNG: "auto" (the rule, the default) or
one backend's name (only that one, and the formula where it declines). The self-check (c and triton, which run code of
their own): before a backend's first draw of a kind (per normal backend and device type), sample draws from 16 keys
at two sizes and, for normals, the mantissas at both ends, against the formula bit for bit; a difference warns once
and leaves that backend out for that kind. `status()` says what each backend can do here and which one drew last.
"""
from __future__ import annotations

import math
import os
import threading
import warnings
from typing import Callable, NamedTuple

import torch

from torch_impl.random import eager as E
from torch_impl.random import native, triton_kernel

__all__ = ["SWITCH", "SWITCH_VALUES", "TABLE", "TABLE_MIN_DRAWS", "Backend", "Status", "switch", "choose", "status"]

SWITCH = "TORCH_IMPL_RNG"
NAMES = ("c", "triton", "table", "formula")
SWITCH_VALUES = ("auto",) + NAMES
TABLE_MIN_DRAWS = 1 << 19            # from this many normals in one call on, building the 32 MB table pays off
_SAMPLE_KEYS, _SAMPLE_SIZES, _EDGE = 16, (4099, 2), 256   # the self-check: keys, draws per key, mantissas per end


class Backend(NamedTuple):
    """One row of the table: where it runs, what it draws, and how."""

    name: str
    device: str | None                           # the device type of the keys it takes; None: any
    kinds: tuple[str, ...]                       # of "bits", "normal", "member_normal", "hash"
    unavailable: Callable[[], str | None]        # None when it can run in this process, else why not
    takes: Callable[[int, int, bool | None, str], bool]   # (values per key, draws, table, normal backend) -> yes?
    draw: Callable[..., torch.Tensor]            # (kind, keys (B, 2), n, normal backend, **extra) -> (B, n)
    of_mantissas: Callable | None                # (consecutive mantissas, normal backend) -> normals, or None
    hash_pairs: Callable | None                  # fold_in's hash, eager._hash_pairs's signature; None: the formula's
    checked: bool                                # checks itself against the formula before its first draw of a kind


def switch() -> str:
    """The env switch's value; a ValueError naming the allowed ones for any other (the CLIs check it before work)."""
    value = os.environ.get(SWITCH, "auto")
    if value not in SWITCH_VALUES:
        raise ValueError(f"{SWITCH}={value!r}; allowed: {', '.join(SWITCH_VALUES)}")
    return value


# ----------------------------------------------------------------------------- the four backends' draws
def _c_draw(kind: str, keys: torch.Tensor, n: int, backend: str) -> torch.Tensor:
    return native.bits(keys, n) if kind == "bits" else native.normal(keys, n, backend)


def _triton_draw(kind: str, keys: torch.Tensor, n: int, backend: str, generation: int = 0,
                 n_draws: int = 0) -> torch.Tensor:
    out = triton_kernel.launch(kind, keys, n, backend, generation=generation, n_draws=n_draws)
    return (out.to(torch.int64) & 0xFFFFFFFF) if kind == "bits" else out


def _triton_takes(n: int, draws: int, table: bool | None, backend: str) -> bool:
    return 1 <= n < (1 << 31)


def _triton_of_mantissas(m: torch.Tensor, backend: str) -> torch.Tensor:
    no_key = torch.zeros(1, 2, dtype=torch.int64, device=m.device)
    return triton_kernel.launch("normal_of_words", no_key, 0, backend, counters=m.to(torch.int64) << 9)


def _table_takes(n: int, draws: int, table: bool | None, backend: str) -> bool:
    if table is not None:
        return table or switch() == "table"
    return draws >= TABLE_MIN_DRAWS or backend in E._CPU_TABLES or switch() == "table"


def _formula_draw(kind: str, keys: torch.Tensor, n: int, backend: str, generation: int = 0,
                  n_draws: int = 0, use_table: bool = False) -> torch.Tensor:
    """The definition's (B, n) draws; member_normal: (n_draws, B, n) of fold_in(fold_in(keys[s], generation), p)."""
    if kind == "bits":
        return E._u32_to_int64(E._draw(keys, (n,), torch.int32, E._xor_into))
    if kind == "member_normal":
        folded = E.fold_in(E.fold_in(keys, generation).unsqueeze(0), torch.arange(n_draws, device=keys.device)[:, None])
        return E._normal(folded, (n,), use_table, backend)
    return E._normal(keys, (n,), use_table, backend)


def _table_draw(kind: str, keys: torch.Tensor, n: int, backend: str) -> torch.Tensor:
    return _formula_draw(kind, keys, n, backend, use_table=True)


def _always(*_) -> None:
    return None


TABLE = (
    Backend("c", "cpu", ("bits", "normal", "hash"), native.unavailable_reason, lambda *_: True, _c_draw,
            native.normal_of_mantissas, native.hash_pairs, True),
    Backend("triton", "cuda", ("bits", "normal", "member_normal"), triton_kernel.unavailable_reason, _triton_takes,
            _triton_draw, _triton_of_mantissas, None, True),
    Backend("table", None, ("normal",), _always, _table_takes, _table_draw, None, None, False),
    Backend("formula", None, ("bits", "normal", "member_normal", "hash"), _always, lambda *_: True, _formula_draw,
            None, E._hash_pairs, False),
)
_BY_NAME = {b.name: b for b in TABLE}


# ----------------------------------------------------------------------------- the self-check
def _differs(got: torch.Tensor, want: torch.Tensor) -> int:
    """How many of got's values differ from want's in their bits."""
    return int((got.reshape(-1).view(torch.int32) != want.reshape(-1).view(torch.int32)).sum()) \
        if got.dtype == torch.float32 else int((got.reshape(-1) != want.reshape(-1)).sum())


def _self_check(b: Backend, kind: str, backend: str, device: torch.device) -> str | None:
    """None when backend b's `kind` draws equal the formula's on a sample, bit for bit, else what differs: draws from
    _SAMPLE_KEYS fresh keys at _SAMPLE_SIZES values each (the hash, both of erf_inv's branches, a kernel's partial
    block), for normals also the _EDGE lowest and highest mantissas (the far tails), for the hash random words."""
    keys = E.fold_in(E.key(0, device=device), torch.arange(_SAMPLE_KEYS, device=device))
    if kind == "hash":
        gen = torch.Generator().manual_seed(0)
        words = [torch.randint(-2 ** 31, 2 ** 31, (_EDGE,), dtype=torch.int32, generator=gen).to(device)
                 for _ in range(4)]
        if not torch.equal(b.hash_pairs(*words), E._hash_pairs(*words)):
            return "threefry of sampled counter pairs (fold_in's hash) differs from the eager formula"
        return None
    extra = {"generation": 7, "n_draws": 5} if kind == "member_normal" else {}
    for n in _SAMPLE_SIZES:
        got, want = b.draw(kind, keys, n, backend, **extra), _formula_draw(kind, keys, n, backend, **extra)
        differ = _differs(got, want)
        if differ:
            return f"{differ} of {want.numel()} sampled {backend} {kind} draws differ from the eager formula"
    if kind == "normal" and b.of_mantissas is not None:
        for start in (0, E._N_MANTISSAS - _EDGE):
            m = torch.arange(start, start + _EDGE, device=device)
            if _differs(b.of_mantissas(m, backend), E.normal_from_mantissa(m, backend)):
                return f"the {backend} normals of mantissas {start}..{start + _EDGE - 1} differ from the eager formula"
    return None


_lock = threading.Lock()
_checks: dict[str, str | None] = {}      # "backend kind/normal backend/device type" -> None (passed) or what differed


def _passed(b: Backend, kind: str, backend: str, device: torch.device) -> bool:
    """Whether b passed its self-check for this kind (run on first use; a failure, or an error such as a compile
    failure, warns once and leaves b out for it)."""
    tag = f"{b.name} {kind}/{backend}/{device.type}"
    if tag not in _checks:
        with _lock:
            if tag not in _checks:
                try:
                    _checks[tag] = _self_check(b, kind, backend, device)
                except Exception as err:  # noqa: BLE001 - any failure to run means: the next backend draws
                    _checks[tag] = f"{type(err).__name__}: {(str(err).strip().splitlines() or [''])[0][:200]}"
                if _checks[tag] is not None:
                    warnings.warn(f"torch_impl.random: the {b.name} backend is not used for {kind}/{backend}/"
                                  f"{device.type}: {_checks[tag]}", RuntimeWarning, stacklevel=5)
    return _checks[tag] is None


# ----------------------------------------------------------------------------- the rule
_drew: dict[str, tuple[str, tuple[tuple[str, str], ...]]] = {}   # "kind/device type" -> (backend, skipped: why)


def _declines(b: Backend, named: str, kind: str, device: torch.device, n: int, draws: int, table: bool | None,
              backend: str) -> str | None:
    """None when backend b takes this request, else why not (in the order the rule asks)."""
    if named not in ("auto", b.name) and b.name != "formula":
        return f"{SWITCH}={named}"
    if kind not in b.kinds:
        return f"draws no {kind}"
    if b.device is not None and device.type != b.device:
        return f"takes {b.device} keys only"
    why = b.unavailable()
    if why is not None:
        return why
    if not b.takes(n, draws, table, backend):
        return "declines this size" if b.name != "table" else f"under {TABLE_MIN_DRAWS} draws, table not built"
    if b.checked and not _passed(b, kind, backend, device):
        return f"failed its self-check ({_checks[f'{b.name} {kind}/{backend}/{device.type}']})"
    return None


def choose(kind: str, device: torch.device, n: int = 1, n_keys: int = 1, table: bool | None = None,
           backend: str = "cpu") -> Backend:
    """The backend that draws this request: the first of TABLE that takes it (module doc), the formula else."""
    named = switch()
    draws = n * n_keys
    skipped = []
    for b in TABLE:
        why = _declines(b, named, kind, device, n, draws, table, backend)
        if why is None:
            _drew[f"{kind}/{device.type}"] = (b.name, tuple(skipped))
            return b
        skipped.append((b.name, why))
    raise AssertionError("the formula takes every request")          # unreachable: it declines nothing


class Status(NamedTuple):
    """What the generator does in this process: the switch, each backend's availability, the self-checks run and
    which backend drew each kind last, with why the ones before it did not."""

    switch: str
    backends: dict[str, str | None]              # name -> None (can run here) or why not
    checks: dict[str, str | None]                # "backend kind/normal backend/device type" -> None (passed) or why not
    drew: dict[str, tuple[str, tuple[tuple[str, str], ...]]]   # "kind/device type" -> (backend, ((skipped, why), ...))

    def __str__(self) -> str:
        can = ", ".join(f"{name}" if why is None else f"{name} ({why})" for name, why in self.backends.items())
        lines = [f"rng backends ({SWITCH}={self.switch}): {can}"]
        for what, (name, skipped) in sorted(self.drew.items()):
            lines.append(f"  {what}: {name}" + "".join(f"; not {s}: {why}" for s, why in skipped))
        lines += [f"  self-check {tag}: {'passed' if why is None else why}" for tag, why in sorted(self.checks.items())]
        return "\n".join(lines)


def status() -> Status:
    """This process's Status (loads the C generator on first call, to say whether it is there)."""
    value = os.environ.get(SWITCH, "auto")
    return Status(value, {b.name: b.unavailable() for b in TABLE}, dict(_checks), dict(_drew))


def draw(kind: str, keys: torch.Tensor, shape: tuple[int, ...], table: bool | None = None,
         backend: str = "cpu") -> torch.Tensor:
    """(*batch, *shape) draws of `kind` ("bits" or "normal") through the backend the rule picks; keys already
    checked, shape a tuple."""
    batch = tuple(keys.shape[:-1])
    n = math.prod(shape)
    b = choose(kind, keys.device, n, math.prod(batch), table, backend)
    return b.draw(kind, keys.reshape(-1, 2), n, backend).reshape(batch + shape)


def hash_pairs(device: torch.device) -> Callable:
    """fold_in's hash for keys on `device`: the C generator's on the CPU where it runs, else the formula's."""
    return choose("hash", device).hash_pairs
