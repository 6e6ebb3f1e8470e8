"""What a study folder holds, as typed tables, per-arm samples and learning curves on a common grid."""
from __future__ import annotations

import numpy as np
import pandas as pd

from gap.runs import RunSpec
from gap.store import RUN_COLUMNS, RunStore
from gap.stats import Sample, sample


def run_table(store: RunStore, specs: list[RunSpec] | None = None) -> pd.DataFrame:
    """Committed runs (only those of `specs` when given: a folder may also hold runs of other settings)."""
    rows = store.run_rows()
    if specs is not None:
        keys = {s.key for s in specs}
        rows = [r for r in rows if (r["arm"], int(r["seed"]), r["config"], r["knobs"]) in keys]
    df = pd.DataFrame(rows, columns=list(RUN_COLUMNS))
    if df.empty:
        return df
    df["seed"] = df["seed"].astype(int)
    df["solved"] = df["solved"].map({"True": True, "False": False, True: True, False: False}).astype(bool)
    df["steps_to_solve"] = pd.to_numeric(df["steps_to_solve"], errors="coerce")
    for col in ("epochs", "env_steps"):
        df[col] = df[col].astype(np.int64)
    df["wall_s"] = df["wall_s"].astype(float)
    df["cpu_s"] = pd.to_numeric(df["cpu_s"], errors="coerce")
    # The sample value: steps to solve, or for an unsolved run the steps it reached (a lower bound).
    df["steps"] = np.where(df["solved"], df["steps_to_solve"], df["env_steps"]).astype(float)
    return df


def epoch_table(store: RunStore, run_ids=None) -> pd.DataFrame:
    df = pd.DataFrame(store.epoch_rows())
    if df.empty:
        return df
    if run_ids is not None:
        df = df[df["run_id"].isin(set(run_ids))]
    for col in ("epoch", "env_steps", "seed"):
        df[col] = pd.to_numeric(df[col])
    for col in ("mean_return", "max_return", "sigma", "lr", "wall_s"):
        df[col] = pd.to_numeric(df[col], errors="coerce")
    return df


def samples(runs: pd.DataFrame) -> dict[str, Sample]:
    """arm -> Sample (censored = did not solve), seeds in ascending order."""
    out = {}
    for arm, g in runs.groupby("arm", sort=False):
        g = g.sort_values("seed")
        out[arm] = sample(g["steps"].to_numpy(), ~g["solved"].to_numpy())
    return out


class Curves(dict):
    """arm -> (grid (G,), median (G,), q25 (G,), q75 (G,), n_runs)."""


def learning_curves(epochs: pd.DataFrame, n_grid: int = 200) -> Curves:
    """Median and interquartile band of the population mean return per arm, against env steps.

    Each run is interpolated linearly on one grid from 0 to the largest env-step count of
    any run; before its first epoch a run is at its first value and after its last epoch
    (it solved and stopped) it keeps its last value.
    """
    curves = Curves()
    if epochs.empty:
        return curves
    grid = np.linspace(0.0, float(epochs["env_steps"].max()), n_grid)   # (G,)
    for arm, g in epochs.groupby("arm", sort=False):
        ys = []
        for _, run in g.groupby("run_id"):
            run = run.sort_values("epoch")
            ys.append(np.interp(grid, run["env_steps"].to_numpy(float), run["mean_return"].to_numpy(float)))
        y = np.stack(ys)                                                 # (runs, G)
        q25, med, q75 = np.percentile(y, [25, 50, 75], axis=0)
        curves[arm] = (grid, med, q25, q75, y.shape[0])
    return curves
