"""Build the C side (egg_int8.c) into a shared library with the system C compiler; `python -m c_int8.build`.

The library is `build/c_int8/libegg_int8-<hash>.so` (git ignores build/), named for the source's hash so a stale
build is never loaded. Compiler: $CC if set (then only that one), else the first of cc, gcc, clang on PATH;
flags -std=c99 -O2 -fwrapv -shared -fPIC (-fwrapv: signed int32 arithmetic wraps, as XLA's does).

Command line: exit 0 when built (or already built), 0 with a "skipped" line when no compiler is found (the C
side is optional: `make setup` must never fail for it), 2 when the compiler fails, with its error.
"""
from __future__ import annotations

import sys
from pathlib import Path

import cbuild
from cbuild import BuildError, NoCompiler, find_compiler  # noqa: F401 - the C side's errors, re-exported

SOURCE = Path(__file__).with_name("egg_int8.c")
LIB_DIR = Path(__file__).resolve().parent.parent / "build" / "c_int8"
FLAGS = ("-std=c99", "-O2", "-fwrapv", "-shared", "-fPIC")
LIBS = ("-lm",)


def library_path(source: Path = SOURCE, lib_dir: Path = LIB_DIR) -> Path:
    return cbuild.library_path(source, lib_dir, FLAGS + LIBS)


def build(cc: str | None = None, source: Path = SOURCE, lib_dir: Path = LIB_DIR, force: bool = False) -> Path:
    """Compile source into lib_dir (atomically; older builds removed); the library's path.

    NoCompiler when there is no compiler, BuildError (the compiler's error) when it fails."""
    return cbuild.build(source, lib_dir, FLAGS, LIBS, cc, force)


def main(argv: list[str] | None = None) -> int:
    return cbuild.main(argv, "python -m c_int8.build", __doc__.splitlines()[0], build, LIB_DIR, "C side",
                       "the tests that need it skip", source=SOURCE)


if __name__ == "__main__":
    sys.exit(main())
