"""The integer gap study: does egg.c's integer ES learn the byte LM as fast as nano-egg's, and which of egg.c's
departures cause how much?

Design: the seven knobs of spec/int8_knobs.py (INT8_KNOBS) are the factors, low = nano-egg's value, high = egg.c's.
pyDOE's `fracfact_by_res(7, 4)` gives the resolution-IV fraction 2^(7-3): 16 points, no main effect aliased with a
two-factor interaction, and both corners (all nano-egg, all egg.c) among them. Every point trains at the same seeds
(42, 142, ...), the same size, population, tokens per step and corpus: the `cpu` int8 preset (d 64, 2 layers, pop
256, T 32, 800 epochs), on the torch int8 port (bit-equal to the JAX reference and the C side at every knob; about
six times faster than the C side here).

Outcome per run: validation bits/byte after the last epoch (noise off, lower is better), and the curve every
validate_every epochs. The store is gap.study's (runs.csv one row per run, epochs.csv its curve, appended and
fsync'd run by run), so an interrupted study resumes where it stopped.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from gap.study import RunSpec, seed_list
from spec.int8 import INT8_PRESETS, Int8Config
from spec.int8_knobs import INT8_KNOBS, NANO_EGG, Int8Knobs

PRESET = "cpu"
SEEDS = 6
KNOBS = tuple(INT8_KNOBS)                 # the factors, in the knob table's order
RESOLUTION = 4
# Measured on the 96 runs of reports/gap-int8 at the cpu preset (800 epochs): 39-67 s of one core each, 52 s on
# average (AMD EPYC, torch 2.13, one thread per run), across the design's points.
CPU_S_PER_EPOCH = 52.0 / 800


@dataclass(frozen=True)
class Int8Arm:
    """One design point: the knobs at egg.c's value (`drifts`); trained by the torch int8 port."""

    name: str
    drifts: tuple[tuple[str, str], ...] = ()
    side: str = "torch"

    @property
    def knobs(self) -> Int8Knobs:
        return NANO_EGG.replace(**dict(self.drifts))

    def level(self, knob: str) -> int:
        """+1 where the knob is egg.c's, -1 where nano-egg's."""
        return 1 if knob in dict(self.drifts) else -1


def arm_name(drifts: dict[str, str]) -> str:
    if not drifts:
        return "nano-egg"
    if set(drifts) == set(KNOBS):
        return "egg.c"
    return "nano-egg+" + "+".join(f"{k}={v}" for k, v in drifts.items())


def design_matrix() -> np.ndarray:
    """(16, 7) of -1/+1: the resolution-IV fraction over KNOBS (pyDOE)."""
    import pydoe
    return np.asarray(pydoe.fracfact_by_res(len(KNOBS), RESOLUTION), dtype=np.int64)


def arms() -> list[Int8Arm]:
    """The design's points as arms, the two corners first (nano-egg, egg.c)."""
    out = []
    for row in design_matrix():
        drifts = {k: INT8_KNOBS[k].egg_c for k, level in zip(KNOBS, row) if level > 0}
        out.append(Int8Arm(arm_name(drifts), tuple(drifts.items())))
    corners = [a for a in out if a.name in ("nano-egg", "egg.c")]
    return sorted(corners, key=lambda a: a.name != "nano-egg") + [a for a in out if a not in corners]


def plan(cfg: Int8Config, seeds: int = SEEDS, corpus: str | None = None) -> list[RunSpec]:
    """Seed-major order (every point's first seed before any point's second), so early results span the design."""
    return [RunSpec(a, s, cfg, corpus) for s in seed_list(seeds) for a in arms()]


def default_config() -> Int8Config:
    return INT8_PRESETS[PRESET]


def describe_knob(knob: str) -> str:
    k = INT8_KNOBS[knob]
    return f"{k.name}={k.egg_c}: {k.means}"
