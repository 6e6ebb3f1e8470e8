"""Recorded calls: a side's answers keyed by their inputs, kept as a bundle (`arrays.npz` + `manifest.json`).

The checks talk to the reference through a few objects. Wrapped in a `Recording`, each call's output is stored under
`call_key` (a hash of the method, a scope such as the run's knobs, and the arguments' exact bytes); a `Replay` answers
the same calls from the store, so a check runs without the reference's framework. A call the store does not hold
(its inputs came from the port) goes to a fallback, the reference's math in numpy, or raises `NotRecorded` for the
caller to turn into a skip with the reason. Outputs that are not plain data (a JAX optimizer state) become `Token`s:
the caller hands them back and the Recording maps them to the real objects.
"""
from __future__ import annotations

import dataclasses
import hashlib
import io
import json
import os
import shutil
import tempfile
import zipfile
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, NamedTuple

import numpy as np

from parity.core import repro_script
from parity.core.port import UsageError
from reporting import xla_flags_text

FORMAT_VERSION = 1
ARRAYS, MANIFEST = "arrays.npz", "manifest.json"


class Token(NamedTuple):
    """Stands for an opaque output (e.g. an optimizer state): the n-th one a Recording handed out."""

    n: int


class Raised(NamedTuple):
    """A recorded call that raised: replayed as the same builtin exception type (else RuntimeError)."""

    kind: str
    message: str


class NotRecorded(LookupError):
    """A call the bundle does not hold and no fallback answers: the check that needs it is skipped, with `why`."""

    def __init__(self, method: str, why: str):
        super().__init__(f"{method}: {why}")
        self.method, self.why = method, why


# ---------------------------------------------------------------- keys
def _feed(h, value: Any) -> None:
    """Feed a canonical encoding of `value` to the hash `h`; TypeError for what has no canonical bytes."""
    if value is None:
        h.update(b"N;")
    elif isinstance(value, Token):
        h.update(b"T%d;" % value.n)
    elif isinstance(value, (bool, np.bool_)):
        h.update(b"B1;" if value else b"B0;")
    elif isinstance(value, (int, np.integer)):
        h.update(b"I%d;" % int(value))
    elif isinstance(value, float):
        h.update(b"F" + float(value).hex().encode() + b";")
    elif isinstance(value, str):
        data = value.encode()
        h.update(b"S%d:" % len(data) + data)
    elif isinstance(value, (np.ndarray, np.generic)):
        a = np.ascontiguousarray(value)
        h.update(b"A" + a.dtype.str.encode() + repr(a.shape).encode() + b":")
        h.update(a.tobytes())
    elif isinstance(value, Mapping):
        h.update(b"D%d:" % len(value) + type(value).__name__.encode() + b":")
        for k in sorted(value, key=repr):
            _feed(h, k)
            _feed(h, value[k])
    elif dataclasses.is_dataclass(value) and not isinstance(value, type):
        h.update(b"C" + type(value).__name__.encode() + b":")
        optional = getattr(type(value), "KEY_OPTIONAL", ())       # fields added later: keyed only off their default
        for f in dataclasses.fields(value):
            if f.name in optional and getattr(value, f.name) == f.default:
                continue
            _feed(h, f.name)
            _feed(h, getattr(value, f.name))
    elif isinstance(value, slice):                  # a block of a leaf (parity.tree.blocks.Block holds three)
        h.update(b"R:")
        for part in (value.start, value.stop, value.step):
            _feed(h, part)
    elif isinstance(value, (tuple, list)):
        h.update(b"L%d:" % len(value) + type(value).__name__.encode() + b":")
        for item in value:
            _feed(h, item)
    elif hasattr(value, "__array__") and hasattr(value, "shape"):     # a framework's array (JAX, torch on the CPU)
        _feed(h, np.asarray(value))
    else:
        raise TypeError(f"cannot key a call on a {type(value).__name__}: give arrays, scalars, strings, dicts, "
                        "tuples, slices, dataclasses or Tokens")


def call_key(method: str, args: tuple = (), kwargs: Mapping | None = None, scope: str = "") -> str:
    """sha256 (hex) of (scope, method, args, kwargs) in a canonical encoding: equal exactly when the bytes are."""
    h = hashlib.sha256()
    for part in (scope, method, tuple(args), dict(kwargs or {})):
        _feed(h, part)
    return h.hexdigest()


# ---------------------------------------------------------------- plain data
def _is_data(value: Any) -> bool:
    """Whether `value` is plain data a bundle stores: numpy arrays and scalars, Python scalars, strings, None,
    Tokens, and dicts, lists and tuples of those."""
    if value is None or isinstance(value, (Token, bool, int, float, str, np.ndarray, np.generic)):
        return True
    if isinstance(value, Mapping):
        return type(value) is dict and all(isinstance(k, (str, int)) and _is_data(v) for k, v in value.items())
    if isinstance(value, (tuple, list)):
        return type(value) in (tuple, list) and all(_is_data(v) for v in value)
    return False


def encode(value: Any, arrays: dict[str, np.ndarray]) -> Any:
    """The JSON structure of plain data; its arrays go to `arrays` under fresh names."""
    if value is None:
        return {"t": "none"}
    if isinstance(value, Token):
        return {"t": "token", "n": value.n}
    if isinstance(value, Raised):
        return {"t": "raised", "kind": value.kind, "message": value.message}
    if isinstance(value, (bool, np.bool_)):
        return {"t": "bool", "v": bool(value)}
    if isinstance(value, int):
        return {"t": "int", "v": value}
    if isinstance(value, float):
        return {"t": "float", "v": value.hex()}
    if isinstance(value, str):
        return {"t": "str", "v": value}
    if isinstance(value, (np.ndarray, np.generic)):
        name = f"a{len(arrays)}"
        arrays[name] = np.asarray(value)
        return {"t": "array" if isinstance(value, np.ndarray) else "scalar", "k": name}
    if isinstance(value, dict):
        return {"t": "dict", "items": [[k, encode(v, arrays)] for k, v in value.items()]}
    if isinstance(value, (tuple, list)):
        return {"t": type(value).__name__, "items": [encode(v, arrays) for v in value]}
    raise TypeError(f"cannot store a {type(value).__name__}")


def _recording_kind(node: Mapping) -> Any:
    """The kinds only a recording holds: an opaque state's token, an error the reference raised."""
    if node["t"] == "token":
        return Token(node["n"])
    if node["t"] == "raised":
        return Raised(node["kind"], node["message"])
    raise ValueError(f"unknown node {node['t']!r}")


def decode(node: Mapping, arrays: Mapping[str, np.ndarray]) -> Any:
    """encode's inverse: parity/core/repro_script.py's decoder (copied into every repro folder, so it stays numpy-only)
    with the recording's own kinds."""
    return repro_script.decode(node, arrays, _recording_kind)


def _copy(value: Any) -> Any:
    """Plain data with every array copied: what the store keeps and hands out stays as recorded whatever a caller
    writes into its copy."""
    if isinstance(value, np.ndarray):
        return value.copy()
    if type(value) in (tuple, list):
        return type(value)(_copy(v) for v in value)
    if type(value) is dict:
        return {k: _copy(v) for k, v in value.items()}
    return value


# ---------------------------------------------------------------- the store
@dataclasses.dataclass
class Store:
    """Recorded outputs by call key, and which method each key belongs to (the manifest's call index)."""

    outputs: dict[str, Any] = dataclasses.field(default_factory=dict)
    methods: dict[str, str] = dataclasses.field(default_factory=dict)

    def put(self, method: str, key: str, output: Any) -> None:
        self.outputs.setdefault(key, output)
        self.methods.setdefault(key, method)

    def merge(self, other: "Store") -> None:
        for key, output in other.outputs.items():
            self.put(other.methods[key], key, output)


def _raise(raised: Raised):
    import builtins

    kind = getattr(builtins, raised.kind, None)
    if isinstance(kind, type) and issubclass(kind, Exception):
        raise kind(raised.message)
    raise RuntimeError(f"{raised.kind}: {raised.message}")


class Recording:
    """`target` with each of `methods` recorded into `store` under `scope`; other attributes pass through.

    Outputs that are not plain data come back as Tokens (the real objects kept here, shared by `child`ren), so
    that what the caller sees while recording is what a Replay will give it."""

    def __init__(self, target: Any, methods: Iterable[str], store: Store | None = None, scope: str = "",
                 objects: list | None = None):
        self._target, self._methods, self._scope = target, frozenset(methods), scope
        self.store = store if store is not None else Store()
        self._objects = objects if objects is not None else []

    def child(self, target: Any, scope: str) -> "Recording":
        """Another object recorded into the same store (e.g. the reference with other run knobs), under `scope`."""
        return Recording(target, self._methods, self.store, scope, self._objects)

    def _real(self, value: Any) -> Any:
        if isinstance(value, Token):
            return self._objects[value.n]
        if type(value) in (tuple, list):
            return type(value)(self._real(v) for v in value)
        if type(value) is dict:
            return {k: self._real(v) for k, v in value.items()}
        return value

    def _storable(self, value: Any) -> Any:
        """Plain data as it is (framework arrays as numpy), tuples item by item, anything else a new Token."""
        if hasattr(value, "__array__") and hasattr(value, "shape") and not isinstance(value, np.ndarray):
            value = np.asarray(value)
        if _is_data(value):
            return value
        if type(value) is tuple:
            return tuple(self._storable(v) for v in value)
        self._objects.append(value)
        return Token(len(self._objects) - 1)

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._target, name)
        if name not in self._methods:
            return attr

        def recorded(*args, **kwargs):
            key = call_key(name, args, kwargs, self._scope)
            try:
                out = attr(*self._real(args), **self._real(kwargs))
            except Exception as err:
                self.store.put(name, key, Raised(type(err).__name__, str(err)))
                raise
            out = self._storable(out)
            self.store.put(name, key, _copy(out))
            return out

        return recorded


class Replay:
    """Answers `methods` from `store` under `scope`; a miss goes to `fallback`'s method of the same name, or raises
    NotRecorded. Other attributes come from `attributes`, then from `fallback`."""

    def __init__(self, store: Store, methods: Iterable[str], scope: str = "", fallback: Any = None,
                 attributes: Mapping[str, Any] | None = None):
        self._store, self._methods, self._scope = store, frozenset(methods), scope
        self._fallback, self._attributes = fallback, dict(attributes or {})
        self.misses: list[str] = []            # methods answered by the fallback, in call order

    def __getattr__(self, name: str) -> Any:
        if name in self._attributes:
            return self._attributes[name]
        if name not in self._methods:
            if self._fallback is not None:
                return getattr(self._fallback, name)
            raise AttributeError(name)

        def replayed(*args, **kwargs):
            key = call_key(name, args, kwargs, self._scope)
            if key in self._store.outputs:
                out = self._store.outputs[key]
                if isinstance(out, Raised):
                    _raise(out)
                return _copy(out)
            answer = getattr(self._fallback, name, None) if self._fallback is not None else None
            if answer is None:
                raise NotRecorded(name, "the bundle holds no such call (its inputs differ from every recorded "
                                        "call), and no numpy reference computes it")
            self.misses.append(name)
            return answer(*args, **kwargs)

        return replayed


# ---------------------------------------------------------------- bundles
class Bundle(NamedTuple):
    """A bundle read from disk: its manifest and its calls."""

    folder: Path
    manifest: dict
    store: Store


def content_hash(arrays_bytes: bytes, manifest: Mapping) -> str:
    """sha256 over the arrays file's bytes and the canonical JSON of the whole manifest but its hash (seed, sizes,
    versions and the call index alike): what the manifest's `content_hash` covers."""
    h = hashlib.sha256(arrays_bytes)
    rest = {k: v for k, v in manifest.items() if k != "content_hash"}
    h.update(json.dumps(rest, sort_keys=True, separators=(",", ":")).encode())
    return h.hexdigest()


def write_bundle(folder: Path | str, store: Store, manifest: Mapping[str, Any]) -> Path:
    """Write `store` with `manifest` (plus format version, call index and content hash) to `folder`, atomically:
    a temporary sibling folder renamed into place, so a reader never sees half a bundle."""
    folder = Path(folder)
    arrays: dict[str, np.ndarray] = {}
    calls = [{"method": store.methods[k], "key": k, "out": encode(v, arrays)} for k, v in store.outputs.items()]
    buffer = io.BytesIO()
    np.savez_compressed(buffer, **arrays)
    data = buffer.getvalue()
    full = {**manifest, "format_version": FORMAT_VERSION, "calls": calls,
            "arrays_bytes": len(data)}
    full["content_hash"] = content_hash(data, full)
    folder.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{folder.name}.", dir=folder.parent))
    try:
        (tmp / ARRAYS).write_bytes(data)
        (tmp / MANIFEST).write_text(json.dumps(full, indent=1, sort_keys=True) + "\n", encoding="utf-8")
        os.chmod(tmp, 0o755)
        old = None
        if folder.exists():
            old = Path(tempfile.mkdtemp(prefix=f".{folder.name}.old.", dir=folder.parent))
            os.replace(folder, old / folder.name)
        os.replace(tmp, folder)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return folder


def check_holds(bundle: Bundle, task: str, size: str | None, seed: int | None, example: str,
                record: Callable[[Any, Any], str]) -> None:
    """UsageError (exit 2) unless `bundle` was recorded for `task` and, where given, `size` and `seed`; each message
    says what to do: `example` names the task's committed bundle, record(size, seed) the command that makes one."""
    m, folder = bundle.manifest, bundle.folder
    if m.get("task") != task:
        raise UsageError(f"bundle {folder} holds task {m.get('task')!r}, not {task}: give a {task} bundle (e.g. "
                         f"{example}, made by `{record('quick', 0)}`), or check it with `--task "
                         f"{m.get('task')}`")
    if size is not None and m.get("size") != size:
        raise UsageError(f"bundle {folder} holds size {m.get('size')!r}, not {size!r}: drop --size (the bundle's is "
                         f"used) or record that size with `{record(size, m.get('seed', 0))}`")
    if seed is not None and m.get("seed") != seed:
        raise UsageError(f"bundle {folder} holds seed {m.get('seed')!r}, not {seed}: drop --seed (the bundle's is "
                         f"used) or record that seed with `{record(m.get('size'), seed)}`")


def run_size_and_seed(bundle: Bundle | None, size: str | None, seed: int | None,
                      default_size: str = "quick") -> tuple[str, int]:
    """The run's (size, seed): the bundle's with --against (check_holds has held any given ones to them), else the
    ones given, else the defaults (default_size, seed 0)."""
    if bundle is not None:
        return bundle.manifest["size"], bundle.manifest["seed"]
    return size or default_size, 0 if seed is None else seed


def recording_of(bundle: Bundle) -> str:
    """What the report says of a bundle: its folder, format, content hash, task, size and seed, and where and with
    which versions it was recorded."""
    m = bundle.manifest
    versions = ", ".join(f"{k} {v}" for k, v in m.get("versions", {}).items())
    return (f"bundle {bundle.folder} (format version {m.get('format_version')}, content hash "
            f"{str(m.get('content_hash'))[:16]}..., task {m.get('task')}, size {m.get('size')}, seed {m.get('seed')}; "
            f"recorded by `{m.get('command')}` with {versions}; {m.get('device')}; matmul precision "
            f"{m.get('matmul_precision')}; XLA_FLAGS {_recorded_flags(m)})")


def _recorded_flags(manifest: dict) -> str:
    """A bundle's XLA_FLAGS in a report's words; 'not recorded' for a bundle written before they were."""
    if "xla_flags" not in manifest:
        return "not recorded"
    return xla_flags_text(manifest["xla_flags"])


def read_bundle(folder: Path | str, regenerate: str = "python -m parity record") -> Bundle:
    """The bundle in `folder`, checked whole; UsageError (exit 2) saying what is wrong and what to do for a missing
    folder or file, a truncated or unreadable file, another format version or a failed content hash."""
    folder = Path(folder)
    if not folder.is_dir():
        raise UsageError(f"bundle {folder}: no such folder; give a folder written by `{regenerate}` (it holds "
                         f"{MANIFEST} and {ARRAYS}), e.g. vectors/cartpole-quick")
    for name in (MANIFEST, ARRAYS):
        if not (folder / name).is_file():
            raise UsageError(f"bundle {folder}: {name} is missing; the folder is not a whole bundle. Regenerate it "
                             f"with `{regenerate}`")
    try:
        manifest = json.loads((folder / MANIFEST).read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError) as err:
        raise UsageError(f"bundle {folder}: {MANIFEST} is not valid JSON ({err}); it is truncated or damaged. "
                         f"Regenerate it with `{regenerate}`") from None
    version = manifest.get("format_version") if isinstance(manifest, dict) else None
    if version != FORMAT_VERSION:
        raise UsageError(f"bundle {folder}: format version {version!r}, but this harness reads version "
                         f"{FORMAT_VERSION}; regenerate the bundle with this version's `{regenerate}`"
                         + (f" (it was made by: {manifest.get('command')})" if isinstance(manifest, dict)
                            and manifest.get("command") else ""))
    data = (folder / ARRAYS).read_bytes()
    calls = manifest.get("calls")
    if not isinstance(calls, list) or content_hash(data, manifest) != manifest.get("content_hash"):
        raise UsageError(f"bundle {folder}: the content hash does not match the manifest's "
                         f"({str(manifest.get('content_hash'))[:12]}...): the bundle was changed or damaged after it was "
                         f"written. Regenerate it with `{regenerate}`")
    try:
        with np.load(io.BytesIO(data), allow_pickle=False) as npz:
            arrays = {name: npz[name] for name in npz.files}
    except (ValueError, OSError, zipfile.BadZipFile, EOFError) as err:
        raise UsageError(f"bundle {folder}: {ARRAYS} cannot be read ({err}); it is truncated or damaged. "
                         f"Regenerate it with `{regenerate}`") from None
    store = Store()
    for call in calls:
        store.put(call["method"], call["key"], decode(call["out"], arrays))
    return Bundle(folder, manifest, store)

