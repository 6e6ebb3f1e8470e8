"""The LM suite's conformance vectors: the JAX reference's answers to `check --task lm` at one (size, seed), recorded
into a bundle (parity.core.tape) and replayed without JAX (`check --task lm --against BUNDLE`).

The checks reach the reference only through parity/tree/reference.py's functions. Each call is one of two kinds:
- inputs fixed by (size, seed) alone, recorded: `init`, `draws` (JAX's normals of every perturbed leaf at both epochs,
  under the faithful key scheme and the two drifted ones the noise check names: shared slice keys, declaration-order
  keys), `shape` and `grads` (on fitness from the suite's own seeded stream), `product` (fresh seeded factors),
  `scores` (the forward on seeded params) and `epoch_step` (the lockstep trajectory from the reference's init);
- inputs that come from the port (the update on the port's gradient; in distribution the forward, shaping, gradient
  and step on the port's own noise): answered by parity.tree.numpy_reference, the same math in numpy.
dense_noise and factors_abs_product are numpy on the recorded draws (a fraction of the bytes of the dense noise). A
recorded call whose inputs differ on replay (e.g. a port without `update` leaves the seeded stream elsewhere) goes to
numpy where numpy can answer it and is otherwise skipped with the reason (parity.core.tape.NotRecorded).
"""
from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

from parity.core.port import UsageError
from parity.core.tape import Bundle, Recording, Replay, Store, check_holds, read_bundle, write_bundle
from parity.tree import check as tree_check
from parity.tree.base import EPOCHS, follow_reference_rng
from parity.tree.lockstep import reference_draws
from parity.tree.numpy_reference import NumpyTreeReference, perturbs
from spec.lm import LMConfig, lm_tree
from spec.platform import ReferencePlatform, recorded_platform
from spec.tree_knobs import TreeKnobs

TASK = "lm"
RECORDED = ("init", "draws", "shape", "grads", "product", "scores", "epoch_step")
VERSIONS = ("jax", "jaxlib", "numpy", "scipy", "torch")


def regenerate(size: str = "quick", seed: int = 0, out: str = "vectors/lm-quick") -> str:
    return f"python -m parity record --task lm --size {size}" + (f" --seed {seed}" if seed else "") + f" --out {out}"


class LMReference:
    """tree_reference's surface: the RECORDED functions from `source` (a Recording of tree_reference, or a Replay of a
    bundle falling back to numpy), everything else from `numpy` (a NumpyTreeReference on source's draws); `platform`
    where the reference ran (recorded: the bundle's manifest); `live`, while recording, the reference itself (what a
    TF32 platform's checks evaluate at float32, unrecorded)."""

    def __init__(self, source: Any, numpy: NumpyTreeReference, recorded: tuple[str, ...] = RECORDED,
                 platform: ReferencePlatform | None = None, live: Any = None):
        self.source, self.numpy, self.recorded = source, numpy, recorded
        self.platform, self.live = platform or ReferencePlatform(), live

    def float32(self):
        """The live reference at float32 while recording; a replay has none (tree_check skips what needs it)."""
        from parity.core.tape import NotRecorded
        if self.live is None:
            raise NotRecorded("float32", "a TF32 reference replayed from a bundle cannot be evaluated at float32, "
                                         "which bounds its own rounding here; record the bundle with "
                                         "--reference-precision highest, or check against the live reference")
        return self.live.float32()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.source if name in self.recorded else self.numpy, name)

    @property
    def misses(self) -> list[str]:
        """Recorded functions the bundle could not answer (their inputs came from the port), answered by numpy."""
        return list(getattr(self.source, "misses", []))


def recording_reference(store: Store, platform: ReferencePlatform | None = None) -> LMReference:
    """The live reference on `platform`, every RECORDED call stored in `store`; noise as the replay will compute it."""
    from parity.tree import reference as tree_reference
    live = tree_reference.on_platform(platform)
    source = Recording(live, RECORDED, store)
    return LMReference(source, NumpyTreeReference(source.draws), platform=live.platform, live=live)


def replay_reference(bundle: Bundle) -> LMReference:
    """The reference from a bundle alone (no JAX): recorded calls by key, the rest in numpy."""
    numpy = NumpyTreeReference(Replay(bundle.store, ("draws",)).draws)
    return LMReference(Replay(bundle.store, RECORDED, fallback=numpy), numpy,
                       platform=recorded_platform(bundle.manifest))


def drift_variants(leaf) -> tuple[str, ...]:
    """The draws the noise check compares a departing leaf with to name a knob (tmm_transposed reuses the faithful
    draws): shared slice keys (stacked leaves), declaration-order keys (every leaf)."""
    return ("faithful",) + (("shared",) if leaf.scan_axes else ()) + ("insertion",)


def config_record(cfg: LMConfig) -> dict:
    """The configuration as the manifest stores it (JSON values)."""
    return json.loads(json.dumps(dataclasses.asdict(cfg)))


def faithful_knobs(platform: ReferencePlatform) -> TreeKnobs:
    """The faithful tree side that drives a recording: rng following the reference's normals where the knob has
    per-backend values (jax-cpu, jax-gpu)."""
    return follow_reference_rng(TreeKnobs(), platform)[0]


def lm_sizes() -> dict[str, LMConfig]:
    return tree_check.sizes()


def record_lm(size: str, seed: int, out: Path, log=lambda line: None, platform: ReferencePlatform | None = None,
              knobs: TreeKnobs = TreeKnobs()) -> Path:
    """Record the reference's answers to every LM check at (size, seed) into the bundle folder `out` (written
    atomically), the reference on `platform` (default where JAX runs); the checks are driven by the faithful torch
    side (`knobs`: its rng following the reference's normals), which must pass them all (else nothing is written: a
    recording the faithful side fails would hold a wrong reference)."""
    from reporting import cpu_name, versions, xla_flags
    sizes = lm_sizes()
    if size not in sizes:
        raise UsageError(f"--task lm --size {size!r}: the LM suite's sizes are {', '.join(sizes)}")
    cfg, store = sizes[size], Store()
    ref = recording_reference(store, platform)
    rows = tree_check.run(cfg, knobs, seed, log, reference=ref)              # side: torch_impl, faithful
    failed = [f"{r.check}: {r.quantity}: {r.cause}" for r in rows if r.verdict != "pass"]
    if failed:
        raise RuntimeError("the faithful torch side did not pass every LM check while recording, so no bundle was "
                           "written:\n  " + "\n  ".join(failed))
    for epoch in EPOCHS:
        for leaf in lm_tree(cfg).leaves:
            if perturbs(cfg, leaf):
                for variant in drift_variants(leaf):
                    ref.draws(cfg, seed, epoch, leaf, variant)
    manifest = {"task": TASK, "size": size, "seed": seed, "config": config_record(cfg),
                "sizes": f"d_model {cfg.d_model}, layers {cfg.layers}, d_hidden {cfg.d_hidden}, T {cfg.seq_len}, "
                         f"pop {cfg.pop}, rank {cfg.rank}",
                "versions": versions(VERSIONS), "xla_flags": xla_flags(),
                "device": f"JAX reference on {ref.platform.where()[len('JAX on '):]}; host CPU {cpu_name()}",
                "matmul_precision": ref.platform.precision_words(), "platform": ref.platform.fields(),
                "command": regenerate(size, seed, str(out)), "recorded": list(RECORDED),
                "numpy_answers": "update, scores_dense and any call whose inputs come from the port "
                                 "(parity/tree/numpy_reference.py)"}
    return write_bundle(out, store, manifest)


def open_bundle(folder: str | Path, size: str | None, seed: int | None) -> Bundle:
    """The LM bundle in `folder`, checked before any work: UsageError (exit 2) for a bundle that cannot be read
    (parity.core.tape.read_bundle), of another task, or not holding the asked size or seed, or recorded at a configuration
    this version's size no longer has."""
    bundle = read_bundle(folder, regenerate())
    check_holds(bundle, TASK, size, seed, "vectors/lm-quick", lambda s, e: regenerate(s, e, "BUNDLE"))
    m = bundle.manifest
    sizes = lm_sizes()
    if m.get("size") not in sizes or config_record(sizes[m["size"]]) != m.get("config"):
        raise UsageError(f"bundle {folder} was recorded at size {m.get('size')!r} with configuration "
                         f"{m.get('config')}, which this version's LM sizes ({', '.join(sizes)}) do not hold: "
                         f"regenerate it with `{m.get('command') or regenerate()}`")
    return bundle


def bundle_reference(folder: str | Path, cfg: LMConfig, seed: int) -> LMReference:
    """The replayed reference of the bundle in `folder` for a run at (cfg, seed) (the pytest plugin's against=);
    UsageError when the bundle holds another configuration or seed."""
    bundle = open_bundle(folder, None, seed)
    if bundle.manifest["config"] != config_record(cfg):
        raise UsageError(f"bundle {folder} holds size {bundle.manifest['size']!r} ({bundle.manifest['sizes']}), not "
                         f"this run's configuration {cfg}: give a bundle of that size, or record one with "
                         f"`{regenerate('SIZE', seed, 'BUNDLE')}`")
    return replay_reference(bundle)


# ----------------------------------------------------------------------------- --task tree: a port's declared tree
TREE_TASK = "tree"
TREE_RECORDED = ("draws",)      # JAX's normals: everything else is numpy arithmetic on them (tree_numpy_reference)


def regenerate_tree(port: str = "PORT", size: str = "quick", seed: int = 0, out: str = "BUNDLE") -> str:
    return (f"python -m parity record --task tree --port {port} --size {size}" + (f" --seed {seed}" if seed else "")
            + f" --out {out}")


def tree_draws(run) -> list[tuple[Any, int, Any, str]]:
    """(configuration, epoch, leaf, variant) of every draw the tree suite may ask the reference for on this run:
    the noise check's epochs under the faithful key scheme and the drifted ones it names, the gradients' epoch, and
    the trajectory's epochs and generations (parity.tree.lockstep.reference_draws)."""
    leaves = [leaf for leaf in run.tree.leaves if perturbs(run, leaf)]
    out = [(run, epoch, leaf, variant) for epoch in EPOCHS for leaf in leaves for variant in drift_variants(leaf)]
    out += [(cfg, epoch, leaf, "faithful") for cfg, epoch in reference_draws(run) for leaf in leaves]
    return list(dict.fromkeys(out))


def record_tree(port_spec: str, size: str, seed: int, out: Path, log=lambda line: None,
                platform: ReferencePlatform | None = None) -> Path:
    """Record JAX's draws for every check of the tree suite on the port's declared tree and settings at (size,
    seed) into the bundle folder `out` (written atomically), the reference on `platform` (default where JAX runs);
    UsageError before any work for a port or tree that cannot be checked. The rest of the reference is numpy on these
    draws, on replay as when recorded."""
    from parity.tree import reference as tree_reference
    from parity.tree.adapter import declared_run, load_tree_port
    from reporting import cpu_name, versions, xla_flags
    if size not in tree_check.TREE_SIZES:
        raise UsageError(f"--task tree --size {size!r}: the tree suite's sizes are {', '.join(tree_check.TREE_SIZES)}")
    run, lines = declared_run(load_tree_port(port_spec, None), tree_check.TREE_SIZES[size])
    store = Store()
    live = tree_reference.on_platform(platform)
    source = Recording(live, TREE_RECORDED, store)
    wanted = tree_draws(run)
    for i, (cfg, epoch, leaf, variant) in enumerate(wanted):
        source.draws(cfg, seed, epoch, leaf, variant)
        if (i + 1) % 20 == 0 or i + 1 == len(wanted):
            log(f"record: {i + 1} of {len(wanted)} draws")
    manifest = {"task": TREE_TASK, "size": size, "seed": seed, "port": port_spec, "run": config_record(run),
                "sizes": "; ".join(lines), "versions": versions(VERSIONS), "xla_flags": xla_flags(),
                "device": f"JAX reference on {live.platform.where()[len('JAX on '):]}; host CPU {cpu_name()}",
                "matmul_precision": live.platform.precision_words(), "platform": live.platform.fields(),
                "command": regenerate_tree(port_spec, size, seed, str(out)), "recorded": list(TREE_RECORDED),
                "numpy_answers": "shaping, gradients, the step and the products: numpy on the recorded draws "
                                 "(parity/tree/numpy_reference.py)"}
    return write_bundle(out, store, manifest)


def open_tree_bundle(folder: str | Path, size: str | None, seed: int | None) -> Bundle:
    """A --task tree bundle, checked before any work (UsageError, exit 2): readable, of this task, at the asked size
    and seed."""
    bundle = read_bundle(folder, regenerate_tree())
    check_holds(bundle, TREE_TASK, size, seed, "a bundle of your port",
                lambda s, e: regenerate_tree(bundle.manifest.get("port", "PORT"), s, e))
    return bundle


def tree_bundle_reference(bundle: Bundle, run) -> LMReference:
    """The replayed reference of a --task tree bundle for this run (the port's declared tree and settings); UsageError
    when the bundle was recorded for another tree or other settings."""
    m, declared = bundle.manifest, config_record(run)
    recorded = m.get("run") if isinstance(m.get("run"), dict) else {}
    if recorded != declared:
        differ = sorted(k for k in set(recorded) | set(declared) if recorded.get(k) != declared.get(k))
        raise UsageError(f"bundle {bundle.folder} was recorded for another tree or other settings ({', '.join(differ)} "
                         f"differ from the port's declaration): record this port's with "
                         f"`{regenerate_tree(m.get('port', 'PORT'), m['size'], m['seed'])}`")
    numpy = NumpyTreeReference(Replay(bundle.store, TREE_RECORDED).draws)
    return LMReference(Replay(bundle.store, TREE_RECORDED, fallback=numpy), numpy, TREE_RECORDED,
                       platform=recorded_platform(m))
