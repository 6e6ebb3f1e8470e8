"""Conformance vectors for the CartPole suite: the reference's answers recorded to a bundle, replayed without JAX.

`record` (parity.mlp.recording) runs the suite with the JAX reference on both sides, the reference side wrapped
in a parity.core.tape Recording: every call the checks make on it (noise, products, shaping, gradients, forwards
along the lockstep episodes, init, the ES loop, action uniforms) is stored under the key of its inputs, plus the
calls only some ports trigger (a dense port's larger noise draw); draws are stored as digests. `ReferenceReplay` stands in for
ReferencePort on `check --against`: recorded calls are answered from the bundle, draws by parity.core.numpy_random
checked against their digests, and the calls whose inputs come from the port (the reference optimizer on the
port's gradient from the port's parameters; everything at a shape the port declares) by parity.mlp.numpy_reference.
A call on a recorded ES state that the bundle does not hold, or a draw that fails its digest, raises
tape.NotRecorded, which the suite reports as a skipped check. Nothing here imports JAX.
"""
from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import numpy as np

from parity.core import tape
from parity.core.port import UsageError
from parity.mlp.numpy_reference import NumpyReference
from spec.config import Config
from spec.knobs import RunSettings
from spec.platform import recorded_platform

TASK = "cartpole"
# ReferencePort methods whose answers a bundle holds (keyed by their inputs).
RECORDED = ("noise", "perturbed_linear", "shape_fitness", "gradient", "rejects_nonfinite", "forward", "init_params",
            "es_init", "es_ask", "es_tell", "es_params", "action_uniforms")
# The reference's draws: the bundle keeps a digest of each (the draws are most of the bytes: ~40 MB at the quick
# size); the replay draws them with parity.core.numpy_random and checks each against its digest, bit for bit.
DRAWN = ("noise", "es_ask", "action_uniforms", "init_params")
DIGEST = "sha256"


def digest(value: Any) -> dict:
    """What a bundle keeps of a draw: the sha256 of its canonical bytes (dtype, shape and values of each array)."""
    return {DIGEST: tape.call_key("draw", (value,))}


def digested(store: tape.Store) -> tape.Store:
    """The store with each DRAWN call's output replaced by its digest."""
    out = tape.Store()
    for key, value in store.outputs.items():
        method = store.methods[key]
        out.put(method, key, digest(value) if method in DRAWN and not isinstance(value, tape.Raised) else value)
    return out


REGENERATE = "make vectors (python -m parity record --task cartpole --size quick --out vectors/cartpole-quick)"


def scope(cfg: Config, run: RunSettings) -> str:
    """The key scope of a reference configured by (cfg, run): a call under other run knobs is another call."""
    return json.dumps({"cfg": dataclasses.asdict(cfg), "run": dataclasses.asdict(run)}, sort_keys=True)


# ---------------------------------------------------------------- replay (numpy only)
class ReferenceReplay(tape.Replay):
    """ReferencePort's surface answered from a bundle; numpy_reference for what the port's outputs feed, and for
    the draws (each checked against the bundle's digest of the reference's own)."""

    jax_compatible_rng = True
    name = "jax_reference (from bundle)"

    def __init__(self, bundle: tape.Bundle, cfg: Config, run: RunSettings | None = None):
        run = run or RunSettings()
        platform = recorded_platform(bundle.manifest)
        self._numpy = NumpyReference(cfg, run, platform.normals)
        super().__init__(bundle.store, RECORDED, scope(cfg, run), fallback=self._numpy,
                         attributes={"cfg": cfg, "run": run, "platform": platform})
        self.bundle = bundle
        self._es: dict[int, tuple[dict, int]] = {}       # ES state token -> (shapes, seed)
        self.verified = 0                                # draws checked against their digest

    def with_run_knobs(self, **changes) -> "ReferenceReplay":
        return ReferenceReplay(self.bundle, self.cfg, self.run.replace(**changes))

    def _drawn(self, method: str, args: tuple, value):
        """numpy's draw, checked against the bundle's digest of the reference's when it holds the call."""
        recorded = self._store.outputs.get(tape.call_key(method, args, {}, self._scope))
        if isinstance(recorded, dict) and DIGEST in recorded:
            if digest(value)[DIGEST] != recorded[DIGEST]:
                raise tape.NotRecorded(method, "the numpy draw differs from the reference's recorded digest (a "
                                               "generator mismatch: report it); run this check live")
            self.verified += 1
        else:
            self.misses.append(method)
        return value

    def noise(self, shapes, seed, epoch, members, pop, sigma, rank):
        return self._drawn("noise", (shapes, seed, epoch, members, pop, sigma, rank),
                           self._numpy.noise(shapes, seed, epoch, members, pop, sigma, rank))

    def init_params(self, shapes, seed):
        return self._drawn("init_params", (shapes, seed), self._numpy.init_params(shapes, seed))

    def action_uniforms(self, seed, epoch, pop):
        return self._drawn("action_uniforms", (seed, epoch, pop), self._numpy.action_uniforms(seed, epoch, pop))

    def _recorded(self, method: str, args: tuple):
        """The bundle's answer to a call on a recorded ES state (a Token), or NotRecorded."""
        key = tape.call_key(method, args, {}, self._scope)
        if key not in self._store.outputs:
            raise tape.NotRecorded(method, f"the bundle holds no {method} call on its ES state with these inputs")
        return tape.Replay.__getattr__(self, method)(*args)

    # The ES loop: the recorded run (Token states) where the bundle holds es_init's call, else numpy_reference's.
    def es_init(self, params, seed):
        state = tape.Replay.__getattr__(self, "es_init")(params, seed)     # a miss: numpy's ESState
        if isinstance(state, tape.Token):
            self._es[state.n] = ({k: v.shape for k, v in params.items()}, int(seed))
        return state

    def es_tell(self, state, noise, fitness, epoch):
        if not isinstance(state, tape.Token):
            return self._numpy.es_tell(state, noise, fitness, epoch)
        new = self._recorded("es_tell", (state, noise, fitness, epoch))
        self._es[new.n] = self._es[state.n]
        return new

    def es_params(self, state):
        if not isinstance(state, tape.Token):
            return self._numpy.es_params(state)
        return self._recorded("es_params", (state,))

    def es_ask(self, state, epoch):
        if not isinstance(state, tape.Token):
            return self._numpy.es_ask(state, epoch)
        if state.n not in self._es:
            raise tape.NotRecorded("es_ask", "an ES state the bundle did not start")
        shapes, seed = self._es[state.n]
        pop = self.cfg.pop
        return self._drawn("es_ask", (state, epoch), self._numpy.noise(
            shapes, seed, epoch, np.arange(pop), pop, self._numpy.sigma_at(epoch), self.cfg.rank))


def sizes_record(sizes) -> dict:
    """The Sizes as the manifest stores them (JSON: tuples as lists)."""
    return json.loads(json.dumps(dataclasses.asdict(sizes), default=list))


def _same_sizes(folder, manifest: dict) -> None:
    """UsageError when this harness's sizes of that name are not the ones the bundle was recorded at."""
    from parity.mlp.sizes import SIZES

    name = manifest.get("size")
    if name in SIZES and sizes_record(SIZES[name]) == manifest.get("sizes"):
        return
    what = "unknown here" if name not in SIZES else "defined with other populations, epochs or shapes here"
    raise UsageError(f"bundle {folder}: recorded at size {name!r} as another version of the harness defined it "
                     f"({name!r} is {what}); regenerate it: python -m parity record --task cartpole --size {name} "
                     "--out BUNDLE (make vectors for the committed one)")


def open_bundle(folder: Path | str, size: str | None = None, seed: int | None = None) -> tape.Bundle:
    """The CartPole bundle in `folder`, checked whole and against the --size and --seed given (None: the
    bundle's); UsageError (exit 2) for a bad bundle or one of another task, size or seed."""
    bundle = tape.read_bundle(folder, REGENERATE)
    tape.check_holds(bundle, TASK, size, seed, "vectors/cartpole-quick",
                     lambda s, e: f"python -m parity record --task cartpole --size {s} --seed {e} --out BUNDLE")
    _same_sizes(folder, bundle.manifest)
    return bundle


def describe(bundle: tape.Bundle) -> str:
    """The report's line on where the reference side came from."""
    return (f"recorded {tape.recording_of(bundle)}; draws by parity.core.numpy_random, each checked against the bundle's "
            "digest; calls whose inputs came from the port computed by parity.mlp.numpy_reference")


