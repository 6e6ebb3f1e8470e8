"""`python -m parity.gap` (the same as `python -m parity gap`)."""
import sys

from parity.gap.cli import main

sys.exit(main())
