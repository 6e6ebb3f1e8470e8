"""The study's figures (PNG, matplotlib's Agg backend): learning curves, steps per seed, the ladder, the
factorial's effects."""
from __future__ import annotations

import matplotlib

matplotlib.use("Agg")
import matplotlib.ticker  # noqa: E402
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from gap.attribution import Step  # noqa: E402
from gap.results import Curves  # noqa: E402
from gap.stats import Sample  # noqa: E402
from spec.config import SOLVED_RETURN  # noqa: E402


def learning_curves(curves: Curves, arms: list[str], path: str, title: str) -> None:
    """Median (line) and interquartile band (shade) of the population mean return against env steps."""
    fig, ax = plt.subplots(figsize=(8, 5))
    for arm in arms:
        if arm not in curves:
            continue
        grid, med, q25, q75, n = curves[arm]
        wide = not arm.startswith("torch:")   # the reference drawn wide: an identical torch arm stays visible on it
        line, = ax.plot(grid / 1e6, med, label=f"{arm} (n={n})", lw=4.0 if wide else 1.5, alpha=0.5 if wide else 1.0)
        ax.fill_between(grid / 1e6, q25, q75, color=line.get_color(), alpha=0.18, lw=0)
    ax.axhline(SOLVED_RETURN, color="k", ls=":", lw=1, label=f"solved ({SOLVED_RETURN:g})")
    ax.set(xlabel="env steps (millions)", ylabel="population mean return", title=title, ylim=(0, 510))
    ax.legend(fontsize=7, loc="lower right")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def steps_per_seed(samples: dict[str, Sample], arms: list[str], path: str, title: str) -> None:
    """One row per arm: a box of steps to solve and every seed as a dot; hollow = did not solve (a lower bound)."""
    arms = [a for a in arms if a in samples]
    fig, ax = plt.subplots(figsize=(8, 0.45 * len(arms) + 1.6))
    rng = np.random.default_rng(0)   # jitter only
    ax.boxplot([samples[a].steps / 1e6 for a in arms], orientation="horizontal", widths=0.5, showfliers=False,
               medianprops={"color": "k"})
    labelled = False
    for i, arm in enumerate(arms, start=1):
        s = samples[arm]
        y = i + rng.uniform(-0.15, 0.15, s.n)
        ax.scatter(s.steps[~s.censored] / 1e6, y[~s.censored], s=18, color="C0", zorder=3)
        if s.n_censored:
            ax.scatter(s.steps[s.censored] / 1e6, y[s.censored], s=30, facecolors="none", edgecolors="C3",
                       zorder=3, label=None if labelled else "not solved (steps reached)")
            labelled = True
    ax.set_yticks(range(1, len(arms) + 1), arms, fontsize=8)
    ax.invert_yaxis()
    ax.set(xlabel="env steps to solve (millions)", title=title)
    if any(samples[a].n_censored for a in arms):
        ax.legend(fontsize=7)
    ax.grid(axis="x", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def ladder(steps: list[Step], path: str, title: str) -> None:
    """Ratio of mean steps (with the drift / without) and its bootstrap interval, per ladder rung and single drift."""
    views = [("ladder", "cumulative ladder: drift k on vs off"), ("single", "each drift alone, vs torch:jax")]
    rows = {v: [s for s in steps if s.view == v and s.cmp is not None] for v, _ in views}
    height = max(len(r) for r in rows.values()) if any(rows.values()) else 1
    fig, axes = plt.subplots(1, 2, figsize=(11, 0.45 * height + 1.8), sharex=True)
    for ax, (view, label) in zip(axes, views):
        r = rows[view]
        y = np.arange(len(r))
        ratio = np.array([s.cmp.ratio for s in r])
        lo = np.array([s.cmp.ratio_lo for s in r])
        hi = np.array([s.cmp.ratio_hi for s in r])
        bound = np.array([s.cmp.ratio_kind != "estimate" for s in r], bool)
        for mask, face, text in ((~bound, "C0", None), (bound, "none", "a bound (runs that did not solve)")):
            if mask.any():
                ax.errorbar(ratio[mask], y[mask], xerr=[(ratio - lo)[mask], (hi - ratio)[mask]], fmt="o",
                            color="C0", mfc=face, capsize=3, label=text)
        if bound.any():
            ax.legend(fontsize=7)
        ax.axvline(1.0, color="k", lw=1, ls=":")
        ax.set_yticks(y, [s.knob for s in r], fontsize=8)
        ax.invert_yaxis()
        ax.set_xscale("log")
        ax.xaxis.set_major_formatter(matplotlib.ticker.ScalarFormatter())
        ax.xaxis.set_minor_formatter(matplotlib.ticker.ScalarFormatter())
        ax.set(title=label, xlabel="ratio of mean steps to solve (95% bootstrap interval)")
        ax.grid(axis="x", alpha=0.3)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def effects(fit, path: str, title: str) -> None:
    """The factorial's main effects and interaction chains: ratio (on / off) with its 95% interval, log scale."""
    rows = [(e.term, e) for e in fit.effects] + [(e.term.replace(" = ", " =\n"), e) for e in fit.interactions]
    fig, ax = plt.subplots(figsize=(8, 0.42 * len(rows) + 1.6))
    y = np.arange(len(rows))
    ratio = np.array([e.ratio for _, e in rows])
    lo, hi = np.array([e.lo for _, e in rows]), np.array([e.hi for _, e in rows])
    main = np.arange(len(rows)) < len(fit.effects)
    for mask, color, label in ((main, "C0", "main effect"), (~main, "C1", "two-factor alias chain")):
        ax.errorbar(ratio[mask], y[mask], xerr=[(ratio - lo)[mask], (hi - ratio)[mask]], fmt="o", color=color,
                    capsize=3, label=label)
    ax.axvline(1.0, color="k", lw=1, ls=":")
    ax.axvline(fit.predicted, color="C2", lw=1, ls="--", label=f"predicted all on / all off x{fit.predicted:.2f}")
    ax.set_yticks(y, [t for t, _ in rows], fontsize=7)
    ax.invert_yaxis()
    ax.set_xscale("log")
    ax.xaxis.set_major_formatter(matplotlib.ticker.ScalarFormatter())
    ax.xaxis.set_minor_formatter(matplotlib.ticker.ScalarFormatter())
    ax.set(title=title, xlabel="steps to solve, drift on / off (log-normal AFT, 95% interval)")
    ax.legend(fontsize=7)
    ax.grid(axis="x", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
