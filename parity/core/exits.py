"""The exit contract every `python -m parity` command keeps: 0 pass, 1 mismatch, 2 bad usage or a port that breaks
its protocol, 3 the suite itself crashed (no verdict, and no report written: a CI gate must not read a bug of the
suite as a drift of the port)."""
from __future__ import annotations

import sys
import traceback

EXIT_PASS, EXIT_MISMATCH, EXIT_USAGE, EXIT_INTERNAL = 0, 1, 2, 3


def internal_error(command: str) -> int:
    """Print the traceback of the exception being handled and say that it is the suite's, not the port's; returns
    EXIT_INTERNAL (call it from an `except` block, before any report is written)."""
    traceback.print_exc()
    print(f"{command}: internal error in the suite (exit {EXIT_INTERNAL}); no verdict, no report written. "
          "Please report it with the traceback above.", file=sys.stderr)
    return EXIT_INTERNAL
