"""The integer parity check's pieces: shared inputs (Case), exact comparison, the first parting, and knob naming.

Every side (JAX reference, torch port, C side) computes the same named pieces from the same Case, in pipeline order:
    init.<leaf>                     the side's own init from the seed
    starts.<leaf>                   every member's clamped window start at the case's epoch       (pop, *stack)
    noise.<leaf>.A|B|E              the traced members' noise (A signed, rank axis dropped)       (m, *stack, n)
    trace.<op>                      the traced members' every intermediate, logits and ll         (m, T, ...)
    trace.state, trace.score        their final states and scores
    scores, states                  the whole population's scores and states after T tokens      (pop,), (pop, L, d)
    fitness                         sign(s_2k - s_2k+1) of the case's scores (ties and wraps included) (pairs,)
    votes.<leaf>                    Z from the case's fitness signs at the epoch
    update.<leaf>                   the params after the vote at the case's threshold
    trajectory.<e>.scores|<leaf>    K epochs from the side's init on the corpus: scores and params after each
Integer arithmetic has no rounding, so two sides agree when every piece is equal element for element
(`np.array_equal`): no tolerance. Each piece reads the Case's inputs, not an upstream piece of the side, so a
difference is located where it arises; the first differing piece in this order is where the sides part.

Naming a departure: a side that parts from the reference is matched against the knob signatures of a side that
implements every egg.c departure (the C side): the smallest set of knobs (spec/int8_knobs.py) with which that side
reproduces the departing side's every piece exactly names the cause (`name_knobs`).
"""
from __future__ import annotations

import functools
import zlib
from dataclasses import dataclass, field
from typing import Callable, NamedTuple

import numpy as np

from spec.int8 import Int8Config, int8_tree, threshold_at
from spec.int8_knobs import ALL_INT8_KNOBS, NANO_EGG, Int8Knobs

Pieces = dict[str, np.ndarray]
GROUPS = ("init", "starts", "noise", "trace", "scores", "states", "fitness", "votes", "update", "trajectory")


@dataclass(frozen=True)
class Case:
    """The shared inputs of one comparison (numpy; int8 params in spec.int8.int8_tree's paths and shapes)."""

    cfg: Int8Config
    seed: int
    epoch: int                       # starts, noise, traces, scores and votes are taken at this epoch
    threads: tuple[int, ...]         # the traced members (noise and every intermediate)
    params: dict = field(repr=False)                 # {path: int8}, random
    tokens: np.ndarray = field(repr=False)           # (pop, T + 1) uint8, a byte 0 inside every row
    states: np.ndarray = field(repr=False)           # (pop, L, d) int8, random
    scores: np.ndarray = field(repr=False)           # (pop,) int32 with ties and int32 extremes (fitness, update)
    fitness: np.ndarray = field(repr=False)          # (pairs,) int8 in {-1, 0, 1} (votes)
    threshold: int                   # the update's vote threshold
    trajectory_epochs: int
    corpus: object = field(default=None, repr=False)  # rollout.corpus.Corpus for the trajectory (None: the shipped one)


def _rng(seed: int, tag: str) -> np.random.Generator:
    return np.random.default_rng([seed, zlib.crc32(tag.encode())])


def make_case(cfg: Int8Config, seed: int, trajectory_epochs: int, corpus=None) -> Case:
    """Fresh random inputs from the run's seed (same seed, same case): params, tokens, states, scores, fitness.

    The epoch is 3 (a later window than epoch 0, and a threshold > 0 in the trajectory's schedule); the traced
    members are the first pair and the last member; the update's threshold is the schedule's value at the end of its
    decay (alpha_e = 2^-alpha), where some entries move and most are held."""
    if not 1 <= trajectory_epochs <= cfg.epochs:
        raise ValueError(f"the trajectory runs 1..{cfg.epochs} epochs (the preset's), got {trajectory_epochs}")
    rng = _rng(seed, "int8-case")
    tree = int8_tree(cfg)
    params = {p: rng.integers(-127, 128, shape).astype(np.int8) for p, shape in tree.shapes.items()}
    tokens = rng.integers(1, 256, (cfg.pop, cfg.tokens_per_update + 1)).astype(np.uint8)
    tokens[np.arange(cfg.pop), rng.integers(1, cfg.tokens_per_update, cfg.pop)] = 0    # a state reset in every row
    states = rng.integers(-127, 128, (cfg.pop, cfg.n_layer, cfg.n_embd)).astype(np.int8)
    scores = rng.integers(-3, 4, cfg.pop).astype(np.int32) * rng.integers(1, 1000, cfg.pop).astype(np.int32)
    scores[:4] = [2 ** 31 - 1, -2 ** 31, 7, 7]                       # a wrapping difference, and a tie
    fitness = rng.integers(-1, 2, cfg.pairs).astype(np.int8)
    threshold = threshold_at(cfg.alpha_decay_timestep, cfg.alpha, cfg.alpha_decay_timestep)
    threads = tuple(sorted({0, 1, cfg.pop - 1}))
    return Case(cfg, seed, 3, threads, params, tokens, states, scores, fitness, threshold, trajectory_epochs, corpus)


def noise_pieces(per_member: list[dict], paths) -> Pieces:
    """noise.<path>.B and .A (low rank; the rank axis dropped) or .E (full rank), stacked over the traced members,
    from one {path: (A, B) or E} dict per member."""
    out: Pieces = {}
    for path in paths:
        values = [m[path] for m in per_member]
        if isinstance(values[0], tuple):
            out[f"noise.{path}.B"] = np.stack([np.asarray(v[1])[..., 0] for v in values])
            out[f"noise.{path}.A"] = np.stack([np.asarray(v[0])[..., 0] for v in values])
        else:
            out[f"noise.{path}.E"] = np.stack([np.asarray(v) for v in values])
    return out


# ----------------------------------------------------------------------------- comparison
class Parting(NamedTuple):
    """Where two sides part: the first differing piece in pipeline order and its first differing element."""

    piece: str
    element: str                     # e.g. "member 1, token 4, unit 2"
    reference: str                   # the reference's value there (or its shape, for a shape mismatch)
    side: str
    differing: int                   # elements that differ in the piece
    total: int

    def text(self) -> str:
        if self.element == "shape":
            return f"{self.piece}: shape {self.side} where the reference has {self.reference}"
        return (f"{self.piece} at [{self.element}]: {self.side} where the reference has {self.reference} "
                f"({self.differing} of {self.total} elements differ)")


def group(piece: str) -> str:
    return piece.split(".", 1)[0]


def _axis_names(piece: str, ndim: int) -> list[str]:
    """Names of a piece's axes, outermost first (a stacked `blocks.*` leaf has a layer axis after the members)."""
    g, rest = (piece.split(".", 1) + [""])[:2]
    if g == "trajectory":
        rest = rest.split(".", 1)[1]
        g = "scores" if rest == "scores" else "leaf"
    elif g in ("init", "votes", "update"):
        g = "leaf"
    layer = ["layer"] if rest.startswith("blocks.") else []
    lead = {"leaf": layer, "starts": ["member"] + layer, "noise": ["member"] + layer, "scores": ["member"],
            "states": ["member", "layer"], "fitness": ["pair"],
            "trace": {"state": ["member", "layer"], "score": ["member"]}.get(rest, ["member", "token"])}.get(g, [])
    left = ndim - len(lead)
    tail = ["entry"] * left if g == "noise" else {0: [], 1: ["unit"], 2: ["row", "col"]}.get(
        left, [f"axis {i}" for i in range(left)])
    return (lead + tail)[:ndim]


def element_text(piece: str, index: tuple[int, ...], members: tuple[int, ...]) -> str:
    names = _axis_names(piece, len(index))
    parts = []
    for name, i in zip(names, index):
        i = int(i)
        if name == "member" and group(piece) in ("noise", "trace"):
            i = members[i]                                  # the traced members are named by thread id
        parts.append(f"{name} {i}")
    return ", ".join(parts) or "scalar"


def first_parting(reference: Pieces, side: Pieces, members: tuple[int, ...] = ()) -> Parting | None:
    """The first piece (in the reference's order) where side differs, with its first differing element; None if
    every piece is equal. A piece the side lacks, or of another shape, parts there."""
    for piece, want in reference.items():
        got = side.get(piece)
        if got is None:
            return Parting(piece, "shape", str(tuple(np.shape(want))), "missing", 0, int(np.size(want)))
        want, got = np.asarray(want), np.asarray(got)
        if want.shape != got.shape:
            return Parting(piece, "shape", str(want.shape), str(got.shape), 0, int(want.size))
        differ = want != got
        if differ.any():
            index = tuple(np.argwhere(differ)[0])
            return Parting(piece, element_text(piece, index, members), str(want[index].item()),
                           str(got[index].item()), int(differ.sum()), int(want.size))
    return None


def equal_counts(reference: Pieces, side: Pieces) -> tuple[int, int]:
    """(pieces exactly equal, elements equal over all pieces of matching shape): how close two sides are."""
    pieces = elements = 0
    for piece, want in reference.items():
        got = side.get(piece)
        if got is None or np.shape(got) != np.shape(want):
            continue
        same = int(np.sum(np.asarray(want) == np.asarray(got)))
        elements += same
        pieces += same == np.size(want)
    return pieces, elements


def group_table(reference: Pieces, side: Pieces) -> dict[str, tuple[int, int]]:
    """{group: (pieces equal, pieces)} in GROUPS order."""
    out: dict[str, list[int]] = {}
    for piece, want in reference.items():
        got = side.get(piece)
        ok = got is not None and np.shape(got) == np.shape(want) and np.array_equal(want, got)
        tally = out.setdefault(group(piece), [0, 0])
        tally[0] += ok
        tally[1] += 1
    return {g: tuple(out[g]) for g in GROUPS if g in out}


# ----------------------------------------------------------------------------- naming a departure
class Naming(NamedTuple):
    """The knobs that reproduce a departing side exactly (exact=True), or the closest set found and what is left."""

    knobs: Int8Knobs
    exact: bool
    left: Parting | None             # where the best signature still parts from the side (None when exact)
    tried: int                       # signatures computed


def name_knobs(target: Pieces, signature: Callable[[Int8Knobs], Pieces], members: tuple[int, ...] = (),
               candidates: tuple[str, ...] = tuple(ALL_INT8_KNOBS), log: Callable[[str], None] = lambda s: None
               ) -> Naming:
    """The smallest knob set whose signature equals target at every piece: greedy forward (each step adds the knob
    that makes the most pieces, then elements, equal), then backward (a knob whose removal keeps equality is dropped,
    so every named knob is needed). signature(knobs) computes the pieces of the signature side with those knobs."""
    signature = functools.lru_cache(maxsize=None)(signature)
    chosen: dict[str, str] = {}
    best = equal_counts(target, signature(NANO_EGG))
    while first_parting(target, signature(NANO_EGG.replace(**chosen)), members) is not None:
        step = None
        for knob in candidates:
            if knob in chosen:
                continue
            trial = {**chosen, knob: ALL_INT8_KNOBS[knob].egg_c}
            score = equal_counts(target, signature(NANO_EGG.replace(**trial)))
            if score > best and (step is None or score > step[1]):
                step = (knob, score)
        if step is None:
            break
        chosen[step[0]] = ALL_INT8_KNOBS[step[0]].egg_c
        best = step[1]
        log(f"  signature search: + {step[0]}={chosen[step[0]]} ({best[0]} of {len(target)} pieces equal)")
    knobs = NANO_EGG.replace(**chosen)
    left = first_parting(target, signature(knobs), members)
    if left is None:
        for knob in list(chosen):
            trial = {k: v for k, v in chosen.items() if k != knob}
            if first_parting(target, signature(NANO_EGG.replace(**trial)), members) is None:
                chosen = trial
        knobs = NANO_EGG.replace(**chosen)
    return Naming(knobs, left is None, left, signature.cache_info().misses)
