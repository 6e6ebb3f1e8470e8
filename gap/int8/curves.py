"""The integer study's learning curves per design point: a CSV of validation bits/byte against epochs (mean, spread
and seeds per point and measured epoch) and a PNG with one panel per point (every seed, their mean, and the
nano-egg corner's mean for reference), so an arm that does not learn, or learns in a way the additive model misses,
shows as itself."""
from __future__ import annotations

import math

import numpy as np
import pandas as pd

from gap.study import mean_curve

SHORT = {"int8_noise": "noise", "vote_threshold": "vote", "evolving": "evolving", "out_shift": "shift",
         "ln_division": "ln", "log2": "log2", "state_reset": "reset"}   # panel titles: the knobs at egg.c's value


def curve_table(cv: dict, order: list[str]) -> pd.DataFrame:
    """One row per (point, measured epoch): epoch (1-based), seeds, mean, sd, min, max of validation bits/byte."""
    rows = []
    for arm in [a for a in order if a in cv] + sorted(set(cv) - set(order)):
        by_epoch: dict[int, list[float]] = {}
        for points in cv[arm].values():
            for e, v in points:
                by_epoch.setdefault(e, []).append(v)
        for e in sorted(by_epoch):
            vals = np.asarray(by_epoch[e], float)
            rows.append({"arm": arm, "epoch": e + 1, "seeds": vals.size, "mean_val_bpb": float(vals.mean()),
                         "sd_val_bpb": float(vals.std(ddof=1)) if vals.size > 1 else float("nan"),
                         "min_val_bpb": float(vals.min()), "max_val_bpb": float(vals.max())})
    return pd.DataFrame(rows, columns=["arm", "epoch", "seeds", "mean_val_bpb", "sd_val_bpb", "min_val_bpb",
                                       "max_val_bpb"])


def panel_title(drifts: dict[str, str], name: str) -> str:
    """`nano-egg`, `egg.c`, or the departures on at this point in short words (`vote, shift, ln`)."""
    if name in ("nano-egg", "egg.c"):
        return f"{name} (corner)"
    return "+ " + ", ".join(SHORT.get(k, k) for k in drifts)


def plot_points(cv: dict, arms: list, path: str, reference: str = "nano-egg") -> None:
    """One panel per design point: each seed's validation curve (thin), their mean (thick), the reference's mean
    (dashed); shared axes so the panels compare at a glance."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    shown = [a for a in arms if a.name in cv]
    if not shown:
        return
    cols = 4
    rows = math.ceil(len(shown) / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(3.1 * cols, 2.3 * rows + 0.6), sharex=True, sharey=True,
                             squeeze=False)
    ref = mean_curve(cv.get(reference, {}))
    for ax, arm in zip(axes.flat, shown):
        for points in cv[arm.name].values():
            pts = sorted(points)
            ax.plot([e + 1 for e, _ in pts], [v for _, v in pts], color="C0", lw=0.6, alpha=0.45)
        xs, ys = mean_curve(cv[arm.name])
        ax.plot(xs, ys, color="C0", lw=2.0)
        if arm.name != reference and len(ref[0]):
            ax.plot(*ref, color="k", lw=1.0, ls="--")
        ax.set_title(f"{panel_title(dict(arm.drifts), arm.name)} ({len(cv[arm.name])} seeds)", fontsize=7.5)
        ax.grid(alpha=0.3)
    for ax in axes.flat[len(shown):]:
        ax.set_visible(False)
    for ax in axes[-1]:
        ax.set_xlabel("epoch", fontsize=8)
    for ax in axes[:, 0]:
        ax.set_ylabel("val bits/byte", fontsize=8)
    fig.suptitle("Integer EGGROLL, every design point: validation bits/byte against epochs (thin: seeds; thick: "
                 f"mean; dashed: the {reference} corner's mean)", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
