"""The GPU section's vocabulary, shared by bench.gpu (which measures and writes the rows) and bench.gpu_report (which
reads them back): the impls it times, the measures it writes, and an aim it judges."""
from __future__ import annotations

from typing import NamedTuple

TORCH, GRAPHED, EAGER, JAX = "torch_impl", "torch_impl_graphed", "torch_impl_eager", "jax_reference"
COMPILED = "torch_impl_compiled"
STEP_TOKENS = "step_tokens_per_s"         # LM / int8: tokens scored and learned from per second
FORWARD_MS = "forward_ms"
STEP_MS = "step_ms"
FIRST_CALL_S = "first_call_s"             # a case's first call: a capture, a compilation, lazy inits
RATIO = "ratio_over_jax"                  # the row's impl's speed over jax_reference's, round by round


class Aim(NamedTuple):
    model: str                            # cartpole, lm, int8
    pop: int                              # the population the aim is judged at (0: the preset's)
    impl: str                             # whose ratio over jax_reference
    target: float                         # the ratio aimed at
    label: str
