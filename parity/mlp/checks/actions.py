"""Actions: given the same logits and uniforms, does the port choose the reference's action?

The reference samples by inverse CDF: action 1 when u >= p0 = softmax(logits)[0], p0 computed in float64
from the float32 logits. Logits: standard normal at several scales, exact ties and saturated values; uniforms
from the suite's own stream. Exact comparison, except where u lies within 1e-6 of p0, where a port computing
the softmax in float32 may round to the other side (those cases are counted, not judged). A port that picks
argmax(logits) and ignores its uniforms is named as actions=greedy.
"""
from __future__ import annotations

from typing import NamedTuple

import numpy as np

from parity.core import diagnose
from parity.core.verdict import Recorder, summarize
from rollout.episodes import greedy_actions, sample_actions

NAME = "actions"
BOUNDARY = 1e-6      # |u - p0| below this: float32 rounding of the softmax may decide (not judged)


class Measured(NamedTuple):
    cases: int
    judged: int                  # cases outside the float32 boundary band
    differ: int                  # judged cases where the port's action is not the reference's
    greedy_agreement: float      # share of all cases where the port's action is argmax(logits)
    first: str                   # the first differing case, in words


def _cases(ctx, n: int) -> tuple[np.ndarray, np.ndarray]:
    """(logits (n, 2) float32, u (n,) float32): normal logits at three scales, ties and saturated pairs."""
    rng = ctx.rng("actions")
    scale = np.repeat([0.3, 2.0, 10.0], -(-n // 3))[:n, None]
    logits = (rng.standard_normal((n, 2)) * scale).astype(np.float32)
    logits[: n // 10, 1] = logits[: n // 10, 0]                          # exact ties: p0 = 1/2
    logits[n // 10: n // 5] = np.float32([[30.0, -30.0]])                  # saturated: p0 ~ 1
    return logits, rng.random(n).astype(np.float32)


def measure(ctx) -> Measured:
    logits, u = _cases(ctx, 4 * ctx.cfg.pop)
    port = ctx.port.actions(logits, u)
    ref = sample_actions(logits, u)
    z = logits.astype(np.float64)
    p0 = 1.0 / (1.0 + np.exp(z[:, 1] - z[:, 0]))
    judged = np.abs(u - p0) >= BOUNDARY
    ctx.witness(f"n={len(u)}", port, port, ref, np.where(judged, 0.0, np.inf),
                "equal where u is farther than the float32 boundary band from softmax(logits)[0]; free inside it")
    wrong = np.flatnonzero(judged & (port != ref))
    first = ""
    if wrong.size:
        i = int(wrong[0])
        first = (f"logits {logits[i].tolist()} and u {float(u[i]):.6g} (p0 {p0[i]:.6g}): the port chose "
                 f"{int(port[i])}, the reference {int(ref[i])}")
    return Measured(len(u), int(judged.sum()), int(wrong.size), float(np.mean(port == greedy_actions(logits, u))),
                    first)


def judge(m: Measured) -> Recorder:
    rec = Recorder(NAME)
    if m.greedy_agreement == 1.0:
        cause = diagnose.cause("actions", "the port picks argmax(logits) whatever its uniforms (actions=greedy); the "
                                          "reference samples action 1 when u >= softmax(logits)[0]")
    else:
        cause = diagnose.other("action rule", f"the port's action differs from the reference's inverse-CDF sample "
                                              f"on {m.differ} of {m.judged} cases, e.g. {m.first}")
    size = f"{m.judged} of {m.cases} cases (|u - p0| >= {BOUNDARY:g})"
    rec.equal("actions differing from the reference's rule", "port", size, m.differ, 0,
              "exact outside the float32 boundary band", cause=cause)
    rec.info("share of actions equal to argmax(logits)", "port", f"{m.cases} cases", m.greedy_agreement,
             "a sampling port agrees only where the sample happens to be the likelier action")
    return rec


def section(m: Measured) -> str:
    return "\n".join([
        f"{m.cases} (logits, uniform) cases: normal logits at scales 0.3, 2 and 10, exact ties and saturated pairs. "
        "The reference's rule: action 1 when u >= p0 = softmax(logits)[0] (float64). Allowed: no differing action "
        f"where |u - p0| >= {BOUNDARY:g}; the {m.cases - m.judged} cases inside that band are not judged (a float32 "
        "softmax may round either way there). Exact, no false alarms.",
    ])


def run(ctx):
    m = measure(ctx)
    return summarize(NAME, judge(m), section(m))
