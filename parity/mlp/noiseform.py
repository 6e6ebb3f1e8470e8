"""What the checks read from a noise dict whatever its form: factors or dense perturbations, one dict or two.

Factor form (the protocol's default): weight -> (A (m, out, r) already times +-sigma/sqrt(r), B (m, in, r)).
Dense form (a port that declares `dense_noise = True`): weight -> E (m, out, in), member i's whole perturbation
A_i B_i^T. Biases: eps (m, out) already times +-sigma, in both forms. A port may give the noise its forward applies
and the noise its update uses apart: `SplitNoise` is the forward noise (a dict) carrying both as `forward` and
`update`. Everything here is a pure function of its arguments; the statistics live in parity.core.tolerances.
"""
from __future__ import annotations

import numpy as np

from parity.core.port import SplitNoise
from parity.core.tolerances import chi2_interval, entry_ks, gamma, ks_critical, ulp_distance

CHUNK = 64                 # members per float64 product when factors are turned dense (bounds the temporary)
SAME_DRAWS = 1e-4          # ||E_a - c E_b||_F / ||E_a||_F below this: one dense draw at two sigmas (float32 rounding
                           # of a rank-r product is ~1e-6 of it; independent draws are O(1) apart)


def forward_of(noise: dict) -> dict:
    """The noise a forward applies: a split's forward part, else the dict itself (same object: ports cache on it)."""
    return noise.forward if isinstance(noise, SplitNoise) else noise


def update_of(noise: dict) -> dict:
    """The noise a gradient or an update uses: a split's update part, else the dict itself."""
    return noise.update if isinstance(noise, SplitNoise) else noise


def weight_names(noise: dict) -> list[str]:
    """The weights a noise dict perturbs, in its order."""
    return [k for k in noise if k.endswith(".weight")]


def bias_names(noise: dict) -> list[str]:
    """The biases a noise dict perturbs (none when the port perturbs no bias)."""
    return [k for k in noise if k.endswith(".bias")]


def is_dense(noise: dict) -> bool:
    """Whether the weights come as perturbations E rather than factors (A, B)."""
    return any(not isinstance(noise[w], tuple) for w in weight_names(noise))


def members(noise: dict) -> int:
    """How many members (rows) a noise dict holds."""
    value = next(iter(noise.values()))
    return (value[0] if isinstance(value, tuple) else value).shape[0]


def dense_of(A: np.ndarray, B: np.ndarray) -> np.ndarray:
    """E = A B^T per member, formed in float64 (exact products of float32 factors) and rounded once to float32."""
    A64, B64 = np.asarray(A, np.float64), np.asarray(B, np.float64)
    out = np.empty((A64.shape[0], A64.shape[1], B64.shape[1]), np.float32)
    for start in range(0, A64.shape[0], CHUNK):
        out[start:start + CHUNK] = A64[start:start + CHUNK] @ np.swapaxes(B64[start:start + CHUNK], 1, 2)
    return out


def to_dense(noise: dict) -> dict:
    """The same noise with every weight's factors turned into E (a split stays a split)."""
    if isinstance(noise, SplitNoise):
        return SplitNoise(to_dense(noise.forward), to_dense(noise.update))
    return {k: dense_of(*v) if isinstance(v, tuple) else v for k, v in noise.items()}


def perturbation(noise: dict, name: str, rows=slice(None)) -> np.ndarray:
    """Members' perturbation of a weight in float64, (m, out, in): A B^T from factors, E as given."""
    value = noise[name]
    if isinstance(value, tuple):
        return np.asarray(value[0][rows], np.float64) @ np.swapaxes(np.asarray(value[1][rows], np.float64), 1, 2)
    return np.asarray(value[rows], np.float64)


def entries(noise: dict, name: str) -> int:
    """Entries of one member's perturbation of a weight (out * in)."""
    value = noise[name]
    return value[0].shape[1] * value[1].shape[1] if isinstance(value, tuple) else value.shape[1] * value.shape[2]


def draws(noise: dict, name: str) -> np.ndarray:
    """The raw draw per member that identifies a noise sample: B of the factors, E itself, or a bias's eps."""
    value = noise[name]
    return value[1] if isinstance(value, tuple) else value


def independent_entries(noise: dict, name: str, reps: np.ndarray) -> np.ndarray:
    """The diagonal of each chosen member's E / its perturbation, flattened (float64).

    Entry (i, i) of A B^T involves row i of A and row i of B only, so diagonal entries are independent of each other
    (and of other members' and leaves'): min(out, in) independent samples per member and weight.
    """
    p = perturbation(noise, name, reps)
    k = min(p.shape[1], p.shape[2])
    return p[:, np.arange(k), np.arange(k)].ravel()


# ----------------------------------------------------------------------------- the same draws at two sigmas
def scale_ratio(a: dict, b: dict) -> float:
    """The common factor c with a = c * b over all weights (same draws assumed): median of the ratios of A or, when
    either side is dense, of the perturbations A B^T or E."""
    dense = is_dense(a) or is_dense(b)

    def values(noise):
        return np.concatenate([(perturbation(noise, k) if dense else np.asarray(noise[k][0], np.float64)).ravel()
                               for k in weight_names(noise)])

    num, den = values(a), values(b)
    keep = den != 0
    return float(np.median(num[keep] / den[keep]))


def same_draws(a: dict, b: dict) -> bool:
    """Whether two noise dicts hold the same draws at possibly different sigmas: B equal (both factors), or the
    perturbations proportional within float32 rounding (either side dense, e.g. a dense port on shared draws)."""
    names = weight_names(a)
    if not all(k in b for k in names):
        return False
    if not (is_dense(a) or is_dense(b)):
        return all(np.array_equal(a[k][1], b[k][1]) for k in names)
    c = scale_ratio(a, b)
    for k in names:
        ea, eb = perturbation(a, k), perturbation(b, k)
        if ea.shape != eb.shape or np.linalg.norm(ea - c * eb) > SAME_DRAWS * np.linalg.norm(ea):
            return False
    return True


def scale_test(noise: dict, reps: np.ndarray, sigma: float, r: int, alpha: float) -> tuple[str, float, tuple, str, float]:
    """(quantity, value, ("stat", lo, hi, alpha), why, the noise's scale over sigma's): the noise against sigma,
    over independent members `reps`.

    Factors: A / (sigma/sqrt r) is iid N(0,1), so the mean square of all its entries is chi-square(n)/n (exact).
    Dense: the independent (diagonal) entries of E / sigma against EGGROLL's entry distribution, exact KS.
    """
    names = weight_names(noise)
    if not is_dense(noise):
        a = np.concatenate([noise[k][0][reps].ravel() for k in names]).astype(np.float64)
        value = float(np.mean(a ** 2) * r / sigma ** 2)
        lo, hi = chi2_interval(a.size, alpha)
        return ("noise: mean square of A / (sigma_e / sqrt r)", value, ("stat", lo, hi, alpha),
                f"chi-square({a.size})/{a.size}, alpha={alpha:.2g}", float(np.sqrt(value)))
    x = np.concatenate([independent_entries(noise, k, reps) for k in names]) / sigma
    distance, err = entry_ks(x, r)
    return ("noise: KS distance of E / sigma_e to EGGROLL's entries", distance,
            ("stat", 0.0, ks_critical(x.size, alpha) + err, alpha), f"exact KS critical value, alpha={alpha:.2g}",
            float(np.sqrt(np.mean(x ** 2))))


# ----------------------------------------------------------------------------- a dense port claiming JAX's draws
def dense_mismatch(E: np.ndarray, A: np.ndarray, B: np.ndarray) -> float:
    """max |E - A B^T| / (gamma_{r+3} |A| |B|^T): above 1, E is not a float32 product of these factors."""
    exact = perturbation({"w": (A, B)}, "w")
    bound = gamma(A.shape[-1] + 3) * (np.abs(np.asarray(A, np.float64)) @ np.swapaxes(np.abs(np.asarray(B, np.float64)), 1, 2))
    diff = np.abs(np.asarray(E, np.float64) - exact)
    return float(np.max(diff / np.maximum(bound, 1e-300))) if np.any(diff > 0) else 0.0


def max_ulps(port: dict, ref: dict, name: str) -> int:
    """The ULP distance of one leaf, port against reference; a dense weight within the float32 bound of the
    reference's product counts as identical (0), else its ULP distance to fl32(A B^T)."""
    p, q = port[name], ref[name]
    if isinstance(q, tuple) and not isinstance(p, tuple):
        return 0 if dense_mismatch(p, *q) <= 1 else int(ulp_distance(p, dense_of(*q)).max())
    pairs = zip(p, q) if isinstance(q, tuple) else [(p, q)]
    return max(int(ulp_distance(a, b).max()) for a, b in pairs)

