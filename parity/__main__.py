"""`python -m parity {check,gap,bench} ...`: one entry point, one subcommand per tool.

`check` is the parity suite (parity.cli); `gap` and `bench` are imported only when asked for.
"""
from __future__ import annotations

import importlib
import sys

COMMANDS = {
    "check": ("parity.cli", "the parity suite: same math, same noise (exit 0 parity, 1 mismatch, 2 bad usage)"),
    "gap": ("parity.gap.cli", "learning-curve study and gap attribution"),
    "bench": ("parity.bench.cli", "throughput benchmark"),
}


def usage() -> str:
    lines = ["usage: python -m parity {check,gap,bench} [options]", ""]
    lines += [f"  {name:<6} {what}" for name, (_, what) in COMMANDS.items()]
    lines += ["", "`python -m parity check --help` lists the options of a subcommand."]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(usage(), file=sys.stdout if argv else sys.stderr)
        return 0 if argv else 2
    name, rest = argv[0], argv[1:]
    if name not in COMMANDS:
        print(f"python -m parity: unknown command {name!r}\n\n{usage()}", file=sys.stderr)
        return 2
    module = importlib.import_module(COMMANDS[name][0])
    return int(module.main(rest) or 0)


if __name__ == "__main__":
    sys.exit(main())
