"""Compile one C source into a shared library named for its content, with the system C compiler.

What the project's C sides (c_int8, c_rng) share: the compiler search ($CC if set, then only that one; else the
first of cc, gcc, clang on PATH), the library named `lib<stem>-<hash>.so` for the source, any generated inputs and
the flags (so a stale build is never loaded), an atomic write, and older builds removed. No compiler raises
NoCompiler (the C sides are optional), a failing compiler BuildError with its own error output.
"""
from __future__ import annotations

import argparse
import ctypes
import hashlib
import importlib
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Callable, Mapping, NamedTuple, Sequence

CANDIDATES = ("cc", "gcc", "clang")


class NoCompiler(RuntimeError):
    """No C compiler: the C side is skipped (the message says which were looked for)."""


class BuildError(RuntimeError):
    """The compiler ran and failed: the message holds its command and error output."""


def find_compiler(cc: str | None = None) -> str:
    """The compiler's path: cc (or $CC) if given, which must exist; else cc, gcc or clang on PATH."""
    cc = cc if cc is not None else os.environ.get("CC") or None
    if cc:
        found = shutil.which(cc)
        if found is None:
            raise NoCompiler(f"no C compiler: CC={cc} was not found (set CC to a C compiler, or unset it to look "
                             f"for {', '.join(CANDIDATES)} on PATH)")
        return found
    for name in CANDIDATES:
        found = shutil.which(name)
        if found:
            return found
    raise NoCompiler(f"no C compiler: none of {', '.join(CANDIDATES)} is on PATH (install one, e.g. gcc, or set "
                     f"CC)")


def content_hash(source: Path, flags: Sequence[str], extra: bytes = b"") -> str:
    """16 hex digits over the source, any generated input (`extra`) and the command line's flags."""
    return hashlib.sha256(Path(source).read_bytes() + extra + " ".join(flags).encode()).hexdigest()[:16]


def library_path(source: Path, lib_dir: Path, flags: Sequence[str], extra: bytes = b"") -> Path:
    return Path(lib_dir) / f"lib{Path(source).stem}-{content_hash(source, flags, extra)}.so"


def build(source: Path, lib_dir: Path, flags: Sequence[str], libs: Sequence[str] = (), cc: str | None = None,
          force: bool = False, extra: bytes = b"") -> Path:
    """Compile source into lib_dir (atomically; older builds of the same stem removed); the library's path.

    `extra`: the bytes of generated inputs the source includes (part of the name). NoCompiler when there is no
    compiler, BuildError (the compiler's error) when it fails."""
    source, lib_dir = Path(source), Path(lib_dir)
    target = library_path(source, lib_dir, (*flags, *libs), extra)
    if target.exists() and not force:
        return target
    compiler = find_compiler(cc)
    lib_dir.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(suffix=".so", dir=lib_dir)
    os.close(fd)
    command = [compiler, *flags, "-o", tmp, str(source), *libs]
    try:
        done = subprocess.run(command, capture_output=True, text=True)
    except OSError as exc:
        os.unlink(tmp)
        raise BuildError(f"the C compiler {compiler} could not run: {exc}") from exc
    if done.returncode != 0:
        os.unlink(tmp)
        raise BuildError(f"the C compiler failed (exit {done.returncode}): {' '.join(command)}\n"
                         f"{(done.stderr or done.stdout).strip() or '(the compiler printed nothing)'}")
    os.replace(tmp, target)
    for old in lib_dir.glob(f"lib{source.stem}-*.so"):
        if old != target:
            old.unlink(missing_ok=True)
    return target


def main(argv: list[str] | None, prog: str, description: str, build: Callable[..., Path], lib_dir: Path,
         what: str, skipped: str, source: Path | None = None) -> int:
    """A C side's `python -m <prog>`: `build(cc, lib_dir=, force=[, source=])`, then exit 0 built (or current), 0
    with "<what> skipped: ...; <skipped>" without a compiler (the C sides are optional: `make setup` never fails
    for them), 2 with the compiler's error. `source` given: a hidden --source flag (the tests build a broken one)."""
    parser = argparse.ArgumentParser(prog=prog, description=description)
    parser.add_argument("--cc", help="the C compiler (default: $CC, else cc, gcc or clang on PATH)")
    if source is not None:
        parser.add_argument("--source", type=Path, default=source, help=argparse.SUPPRESS)
    parser.add_argument("--lib-dir", type=Path, default=lib_dir,
                        help=f"where the library goes (default {lib_dir.parent.name}/{lib_dir.name})")
    parser.add_argument("--force", action="store_true", help="rebuild even if the library is current")
    args = parser.parse_args(argv)
    try:
        path = build(args.cc, lib_dir=args.lib_dir, force=args.force,
                     **({"source": args.source} if source is not None else {}))
    except NoCompiler as exc:
        print(f"{what} skipped: {exc}; {skipped}", file=sys.stderr)
        return 0
    except BuildError as exc:
        print(f"error: {what} not built: {exc}", file=sys.stderr)
        return 2
    root = Path(__file__).resolve().parent
    print(f"{what} built: {path.relative_to(root) if path.is_relative_to(root) else path}")
    return 0


class Loader(NamedTuple):
    """A C side's `load(cc=None, lib_dir=None)` (the library, built first if missing or stale, cached per folder)
    and `unavailable_reason(cc=None, lib_dir=None)` (None when it loads, else why not: a skip message)."""

    load: Callable[..., ctypes.CDLL]
    unavailable_reason: Callable[..., str | None]


def loader(build_module: str, signatures: Mapping[str, tuple], what: str, unavailable: type[Exception]) -> Loader:
    """The Loader of the library `build_module` (a module with LIB_DIR and build(cc, lib_dir=...)) builds, each
    function's restype and argtypes set from `signatures` (name -> (restype, argtypes)); load raises
    `unavailable("{what} skipped: ...")` without a compiler and `unavailable("{what} not built: ...")` when the
    build fails. The build module is imported on first load, so `python -m <build_module>` runs it fresh."""
    cache: dict[str, ctypes.CDLL] = {}

    def load(cc: str | None = None, lib_dir: Path | None = None) -> ctypes.CDLL:
        build = importlib.import_module(build_module)
        lib_dir = Path(build.LIB_DIR if lib_dir is None else lib_dir)
        if str(lib_dir) not in cache:
            try:
                path = build.build(cc, lib_dir=lib_dir)
            except NoCompiler as exc:
                raise unavailable(f"{what} skipped: {exc}") from exc
            except (BuildError, OSError) as exc:       # OSError: e.g. a build folder that cannot be written
                raise unavailable(f"{what} not built: {exc}") from exc
            lib = ctypes.CDLL(str(path))
            for name, (restype, argtypes) in signatures.items():
                fn = getattr(lib, name)
                fn.restype, fn.argtypes = restype, argtypes
            cache[str(lib_dir)] = lib
        return cache[str(lib_dir)]

    def unavailable_reason(cc: str | None = None, lib_dir: Path | None = None) -> str | None:
        try:
            load(cc, lib_dir)
        except unavailable as exc:
            return str(exc)
        return None

    return Loader(load, unavailable_reason)
