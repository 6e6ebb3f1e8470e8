"""Calling a port, whatever its protocol (the CartPole MLP's, parity.mlp.adapter; a tree's, parity.tree.adapter):
the errors a port's call ends in, checking what it returned, the port's own frames of a traceback, and the guard that
turns an output holding NaN or inf into a NonFinite the failing check reports.
"""
from __future__ import annotations

import functools
import importlib
import inspect
import os
import traceback
from pathlib import Path
from typing import Any, Callable, Mapping

import numpy as np


class SplitNoise(dict):
    """A port's forward noise (this dict; also `forward`, a plain copy) and its update noise (`update`)."""

    def __init__(self, forward: dict, update: dict):
        super().__init__(forward)
        self.forward = dict(forward)
        self.update = dict(update)


class UsageError(ValueError):
    """Bad command-line usage or input (exit code 2)."""


class PortError(RuntimeError):
    """The port broke the protocol inside `method`: raised, or returned the wrong shape/dtype/type."""

    def __init__(self, method: str, message: str, original: BaseException | None = None):
        super().__init__(f"port method `{method}`: {message}")
        self.method = method
        self.original = original


class NonFinite(PortError):
    """`method` returned an output of the right form holding NaN or inf: `where` [(path in the output, array)] for each
    array that does; `args`, `kwargs` the call as the wrapper (`source`) was given it. parity.core.nonfinite turns it into
    the failure of the check that made the call; anywhere else it is a PortError (exit 2), as before."""

    def __init__(self, method: str, output: Any, where: list, args: tuple, kwargs: dict, source: Any,
                 port_call: tuple | None = None):
        shown = ", ".join(f"'{'/'.join(map(str, p))}'" if p else "the result" for p, _ in where[:4])
        super().__init__(method, f"returned NaN or inf in {shown}" + (" ..." if len(where) > 4 else ""))
        self.output, self.where, self.args, self.kwargs, self.source = output, where, args, kwargs, source
        self.port_call = port_call      # (method, args, kwargs) as the port itself was called (its inputs, uncopied)


def imported_attr(spec: str, example: str) -> tuple[Any, str]:
    """(the object, its name) that `--port package.module:attr` names, imported; UsageError saying what is wrong
    (no colon: the form, with `example`; the module not importable or raising; no such attribute)."""
    if ":" not in spec:
        raise UsageError(f"--port expects package.module:attr (e.g. {example}), got {spec!r}")
    module_name, attr = spec.split(":", 1)
    try:
        module = importlib.import_module(module_name)
    except ImportError as err:
        raise UsageError(f"--port {spec}: cannot import module {module_name!r} ({err}); is it on PYTHONPATH?") from err
    except Exception as err:          # the port's own module failed while importing
        raise UsageError(f"--port {spec}: importing module {module_name!r} raised {type(err).__name__}: {err}") from err
    if not hasattr(module, attr):
        raise UsageError(f"--port {spec}: module {module_name!r} has no attribute {attr!r}")
    return getattr(module, attr), attr


def nonfinite_arrays(value: Any, path: tuple = ()) -> list[tuple[tuple, np.ndarray]]:
    """[(path, array)] of the float arrays in a validated output (dicts, a SplitNoise's parts, tuples) holding NaN
    or inf; other objects (an optimizer's opaque state) are not looked into."""
    if isinstance(value, SplitNoise):
        return nonfinite_arrays(value.forward, path + ("forward",)) + nonfinite_arrays(value.update, path + ("update",))
    if isinstance(value, Mapping):
        return [found for k, v in value.items() for found in nonfinite_arrays(v, path + (k,))]
    if isinstance(value, (tuple, list)):
        return [found for i, v in enumerate(value) for found in nonfinite_arrays(v, path + (i,))]
    if isinstance(value, np.ndarray) and np.issubdtype(value.dtype, np.floating) and not np.all(np.isfinite(value)):
        return [(path, value)]
    return []


def finite_outputs(*methods: str, parts: Mapping[str, int] | None = None):
    """Class decorator for a checked wrapper: each of `methods` raises NonFinite when its validated output (or item
    `parts[method]` of it: an optimizer step's params, not its opaque state) holds NaN or inf."""
    def decorate(cls):
        for name in methods:
            setattr(cls, name, _finite_method(getattr(cls, name), name, (parts or {}).get(name)))
        return cls
    return decorate


def _finite_method(fn: Callable, name: str, part: int | None) -> Callable:
    @functools.wraps(fn)
    def checked(self, *args, **kwargs):
        output = fn(self, *args, **kwargs)
        where = nonfinite_arrays(output if part is None else output[part], () if part is None else (part,))
        if where:
            raise NonFinite(name, output, where, args, kwargs, self, getattr(self, "last_call", None))
        return output
    return checked


def _positional_arity(fn: Callable) -> int | None:
    """How many positional arguments a bound method takes, or None when it cannot be told (*args, builtins)."""
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return None
    if any(p.kind == p.VAR_POSITIONAL for p in params):
        return None
    return sum(p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) and p.default is p.empty for p in params)


# ----------------------------------------------------------------------------- where a port failed
SUITE_DIR = Path(__file__).resolve().parent.parent      # parity/: every suite's own frames


def _shown(path: str) -> str:
    """A path relative to the working directory when it lies below it."""
    try:
        return os.path.relpath(path) if Path(path).resolve().is_relative_to(Path.cwd()) else path
    except ValueError:
        return path


def port_frames(err: BaseException) -> list[traceback.FrameSummary]:
    """The frames of an exception raised inside a port, the suite's own (parity/) left out."""
    return [f for f in traceback.extract_tb(err.__traceback__)
            if not Path(f.filename).resolve().is_relative_to(SUITE_DIR)]


def defined_at(port: Any, method: str) -> str:
    """'file:line' of a port method's definition, or '' when it cannot be found (a builtin, a lambda in C)."""
    fn = getattr(port, method, None)
    try:
        fn = inspect.unwrap(getattr(fn, "__func__", fn))
        return f"{_shown(inspect.getsourcefile(fn))}:{inspect.getsourcelines(fn)[1]}"
    except (TypeError, OSError):
        return ""


def port_trace(err: "PortError", port: Any) -> tuple[str, str]:
    """(where, traceback text): the port's innermost frame 'file:line in function' and its own frames formatted
    like Python's traceback, for an exception inside the port; for a wrong return value, 'file:line' of the
    method's definition and no traceback."""
    if err.original is None or err.original.__traceback__ is None:
        return defined_at(port, err.method), ""
    frames = port_frames(err.original)
    if not frames:
        return "", ""
    last = frames[-1]
    text = "".join(traceback.format_list([traceback.FrameSummary(_shown(f.filename), f.lineno, f.name, line=f.line)
                                          for f in frames]))
    text += "".join(traceback.format_exception_only(type(err.original), err.original))
    return f"{_shown(last.filename)}:{last.lineno} in {last.name}", text.rstrip()


# ----------------------------------------------------------------------------- validation helpers
def _array(method: str, what: str, value: Any, shape: tuple | None, dtype=np.float32) -> np.ndarray:
    """`value` as a numpy array of exactly `shape` and `dtype`, or a PortError saying what was expected."""
    try:
        arr = np.asarray(value)
    except Exception as err:
        raise PortError(method, f"{what} is a {type(value).__name__}, which numpy cannot read; return numpy arrays "
                                f"(e.g. tensor.detach().cpu().numpy())", err) from err
    if arr.dtype == object:
        raise PortError(method, f"{what} is not a numeric array (got {type(value).__name__})")
    if dtype is not None and arr.dtype != np.dtype(dtype):
        raise PortError(method, f"{what} has dtype {arr.dtype}; expected {np.dtype(dtype).name}")
    if shape is not None and tuple(arr.shape) != tuple(shape):
        raise PortError(method, f"{what} has shape {tuple(arr.shape)}; expected {tuple(shape)}")
    return arr          # NaN and inf are judged by the wrapper's finite_outputs, which knows the call


def has_methods(port: Any, method: str, groups: Mapping[str, tuple[str, ...]]) -> bool:
    """Whether the port has `method` and every method of the optional group it belongs to."""
    group = next((g for g in groups.values() if method in g), (method,))
    return all(callable(getattr(port, m, None)) for m in group)


def call_port(port: Any, method: str, signatures: Mapping[str, str], *args, **kwargs):
    """port.method(*args, **kwargs), with a missing method or an exception inside the port as a PortError naming
    the method (and, when missing, its expected signature from `signatures`)."""
    fn: Callable | None = getattr(port, method, None)
    if not callable(fn):
        raise PortError(method, f"is not implemented; expected {signatures[method]}")
    try:
        return fn(*args, **kwargs)
    except PortError:
        raise
    except Exception as err:
        raise PortError(method, f"raised {type(err).__name__}: {err}", err) from err
