"""Build the C side (egg_int8.c) into a shared library with the system C compiler; `python -m c_int8.build`.

The library is `build/c_int8/libegg_int8-<hash>.so` (git ignores build/), named for the source's hash so a stale
build is never loaded. Compiler: $CC if set (then only that one), else the first of cc, gcc, clang on PATH;
flags -std=c99 -O2 -fwrapv -shared -fPIC (-fwrapv: signed int32 arithmetic wraps, as XLA's does).

Command line: exit 0 when built (or already built), 0 with a "skipped" line when no compiler is found (the C
side is optional: `make setup` must never fail for it), 2 when the compiler fails, with its error.
"""
from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

SOURCE = Path(__file__).with_name("egg_int8.c")
ROOT = Path(__file__).resolve().parent.parent
LIB_DIR = ROOT / "build" / "c_int8"
FLAGS = ("-std=c99", "-O2", "-fwrapv", "-shared", "-fPIC")
LIBS = ("-lm",)
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


def source_hash(source: Path = SOURCE) -> str:
    return hashlib.sha256(source.read_bytes() + " ".join(FLAGS + LIBS).encode()).hexdigest()[:16]


def library_path(source: Path = SOURCE, lib_dir: Path = LIB_DIR) -> Path:
    return Path(lib_dir) / f"libegg_int8-{source_hash(source)}.so"


def build(cc: str | None = None, source: Path = SOURCE, lib_dir: Path = LIB_DIR, force: bool = False) -> Path:
    """Compile source into lib_dir (atomically; older builds removed); the library's path.

    NoCompiler when there is no compiler, BuildError (the compiler's error) when it fails."""
    source, lib_dir = Path(source), Path(lib_dir)
    target = library_path(source, lib_dir)
    if target.exists() and not force:
        return target
    compiler = find_compiler(cc)
    lib_dir.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(suffix=".so", dir=lib_dir)
    os.close(fd)
    command = [compiler, *FLAGS, "-o", tmp, str(source), *LIBS]
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
    for old in lib_dir.glob("libegg_int8-*.so"):
        if old != target:
            old.unlink(missing_ok=True)
    return target


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m c_int8.build", description=__doc__.splitlines()[0])
    parser.add_argument("--cc", help="the C compiler (default: $CC, else cc, gcc or clang on PATH)")
    parser.add_argument("--source", type=Path, default=SOURCE, help=argparse.SUPPRESS)
    parser.add_argument("--lib-dir", type=Path, default=LIB_DIR, help="where the library goes (default build/c_int8)")
    parser.add_argument("--force", action="store_true", help="rebuild even if the library is current")
    args = parser.parse_args(argv)
    try:
        path = build(args.cc, args.source, args.lib_dir, args.force)
    except NoCompiler as exc:
        print(f"C side skipped: {exc}; the tests that need it skip", file=sys.stderr)
        return 0
    except BuildError as exc:
        print(f"error: C side not built: {exc}", file=sys.stderr)
        return 2
    print(f"C side built: {path.relative_to(ROOT) if path.is_relative_to(ROOT) else path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
