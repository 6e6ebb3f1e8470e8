"""Fitness shaping: both sides shape the same fitness vectors; what each does with NaN/inf is reported.

Vectors: standard normal at several sizes, CartPole-like integer returns with many ties, a
constant vector, a tiny spread (variance 1e-6, where the reference's +1e-5 dominates), a large
offset, and grouped shaping (group_size 8). Tolerance: the float32 bound of
parity.tolerances.shaping_bound on each side, summed (deterministic).

NaN or infinite fitness: upstream EggRoll validates neither, and neither does the reference, so a
port that accepts them behaves like upstream: an `info` row with advice (a warning), never a drift
and never a change of the exit code. A port that rejects them is reported the same way.
"""
from __future__ import annotations

import numpy as np

from parity import diagnose
from parity.adapter import PortError
from parity.tolerances import shaping_bound
from parity.verdict import Recorder, fmt, summarize

NAME = "fitness"


def vectors(ctx) -> list[tuple[str, np.ndarray, int]]:
    """(label, f float32, group_size) for every case."""
    rng = ctx.rng(11)
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


NONFINITE = (("NaN", np.nan), ("+inf", np.inf), ("-inf", -np.inf))
ADVICE = ("advice: reject NaN/inf fitness with a clear error in your training loop, as the built-in trainers and "
          "torch_impl.es.tell do; a NaN return otherwise spreads into every noisy weight in one step")


def nonfinite_fitness(base: np.ndarray, value: float) -> np.ndarray:
    """base with member 3 set to value (a NaN or an infinity)."""
    f = base.copy()
    f[3] = value
    return f


def port_nonfinite_message(port, f: np.ndarray) -> str | None:
    """The error the port's shape_fitness raises for f, or None when it returns a vector."""
    try:
        port.shape_fitness(f, 0)
    except Exception as err:       # the port's own validation
        return f"{type(err).__name__}: {err}"
    return None


def nonfinite_note(side: str, label: str, message: str | None) -> str:
    """The row's note: a warning with advice when the side accepts the value, else what it raised."""
    if message is not None:
        return f"{side} rejects {label} fitness with an error"
    if side == "reference":
        return f"reference accepts {label} fitness, as upstream EggRoll does (it validates no fitness)"
    return f"warning: the port accepts {label} fitness, like upstream EggRoll; {ADVICE}"


def nonfinite_rows(ctx, rec: Recorder) -> list[str]:
    """Info rows (1 = rejected, 0 = accepted) for both sides on NaN, +inf and -inf; returns the section's lines."""
    base = ctx.rng(12).standard_normal(16).astype(np.float32)
    noise = ctx.reference.noise(ctx.shapes, ctx.seed, 0, np.arange(16), 16, ctx.cfg.sigma, ctx.cfg.rank)
    lines, port_accepts = [], False
    for label, value in NONFINITE:
        f = nonfinite_fitness(base, value)
        port_msg = port_nonfinite_message(ctx.port.port, f)
        ref_msg = ctx.reference.rejects_nonfinite(noise, f, ctx.shapes)
        for side, msg in (("port", port_msg), ("reference", ref_msg)):
            note = nonfinite_note(side, label, msg)
            rec.info(f"{label} fitness rejected", side, "N=16", float(msg is not None), note)
        lines.append(f"- {label}: port says `{port_msg}`; reference says `{ref_msg}`")
        port_accepts = port_accepts or port_msg is None
    if port_accepts:
        lines.append(f"- warning: the port accepts non-finite fitness, as upstream EggRoll does; {ADVICE}.")
    return lines


def run(ctx):
    rec = Recorder(NAME)
    cases = vectors(ctx)
    matches = {name: 0 for name in diagnose.FITNESS_CANDIDATES}
    measured: list[tuple[str, float | None, str]] = []      # (label, ratio or None if the port raised, note)
    unsupported: list[str] = []
    for label, f, group in cases:
        ref = ctx.ref.shape_fitness(f, group)
        try:
            port = ctx.port.shape_fitness(f, group)
        except PortError as err:
            if err.original is None:
                raise
            if isinstance(err.original, NotImplementedError):     # a port may leave grouped shaping out
                unsupported.append(f"- {label}: the port does not implement it ({err.original})")
                continue
            measured.append((label, None, f"the port rejects {label}: {err.original}"))
            continue
        allowed = 2 * shaping_bound(f)                                          # (N,) both sides
        ratio = float(np.max(np.abs(port.astype(np.float64) - ref) / allowed))
        f64 = f.astype(np.float64)
        for name, (_, formula, _) in diagnose.FITNESS_CANDIDATES.items():
            try:
                cand = formula(f64, group)
            except Exception:          # a candidate that does not apply to this vector
                continue
            if np.all(np.abs(port - cand) <= allowed + 1e-6 * np.abs(cand)):
                matches[name] += 1
        measured.append((label, ratio, f"max |diff| {fmt(float(np.max(np.abs(port - ref))))}"))

    bad = [(label, r, note) for label, r, note in measured if r is None or r > 1.0]
    found = None
    if bad:
        label, _, note = max(bad, key=lambda b: np.inf if b[1] is None else b[1])
        produced = sum(r is not None for _, r, _ in measured)
        found = diagnose.fitness_cause(matches, produced, len(cases), len(bad), f"{label}: {note}")
    for label, ratio, note in measured:
        if ratio is None:
            rec.fail("shaped fitness", "port", label, float("nan"), "returns a shaped vector", found)
        else:
            rec.bound("max |port - ref| / bound", "both", label, ratio, 1.0, "float32 shaping bound, both sides",
                      cause=found)

    messages = nonfinite_rows(ctx, rec)

    section = "\n".join([
        "Both sides shape the same float32 fitness vectors. Allowed: |port - reference| <= the sum of both "
        "sides' float32 bounds for (f - mean) / sqrt(var + 1e-5) (mean: gamma_N mean|f|; variance: "
        "gamma_{N+2}; sqrt, +eps, division: 3u), per element; deterministic, no false alarms.",
        "",
        "Candidates the diagnosis tries when a vector differs: " + "; ".join(
            f"{k}: {v[0]}" for k, v in diagnose.FITNESS_CANDIDATES.items()) + ".",
        "",
        "Non-finite fitness (reported, never judged: upstream EggRoll accepts it, so a port may too):",
        *messages,
        *(["", "Not judged (the port raises NotImplementedError):", *unsupported] if unsupported else []),
    ])
    return summarize(NAME, rec, section)
