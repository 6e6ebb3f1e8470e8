"""The published CartPole-v1 steps to solve (JAX EGGROLL vs torch EGGROLL, 10 seeds each, paper preset).

A copy of the published per-seed steps to solve (the project's shared data file), kept in the package so
the report can put the study beside it wherever the project is installed.
"""
from __future__ import annotations

import io

import pandas as pd

from gap.stats import Sample, sample

JAX_METHOD, TORCH_METHOD = "jax_eggroll", "torch_eggroll"
SOURCE = "a HyperscaleES fork's CartPole-v1 benchmark: pop 2048, rank 4, 3x256, 10 seeds per method"

CSV = """\
method,seed,steps_to_solve,final_return,wall_time_s
jax_eggroll,42,15505292,500.0,3294.7
jax_eggroll,142,15524784,500.0,3434.9
jax_eggroll,242,14493991,500.0,3403.6
jax_eggroll,342,16414429,500.0,3422.5
jax_eggroll,442,16105787,500.0,3421.1
jax_eggroll,542,13993906,500.0,3421.3
jax_eggroll,642,15451408,500.0,3447.2
jax_eggroll,742,15852392,500.0,3435.7
jax_eggroll,842,14860914,500.0,3437.1
jax_eggroll,942,16749766,500.0,3425.2
torch_eggroll,42,16064186,500.0,3179.1
torch_eggroll,142,14470236,500.0,3180.5
torch_eggroll,242,15283908,500.0,3208.9
torch_eggroll,342,21707930,500.0,3203.5
torch_eggroll,442,18549495,500.0,3218.4
torch_eggroll,542,16881904,499.9,3248.6
torch_eggroll,642,18295406,500.0,3255.4
torch_eggroll,742,17966088,499.9,3205.7
torch_eggroll,842,15494854,499.2,3207.2
torch_eggroll,942,17086035,500.0,3224.0
"""


def table() -> pd.DataFrame:
    """The published rows: method, seed, steps_to_solve, final_return, wall_time_s."""
    return pd.read_csv(io.StringIO(CSV))


def samples() -> tuple[Sample, Sample]:
    """(jax, torch) steps to solve; every published run solved, so nothing is censored."""
    t = table()
    pick = lambda m: sample(t.loc[t["method"] == m, "steps_to_solve"].to_numpy())  # noqa: E731
    return pick(JAX_METHOD), pick(TORCH_METHOD)
