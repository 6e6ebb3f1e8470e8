"""The two int8 sizes every integer test file shares (no assertions here).

The JAX reference compiles one program per configuration's shapes (jax_reference.int8: _population_scores,
_member_trace, _tree_votes, _update, ...); tests at the same two sizes as `python -m parity int8 --size
selftest|quick` reuse those programs within a test process, and across processes through JAX's persistent
compilation cache (tests/conftest.py), where each file used to compile its own.
"""
from __future__ import annotations

from spec.int8 import INT8_PRESETS

SELFTEST = INT8_PRESETS["selftest"]          # d 4, 1 layer, pop 8, T 8
QUICK = INT8_PRESETS["quick"]                # d 16, 2 layers, pop 32, T 16: parity int8's default size
INT8_CONFIGS = [SELFTEST, QUICK]
INT8_IDS = ["d4", "d16"]

# Command lines both trainers' `python -m {jax_reference,torch_impl}` refuse with a usage error (exit 2, "error:")
# before any work: a bad size, pop, sigma shift, a flag of another task, a missing corpus.
BAD_TRAINER_ARGV = [["--task", "int8", "--hidden", "8"], ["--task", "int8", "--pop", "7"],
                    ["--task", "int8", "--sigma-shift", "40"], ["--task", "int8", "--lr", "0.1"],
                    ["--task", "int8", "--corpus", "/no/such/file"], ["--task", "lm", "--alpha", "2"]]
