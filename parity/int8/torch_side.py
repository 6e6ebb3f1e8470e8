"""The torch side of `python -m parity int8`: torch_impl's int8 port computes every piece of a Case, with the knobs
given (spec/int8_knobs.py; nano-egg's by default). The whole population runs in each batched call; the traced
members' noise and intermediates are read out of it."""
from __future__ import annotations

from typing import Callable

import numpy as np

from parity.int8.pieces import Case, Pieces
from spec.int8_knobs import NANO_EGG, Int8Knobs

NAME = "torch (torch_impl int8 port)"


def _np(t) -> np.ndarray:
    """A tensor as numpy, from whatever device it is on."""
    return t.cpu().numpy()


class TorchSide:
    """torch_impl.int8_* for one configuration, seed and knob setting, on `device` (one CPU thread)."""

    def __init__(self, cfg, seed: int, knobs: Int8Knobs = NANO_EGG, device: str = "cpu"):
        self.cfg, self.seed, self.knobs, self.device = cfg, seed, knobs, device
        self.name = NAME + (f" with {', '.join(f'{k}={v}' for k, v in knobs.departures().items())}"
                            if knobs.departures() else "")

    def pieces(self, case: Case, log: Callable[[str], None] = lambda s: None) -> Pieces:
        import torch
        from torch_impl.int8 import es as int8_es, model as tm, noise as tn
        from torch_impl.train import intra_op_threads
        cfg = case.cfg
        dev = torch.device(self.device)
        with intra_op_threads(1), torch.inference_mode():
            es = int8_es.make(cfg, self.knobs)
            state = int8_es.init(es, case.seed, self.device)
            out: Pieces = {f"init.{p}": _np(v) for p, v in state.params.items()}
            paths = list(state.params)
            starts = tn.window_starts(es.tree, state.keys, case.epoch, np.arange(cfg.pop), cfg.noise_reuse)
            out.update({f"starts.{p}": _np(starts[p]) for p in paths})
            noise, _ = int8_es.ask(es, state._replace(epoch=case.epoch))
            members = tn.member_view(noise, cfg.pop)
            threads = list(case.threads)
            for p in paths:
                if p not in members.E and p not in members.A:          # a leaf that does not evolve: no noise
                    continue
                if p in members.E:
                    out[f"noise.{p}.E"] = _np(members.E[p][threads])
                else:
                    out[f"noise.{p}.B"] = _np(members.B[p][threads])
                    out[f"noise.{p}.A"] = _np(members.A[p][threads])
            params = {p: torch.from_numpy(v).to(dev) for p, v in case.params.items()}
            tokens = torch.from_numpy(case.tokens.astype(np.int64)).to(dev)
            scores, states, trace = tm.scores(params, members, tokens, torch.from_numpy(case.states).to(dev),
                                              cfg.sigma_shift, trace=True, knobs=self.knobs)
            for name in tm.trace_names(cfg.n_layer):
                out[f"trace.{name}"] = _np(trace[name][threads])
            out["trace.state"] = _np(states[threads])
            out["trace.score"] = _np(scores[threads])
            out["scores"], out["states"] = _np(scores), _np(states)
            out["fitness"] = _np(int8_es.fitness(torch.from_numpy(case.scores).to(dev)))
            votes = int8_es.leaf_votes(es.tree, noise, torch.from_numpy(case.fitness).to(dev), cfg.use_clt)
            out.update({f"votes.{p}": _np(votes[p]) for p in paths})
            Z = int8_es.leaf_votes(es.tree, noise, int8_es.fitness(torch.from_numpy(case.scores).to(dev)), cfg.use_clt)
            new = int8_es.update(es, params, Z, case.threshold)
            out.update({f"update.{p}": _np(new[p]) for p in paths})
        out.update(self.trajectory(case))
        return out

    def trajectory(self, case: Case) -> Pieces:
        from torch_impl.int8.train import train_int8
        out: Pieces = {}

        def observe(epoch, scores, params, info):
            out[f"trajectory.{epoch}.scores"] = _np(scores)
            out.update({f"trajectory.{epoch}.{p}": _np(v) for p, v in params.items()})
        train_int8(case.cfg.replace(epochs=case.trajectory_epochs), case.seed, case.corpus, progress=False,
                   observe=observe, knobs=self.knobs, device=self.device, validate=False)
        return out
