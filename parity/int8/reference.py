"""The JAX side of `python -m parity int8`: jax_reference.int8 (nano-egg's QEggRoll) computes every piece of a Case.

Also the source of the two 2^23-entry look-ups the C side is handed (its module says why): the int8 noise LUT and
nano-egg's init LUT round(normal * 16), both from JAX's own float32 normal of every 23-bit pattern.
"""
from __future__ import annotations

from typing import Callable

import numpy as np

from parity.int8.pieces import Case, Pieces, noise_pieces
from spec.platform import ReferencePlatform
from spec.tree import nest

NAME = "JAX (jax_reference.int8)"


def _flat(tree) -> dict:
    """{dotted path: np.ndarray} in flatten order (jax_reference.population.params_to_flat, imported when a check
    runs: this module imports no JAX until then)."""
    from jax_reference.population import params_to_flat
    return params_to_flat(tree)


def _flat_noise(noise) -> dict:
    """{path: (A, B) or E} from member_noise's nested tree (tuples are leaves here)."""
    out = {}

    def walk(node, prefix):
        for k, v in node.items():
            if isinstance(v, dict):
                walk(v, f"{prefix}{k}.")
            else:
                out[f"{prefix}{k}"] = tuple(np.asarray(x) for x in v) if isinstance(v, tuple) else np.asarray(v)
    walk(noise, "")
    return out


def _scope(platform: ReferencePlatform | None):
    import contextlib
    if platform is None:
        return contextlib.nullcontext()
    from jax_reference.platform import scope
    return scope(platform)


def lookups(platform: ReferencePlatform | None = None) -> tuple[np.ndarray, np.ndarray]:
    """(noise LUT int8(normal * 16), init LUT round(normal * 16)), each (2^23,) int8, from JAX's own normals (those
    of `platform`'s backend: gpu-sim's are the GPU's)."""
    from jax_reference.int8 import model as q
    with _scope(platform):
        return np.asarray(q.normal_lut()), np.asarray(q.init_lut())


def lookups_differ(platform: ReferencePlatform) -> tuple[int, int]:
    """Entries of the two look-ups where `platform`'s normals give other int8 values than JAX's CPU normals."""
    cpu = platform.replace(normals="cpu")
    return tuple(int(np.sum(a != b)) for a, b in zip(lookups(platform), lookups(cpu)))


class ReferenceSide:
    """jax_reference.int8 for one configuration and seed, on `platform` (its normals: the look-up and the init;
    its products are integer, exact under any matmul precision)."""

    name = NAME

    def __init__(self, cfg, seed: int, platform: ReferencePlatform | None = None):
        from jax_reference.int8 import model as q
        from parity.core import platform as core_platform
        core_platform.enable_compile_cache()          # its compiles kept on disk for the next run
        self.q, self.cfg, self.seed, self.platform = q, cfg, seed, platform
        with _scope(platform):
            self.init = q.init_int8(cfg, seed)
            self.frozen, self.nparams = q.QEggRoll.init_noiser(self.init.params, cfg.sigma_shift, 0, noise_seed=seed,
                                                               noise_reuse=cfg.noise_reuse, rank=cfg.rank,
                                                               use_clt=cfg.use_clt, fast_fitness=cfg.fast_fitness)
        self.paths = list(_flat(self.init.params))

    def pieces(self, case: Case, log: Callable[[str], None] = lambda s: None) -> Pieces:
        with _scope(self.platform):
            return self._pieces(case)

    def _pieces(self, case: Case) -> Pieces:
        import jax.numpy as jnp
        q, init, cfg = self.q, self.init, case.cfg
        out: Pieces = {f"init.{p}": v for p, v in _flat(init.params).items()}
        starts = _flat(q.window_starts(self.frozen, init.params, init.es_tree_key, case.epoch,
                                       np.arange(cfg.pop), init.es_map))
        out.update({f"starts.{p}": starts[p].astype(np.int64) for p in self.paths})
        per_member = [_flat_noise(q.member_noise(self.nparams, self.frozen, init.params, init.es_tree_key,
                                                 init.es_map, (jnp.int32(case.epoch), jnp.int32(t))))
                      for t in case.threads]
        out.update(noise_pieces(per_member, self.paths))
        params = nest({p: jnp.asarray(v) for p, v in case.params.items()})
        traces = []
        for t in case.threads:
            trace, state = q.member_trace(q.QEggRoll, self.frozen, self.nparams, params, init.es_tree_key,
                                          (jnp.int32(case.epoch), jnp.int32(t)),
                                          jnp.asarray(case.tokens[t, :-1].astype(np.int32)),
                                          jnp.asarray(case.tokens[t, 1:].astype(np.int32)),
                                          jnp.asarray(case.states[t]))
            traces.append(({k: np.asarray(v) for k, v in trace.items()}, np.asarray(state)))
        for name in q.trace_names(cfg.n_layer):
            out[f"trace.{name}"] = np.stack([tr[name] for tr, _ in traces])
        out["trace.state"] = np.stack([st for _, st in traces])
        out["trace.score"] = np.stack([np.sum(tr["ll"].astype(np.int64)).astype(np.int32) for tr, _ in traces])
        scores, states = q.population_scores(self.frozen, self.nparams, params, init.es_tree_key, init.es_map,
                                             case.epoch, case.tokens, case.states)
        out["scores"], out["states"] = np.asarray(scores), np.asarray(states)
        out["fitness"] = np.asarray(q.QEggRoll.convert_fitnesses({}, {}, jnp.asarray(case.scores)))
        out.update(self._votes(case))
        nparams = dict(self.nparams, update_threshold=jnp.int32(case.threshold))
        new = _flat(q.update(self.frozen, nparams, params, init.es_tree_key, init.es_map, case.scores, case.epoch))
        out.update({f"update.{p}": new[p] for p in self.paths})
        out.update(self.trajectory(case))
        return out

    def _votes(self, case: Case) -> Pieces:
        """votes.<leaf>: Z of every leaf (slices stacked) from the case's fitness signs, by q.tree_votes (one
        program for the tree)."""
        q, init = self.q, self.init
        votes = _flat(q.tree_votes(self.frozen, self.nparams, init.params, init.es_tree_key, init.es_map,
                                   case.fitness, case.epoch))
        return {f"votes.{path}": votes[path] for path in self.paths}

    def trajectory(self, case: Case) -> Pieces:
        from jax_reference.int8.train import train_int8
        out: Pieces = {}

        def observe(epoch, scores, params):
            out[f"trajectory.{epoch}.scores"] = np.asarray(scores)
            out.update({f"trajectory.{epoch}.{p}": v for p, v in _flat(params).items()})
        train_int8(case.cfg.replace(epochs=case.trajectory_epochs), case.seed, case.corpus, progress=False,
                   observe=observe, validate=False)
        return out
