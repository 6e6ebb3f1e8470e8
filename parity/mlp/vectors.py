"""Conformance vectors for the CartPole suite: the reference's answers recorded to a bundle, replayed without JAX.

`record` runs the suite with the JAX reference on both sides, the reference side wrapped in a parity.core.tape
Recording: every call the checks make on it (noise, products, shaping, gradients, forwards along the lockstep
episodes, init, the ES loop, action uniforms) is stored under the key of its inputs, plus the calls only some
ports trigger (a dense port's larger noise draw); draws are stored as digests. `ReferenceReplay` stands in for
ReferencePort on `check --against`: recorded calls are answered from the bundle, draws by parity.core.numpy_random
checked against their digests, and the calls whose inputs come from the port (the reference optimizer on the
port's gradient from the port's parameters; everything at a shape the port declares) by parity.mlp.numpy_reference.
A call on a recorded ES state that the bundle does not hold, or a draw that fails its digest, raises
tape.NotRecorded, which the suite reports as a skipped check. Nothing here imports JAX except `record`, lazily.
"""
from __future__ import annotations

import dataclasses
import datetime
import json
from pathlib import Path
from typing import Any

import numpy as np

from parity.core import tape
from parity.mlp.adapter import CheckedPort
from parity.core.port import UsageError
from parity.mlp.numpy_reference import NumpyReference
from spec.config import Config
from spec.knobs import RunSettings
from spec.platform import ReferencePlatform, recorded_platform

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


# ---------------------------------------------------------------- recording (needs JAX)
class RecordingReference(tape.Recording):
    """A ReferencePort whose RECORDED calls go to a shared store; with_run_knobs gives a recorded candidate."""

    def __init__(self, reference, store: tape.Store | None = None, objects: list | None = None):
        super().__init__(reference, RECORDED, store, scope(reference.cfg, reference.run), objects)

    def with_run_knobs(self, **changes) -> "RecordingReference":
        return RecordingReference(self._target.with_run_knobs(**changes), self.store, self._objects)


def _extra_calls(ref: CheckedPort, sizes, seed: int) -> None:
    """The reference calls some ports trigger and the reference as a port does not: a dense port's noise check
    draws dense.population(shapes) members."""
    from parity.mlp.checks import dense
    from parity.mlp.suite import param_shapes

    shapes, cfg = param_shapes(sizes.cfg), sizes.cfg
    pop = dense.population(shapes)
    ref.noise(shapes, seed, 0, np.arange(pop), pop, cfg.sigma, cfg.rank)


def record(sizes, seed: int, checks, log=lambda line: None,
           platform: ReferencePlatform | None = None) -> tuple[tape.Store, list]:
    """Run the suite with the JAX reference on both sides, the reference side recorded; (store, results). The
    recorded side runs on `platform` (default where JAX runs); the other is the same reference at float32
    (highest), so a TF32 platform's recording checks itself against its own float32 products."""
    from parity.mlp.reference_port import ReferencePort
    from parity.mlp.suite import run_suite

    recorder = RecordingReference(ReferencePort(sizes.cfg, platform=platform))
    exact = (recorder.platform.replace(precision_requested="highest", precision="float32") if recorder.platform.tf32
             else recorder.platform)
    results = run_suite(ReferencePort(sizes.cfg, platform=exact), sizes, seed, checks=checks, log=log,
                        reference=recorder)
    _extra_calls(CheckedPort(recorder), sizes, seed)
    return digested(recorder.store), results


def recording_manifest(sizes, seed: int, checks, command: str, platform: ReferencePlatform | None = None) -> dict:
    """What a bundle says about itself besides its calls: task, size, seed, sizes, run settings, versions, device
    and the reference's platform (spec.platform's fields, which `check --against` takes as the reference's)."""
    from parity.mlp.reference_port import backend_info
    from reporting import versions

    return {"task": TASK, "size": sizes.name, "seed": int(seed), "checks": list(checks),
            "sizes": sizes_record(sizes), "run": dataclasses.asdict(RunSettings()), "command": command,
            "draws": f"the outputs of {', '.join(DRAWN)} as the sha256 of their bytes (parity.core.numpy_random redraws "
                     "them on replay)",
            "versions": versions(("jax", "jaxlib", "optax", "numpy")), **backend_info(platform),
            "recorded": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")}


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
    from parity.mlp.suite import SIZES

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


# ---------------------------------------------------------------- python -m parity record
def _record_parser():
    import argparse

    from parity.mlp.suite import SIZES
    from spec.limits import device_arg, seed_arg
    from spec.platform import add_reference_flags

    class Parser(argparse.ArgumentParser):
        def error(self, message: str):
            raise UsageError(f"{message}\n\n{self.format_usage().strip()}")

    p = Parser(prog="python -m parity record",
               description="Record the JAX reference's answers to every call of the parity suite as a bundle "
                           "(arrays.npz + manifest.json) that `python -m parity check --against BUNDLE` replays "
                           "without JAX.")
    p.add_argument("--task", choices=("cartpole", "lm", "tree"), default="cartpole",
                   help="which suite (default cartpole; tree: a port's own declared tree, with --port)")
    p.add_argument("--port", metavar="MODULE:ATTR", help="--task tree: the port whose declared tree and settings "
                                                         "the bundle is recorded for (e.g. examples.gpt_adapter:GPTAdapter)")
    p.add_argument("--size", default="quick", help=f"the suite's size: {', '.join(sorted(SIZES))} for cartpole, "
                                                   "quick or selftest for lm and tree (default quick)")
    p.add_argument("--seed", type=seed_arg, default=0, help="run seed in [0, 2**32 - 1] (default 0)")
    p.add_argument("--out", required=True, help="the bundle folder to write (e.g. runs/vectors/cartpole-quick)")
    p.add_argument("--device", type=device_arg, default=None,
                   help="where the JAX reference records: cpu (JAX's CPU) or cuda / cuda:N (JAX's GPU); default: "
                        "--reference-platform decides (auto: where JAX runs)")
    add_reference_flags(p)
    p.add_argument("--quiet", action="store_true", help="no progress lines")
    return p


def _record_tree(args, platform: ReferencePlatform) -> int:
    """`record --task tree --port X`: the port's tree and settings checked before any work (UsageError, exit 2)."""
    from parity import tree_vectors
    log = (lambda line: None) if args.quiet else (lambda line: print(line, flush=True))
    written = tree_vectors.record_tree(args.port, args.size, args.seed, Path(args.out), log, platform)
    size = sum(p.stat().st_size for p in Path(written).iterdir())
    print(f"parity record: wrote {written} ({size / 1e6:.2f} MB)")
    return 0


def record_platform(args) -> ReferencePlatform:
    """The platform the bundle is recorded on, from --device and the reference flags (UsageError, exit 2, for a
    contradiction or a CUDA device JAX does not see), before any work."""
    from parity.mlp.reference_port import PlatformError, platform_for
    from spec.limits import cuda_missing
    from spec.platform import PlatformRequest, request_of

    request = request_of(args)
    cuda = (args.device or "").startswith("cuda")
    if args.device and request.platform != "auto" and (cuda or request.platform == "gpu-sim"):
        raise UsageError(f"--device {args.device} with --reference-platform {request.platform}: one place to record; "
                         "give one of them (--device cuda records on JAX's GPU, gpu-sim simulates one on the CPU)")
    if args.device == "cpu":
        request = PlatformRequest("cpu", request.precision)
    try:
        return platform_for(request, gpu=cuda)
    except PlatformError:
        raise UsageError(cuda_missing(args.device, " (JAX sees no GPU: install jax[cuda])")) from None


def record_main(argv: list[str]) -> int:
    """`python -m parity record`: exit 0 with the bundle written, 2 on bad usage (nothing written)."""
    import sys

    from parity.mlp.suite import CHECKS, SIZES
    from spec.limits import check_out_dir

    try:
        args = _record_parser().parse_args(argv)
        check_out_dir(args.out)
        platform = record_platform(args)
        if args.task == "cartpole" and args.size not in SIZES:
            raise UsageError(f"--size {args.size}: unknown; known: {', '.join(sorted(SIZES))}")
        if args.task == "lm":
            from parity.tree_vectors import lm_sizes
            if args.size not in lm_sizes():
                raise UsageError(f"--task lm --size {args.size}: unknown; the LM suite's sizes: "
                                 f"{', '.join(lm_sizes())}")
        if (args.task == "tree") != bool(args.port):
            raise UsageError("--port goes with --task tree: the bundle is recorded for the port's declared tree "
                             "(e.g. --task tree --port examples.gpt_adapter:GPTAdapter)")
        if args.task == "tree":
            return _record_tree(args, platform)
    except ValueError as err:       # UsageError and the limits' errors
        print(f"parity record: {err}", file=sys.stderr)
        return 2
    log = (lambda line: None) if args.quiet else (lambda line: print(line, flush=True))
    if args.task == "lm":
        from parity import tree_vectors

        written = tree_vectors.record_lm(args.size, args.seed, Path(args.out), log, platform,
                                         tree_vectors.faithful_knobs(platform))
    else:
        sizes = SIZES[args.size]
        command = "python -m parity record " + " ".join(argv)
        store, results = record(sizes, args.seed, CHECKS, log, platform)
        bad = [r.name for r in results if r.verdict != "pass"]
        if bad:
            print(f"parity record: the reference against itself did not pass {', '.join(bad)}; the bundle records "
                  "what it computed all the same", file=sys.stderr)
        written = tape.write_bundle(args.out, store, recording_manifest(sizes, args.seed, CHECKS, command, platform))
    size = sum(p.stat().st_size for p in Path(written).iterdir())
    print(f"parity record: wrote {written} ({size / 1e6:.2f} MB)")
    return 0
