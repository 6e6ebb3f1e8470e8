"""The C side of `python -m parity int8`: c_int8 (the project's C99 integer EGGROLL) computes every piece of a Case,
with any of egg.c's departures switched on (spec/int8_knobs.py) — so it is also the signature side that names a
departing side's knobs. The two 2^23-entry look-ups are handed in (from the reference; c_int8's module says why)."""
from __future__ import annotations

from typing import Callable

import numpy as np

from parity.int8.pieces import Case, Pieces, noise_pieces
from spec.int8 import LEAF_CLASSES, thresholds
from spec.int8_knobs import NANO_EGG, Int8Knobs, evolves

NAME = "C (c_int8, egg_int8.c)"


def unavailable_reason() -> str | None:
    """Why the C side cannot run here (no compiler, a failed build), or None."""
    import c_int8
    return c_int8.unavailable_reason()


class CSide:
    """c_int8.Int8C for one configuration, seed and knob setting."""

    def __init__(self, cfg, seed: int, lut: np.ndarray, init_lut: np.ndarray, knobs: Int8Knobs = NANO_EGG):
        import c_int8
        self.c_int8, self.cfg, self.seed, self.knobs = c_int8, cfg, seed, knobs
        self.lut, self.init_lut = lut, init_lut
        self.side = c_int8.Int8C(cfg, seed, lut, knobs)
        self.name = NAME + (f" with {', '.join(f'{k}={v}' for k, v in knobs.departures().items())}"
                            if knobs.departures() else "")

    def pieces(self, case: Case, log: Callable[[str], None] = lambda s: None) -> Pieces:
        c, cfg, paths = self.side, case.cfg, self.side.paths
        init = self.c_int8.init_params(cfg, case.seed, self.init_lut)
        out: Pieces = {f"init.{p}": init[p] for p in paths}
        starts = c.window_starts(case.epoch, np.arange(cfg.pop))
        out.update({f"starts.{p}": starts[p].astype(np.int64) for p in paths})
        noised = [p for p in paths if evolves(LEAF_CLASSES[p], self.knobs)]     # a frozen leaf draws no noise
        out.update(noise_pieces([c.member_noise(case.epoch, t) for t in case.threads], noised))
        traces = [c.member_trace(case.params, case.epoch, t, case.tokens[t], case.states[t]) for t in case.threads]
        for name in c.trace_names():
            out[f"trace.{name}"] = np.stack([tr[name] for tr, _, _ in traces])
        out["trace.state"] = np.stack([st for _, st, _ in traces])
        out["trace.score"] = np.array([score for _, _, score in traces], np.int32)
        out["scores"], out["states"] = c.population_scores(case.params, case.epoch, case.tokens, case.states)
        out["fitness"] = self.c_int8.fitness(case.scores)
        out.update({f"votes.{p}": z for p, z in c.votes(case.fitness, case.epoch).items()})
        new = c.update(case.params, case.scores, case.epoch, case.threshold)
        out.update({f"update.{p}": new[p] for p in paths})
        out.update(self.trajectory(case, init))
        return out

    def trajectory(self, case: Case, init: dict) -> Pieces:
        out: Pieces = {}

        def observe(epoch, result):
            out[f"trajectory.{epoch}.scores"] = result.scores
            out.update({f"trajectory.{epoch}.{p}": v for p, v in result.params.items()})
        assert len(thresholds(case.cfg)) >= case.trajectory_epochs
        self.c_int8.train_epochs(case.cfg, case.seed, self.lut, init, epochs=case.trajectory_epochs,
                                 corpus=case.corpus, observe=observe, knobs=self.knobs)
        return out
