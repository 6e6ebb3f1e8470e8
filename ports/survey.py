"""Run the parity suite on every port of the registry and gather what it found, what it could not check, and how
its verdicts compare with what each package's code was read to do."""
from __future__ import annotations

import importlib
import importlib.util
import time
import traceback
from pathlib import Path
from typing import Callable, NamedTuple

import numpy as np

from parity.mlp.adapter import GROUPS, CheckedPort, load_port
from parity.core.port import UsageError
from parity.core.report import RunInfo, overall, write_report
from parity.mlp.sizes import Sizes
from parity.mlp.suite import param_shapes, run_suite
from parity.core.verdict import CheckResult
from ports import probes as pr
from ports.readings import Agreement, agreement
from ports.registry import Entry
from reporting import versions, xla_flags

# A missing optional method (or group) -> (checks it skips, drifts then left unchecked): docs/ports.md's skip table.
SKIPPED = {
    "forward": ("the full-MLP part of products, and trajectory", "hidden activation"),
    "init_params": ("init", "weight init"),
    "optimizer": ("updates", "optimizer, learning-rate schedule"),
    "es": ("trajectory", "sigma schedule; what only the training loop does (its own shaping call, lr or sigma "
                         "per epoch)"),
    "action_uniforms": ("the action-randomness parts of noise", "action randomness"),
    "actions": ("actions", "action selection (sampled or greedy)"),
}
SUITE_PACKAGES = ("torch", "jax", "numpy")


class PortResult(NamedTuple):
    entry: Entry
    installed: str                     # the installed version, or "not installed"
    status: str                        # checked | not installed | adapter error | suite error
    name: str                          # the adapter's name ("" when not loaded)
    results: tuple[CheckResult, ...]
    agreements: tuple[Agreement, ...]
    unchecked: tuple[tuple[str, str], ...]   # (what, why)
    findings: tuple[str, ...]          # causes the suite gave without a knob
    probes: tuple[pr.Probe, ...]
    seconds: float
    error: str = ""                    # the traceback when the adapter or the suite failed

    @property
    def verdict(self) -> str:
        return overall(self.results) if self.results else self.status

    def verdict_of(self, check: str) -> str:
        found = [r for r in self.results if r.name == check]
        return found[0].verdict if found else ("not run" if self.status == "checked" else "-")

    @property
    def knobs(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(k for r in self.results for k in r.knobs))


def installed_version(entry: Entry) -> str:
    """The installed version of the entry's distribution, or 'not installed' (its module cannot be found)."""
    if importlib.util.find_spec(entry.module) is None:
        return "not installed"
    return versions((entry.dist,))[entry.dist]


def unchecked(entry: Entry, port: CheckedPort) -> list[tuple[str, str]]:
    """What the protocol could not check for this port: absent methods, the entry's limits, grouped shaping the
    package lacks, and the facts its code was read to hold outside the knobs."""
    items = []
    for group, (checks, drifts) in SKIPPED.items():
        methods = GROUPS.get(group, (group,))
        if not port.has(methods[0]):
            items.append((f"no {'/'.join(methods)} in the package", f"skips {checks}; left unchecked: {drifts}"))
    items += list(entry.cannot)
    try:
        port.unchecked("shape_fitness", np.arange(16, dtype=np.float32), 8)
    except NotImplementedError as err:
        items.append(("grouped fitness shaping (group_size > 0)", f"the package has none ({err}); the fitness check "
                                                                    "reports the grouped vectors as not judged"))
    except Exception:   # noqa: BLE001 - any other failure is the fitness check's to report
        pass
    items += [(f"{r.value}", f"{r.what} ({r.where}); outside the knobs") for r in entry.readings if r.knob is None]
    return items


def run_probes(entry: Entry, port: CheckedPort, sizes: Sizes) -> list[pr.Probe]:
    cfg = sizes.cfg
    shapes = param_shapes(cfg)
    if entry.dense:
        module, attr = entry.dense.split(":")
        return pr.dense_probes(getattr(importlib.import_module(module), attr), shapes, cfg.pop, cfg.sigma, cfg.rank)
    return pr.factor_probes(port, shapes, cfg.pop, cfg.sigma, cfg.rank)


def _info(entry: Entry, name: str, sizes: Sizes, seed: int, seconds: float, device: str) -> RunInfo:
    c = sizes.cfg
    return RunInfo(
        command=f"python -m ports (the survey): python -m parity check --port {entry.spec} --size {sizes.name} "
                f"--seed {seed} --checks {','.join(entry.checks)}",
        port=name, configuration=f"foreign port {entry.spec}: {entry.configured}",
        sizes=f"{sizes.name}: pop {c.pop}, rank {c.rank}, sigma {c.sigma}, lr {c.lr}, MLP {c.sizes}",
        seed=seed, versions=versions(SUITE_PACKAGES + (entry.dist,)), device=device,
        started=time.strftime("%Y-%m-%dT%H:%M:%S"), seconds=seconds, xla_flags=xla_flags())


def survey_entry(entry: Entry, sizes: Sizes, seed: int, out: Path, device: str,
                 log: Callable[[str], None] = lambda line: None) -> PortResult:
    """Check one port: the suite (its report in out/<key>/), the probes, the readings against the verdicts."""
    start = time.perf_counter()
    version = installed_version(entry)
    empty = dict(results=(), agreements=(), unchecked=(), findings=(), probes=())
    if version == "not installed":
        return PortResult(entry, version, "not installed", "", **empty, seconds=0.0,
                          error=f"pip install {entry.dist}=={entry.pinned} (make ports installs the pinned extra)")
    try:
        port = CheckedPort(load_port(entry.spec, sizes.cfg))
    except UsageError:
        return PortResult(entry, version, "adapter error", "", **empty, seconds=time.perf_counter() - start,
                          error=traceback.format_exc())
    try:
        results = tuple(run_suite(port.port, sizes, seed, checks=entry.checks, log=log))
        probe_rows = tuple(run_probes(entry, port, sizes))
    except Exception:   # noqa: BLE001 - one port's crash must not stop the survey
        return PortResult(entry, version, "suite error", port.name, **empty, seconds=time.perf_counter() - start,
                          error=traceback.format_exc())
    seconds = time.perf_counter() - start
    write_report(out / entry.key, results, _info(entry, port.name, sizes, seed, seconds, device))
    named = {k for r in results for k in r.knobs}
    ran = {r.name for r in results if r.verdict in ("pass", "fail")}
    agreements = tuple(agreement(r, named, ran) for r in entry.readings if r.knob is not None)
    findings = tuple(dict.fromkeys(c.text for r in results for c in r.causes if c.knob is None))
    return PortResult(entry, version, "checked", port.name, results, agreements,
                      tuple(unchecked(entry, port)), findings, probe_rows, seconds)
