"""Facts about a port's noise that the suite's checks do not judge, measured through the protocol for the survey.

- seed: does the noise change with the run seed? (A port whose noise ignores it gives every run of a
  benchmark the same noise sequence.)
- per weight leaf, on each member's dense perturbation E_i = A_i B_i^T (or the package's own dense noise):
  the largest numerical rank (EGGROLL: at most r), the variance over sigma^2 (EGGROLL: 1), the kurtosis of the
  entries (EGGROLL at rank r: 3 + 6/r), and, for factors, how many of A's r columns are zero for every member
  (a package that clips the rank to min(r, out, in) leaves them zero when its factors are padded).
A probe reports numbers with what EGGROLL gives; it never changes a verdict of the suite.
"""
from __future__ import annotations

from typing import Callable, NamedTuple

import numpy as np

EPS32 = float(np.finfo(np.float32).eps)
GROUPS = 16          # member groups for the standard error of the kurtosis


class Probe(NamedTuple):
    probe: str
    leaf: str
    value: float
    expected: str
    consistent: bool | None     # None: a fact without an EGGROLL value to compare with
    note: str = ""


def numerical_rank(E: np.ndarray) -> int:
    """rank of one (out, in) float32 matrix: singular values above s_max * max(out, in) * eps(float32)."""
    s = np.linalg.svd(np.asarray(E, np.float64), compute_uv=False)
    return int(np.sum(s > s.max() * max(E.shape) * EPS32)) if s.size and s.max() > 0 else 0


def kurtosis(x: np.ndarray) -> float:
    x = np.asarray(x, np.float64).ravel()
    m2 = np.mean(x ** 2)
    return float(np.mean(x ** 4) / m2 ** 2) if m2 > 0 else float("nan")


def kurtosis_se(E: np.ndarray) -> float:
    """Standard error of the pooled kurtosis, from GROUPS groups of members."""
    groups = [g for g in np.array_split(np.arange(E.shape[0]), GROUPS) if g.size]
    values = np.array([kurtosis(E[g]) for g in groups])
    return float(values.std(ddof=1) / np.sqrt(len(values))) if len(values) > 1 else float("nan")


def leaf_probes(name: str, E: np.ndarray, sigma: float, rank: int, A: np.ndarray | None = None) -> list[Probe]:
    """Rank, scale and kurtosis of one weight leaf's dense noise E (m, out, in); zero columns of A when given."""
    out, inn = E.shape[1:]
    cap = min(rank, out, inn)
    top = max(numerical_rank(e) for e in E)
    var = float(np.mean(np.asarray(E, np.float64) ** 2) / sigma ** 2)
    var_se = float(np.std(np.mean(np.asarray(E, np.float64) ** 2, axis=(1, 2)) / sigma ** 2, ddof=1)
                   / np.sqrt(E.shape[0]))
    k, k_se = kurtosis(E), kurtosis_se(E)
    k_ref = 3 + 6 / rank
    probes = [
        Probe("largest numerical rank of A_i B_i^T", name, top, f"<= {cap} (rank {rank}, shape {out}x{inn})",
              top <= cap),
        Probe("variance of the entries / sigma^2", name, var, "1", abs(var - 1) <= 4 * var_se + 1e-3,
              f"+- {var_se:.2g}"),
        Probe("kurtosis of the entries", name, k, f"{k_ref:g} (3 + 6/r at r={rank})", abs(k - k_ref) <= 4 * k_se,
              f"+- {k_se:.2g}; 3 + 6/r_eff for r_eff = 1, 2, 3: 9, 6, 5"),
    ]
    if A is not None:
        zero = int(np.sum(np.all(np.asarray(A) == 0, axis=(0, 1))))
        probes.append(Probe("columns of A that are zero for every member", name, zero, "0", zero == 0,
                            f"{rank - zero} of {rank} columns used"))
    return probes


def dense_of(noise: dict) -> dict[str, tuple[np.ndarray, np.ndarray | None]]:
    """{weight: (E (m, out, in), A)} from protocol factors."""
    return {k: (np.einsum("mor,mir->moi", v[0].astype(np.float64), v[1].astype(np.float64)), v[0])
            for k, v in noise.items() if isinstance(v, tuple)}


def seed_probe(draw: Callable[[int], dict]) -> Probe:
    """Draw the same members at the same epoch for run seeds 0 and 1."""
    a, b = draw(0), draw(1)
    same = all(np.array_equal(np.asarray(x), np.asarray(y)) for k in a
               for x, y in zip(*((a[k], b[k]) if isinstance(a[k], tuple) else ((a[k],), (b[k],)))))
    return Probe("noise identical for run seeds 0 and 1", "all", float(same), "0 (the noise depends on the seed)",
                 not same, "every run gets the same noise sequence" if same else "")


def factor_probes(port, shapes: dict, pop: int, sigma: float, rank: int) -> list[Probe]:
    """Probes on a protocol port's own `noise` (a CheckedPort): epoch 0, members 0..pop-1."""
    members = np.arange(pop)
    out = [seed_probe(lambda seed: port.noise(shapes, seed, 0, members[:16], pop, sigma, rank))]
    for name, (E, A) in dense_of(port.noise(shapes, 0, 0, members, pop, sigma, rank)).items():
        out += leaf_probes(name, E, sigma, rank, A)
    return out


def dense_probes(dense: Callable, shapes: dict, pop: int, sigma: float, rank: int) -> list[Probe]:
    """Probes on a package's own dense noise: `dense(shapes, pop, sigma, rank, seed) -> {name: (pop, *shape)}`."""
    out = [seed_probe(lambda seed: dense(shapes, pop, sigma, rank, seed))]
    noise = dense(shapes, pop, sigma, rank, 0)
    for name in sorted(k for k in noise if noise[k].ndim == 3):
        out += leaf_probes(name, noise[name], sigma, rank)
    return out
