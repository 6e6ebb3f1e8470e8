"""Compile one C source into a shared library named for its content, with the system C compiler.

What the project's C sides (c_int8, c_rng) share: the compiler search ($CC if set, then only that one; else the
first of cc, gcc, clang on PATH), the library named `lib<stem>-<hash>.so` for the source, any generated inputs and
the flags (so a stale build is never loaded), an atomic write, and older builds removed. No compiler raises
NoCompiler (the C sides are optional), a failing compiler BuildError with its own error output.
"""
from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Sequence

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
