"""Dense noise (ports with `dense_noise`): each member's E must be a rank-r product distributed as EGGROLL's A B^T.

Used by the noise check. Rank (exact, deterministic): the singular values of each independent member's E above
parity.core.tolerances.rank_threshold (the most float32 rounding can give a rank-r product); at most r of them.
Scale and distribution (statistical, exact), on independent entries (the diagonal of each E, see
parity.mlp.noiseform.independent_entries): per weight and pooled, the Kolmogorov-Smirnov distance of E / sigma
(sigma known) to EGGROLL's entry distribution sqrt(chi2_r / r) N(0,1) (variance 1, kurtosis 3 + 6/r), against
its exact critical value. Variance and kurtosis are reported and name the cause (a wrong scale, or another
distribution), not tested: their normal approximations under-cover at the suite's per-test levels (the mean
square about twice at 8k entries, the sample kurtosis tenfold at 57k; simulated at r=4).
"""
from __future__ import annotations

from typing import NamedTuple

import numpy as np

from parity.core import diagnose
from parity.core.diagnose import distribution_cause, is_rescaled, kurtosis, scale_cause
from parity.mlp.noiseform import perturbation
from parity.core.tolerances import entry_ks, entry_moment, ks_critical, rank_threshold
from parity.core.verdict import Recorder, fmt

DENSE_FLOATS = 1 << 24      # float32 entries of E one draw of a dense port's noise may hold (64 MB)
DENSE_MEMBERS = 8192        # members drawn at most (enough independent entries for the tests' limits)


def population(shapes) -> int:
    """Members the noise check draws from a dense port: as many as DENSE_FLOATS allows, even, at least 64."""
    per_member = sum(int(np.prod(s)) for n, s in shapes.items() if n.endswith(".weight"))
    return max(64, min(DENSE_MEMBERS, DENSE_FLOATS // per_member)) // 2 * 2


class Rank(NamedTuple):
    """The numerical rank of one weight's E over independent members."""

    leaf: str
    shape: tuple[int, int]
    threshold: float                           # singular values above it count
    over: int                                  # members whose numerical rank exceeds r
    members: int
    first: tuple[int, int, float] | None       # (member, its rank, sigma_(r+1) / sigma_1) of the first such member
    worst: float                               # max sigma_(r+1) / threshold


def measure_rank(noise: dict, reps: np.ndarray, names, sigma: float, r: int) -> tuple[Rank, ...]:
    """Per weight whose E can exceed rank r (min(out, in) > r): singular values of every independent member's E."""
    out = []
    for name in names:
        p = perturbation(noise, name, reps)                                  # (n, out, in) float64
        if min(p.shape[1:]) <= r:
            continue
        scale = max(sigma, float(np.sqrt(np.mean(p ** 2))))                # the port's own scale if larger
        tau = rank_threshold(scale, p.shape[1], p.shape[2], r)
        s = np.linalg.svd(p, compute_uv=False)                             # (n, min(out, in)), descending
        ranks = (s > tau).sum(1)
        over = np.flatnonzero(ranks > r)
        first = None
        if over.size:
            i = int(over[0])
            first = (int(reps[i]), int(ranks[i]), float(s[i, r] / s[i, 0]))
        out.append(Rank(name, p.shape[1:], tau, int(over.size), len(reps), first, float(np.max(s[:, r]) / tau)))
    return tuple(out)


def rank_cause(rk: Rank, r: int):
    """The rank drift in words: how many members, the first one's rank and its singular value r+1."""
    member, rank, ratio = rk.first
    return diagnose.other("noise rank", f"the port's \"low-rank\" noise is not low rank: {rk.over} of {rk.members} "
                                        f"members' E of '{rk.leaf}' have numerical rank above r={r} (member {member}: "
                                        f"rank {rank}, its singular value {r + 1} is {fmt(ratio)} of its largest; "
                                        f"float32 rounding of a rank-{r} product stays below {fmt(rk.threshold)})")


def judge_rank(rec: Recorder, ranks: tuple[Rank, ...], r: int) -> None:
    """Per weight: no member above rank r (exact), and how close the worst came to the threshold (reported)."""
    for rk in ranks:
        size = f"{rk.members} members, {rk.leaf} {rk.shape[0]}x{rk.shape[1]} r={r}"
        rec.equal(f"{rk.leaf}: members whose E has numerical rank > r", "port", size, rk.over, 0,
                  f"singular values above {fmt(rk.threshold)}, the float32 rounding of a rank-{r} product",
                  cause=(lambda rk=rk: rank_cause(rk, r)) if rk.over else None)
        rec.info(f"{rk.leaf}: max singular value r+1 / threshold", "port", size, rk.worst)


# ----------------------------------------------------------------------------- scale and distribution


def causes(samples: dict[str, np.ndarray], r: int) -> tuple[dict, object]:
    """(cause per weight, cause of the pooled test): a weight whose entries are EGGROLL's at another scale is a
    scaling cause; otherwise, and for the pooled test unless some weight is rescaled, the distribution cause."""
    pooled = np.concatenate(list(samples.values()))
    shape = distribution_cause(pooled, r)
    per_leaf = {name: scale_cause(name, x) if is_rescaled(x, r) else shape for name, x in samples.items()}
    scaled = [c for c in per_leaf.values() if c is not shape]
    return per_leaf, scaled[0] if scaled else shape


def judge_distribution(rec: Recorder, quantity: str, size: str, x: np.ndarray, r: int, alpha: float, cause) -> bool:
    """Exact KS test of independent entries of E / sigma (sigma known) against EGGROLL's entry CDF, its numerical
    error added to the critical value: a wrong scale and a wrong shape both move it."""
    distance, err = entry_ks(x, r)
    rec.alpha += alpha
    return rec.bound(quantity, "port", size, distance, ks_critical(x.size, alpha) + err,
                     f"exact KS critical value (+ {fmt(err)} CDF error), alpha={alpha:.2g}", cause=cause)


def info_moments(rec: Recorder, size: str, x: np.ndarray, r: int) -> None:
    """The pooled entries' variance and kurtosis beside their expected values (reported, not judged)."""
    rec.info("E / sigma, independent entries: variance", "port", size, float(np.mean(x ** 2)), "expected 1")
    rec.info("E / sigma, independent entries: kurtosis", "port", size, kurtosis(x),
             f"expected 3 + 6/r = {fmt(entry_moment(2, r))}")
