"""Recording the CartPole suite's conformance vectors (needs JAX): the suite with the JAX reference on both sides,
the reference side wrapped in a parity.core.tape Recording, and the bundle's manifest. The replay is
parity.mlp.vectors (numpy only); `python -m parity record` (parity/record.py) writes the bundle.
"""
from __future__ import annotations

import dataclasses
import datetime

import numpy as np

from parity.core import tape
from parity.mlp.adapter import CheckedPort
from parity.mlp.vectors import DRAWN, RECORDED, TASK, digested, scope, sizes_record
from spec.knobs import RunSettings
from spec.platform import ReferencePlatform


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
    from parity.mlp.reference import ReferencePort
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
    from parity.mlp.reference import backend_info
    from reporting import versions, xla_flags

    return {"task": TASK, "size": sizes.name, "seed": int(seed), "checks": list(checks),
            "sizes": sizes_record(sizes), "run": dataclasses.asdict(RunSettings()), "command": command,
            "draws": f"the outputs of {', '.join(DRAWN)} as the sha256 of their bytes (parity.core.numpy_random redraws "
                     "them on replay)",
            "versions": versions(("jax", "jaxlib", "optax", "numpy")), "xla_flags": xla_flags(),
            **backend_info(platform),
            "recorded": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")}
