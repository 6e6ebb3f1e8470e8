"""Build the C side (egg_int8.c) into a shared library with the system C compiler; `python -m c_int8.build`.

The library is `build/c_int8/libegg_int8-<hash>.so` (git ignores build/), named for the source's hash so a stale
build is never loaded. Compiler: $CC if set (then only that one), else the first of cc, gcc, clang on PATH;
flags -std=c99 -O2 -fwrapv -shared -fPIC (-fwrapv: signed int32 arithmetic wraps, as XLA's does).

Command line: exit 0 when built (or already built), 0 with a "skipped" line when no compiler is found (the C
side is optional: `make setup` must never fail for it), 2 when the compiler fails, with its error.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import cbuild
from cbuild import BuildError, NoCompiler, find_compiler  # noqa: F401 - the C side's errors, re-exported

SOURCE = Path(__file__).with_name("egg_int8.c")
ROOT = Path(__file__).resolve().parent.parent
LIB_DIR = ROOT / "build" / "c_int8"
FLAGS = ("-std=c99", "-O2", "-fwrapv", "-shared", "-fPIC")
LIBS = ("-lm",)


def library_path(source: Path = SOURCE, lib_dir: Path = LIB_DIR) -> Path:
    return cbuild.library_path(source, lib_dir, FLAGS + LIBS)


def build(cc: str | None = None, source: Path = SOURCE, lib_dir: Path = LIB_DIR, force: bool = False) -> Path:
    """Compile source into lib_dir (atomically; older builds removed); the library's path.

    NoCompiler when there is no compiler, BuildError (the compiler's error) when it fails."""
    return cbuild.build(source, lib_dir, FLAGS, LIBS, cc, force)


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
