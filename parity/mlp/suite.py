"""The parity suite: sizes, the shared context, and the run of every check in order.

Order matters for the diagnosis: fitness, products, noise, gradients and updates isolate one
piece of the math each (both sides fed the same inputs); init compares initial parameters; the
trajectory then trains both sides in lockstep on the reference's returns, compares every epoch
however far they have parted, and attributes each difference to the earlier check that explains it
or to what it reads off the port (sigma and lr schedules, optimizer).
"""
from __future__ import annotations

import dataclasses
import textwrap
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np

from parity.mlp.adapter import CheckedPort, declared_config
from parity.mlp.checks import actions, fitness, gradients, init, noise, products, trajectory, updates
from parity.core.plan import Check, run_plan
from parity.core.port import NonFinite, PortError, port_trace
from parity.core.tape import Bundle, NotRecorded
from parity.core.verdict import ERROR, SKIP, CheckResult, Recorder, skipped, summarize, with_status_row
from parity.mlp.sizes import Sizes
from spec.config import Config
from spec.knobs import RunSettings
from spec.layout import param_shapes as layout_shapes
from spec.platform import ReferencePlatform

# The checks in the order they run: each `run(ctx) -> CheckResult`, one module per check (parity/mlp/checks/). None
# needs another to have run (--checks runs any subset); a later one reads the causes of those that did (causes_of).
# A check's needs are the optional port methods it calls: without one it is skipped, saying what MISSING says.
PLAN: tuple[Check, ...] = (
    Check("fitness", (), fitness.run),
    Check("products", (), products.run),
    Check("actions", ("actions",), actions.run),
    Check("noise", (), noise.run),
    Check("gradients", (), gradients.run),
    Check("updates", ("optimizer_step",), updates.run),
    Check("init", ("init_params",), init.run),
    Check("trajectory", ("es_init",), trajectory.run))
MISSING = {"actions": "the port has no `actions` method (its action rule is then unchecked).",
           "optimizer_step": "the port has no `optimizer_init`/`optimizer_step`.",
           "init_params": "the port has no `init_params`.",
           "es_init": "the port has no es_init / es_ask / es_tell / es_params (see parity/mlp/adapter.py)."}
CHECKS = tuple(check.name for check in PLAN)
# The suite's own random inputs, one numpy stream per purpose (the numbers are fixed: they seed the CSVs' inputs).
RNG_PURPOSES = {"fitness vectors": 11, "non-finite fitness": 12, "linear products": 20, "forward inputs": 21,
                "shared-noise fitness": 41, "synthetic targets": 42, "update fitness": 51, "actions": 61,
                "sigma schedule fitness": 71}


def at_port_rank(sizes: Sizes, port: Any) -> Sizes:
    """The sizes at what the port declares of its own shape (adapter attributes `rank`, `layers`, `hidden`), both
    sides; unchanged when it declares none. A fixed-rank port is then compared as EGGROLL at its rank, not read
    through zero-padded columns, and a port of another depth at its depth."""
    changes = {k: v for k, v in declared_config(port).items() if getattr(sizes.cfg, k) != v}
    return dataclasses.replace(sizes, cfg=sizes.cfg.replace(**changes)) if changes else sizes


def param_shapes(cfg: Config) -> dict[str, tuple[int, ...]]:
    """{name: shape} of the MLP cfg describes, in the JAX flatten order."""
    return layout_shapes(cfg.sizes)


@dataclass
class Context:
    """Everything a check needs: both sides (validated), sizes, the run seed and earlier results."""

    port: CheckedPort
    ref: CheckedPort                 # the reference behind the same validation
    reference: Any                   # parity.mlp.reference.ReferencePort (candidates, schedules, extra probes)
    sizes: Sizes
    seed: int
    results: dict[str, CheckResult] = field(default_factory=dict)
    log: Callable[[str], None] = lambda line: None
    repro: Any = None                # parity.core.repro.Collector when the run writes repros of its failures
    platform: ReferencePlatform = field(default_factory=ReferencePlatform)   # where the reference ran

    def witness(self, label: str, produced: Any, port: Any, reference: Any, allowed: Any, why: str,
                path: tuple = ()) -> None:
        """Tell the repro collector (if any) of an element-wise comparison |port - reference| <= allowed, `port`
        found at `path` in `produced`, the output of a port call (parity.core.repro.Collector.witness)."""
        if self.repro is not None:
            self.repro.witness(label, produced, port, reference, allowed, why, path)

    def replay(self, label: str, steps: Any, result: str, port: Any, reference: Any, allowed: Any, why: str,
               paths: Any = None) -> None:
        """Tell the repro collector (if any) of a comparison seen after a sequence of port calls (`steps`, a list of
        parity.core.repro.Step, whose output named `result` gave `port`), per key within `allowed` of `reference`."""
        if self.repro is not None:
            self.repro.replay(label, steps, result, port, reference, allowed, why, paths)

    def statistic(self, label: str, produced: Any, path: tuple, rows: Any, divisor: float, statistic: str,
                  value: float, interval: tuple, alpha: float, why: str, array: Any) -> None:
        """Tell the repro collector (if any) of a statistical test that failed on the values rows / divisor of the
        array at `path` in `produced`, a port call's output (parity.core.repro.Collector.statistic)."""
        if self.repro is not None:
            self.repro.statistic(label, produced, path, rows, divisor, statistic, value, interval, alpha, why, array)

    @property
    def cfg(self) -> Config:
        return self.sizes.cfg

    @property
    def ref_u(self) -> float:
        """The unit the reference's matmul operands are rounded to before float32 products: U_TF32 where its
        platform resolves to TF32 (its bounds widened by parity.core.tolerances.with_operands), else 0."""
        from parity.core.tolerances import U_TF32
        return U_TF32 if self.platform.tf32 else 0.0

    @property
    def shapes(self) -> dict[str, tuple[int, ...]]:
        return param_shapes(self.cfg)

    def rng(self, purpose: str) -> np.random.Generator:
        """A numpy generator for the suite's own inputs, from (run seed, RNG_PURPOSES[purpose]): no global state."""
        return np.random.default_rng([self.seed, RNG_PURPOSES[purpose]])

    def start(self, check: str) -> None:
        """A check begins: its progress line, and the repro collector's (if any) next check."""
        self.log(f"[{check}] running ...")
        if self.repro is not None:
            self.repro.start(check)

    def causes_of(self, check: str):
        result = self.results.get(check)
        return result.causes if result is not None and result.verdict != "pass" else ()


def protocol_error(name: str, err: PortError, port) -> CheckResult:
    """The `error` result of a check whose port broke the protocol: the message, where, and the port's frames."""
    where, trace = port_trace(err, port)
    section = f"The port broke the adapter protocol, so this check could not judge it:\n\n    {err}\n\n"
    if trace:
        section += ("The port's traceback (its own frames; the suite's are left out):\n\n"
                    + textwrap.indent(trace, "    ") + "\n\n")
    elif where:
        section += f"The port's `{err.method}` is defined at {where}.\n\n"
    section += "See parity/mlp/adapter.py for what each method must return."
    observed = f"{err}" + ((f" [at {where}]" if trace else f" [{err.method} defined at {where}]") if where else "")
    result = summarize(name, Recorder(name), section, verdict=ERROR, observed=observed, allowed="the adapter protocol")
    return dataclasses.replace(result, trace=trace)


def not_recorded(name: str, err: NotRecorded) -> CheckResult:
    """The `skip` result of a check that needs a reference call the bundle does not hold (check --against)."""
    reason = f"the reference's {err.method} is not in the bundle: {err.why}"
    return summarize(name, Recorder(name), f"Skipped: {reason}", verdict=SKIP, observed=f"skipped: {reason}")


def run_check(check: Check | str, ctx: Context) -> CheckResult:
    """Run one check (a Check of PLAN, or its name); a PortError becomes an `error` verdict that names the method, what
    was expected and where; the port's NaN or inf where the reference's answer is finite a `fail`
    (parity.core.nonfinite)."""
    if isinstance(check, str):
        check = PLAN[CHECKS.index(check)]
    name = check.name
    start = time.perf_counter()
    missing = next((need for need in check.needs if not ctx.port.has(need)), None)
    try:
        result = skipped(name, MISSING[missing]) if missing else check.run(ctx)
    except NotRecorded as err:
        result = not_recorded(name, err)
    except NonFinite as err:
        from parity.core import nonfinite
        result = (nonfinite.check_result(name, err, ctx) if err.source is ctx.port else None) \
            or protocol_error(name, err, ctx.port.port)
    except PortError as err:
        missing = err.original if isinstance(err.original, NotRecorded) else None
        result = not_recorded(name, missing) if missing is not None else protocol_error(name, err, ctx.port.port)
    return with_status_row(dataclasses.replace(result, seconds=time.perf_counter() - start))


def reference_side(sizes: Sizes, seed: int, reference_run: RunSettings | None, against: Bundle | Path | str | None,
                   platform: ReferencePlatform | None = None):
    """The reference the checks talk to: parity.mlp.reference.ReferencePort (JAX, imported only here) on `platform`
    (default: where JAX runs), or with `against` (a bundle or its folder) parity.mlp.vectors.ReferenceReplay, which
    imports no JAX."""
    if against is None:
        from parity.core.platform import enable_compile_cache
        from parity.mlp.reference import ReferencePort

        enable_compile_cache()
        return ReferencePort(sizes.cfg, reference_run or RunSettings(), platform)
    from parity.mlp import vectors

    bundle = against if isinstance(against, Bundle) else vectors.open_bundle(against, sizes.name, int(seed))
    return vectors.ReferenceReplay(bundle, sizes.cfg, reference_run or RunSettings(**bundle.manifest["run"]))


def run_suite(port: Any, sizes: Sizes, seed: int = 0, reference_run: RunSettings | None = None,
              checks: tuple[str, ...] = CHECKS, log: Callable[[str], None] = lambda line: None,
              against: Bundle | Path | str | None = None, reference: Any = None,
              repro: Any = None, platform: ReferencePlatform | None = None) -> list[CheckResult]:
    """Run the checks against `port` (an adapter object); returns their results in order.

    against: a recorded bundle (parity.mlp.vectors) answers for the reference, so no JAX is needed; reference: a
    ready reference object (parity.mlp.recording.record passes a recording one) in place of both; repro: a
    parity.core.repro.Collector, given each check's failing port call (written beside the report by the caller);
    platform: where the live reference runs (spec.platform; default where JAX runs), else the reference's own
    `platform` attribute (a bundle's, a recording's)."""
    sizes = at_port_rank(sizes, port)
    unknown = [c for c in checks if c not in CHECKS]
    if unknown:
        raise ValueError(f"unknown check(s) {unknown}; known: {', '.join(CHECKS)}")
    if reference is None:
        reference = reference_side(sizes, seed, reference_run, against, platform)
    ctx = Context(CheckedPort(port), CheckedPort(reference), reference, sizes, int(seed), log=log, repro=repro,
                  platform=getattr(reference, "platform", None) or platform or ReferencePlatform())
    if repro is not None:
        ctx.port.tape = repro.tape
    results = []
    for ran in run_plan([PLAN[CHECKS.index(name)] for name in checks], ctx, attempt=run_check, start=ctx.start):
        result = ctx.results[ran.name] = ran.result
        results.append(result)
        tail = f": {result.cause_text}" if result.cause_text else ""        # its line, its warnings, the port's trace
        what = (result.observed if result.verdict in ("skip", "error") else
                f"{result.observed} (allowed {result.allowed})")
        log(f"[{result.name}] {result.verdict} ({result.seconds:.1f} s) {what}{tail}")
        for warning in result.warnings:
            log(f"[{result.name}] {warning}")
        if result.trace:
            log(textwrap.indent(result.trace, "    "))
    return results
