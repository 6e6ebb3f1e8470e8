"""Fitness shaping: both sides shape the same fitness vectors; what each does with NaN/inf is reported.

Vectors: standard normal at several sizes, CartPole-like integer returns with many ties, a
constant vector, a tiny spread (variance 1e-6, where the reference's +1e-5 dominates), a large
offset, and grouped shaping (group_size 8). Tolerance: the float32 bound of
parity.core.tolerances.shaping_bound on each side, summed (deterministic).

NaN or infinite fitness: upstream EggRoll validates neither, and neither does the reference, so a
port that accepts them behaves like upstream: an `info` row with advice (a warning), never a drift
and never a change of the exit code. A port that rejects them is reported the same way.

NaN or inf shaped out of finite fitness (the reference's is finite on every vector here) fails the vector; where
the vector has no spread (the constant one) the cause says the port divides by a zero spread, and the diagnosis'
candidates match it (parity.core.diagnose.matches_candidate: `std`'s 0/0 there is a NaN or, guarded, zeros). A port that
ignores group_size is matched with groups left out, and the cause says so.
"""
from __future__ import annotations

import math
import warnings
from typing import NamedTuple

import numpy as np

from parity.core import diagnose
from parity.core.port import NonFinite, PortError
from parity.core.tolerances import shaping_bound
from parity.core.verdict import Recorder, fmt, summarize

NAME = "fitness"


def vectors(ctx) -> list[tuple[str, np.ndarray, int]]:
    """(label, f float32, group_size) for every case."""
    rng = ctx.rng("fitness vectors")
    out: list[tuple[str, np.ndarray, int]] = []
    for n in ctx.sizes.fitness_sizes:
        out.append((f"normal N={n}", rng.standard_normal(n).astype(np.float32), 0))
    n = max(ctx.sizes.fitness_sizes)
    out.append((f"returns with ties N={n}", rng.integers(8, 60, size=n).astype(np.float32), 0))
    out.append((f"constant N={n}", np.full(n, 37.0, np.float32), 0))
    out.append((f"tiny spread N={n}", (1e-3 * rng.standard_normal(n)).astype(np.float32), 0))
    out.append((f"offset 500 N={n}", (500 + rng.standard_normal(n)).astype(np.float32), 0))
    g = 8
    m = max(s for s in ctx.sizes.fitness_sizes if s % g == 0)
    out.append((f"grouped N={m} group_size={g}", rng.standard_normal(m).astype(np.float32), g))
    out.append((f"grouped returns N={m} group_size={g}", rng.integers(8, 60, size=m).astype(np.float32), g))
    return out


class Shaped(NamedTuple):
    """One vector's outcome: the port's shaping against the reference's."""

    label: str
    ratio: float | None      # max |port - ref| / (both sides' float32 bound); None when the port raised; NaN or inf
    note: str                # "max |diff| ..." or what the port raised or its NaN / inf
    finite: bool = True      # False: the port returned NaN or inf (note: where), the reference a finite vector
    spread: str = ""         # its NaN / inf on a vector with no spread: that vector's zero spread in words


class Rejection(NamedTuple):
    """What each side does with a non-finite fitness vector (None: it accepted it)."""

    label: str               # NaN, +inf, -inf
    port_error: str | None
    port_output: object      # the port's first shaped values when it accepted, else None
    reference_error: str | None


class Measured(NamedTuple):
    shaped: tuple[Shaped, ...]
    unsupported: tuple[str, ...]      # vectors the port does not implement (NotImplementedError)
    matches: dict[str, int]           # diagnosis candidate -> vectors it reproduces
    cases: int
    rejections: tuple[Rejection, ...]
    ungrouped: frozenset = frozenset()   # candidates that reproduce a grouped vector only with group_size ignored


def _count_matches(port, f: np.ndarray, group: int, allowed, matches: dict[str, int], ungrouped: set) -> None:
    """Add the candidates that reproduce the port's vector (with its groups, else without: `ungrouped`)."""
    f64 = f.astype(np.float64)
    for name, (_, formula, _) in diagnose.FITNESS_CANDIDATES.items():
        for g in dict.fromkeys((group, 0)):
            try:
                with np.errstate(divide="ignore", invalid="ignore"):
                    cand = formula(f64, g)
            except Exception:      # a candidate that does not apply to this vector
                continue
            if diagnose.matches_candidate(port, cand, allowed):
                matches[name] += 1
                if g != group:
                    ungrouped.add(name)
                break


def _shape_one(ctx, label: str, f: np.ndarray, group: int, matches: dict[str, int], ungrouped: set) -> Shaped | str:
    """Shape one vector on both sides; a str when the port does not implement this case. The reference's output is
    validated finite first, so a NaN or inf of the port's is its own (judged, not a protocol break)."""
    ref = ctx.ref.shape_fitness(f, group)
    try:
        port = ctx.port.shape_fitness(f, group)
    except NonFinite as err:
        port = err.output
    except PortError as err:
        if err.original is None:
            raise
        if isinstance(err.original, NotImplementedError):     # a port may leave grouped shaping out
            return f"- {label}: the port does not implement it ({err.original})"
        return Shaped(label, None, f"the port rejects {label}: {err.original}")
    allowed = 2 * shaping_bound(f)                                          # (N,) both sides
    ctx.witness(label, port, port, ref, allowed,
                "the float32 shaping bound of both sides (parity.core.tolerances.shaping_bound)")
    _count_matches(port, f, group, allowed, matches, ungrouped)
    ratio = float(np.max(np.abs(port.astype(np.float64) - ref) / allowed))
    if np.all(np.isfinite(port)):
        return Shaped(label, ratio, f"max |diff| {fmt(float(np.max(np.abs(port - ref))))}")
    return Shaped(label, ratio, diagnose.nonfinite_count(port), False, diagnose.zero_spread(f, group))


NONFINITE = (("NaN", np.nan), ("+inf", np.inf), ("-inf", -np.inf))
ADVICE = ("advice: reject NaN/inf fitness with a clear error in your training loop, as the built-in trainers and "
          "torch_impl.es.tell do; a NaN return otherwise spreads into every noisy weight in one step")


def nonfinite_note(side: str, label: str, message: str | None) -> str:
    """The row's note: a warning with advice when the port accepts the value, else what happened."""
    if message is not None:
        return f"{side} rejects {label} fitness with an error"
    if side == "reference":
        return f"reference accepts {label} fitness, as upstream EggRoll does (it validates no fitness)"
    return f"warning: the port accepts {label} fitness, like upstream EggRoll; {ADVICE}"


def _rejections(ctx) -> tuple[Rejection, ...]:
    """Each side fed a vector with one NaN, +inf or -inf."""
    base = ctx.rng("non-finite fitness").standard_normal(16).astype(np.float32)
    noise = ctx.reference.noise(ctx.shapes, ctx.seed, 0, np.arange(16), 16, ctx.cfg.sigma, ctx.cfg.rank)
    out = []
    for label, value in NONFINITE:
        f = base.copy()
        f[3] = value
        try:
            with np.errstate(all="ignore"), warnings.catch_warnings():    # NaN in, on purpose: no noise from numpy
                warnings.simplefilter("ignore", RuntimeWarning)
                shown, port_msg = np.asarray(ctx.port.unchecked("shape_fitness", f, 0))[:4], None
        except Exception as err:       # the port's own validation: what we want
            shown, port_msg = None, f"{type(err).__name__}: {err}"
        out.append(Rejection(label, port_msg, shown, ctx.reference.rejects_nonfinite(noise, f, ctx.shapes)))
    return tuple(out)


def measure(ctx) -> Measured:
    cases = vectors(ctx)
    matches, ungrouped = {name: 0 for name in diagnose.FITNESS_CANDIDATES}, set()
    outcomes = [_shape_one(ctx, label, f, group, matches, ungrouped) for label, f, group in cases]
    return Measured(tuple(o for o in outcomes if isinstance(o, Shaped)),
                    tuple(o for o in outcomes if isinstance(o, str)), matches, len(cases), _rejections(ctx),
                    frozenset(ungrouped))


def _cause(m: Measured, bad: list[Shaped]):
    """The fitness cause of the failing vectors (the worst: a raise, a NaN or inf, else the largest ratio)."""
    worst = max(bad, key=lambda s: s.ratio if s.ratio is not None and math.isfinite(s.ratio) else math.inf)
    produced = sum(s.ratio is not None for s in m.shaped)
    spread = next((s for s in m.shaped if s.spread), None)
    kinds = " and ".join(k for k in ("NaN", "+inf", "-inf") if spread and k in spread.note)
    also = diagnose.zero_spread_sentence(spread.label, spread.spread, kinds) if spread else ""
    return diagnose.fitness_cause(m.matches, produced, m.cases, len(bad), f"{worst.label}: {worst.note}", m.ungrouped,
                                  also)


def judge(m: Measured) -> Recorder:
    rec = Recorder(NAME)
    bad = [s for s in m.shaped if s.ratio is None or not s.ratio <= 1.0]
    found = _cause(m, bad) if bad else None
    for s in m.shaped:
        if s.ratio is None:
            rec.fail("shaped fitness", "port", s.label, float("nan"), "returns a shaped vector", found)
        else:
            rec.bound("max |port - ref| / bound", "both", s.label, s.ratio, 1.0, "float32 shaping bound, both sides",
                      cause=found)
    # Accepting NaN/inf is what upstream EggRoll does: reported (1 = rejected, 0 = accepted), never a drift.
    for r in m.rejections:
        for side, message in (("port", r.port_error), ("reference", r.reference_error)):
            rec.info(f"{r.label} fitness rejected", side, "N=16", float(message is not None),
                     nonfinite_note(side, r.label, message))
    if accepts_nonfinite(m):
        rec.warnings.append(nonfinite_warning(m))
    return rec


def nonfinite_warning(m: Measured) -> str:
    """The terminal's warning for a port that accepts non-finite fitness: what it accepts, and the advice."""
    accepted = ", ".join(r.label for r in m.rejections if r.port_error is None)
    return f"warning (not a drift): the port accepts {accepted} fitness, like upstream EggRoll; {ADVICE}"


def accepts_nonfinite(m: Measured) -> bool:
    """Whether the port accepted any NaN or infinite fitness vector (a warning, never a verdict)."""
    return any(r.port_error is None for r in m.rejections)


def section(m: Measured) -> str:
    return "\n".join([
        "Both sides shape the same float32 fitness vectors. Allowed: |port - reference| <= the sum of both "
        "sides' float32 bounds for (f - mean) / sqrt(var + 1e-5) (mean: gamma_N mean|f|; variance: "
        "gamma_{N+2}; sqrt, +eps, division: 3u), per element; deterministic, no false alarms.",
        "",
        "Candidates the diagnosis tries when a vector differs: " + "; ".join(
            f"{k}: {v[0]}" for k, v in diagnose.FITNESS_CANDIDATES.items()) + ".",
        "",
        *(["NaN or inf shaped out of finite fitness (the reference's shaping of each is finite; a failure):",
           *[f"- {s.label}: the port returns {s.note}" + (f" ({s.spread})" if s.spread else "")
             for s in m.shaped if not s.finite], ""] if not all(s.finite for s in m.shaped) else []),
        "Non-finite fitness (reported, never a drift: upstream EggRoll validates none):",
        *[f"- {r.label}: port says `{r.port_error}`; reference says `{r.reference_error}`" for r in m.rejections],
        *([f"- warning: the port accepts non-finite fitness, as upstream EggRoll does; {ADVICE}."]
          if accepts_nonfinite(m) else []),
        *(["", "Not judged (the port raises NotImplementedError):", *m.unsupported] if m.unsupported else []),
    ])


def run(ctx):
    m = measure(ctx)
    return summarize(NAME, judge(m), section(m))
