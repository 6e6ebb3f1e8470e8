"""CUDA graphs for the population forwards (issue 35): each forward captured once per shape, then replayed.

On CUDA a population forward is dozens of small kernels (hundreds for the LM's recurrence and the integer model's
tokens), each launched from Python at several microseconds; replaying a captured graph launches them all at once.
What is captured is the call the eager path makes, on static buffers of the same shapes, strides and dtypes that
the caller refreshes in place before each replay: the same kernels on the same values, so the same bits.

- `switch()` reads env TORCH_IMPL_CUDA_GRAPHS: auto (default: capture on CUDA) or never; `wanted(device)`. On the
  CPU nothing here runs: the trainers call their forwards as before, so the switch is a no-op there.
- `Graphs`: captured calls keyed by the caller's signature, sharing one memory pool. A captured output is valid
  until the next replay of any of them (the pool is shared), so callers read or clone it at once. Backends:
  `CudaBackend` (torch.cuda.CUDAGraph) and `Emulated`, which runs the same logic on any device for the CPU tests:
  a replay calls the function again on the static buffers, refuses one that reads other memory than the capture
  read (an input rebound instead of refreshed in place), and spoils every other captured output first, as the
  shared pool may.
- `GraphedCall`: fn(*args) captured per signature of its arguments (a pytree of tensors and constants), its tensor
  arguments copied into static buffers at every call: the LM's and the integer model's epoch forwards.
- `capture_hazards(fn, *args)`: what in a call could not be captured (a host sync, a copy from the host, a tensor
  made from Python data), found on any machine by running it on the meta device; the CPU tests use it.
"""
from __future__ import annotations

import os
from typing import Any, Callable, NamedTuple

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten, tree_leaves, tree_map, tree_unflatten

__all__ = ["SWITCH", "SWITCH_VALUES", "switch", "wanted", "Graphs", "CudaBackend", "Emulated", "GraphedCall", "graphed",
           "signature",
           "static_like", "capture_hazards", "CaptureError"]

SWITCH = "TORCH_IMPL_CUDA_GRAPHS"            # env: auto (default: the CUDA forwards are captured) | never
SWITCH_VALUES = ("auto", "never")
MAX_GRAPHS = 2048                            # captured shapes kept per cache; past it new shapes run eagerly


def switch() -> str:
    """The env switch's value; a ValueError naming the allowed ones for any other (the CLI checks it before work)."""
    value = os.environ.get(SWITCH, "auto")
    if value not in SWITCH_VALUES:
        raise ValueError(f"{SWITCH}={value!r}; allowed: {', '.join(SWITCH_VALUES)}")
    return value


def wanted(device: str | torch.device) -> bool:
    """True when forwards on `device` are captured: a CUDA device and the switch not `never`."""
    return torch.device(device).type == "cuda" and switch() != "never"


class CaptureError(RuntimeError):
    """A captured call was used in a way a CUDA graph cannot honour (the message says which)."""


# ----------------------------------------------------------------------------- static buffers
def static_like(t: torch.Tensor) -> torch.Tensor:
    """An uninitialised tensor with t's shape, strides, storage offset, dtype and device (so a kernel chosen by
    layout sees the same layout); a contiguous one where t's elements overlap (an expanded view)."""
    if any(st == 0 and n > 1 for n, st in zip(t.shape, t.stride())) or t.numel() == 0:
        return torch.empty(t.shape, dtype=t.dtype, device=t.device)
    span = t.storage_offset() + 1 + sum((n - 1) * st for n, st in zip(t.shape, t.stride()))
    return torch.empty(span, dtype=t.dtype, device=t.device).as_strided(t.shape, t.stride(), t.storage_offset())


def signature(leaf) -> tuple:
    if isinstance(leaf, torch.Tensor):
        return ("tensor", tuple(leaf.shape), tuple(leaf.stride()), leaf.storage_offset(), leaf.dtype, leaf.device)
    return ("value", type(leaf).__name__, leaf)


# ----------------------------------------------------------------------------- backends
class Captured(NamedTuple):
    replay: Callable[[], None]
    output: Any                      # the static output (a pytree of tensors), rewritten by every replay


class CudaBackend:
    """torch.cuda.CUDAGraph, all graphs in one memory pool, warmed and captured on one side stream."""

    def __init__(self, device: str | torch.device):
        self.device = torch.device(device)
        self.pool = torch.cuda.graph_pool_handle()
        self.stream = torch.cuda.Stream(self.device)

    def capture(self, fn: Callable[[], Any]) -> tuple[Captured, Any]:
        """(the captured call, the output of the eager warm-up call, which the first call returns)."""
        main = torch.cuda.current_stream(self.device)
        self.stream.wait_stream(main)
        with torch.cuda.stream(self.stream):
            first = fn()                                    # lazy inits, cuBLAS handles, kernel loading
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.pool, stream=self.stream):
            out = fn()
        main.wait_stream(self.stream)
        return Captured(graph.replay, out), first


def _tensors(*groups):
    """The tensors among ops' arguments or results (one level of lists and tuples: what aten ops take and give)."""
    for group in groups:
        for x in group.values() if isinstance(group, dict) else group:
            if isinstance(x, torch.Tensor):
                yield x
            elif isinstance(x, (list, tuple)):
                yield from (y for y in x if isinstance(y, torch.Tensor))


class _Reads(TorchDispatchMode):
    """Which storages a call reads that it did not make itself (its inputs)."""

    def __init__(self):
        super().__init__()
        self.made: set[int] = set()
        self.read: set[int] = set()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        for t in _tensors(args, kwargs):
            if t.numel() and t.untyped_storage().data_ptr() not in self.made:
                self.read.add(t.untyped_storage().data_ptr())
        out = func(*args, **kwargs)
        for t in _tensors((out,)):
            if t.numel():
                self.made.add(t.untyped_storage().data_ptr())
        return out


def _reads(fn: Callable[[], Any]) -> tuple[Any, frozenset[int]]:
    with _Reads() as mode:
        out = fn()
    return out, frozenset(mode.read)


def _spoil(t: torch.Tensor) -> None:
    t.fill_(float("nan") if t.dtype.is_floating_point else -77)


class Emulated:
    """A CUDA graph's contract on any device, for tests: see the module docstring."""

    def __init__(self):
        self.outputs: list[Any] = []
        self.captures = 0
        self.replays = 0

    def capture(self, fn: Callable[[], Any]) -> tuple[Captured, Any]:
        first = fn()
        out, read = _reads(fn)
        out = tree_map(lambda t: t.clone() if isinstance(t, torch.Tensor) else t, out)
        self.outputs.append(out)
        self.captures += 1

        def replay() -> None:
            for other in self.outputs:
                if other is not out:
                    for t in tree_leaves(other):
                        if isinstance(t, torch.Tensor):
                            _spoil(t)
            fresh, now = _reads(fn)
            if now != read:
                raise CaptureError("the replay reads other memory than the capture read: an input was rebound "
                                   "instead of refreshed in place, which a CUDA graph would never see")
            for dst, src in zip(tree_leaves(out), tree_leaves(fresh)):
                dst.copy_(src)
            self.replays += 1

        return Captured(replay, out), first


# ----------------------------------------------------------------------------- caches
class Graphs:
    """Captured calls by key (a shape signature the caller chooses), at most `max_graphs` of them; a key past the
    limit runs its function eagerly (the same result)."""

    def __init__(self, backend, max_graphs: int = MAX_GRAPHS):
        self.backend, self.max_graphs = backend, max_graphs
        self.calls: dict[Any, Captured] = {}

    def run(self, key, fn: Callable[[], Any]) -> Any:
        """fn() through the graph captured for `key` (captured now on first use: fn's eager output is returned)."""
        call = self.calls.get(key)
        if call is not None:
            call.replay()
            return call.output
        if len(self.calls) >= self.max_graphs:
            return fn()
        self.calls[key], first = self.backend.capture(fn)
        return first


class GraphedCall:
    """fn(*args) captured once per signature of args (shapes, strides, dtypes and every non-tensor value) and replayed
    with the arguments' tensors copied into static buffers; returns a copy of the output (its own memory)."""

    def __init__(self, fn: Callable, backend, max_graphs: int = 16):
        self.fn = fn
        self.graphs = Graphs(backend, max_graphs)
        self.statics: dict[Any, list] = {}

    def __call__(self, *args, **kwargs):
        leaves, spec = tree_flatten((args, kwargs))
        key = (spec, tuple(signature(leaf) for leaf in leaves))
        static = self.statics.get(key)
        if static is None:
            static = [static_like(x).copy_(x) if isinstance(x, torch.Tensor) else x for x in leaves]
            self.statics[key] = static
        else:
            for dst, src in zip(static, leaves):
                if isinstance(src, torch.Tensor):
                    dst.copy_(src)

        def call():
            a, kw = tree_unflatten(static, spec)
            return self.fn(*a, **kw)

        out = self.graphs.run(key, call)
        return tree_map(lambda t: t.clone() if isinstance(t, torch.Tensor) else t, out)


def graphed(fn: Callable, device: str | torch.device, backend=None) -> Callable:
    """fn as a GraphedCall on CUDA (unless the switch says never), else fn itself: the CPU path is untouched.
    `backend` (tests): capture on any device."""
    if backend is not None:
        return GraphedCall(fn, backend)
    return GraphedCall(fn, CudaBackend(device)) if wanted(device) else fn


# ----------------------------------------------------------------------------- what a capture cannot hold
_HOST_OPS = ("_local_scalar_dense", "is_nonzero", "item", "equal", "nonzero", "masked_select", "unique")


class _Hazards(TorchDispatchMode):
    def __init__(self, found: list[str]):
        super().__init__()
        self.found = found

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = func.__name__.split(".")[0]
        cpu_in = any(t.device.type == "cpu" for t in _tensors(args, kwargs))
        if name in _HOST_OPS:
            self.found.append(f"{func}: waits for the device (a value read on the host)")
        out = func(*args, **kwargs)
        cpu_out = any(t.device.type == "cpu" for t in _tensors((out,)))
        if cpu_in or cpu_out:
            self.found.append(f"{func}: moves data between the host and the device (or makes a host tensor)")
        return out


class _FromPython(TorchFunctionMode):
    def __init__(self, found: list[str]):
        super().__init__()
        self.found = found

    def __torch_function__(self, func, types, args=(), kwargs=None):
        name = getattr(func, "__name__", "")
        if name == "tensor" or (name in ("as_tensor", "from_numpy") and args and not isinstance(args[0], torch.Tensor)):
            self.found.append(f"torch.{name}: a tensor made from Python data (a copy from the host)")
        return func(*args, **(kwargs or {}))


def capture_hazards(fn: Callable, *args) -> list[str]:
    """What in fn(*args) a CUDA graph could not capture, the call run on the meta device (tensor arguments moved
    there) after one unchecked warm-up call, as a capture follows one: host syncs, host tensors or copies, tensors
    made from Python data; an error the call raises is listed too (a meta tensor has no values, so `.item()`
    raises). An empty list: nothing found."""
    found: list[str] = []
    meta = tree_map(lambda t: t.to("meta") if isinstance(t, torch.Tensor) else t, args)
    try:
        fn(*meta)
        with _FromPython(found), _Hazards(found):
            fn(*meta)
    except (RuntimeError, NotImplementedError) as err:
        found.append(f"raised {type(err).__name__}: {(str(err).splitlines() or [''])[0][:200]}")
    return list(dict.fromkeys(found))
