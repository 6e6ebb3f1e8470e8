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
# The kurtosis band: |z| <= KURTOSIS_Z, z = log(k / k_ref) / (se / k_ref), se = the delta-method standard error of
# k = mean_i(q4_i) / mean_i(q2_i)^2 over the m distinct members (iid; q4_i, q2_i: member i's mean of e^4, e^2),
# taken from EGGROLL's exact covariance of (q4_i, q2_i) (kurtosis_null_moments), not the sample's: q4_i has a heavy
# right tail, so a sample SE is small exactly when k is low (at 4 SE, 14 and 94 false alarms in 20,000 null draws at
# 16x12, m=512 and 2x64, m=128; the former 16-group SE: ~0.2%). With the null SE, z is normal up to the skew and
# excess kurtosis of log k (O(1/sqrt(m)), O(1/m)), at most 0.38 and 0.42 over the test's shape (16x12, m=512) and the
# survey's leaves (64x4, 64x64, 2x64 at m=256 or 128 distinct): Cornish-Fisher moves the normal 4-sigma quantile
# (two-sided 6.3e-5) to at most 5.4 there, and 6 leaves room for the error of those moments and the tail beyond.
# Measured (20,000 seeded null draws each): 0 false alarms at 16x12 m=512, 64x4 and 64x64 (m=256 or 128 distinct),
# 1 at 2x64 (m=256: z 6.11; 128 distinct: z 6.36), so <= 5e-5 per leaf. Power, 2,000 clipped draws (effective
# rank 2, kurtosis 6): all flagged at 16x12 m=512 (z >= 12.6), 64x64, and 64x4 at m=256 (93% at 128 distinct);
# 2x64, 128 entries a member: 94% at m=256, 44% at 128 distinct (the factors' zero columns still show the clipping).
KURTOSIS_Z = 6.0


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


def kurtosis_null_moments(out: int, inn: int, rank: int) -> tuple[np.ndarray, np.ndarray]:
    """Exact mean and covariance of one member's (q4, q2) under EGGROLL at unit scale (a, b ~ N(0, I_r), e = a.b).

    Pairs of entries (p, q) share a row of A, a row of B, both or neither; given the shared factor they are
    independent normals, so E[e_p^s e_q^t] needs only the moments of |a|^2 ~ chi2_r."""
    c1, c2, c3, c4 = (float(np.prod(rank + 2 * np.arange(n))) for n in (1, 2, 3, 4))   # E[(chi2_r)^n]
    n = out * inn
    same, shared, apart = n, out * inn * (inn - 1) + inn * out * (out - 1), out * (out - 1) * inn * (inn - 1)
    e22, e42, e44 = ((same * s + shared * h + apart * a) / n ** 2 for s, h, a in
                     ((3 * c2, c2, c1 * c1), (15 * c3, 3 * c3, 3 * c2 * c1), (105 * c4, 9 * c4, 9 * c2 * c2)))
    mean = np.array([3 * c2, c1])
    return mean, np.array([[e44, e42], [e42, e22]]) - np.outer(mean, mean)


def distinct_members(q4: np.ndarray, q2: np.ndarray) -> int:
    """Members whose (q4, q2) no other member repeats (to 1e-6): an antithetic pair E, -E is one draw, not two."""
    order = np.argsort(q4)
    a, b = q4[order], q2[order]
    repeats = np.isclose(a[1:], a[:-1], rtol=1e-6, atol=0) & np.isclose(b[1:], b[:-1], rtol=1e-6, atol=0)
    return len(q4) - int(np.sum(repeats))


def kurtosis_z(E: np.ndarray, rank: int) -> tuple[float, float, float]:
    """(k, se, z) of the pooled kurtosis of E (m, out, in) against EGGROLL's 3 + 6/r: se from the delta method on
    EGGROLL's exact (q4, q2) covariance over the distinct members, z on the log scale (see KURTOSIS_Z)."""
    E2 = np.asarray(E, np.float64).reshape(E.shape[0], -1) ** 2
    q4, q2 = np.mean(E2 ** 2, axis=1), np.mean(E2, axis=1)
    k = float(np.mean(q4) / np.mean(q2) ** 2) if np.mean(q2) > 0 else float("nan")
    (mu4, mu2), cov = kurtosis_null_moments(*E.shape[1:], rank)
    grad = np.array([1 / mu2 ** 2, -2 * mu4 / mu2 ** 3])              # d(q4 / q2^2) at the null's means
    se = float(np.sqrt(grad @ cov @ grad / distinct_members(q4, q2)))
    k_ref = mu4 / mu2 ** 2
    return k, se, float(np.log(k / k_ref) / (se / k_ref))


def leaf_probes(name: str, E: np.ndarray, sigma: float, rank: int, A: np.ndarray | None = None) -> list[Probe]:
    """Rank, scale and kurtosis of one weight leaf's dense noise E (m, out, in); zero columns of A when given."""
    out, inn = E.shape[1:]
    cap = min(rank, out, inn)
    top = max(numerical_rank(e) for e in E)
    var = float(np.mean(np.asarray(E, np.float64) ** 2) / sigma ** 2)
    var_se = float(np.std(np.mean(np.asarray(E, np.float64) ** 2, axis=(1, 2)) / sigma ** 2, ddof=1)
                   / np.sqrt(E.shape[0]))
    k, k_se, k_z = kurtosis_z(E, rank)
    k_ref = 3 + 6 / rank
    probes = [
        Probe("largest numerical rank of A_i B_i^T", name, top, f"<= {cap} (rank {rank}, shape {out}x{inn})",
              top <= cap),
        Probe("variance of the entries / sigma^2", name, var, "1", abs(var - 1) <= 4 * var_se + 1e-3,
              f"+- {var_se:.2g}"),
        Probe("kurtosis of the entries", name, k, f"{k_ref:g} (3 + 6/r at r={rank})", abs(k_z) <= KURTOSIS_Z,
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
