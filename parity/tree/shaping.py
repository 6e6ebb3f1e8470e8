"""Which fitness shaping a port computes, named by what differs from the reference's (f - group mean) /
sqrt(var(all f) + 1e-5) (spec.tree_knobs group_fitness=global_var): one diagnosis for the fitness check, the es_*
lockstep's shaping row and the LM trajectory (parity.tree.base.fitness_text calls `describe`).

The family fitted: (f - c) / s, c each group's mean or the whole population's, s one of
  sqrt(var_k + eps)  (eps inside the root; ddof 0 with population centring is F.layer_norm(f, eps=eps)),
  std_k + eps        (eps added to the standard deviation),
  1                  (centring only),
var_k the variance of all f with ddof k in {0, 1}; besides it each group by its own spread (`group_fitness`), centred
ranks and the raw fitness (parity.core.diagnose.FITNESS_CANDIDATES, the MLP suite's knob `fitness` words).

Fit, in closed form. Given c, the port's p = d / s with d = f - c, so 1/s = (d . p) / (d . d) (least squares over the
vector); then eps = s^2 - var_k (inside) or s - std_k (outside). eps is read from the vector where it is best
determined (its uncertainty, from the bound below: 2 s^2 rel inside, s rel outside, rel = the bound / |p| at the
largest |d|), rounded to one significant digit when that value is within the uncertainty (0: no epsilon), and
verified by reproducing the port's output on every vector.

The bound a port computing one member of the family in float32 keeps (first order, as
parity.core.tolerances.shaping_bound): the centre gamma_n mean|f|, the centred value one more rounding U |d|; the
variance relative gamma_{n+3} (the sum, the division by n or n - 1), so the root half of it; + eps, the root, the
division and the output's rounding 4 U:  bound = (gamma_n mean|f| + U |d|) / s + |d| / s (gamma_{n+3} / 2 + 4 U).

Power (measured at pop 8 and 16, groups of 4, seeds 0-9; tests/parity/tree/test_fitness.py). Detection, against the
fitness check's bound (base.shaping_pair_bound): a variant departs from the reference in its divisor (or its centre),
so ddof 1 by n / (n - 1) at every spread (>= 9e3 x the bound on the normal trials, >= 900 x on the tiny one), ranks,
centring only, groups ignored, a layer norm and the plain std by >= 1e4 x everywhere; an epsilon's place or value only
where the variance is near eps: eps 1e-5 outside the root is 2.4 x at std 1, 1.5 x at 3, 0.5 x at 10 (the normal
trials, std ~3.5, at 0.7-2.4 x), eps 1e-8 inside 3.2 x at std 1, 0.4 x at 3 (normal trials 0.1-0.4 x); both >= 1e6 x
on the tiny-spread trial (variance ~1e-6). Naming: the check's four trials alone tell the epsilon's place at
0.8-6 x the port bound only (eps 1e-8 outside with ddof 1 from ~2e-12 inside not at all: 0.05 x), so `describe`
adds its own probes (PROBE_SPREADS, stream PROBE_STREAM: no check's numbers move) at variance ~1e-4 and ~1e-8: the
true shaping then reproduces the port at <= 0.18 of the port bound and the nearest other member of the family misses
by >= 7 x (ddof 1, eps 1e-8 outside against inside), every other by >= 6e3 x.
"""
from __future__ import annotations

import math
from typing import Callable, NamedTuple, Sequence

import numpy as np

from parity.core import diagnose
from parity.core.tolerances import U32, gamma
from spec.tree_knobs import TREE_DESCRIPTIONS

REFERENCE = "(f - group mean) / sqrt(var(all f) + 1e-5)"
PROBE_STREAM = 23                  # numpy stream of the diagnosis' own probe vectors (not any check's)
PROBE_SPREADS = (2.0, 1e-2, 1e-3, 1e-4)  # std of the probes: the normal trials', variance ~1e-4, ~1e-6, ~1e-8


class Shaping(NamedTuple):
    centre: str        # "group" (each group's mean) | "population" (the whole population's)
    ddof: int          # the variance's ddof (0, 1)
    place: str         # "inside" sqrt(var + eps) | "outside" std + eps | "none" (not divided)
    eps: float
    fitted: bool = False   # eps as fitted (not a round value)


def centred(f: np.ndarray, g: int, centre: str) -> np.ndarray:
    """f (n,) float64 minus each group's mean (g members each) or the whole population's."""
    if centre == "population" or not g:
        return f - f.mean()
    x = f.reshape(-1, g)
    return (x - x.mean(1, keepdims=True)).ravel()


def divisor(sh: Shaping, f: np.ndarray) -> float:
    """s of the shaping on f (float64)."""
    if sh.place == "none":
        return 1.0
    var = f.var(ddof=sh.ddof) if f.size > sh.ddof else 0.0
    return math.sqrt(var + sh.eps) if sh.place == "inside" else math.sqrt(var) + sh.eps


def port_bound(f: np.ndarray, d: np.ndarray, s: float) -> np.ndarray:
    """A float32 port's bound for d / s (the module docstring), per member."""
    n = f.size
    return (gamma(n) * np.abs(f).mean() + U32 * np.abs(d)) / s + np.abs(d) / s * (gamma(n + 3) / 2 + 4 * U32)


def excess(sh: Shaping, f: np.ndarray, p: np.ndarray, g: int) -> float:
    """max |p - shaping(f)| / port_bound: <= 1 where the shaping reproduces the port's output."""
    d, s = centred(f, g, sh.centre), divisor(sh, f)
    if not s > 0:
        return math.inf
    with np.errstate(invalid="ignore"):
        r = np.abs(p - d / s) / port_bound(f, d, s)
    return float(np.max(r)) if np.all(np.isfinite(r)) else math.inf


def one_scale(f: np.ndarray, p: np.ndarray, g: int, centre: str) -> tuple[float, float] | None:
    """(s, its relative uncertainty) with p = (f - c) / s within the bound, or None: 1/s = d.p / d.d."""
    d = centred(f, g, centre)
    dp, dd = float(d @ p), float(d @ d)
    if not (dd > 0 and dp > 0):
        return None
    s = dd / dp
    bound = port_bound(f, d, s)
    if not np.all(np.abs(p - d / s) <= bound):
        return None
    k = int(np.argmax(np.abs(d)))
    return s, float(bound[k] * s / abs(d[k]))


def _eps_of(s: float, rel: float, var: float, place: str) -> tuple[float, float]:
    """(eps, its uncertainty) of one vector under one place: s^2 - var (inside), s - sqrt(var) (outside)."""
    return (s * s - var, 2 * s * s * rel) if place == "inside" else (s - math.sqrt(var), s * rel)


def _rounded(eps: float, err: float) -> tuple[float, bool]:
    """eps as 0 or one significant digit where that is within err; else as fitted (True)."""
    if abs(eps) <= err:
        return 0.0, False
    r = float(f"{eps:.0e}")
    return (r, False) if abs(r - eps) <= err else (eps, True)


def fit_family(pairs: Sequence[tuple[np.ndarray, np.ndarray]], g: int, centre: str) -> list[Shaping]:
    """Members of the family with this centre that reproduce every (f, port) pair: round epsilons first (powers of
    ten before other single digits), then centring only, ddof 0 before 1, inside before outside."""
    scales = [one_scale(f, p, g, centre) for f, p in pairs]
    if any(sc is None for sc in scales):
        return []
    found: list[Shaping] = []
    if all(excess(Shaping(centre, 0, "none", 0.0), f, p, g) <= 1 for f, p in pairs):
        found.append(Shaping(centre, 0, "none", 0.0))
    for ddof in (0, 1):
        for place in ("inside", "outside"):
            fits = [_eps_of(s, rel, f.var(ddof=ddof), place) for (f, _), (s, rel) in zip(pairs, scales)]
            eps, err = min(fits, key=lambda e: e[1])
            if eps < -err:
                continue
            value, fitted = _rounded(eps, err)
            for sh in (Shaping(centre, ddof, place, value, fitted), Shaping(centre, ddof, place, max(eps, 0.0), True)):
                if all(excess(sh, f, p, g) <= 1 for f, p in pairs):
                    found.append(sh)
                    break
    return sorted(found, key=lambda sh: (sh.fitted, sh.eps != 0 and f"{sh.eps:.0e}"[0] != "1"))


def probes(n: int, g: int) -> list[np.ndarray]:
    """The diagnosis' own fitness vectors (n,) float32 at PROBE_SPREADS, with group offsets at the normal spread."""
    rng = np.random.default_rng([n, PROBE_STREAM])
    groups = n // (g or n)
    return [(rng.standard_normal(n) * std + (rng.standard_normal(groups).repeat(g or n) * 1.5 * std if std > 1 else 0))
            .astype(np.float32) for std in PROBE_SPREADS]


# ----------------------------------------------------------------------------- in words
def _eps_words(eps: float, fitted: bool) -> str:
    return f"{eps:.3g} (fitted)" if fitted else f"{eps:.0e}"


def formula(sh: Shaping, g: int, n: int) -> str:
    """The shaping as a formula: (f - mean) / (std + 1e-05)."""
    top = "f - group mean" if sh.centre == "group" and g and g < n else "f - mean"
    if sh.place == "none":
        return f"{top} (not divided)"
    std, var = ("std(ddof 1)", "var(ddof 1)") if sh.ddof else ("std", "var")
    if sh.eps == 0:
        return f"({top}) / {std}" + ("" if sh.ddof else " (ddof 0, no epsilon)")
    e = _eps_words(sh.eps, sh.fitted)
    return f"({top}) / sqrt({var} + {e})" if sh.place == "inside" else f"({top}) / ({std} + {e})"


def facts(sh: Shaping, g: int, n: int) -> list[str]:
    """What differs from the reference, one fact each."""
    grouped = bool(g) and g < n
    out = []
    other_eps = sh.eps != 1e-5 or sh.fitted
    layer_norm = sh.place == "inside" and sh.ddof == 0 and sh.eps > 0 and (
        (sh.centre == "population" and grouped) or (not grouped and other_eps))
    if layer_norm:
        out.append(f"a layer norm of the fitness with eps {_eps_words(sh.eps, sh.fitted)} (F.layer_norm over the "
                   f"population)" + ("" if other_eps else ": the reference's epsilon"))
    elif sh.place == "inside" and sh.eps > 0 and other_eps:
        out.append(f"eps {_eps_words(sh.eps, sh.fitted)} inside the square root of the variance, not the reference's "
                   f"1e-05")
    if sh.place == "outside" and sh.eps > 0:
        out.append(f"eps {_eps_words(sh.eps, sh.fitted)} added to the standard deviation, not inside the square root "
                   f"of the variance")
    if sh.place != "none" and sh.eps == 0:
        out.append("no epsilon (0/0 where the spread is zero), not the reference's 1e-05 inside the square root")
    if sh.ddof == 1 and sh.place != "none":
        out.append("the unbiased standard deviation (ddof 1, torch.std's default), not the population's (ddof 0)")
    if sh.place == "none":
        out.append("centred only, not divided by the spread")
    if sh.centre == "population" and grouped:
        out.append(f"centred by the whole population's mean, its groups of {g} ignored, not by each group's mean")
    return out


def knob_value(sh: Shaping, g: int, n: int) -> str | None:
    """The MLP suite's knob `fitness` value the shaping is (that suite has no groups: population centring)."""
    if sh.fitted or not (sh.centre == "population" or not g or g == n):
        return None
    if sh.ddof == 0 and sh.place != "none" and sh.eps == 0:
        return "std"
    if sh.ddof == 1 and sh.place == "outside" and sh.eps == 1e-8:
        return "std_unbiased"
    return None


def sentence(sh: Shaping, g: int, n: int) -> str:
    value = knob_value(sh, g, n)
    return diagnose.cause("fitness", f"the port's shaped fitness is {formula(sh, g, n)}: {'; '.join(facts(sh, g, n))}"
                                     + (f" (as fitness={value})" if value else "")
                                     + f"; the reference's {REFERENCE}").text


# ----------------------------------------------------------------------------- the diagnosis
def _group_var(f: np.ndarray, g: int) -> np.ndarray:
    x = f.reshape(-1, g or f.size)
    return ((x - x.mean(1, keepdims=True)) / np.sqrt(x.var(1, keepdims=True) + 1e-5)).ravel()


def _named(pairs, g: int) -> str | None:
    """The cause of the shaping that reproduces every pair, or None."""
    n = pairs[0][0].size
    if g and g < n and all(np.all(np.abs(p - _group_var(f, g)) <= 2 * port_bound(f, centred(f, g, "group"), 1.0)
                                  / np.sqrt(f.reshape(-1, g).var(1) + 1e-5).repeat(g)) for f, p in pairs):
        return (f"{TREE_DESCRIPTIONS['group_fitness']} differs (knob `group_fitness`): each group is divided by its own "
                "spread, not by the global variance")
    centres = ("group", "population") if g and g < n else ("group",)
    for centre in centres:
        found = fit_family(pairs, g, centre)
        if found and not facts(found[0], g, n):      # the reference's own formula: rounding, not a formula
            return diagnose.other("fitness shaping", f"the port's shaped fitness is the reference's {REFERENCE} within "
                                                     f"a float32 port's rounding, beyond both sides' bound").text
        if found:
            return sentence(found[0], g, n)
    for name in ("rank", "raw"):
        words, cand, value = diagnose.FITNESS_CANDIDATES[name]
        if all(diagnose.matches_candidate(p, cand(f, 0), 2 * U32 * np.abs(cand(f, 0)) + 1e-7) for f, p in pairs):
            return diagnose.cause("fitness", f"the port's shaped fitness is {words}"
                                             + (f" (as fitness={value})" if value else "")
                                             + f", the reference's {REFERENCE}").text
    return None


def describe(f: np.ndarray, port: np.ndarray, g: int,
             shape: Callable[[np.ndarray], np.ndarray] | None = None) -> str:
    """The cause of a shaped fitness that differs from the reference's: the shaping that reproduces the port's output
    on f, and on the probes where `shape` (the port's shaping, f (n,) float32 -> (n,)) is given, in words; else what
    was seen (never only "differs")."""
    f64, p64 = np.asarray(f, np.float32).astype(np.float64), np.asarray(port, np.float64)
    g = g if g and f64.size % g == 0 else 0
    pairs = [(f64, p64)]
    if shape is not None:
        for q in probes(f64.size, g):
            try:
                out = np.asarray(shape(q), np.float64)
            except Exception:       # noqa: BLE001 - a probe the port cannot shape is left out, not an error here
                continue
            if out.shape == q.shape and np.all(np.isfinite(out)):
                pairs.append((q.astype(np.float64), out))
    named = _named(pairs, g) if len(pairs) > 1 else None
    named = named or _named(pairs[:1], g)
    if named:
        return named
    d = centred(f64, g, "group")
    ratio = float(d @ p64) / float(d @ d) * math.sqrt(f64.var() + 1e-5) if float(d @ d) > 0 else math.nan
    return diagnose.cause("fitness", f"the port's shaped fitness is none of (f - group or population mean) / s with s "
                                     f"sqrt(var + eps), std + eps (ddof 0 or 1) or 1, each group by its own spread, "
                                     f"centred ranks or the raw fitness; its least-squares scale against the "
                                     f"reference's is {ratio:.6g}; the reference's {REFERENCE}").text
