"""Parity as a test assertion: `assert_port_parity(adapter, ...)` for any test runner, and the pieces the pytest
plugin (parity/pytest_plugin.py) builds one item per check from.

A run is described by a `ParityRequest` (validated before any work: task, size, seed, bundle folder and `expect=`),
run once per port by a `SuiteCache`, and read as one `Outcome` per check, whatever the task. `expect` declares the
drifts a port has on purpose, as knobs of the knob table (spec/knobs.py; spec/tree_knobs.py for task="lm", and for
task="tree" those with the MLP suite's knobs its checks name, TREE_MLP_KNOBS): a
failing check passes when every cause it gives names an expected knob, and the run fails when an expected knob is
named by no check. The suite names knobs, not values: the value is checked against the table (so the declaration
reads as the port's configuration) but not against what the port does. Nothing here imports jax or torch until a
suite runs, so a port author's CI collects the tests without either.
"""
from __future__ import annotations

import logging
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, Sequence

from parity.core.port import UsageError
from parity.core.verdict import KNOB_IN_CAUSE

TASKS = ("cartpole", "lm", "tree")
EXPECT_ITEM = "expect"          # the run-level item: every expected knob named by some check
# Values the suite never names, so expecting them could never be met: a port on its own generator is checked in
# distribution, and a compiled forward is the same math (tests/parity/mlp/test_selftest.py holds both to a pass).
NOT_DRIFTS = {"cartpole": {("rng", "torch"), ("compile", "on")}, "lm": {("rng", "torch")}, "tree": {("rng", "torch")}}
# The MLP suite's knobs the tree suite names on a declared tree (pairing, fitness, optimizer; the trajectory's
# schedules): task="tree" takes them in expect= beside the tree knobs.
TREE_MLP_KNOBS = ("antithetic", "fitness", "optimizer", "noise_reuse", "lr_decay", "sigma_decay")
LOG = logging.getLogger("parity.testing")


class ParityWarning(UserWarning):
    """Advice the suite gives about a port without failing it (e.g. a port that accepts NaN fitness)."""


class SuiteCrash(RuntimeError):
    """The suite itself crashed while checking a port: a bug to report, never a verdict on the port."""


@dataclass(frozen=True)
class ParityRequest:
    """What to check: the adapter (an object, a class or factory called with the config, or 'module:attr'), the task,
    the size, an optional conformance-vector bundle, the declared drifts and the run seed."""

    adapter: Any
    task: str
    size: str
    against: str | None
    expect: tuple[tuple[str, Any], ...]
    seed: int

    @property
    def key(self) -> tuple:
        """One suite run per (port, task, size, bundle, seed); `expect` only changes how the run is judged."""
        who = self.adapter if isinstance(self.adapter, str) else id(self.adapter)
        return who, self.task, self.size, self.against, self.seed

    @property
    def expected(self) -> dict[str, Any]:
        return dict(self.expect)

    @property
    def label(self) -> str:
        """The port as the messages name it."""
        if isinstance(self.adapter, str):
            return self.adapter
        name = getattr(self.adapter, "name", None)
        return str(name) if isinstance(name, str) else getattr(self.adapter, "__qualname__", type(self.adapter).__name__)

    @property
    def item_names(self) -> tuple[str, ...]:
        """The checks of the task in the order they run, then the run-level `expect` item when drifts are declared."""
        return check_names(self.task) + ((EXPECT_ITEM,) if self.expect else ())


def check_names(task: str) -> tuple[str, ...]:
    """The task's checks in the order its suite runs them (importing neither jax nor torch)."""
    if task in ("lm", "tree"):
        from parity.tree.check import CHECKS
    else:
        from parity.mlp.suite import CHECKS
    return CHECKS


def size_names(task: str) -> tuple[str, ...]:
    if task == "tree":
        from parity.tree.check import TREE_SIZES
        return tuple(TREE_SIZES)
    if task == "lm":
        from parity.tree.check import sizes
        return tuple(sizes())
    from parity.mlp.sizes import SIZES
    return tuple(SIZES)


def checked_expect(task: str, expect: Mapping[str, Any] | None) -> tuple[tuple[str, Any], ...]:
    """`expect` as sorted (knob, value) pairs, each a drift of the task's knob table; UsageError saying what would
    be right for an unknown knob, an unknown value, the reference's own value or a value the suite never names."""
    if expect is None:
        return ()
    if not isinstance(expect, Mapping):
        raise UsageError(f"expect= takes a dict {{knob: value}} of the drifts the port has on purpose, e.g. "
                         f"{{'antithetic': 'halves'}}; got {type(expect).__name__} {expect!r}")
    pairs = []
    for knob, value in expect.items():
        value = _knob_value(task, knob, value)
        if (knob, value) in NOT_DRIFTS[task]:
            raise UsageError(f"expect={{{knob!r}: {value!r}}}: the suite never names {knob}={value} (it is checked as "
                             "the same math), so nothing is to be expected; leave it out")
        pairs.append((knob, value))
    return tuple(sorted(pairs))


def _knob_table(task: str) -> tuple[dict, dict, dict]:
    """(choices, numeric knobs, the reference's value of each) of the task's knob table; a declared tree's noise_reuse
    is the port's own declaration, so it has no reference value here (None)."""
    from spec.knobs import CHOICES, NUMERIC, Knobs
    from spec.tree_knobs import TREE_CHOICES, TreeKnobs

    if task == "cartpole":
        return CHOICES, NUMERIC, {k: getattr(Knobs(), k) for k in [*CHOICES, *NUMERIC]}
    if task == "lm":
        return TREE_CHOICES, {}, {k: getattr(TreeKnobs(), k) for k in TREE_CHOICES}
    choices = {**TREE_CHOICES, **{k: CHOICES[k] for k in TREE_MLP_KNOBS if k in CHOICES}}
    numeric = {k: NUMERIC[k] for k in TREE_MLP_KNOBS if k in NUMERIC}
    reference = {k: v[0] for k, v in choices.items()} | {k: getattr(Knobs(), k) for k in numeric}
    return choices, numeric, reference | {"noise_reuse": None}


def _knob_value(task: str, knob: str, value: Any) -> Any:
    """The value of one expected knob, parsed and checked against the task's table (UsageError otherwise)."""
    from spec.knobs import KnobError, Knobs, parse_value

    choices, numeric, reference = _knob_table(task)
    known = [*choices, *numeric]
    if knob not in known:
        raise UsageError(f"expect= names unknown knob {knob!r} for task {task!r}; known knobs: {', '.join(known)}")
    if knob in choices and value not in choices[knob]:
        raise UsageError(f"expect={{{knob!r}: {value!r}}}: unknown value for knob {knob!r}; its drifts: "
                         f"{', '.join(map(repr, choices[knob][1:]))} (the reference's is {choices[knob][0]!r})")
    if knob in numeric:
        try:        # the text a command line would give, so 1.5 is no noise_reuse and True no number
            value = getattr(Knobs().replace(**{knob: parse_value(knob, str(value))}), knob)
        except KnobError:
            raise UsageError(f"expect={{{knob!r}: {value!r}}}: knob {knob!r} takes {numeric[knob][1]}") from None
    if value == reference[knob]:
        raise UsageError(f"expect={{{knob!r}: {value!r}}}: {value!r} is the reference's own value, no drift; "
                         f"name the value the port departs to, or leave {knob!r} out")
    return value


def parity_request(adapter: Any, task: str = "cartpole", size: str = "selftest", against: str | Path | None = None,
                   expect: Mapping[str, Any] | None = None, seed: int = 0) -> ParityRequest:
    """A validated request, or UsageError saying what was wrong and what would be right (before any work)."""
    from spec.limits import check_seed

    if adapter is None:
        raise UsageError("no adapter given: pass the port's adapter object, its class, or 'module:attr'")
    if task not in TASKS:
        raise UsageError(f"unknown task {task!r}; known tasks: {', '.join(TASKS)}")
    if size not in size_names(task):
        raise UsageError(f"unknown size {size!r} for task {task!r}; known sizes: {', '.join(size_names(task))}")
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise UsageError(f"seed must be an int, got {seed!r}")
    try:
        check_seed(seed, "seed")
    except ValueError as err:
        raise UsageError(str(err)) from None
    if against is not None and not Path(against).is_dir():
        raise UsageError(f"against={str(against)!r}: no such bundle folder; give a folder written by "
                         "`python -m parity record` (e.g. vectors/cartpole-quick), or against=None for the live "
                         "JAX reference")
    return ParityRequest(adapter, task, size, None if against is None else str(against),
                         checked_expect(task, expect), seed)


# ----------------------------------------------------------------------------- one check's outcome, either task
@dataclass(frozen=True)
class Outcome:
    """One check as a test sees it: verdict, headline (observed vs allowed), causes as (knob or None, text), the
    number of failing rows that give no cause, and the port's traceback and the suite's advice, if any."""

    name: str
    verdict: str            # pass | fail | skip | error
    observed: str
    allowed: str
    causes: tuple[tuple[str | None, str], ...] = ()
    uncaused: int = 0
    trace: str = ""
    warnings: tuple[str, ...] = ()

    @property
    def knobs(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(k for k, _ in self.causes if k))


def outcome_of_result(result) -> Outcome:
    """The Outcome of a parity.core.verdict.CheckResult (the CartPole suite)."""
    uncaused = sum(1 for r in result.rows if r.verdict == "fail" and not r.cause)
    causes = tuple(dict.fromkeys((c.knob, c.text) for c in result.causes))
    return Outcome(result.name, result.verdict, result.observed, result.allowed, causes, uncaused, result.trace,
                   tuple(result.warnings))


def outcomes_of_rows(rows: Sequence, names: Sequence[str], paths: Sequence[str] = ()) -> tuple[Outcome, ...]:
    """One Outcome per check of the LM suite's rows (parity.tree.check.Row), in `names`' order; a check's verdict is
    its worst row's, its knobs those its failing rows' causes name; causes that differ only in the leaf of the tree's
    `paths` they name are one (parity.tree.base.merged_causes)."""
    unknown = sorted({r.check for r in rows} - set(names))
    if unknown:
        raise SuiteCrash(f"the LM suite returned rows of check(s) {unknown} that parity.tree.check.CHECKS lacks")
    return tuple(_lm_outcome(name, [r for r in rows if r.check == name], paths) for name in names)


def _lm_outcome(name: str, rows: Sequence, paths: Sequence[str] = ()) -> Outcome:
    from parity.tree.base import merged_causes
    from reporting import fmt

    if not rows:
        return Outcome(name, "error", "the LM suite gave no rows for this check", "-")
    failed = [r for r in rows if r.verdict == "fail"]
    if not failed and all(r.verdict == "skip" for r in rows):
        return Outcome(name, "skip", f"skipped: {rows[0].cause or 'no reason given'}", "-")
    judged = [r for r in rows if r.verdict != "skip" and r.value == r.value]
    head = failed[0] if failed else max(judged or rows, key=lambda r: r.value if r.value == r.value else -1)
    texts = merged_causes((r.cause for r in failed if r.cause), paths)
    causes = tuple(dict.fromkeys((knob, text) for text in texts for knob in _knobs_of(text)))
    return Outcome(name, "fail" if failed else "pass", f"{head.quantity} = {fmt(head.value)}", head.allowed, causes,
                   sum(1 for r in failed if not r.cause))


def _knobs_of(text: str) -> list[str | None]:
    """The knobs a cause of the LM suite names (one text may restate an earlier check's), or [None] for none."""
    return list(dict.fromkeys(KNOB_IN_CAUSE.findall(text))) or [None]


# ----------------------------------------------------------------------------- judging
def check_failure(outcome: Outcome, request: ParityRequest) -> str | None:
    """Why this check fails the test, in the suite's words, or None: it passed, was skipped, or failed only through
    drifts `expect` declares (every cause names an expected knob)."""
    expected = request.expected
    if outcome.verdict in ("pass", "skip", "info"):
        return None
    new = [(k, t) for k, t in outcome.causes if k not in expected]
    if outcome.verdict == "fail" and outcome.causes and not new and not outcome.uncaused:
        return None
    lines = [f"{request.label}: check `{outcome.name}` {outcome.verdict}",
             f"  observed: {outcome.observed}", f"  allowed:  {outcome.allowed}"]
    lines += [f"  cause:    {text}" + ("  (expected)" if knob in expected else "") for knob, text in outcome.causes]
    if outcome.uncaused:
        lines.append(f"  {outcome.uncaused} failing row(s) give no cause: a difference no knob of the table explains")
    knobs = list(dict.fromkeys(k for k, _ in new if k))
    if knobs:
        lines.append(f"  not expected: {', '.join(f'knob `{k}`' for k in knobs)}; a drift the port has on purpose "
                     f"is declared with expect={{{', '.join(f'{k!r}: <its value>' for k in knobs)}}}")
    if outcome.trace:
        lines += ["  the port raised (its own frames):", *("    " + line for line in outcome.trace.splitlines())]
    return "\n".join(lines)


def expect_failure(outcomes: Iterable[Outcome], request: ParityRequest) -> str | None:
    """Why the declared drifts fail the run, or None: each expected knob must be named by some check."""
    outcomes = tuple(outcomes)
    named = {k for o in outcomes for k in o.knobs}
    gone = {k: v for k, v in request.expect if k not in named}
    if not gone:
        return None
    unseen = [o.name for o in outcomes if o.verdict in ("skip", "error")]
    return (f"{request.label}: expected drift(s) not seen: {', '.join(f'{k}={v}' for k, v in gone.items())} named by "
            "no check; if the port no longer departs there, drop it from expect="
            + (f" (checks that did not judge, which might have named it: {', '.join(unseen)})" if unseen else ""))


def run_failures(outcomes: Sequence[Outcome], request: ParityRequest) -> list[str]:
    """Every reason the run fails the test: each check's, then the declared drifts'."""
    found = [check_failure(o, request) for o in outcomes]
    return [f for f in found + [expect_failure(outcomes, request)] if f]


# ----------------------------------------------------------------------------- running
def _run_cartpole(request: ParityRequest, log: Callable[[str], None]) -> tuple[Outcome, ...]:
    from parity.mlp.adapter import built_adapter, check_adapter, load_port
    from parity.mlp.sizes import SIZES
    from parity.mlp.suite import run_suite

    sizes = SIZES[request.size]
    if isinstance(request.adapter, str):
        port = load_port(request.adapter, sizes.cfg)
    else:
        port = check_adapter(built_adapter(request.adapter, sizes.cfg, request.label), request.label)
    return tuple(outcome_of_result(r) for r in run_suite(port, sizes, request.seed, log=log, against=request.against))


def _tree_suite(cfg, port, reference, seed: int, log: Callable[[str], None]) -> tuple[Outcome, ...]:
    """The tree suite on a loaded port at cfg (the LM's LMConfig or a port's declared TreeRun) against reference (a
    bundle's replay, or None: live JAX); a port that breaks the tree protocol is a UsageError."""
    from parity.tree import check as tree_check
    from parity.core.port import PortError
    from parity.tree.adapter import CheckedTreePort, PortSide
    from spec.tree_knobs import TreeKnobs

    try:
        rows = tree_check.run(cfg, TreeKnobs(), seed, log, side=PortSide(CheckedTreePort(port, cfg), cfg),
                              reference=reference)
    except PortError as err:
        raise UsageError(f"{err}\n  the port breaks the tree protocol (parity/tree/adapter.py)") from err
    return outcomes_of_rows(rows, tree_check.CHECKS, cfg.tree.paths)


def _run_lm(request: ParityRequest, log: Callable[[str], None]) -> tuple[Outcome, ...]:
    from parity.tree import check as tree_check
    from parity.mlp.adapter import built_adapter
    from parity.tree.adapter import load_tree_port, port_tree

    cfg = tree_check.sizes()[request.size]
    if isinstance(request.adapter, str):
        port = load_tree_port(request.adapter, cfg)
    else:
        port = built_adapter(request.adapter, cfg, request.label)
    port_tree(port, cfg)
    reference = None
    if request.against is not None:
        from parity.tree.vectors import bundle_reference
        reference = bundle_reference(request.against, cfg, request.seed)
    return _tree_suite(cfg, port, reference, request.seed, log)


def _run_tree(request: ParityRequest, log: Callable[[str], None]) -> tuple[Outcome, ...]:
    """The tree suite on the port's own declared tree (its settings, the size's defaults for the rest)."""
    from parity.tree import check as tree_check
    from parity.tree.adapter import built_tree_port, declared_run, load_tree_port

    if isinstance(request.adapter, str):
        port = load_tree_port(request.adapter, None)
    else:
        port = built_tree_port(request.adapter, None, request.label)
    run, _ = declared_run(port, tree_check.TREE_SIZES[request.size])
    reference = None
    if request.against is not None:
        from parity.tree.vectors import open_tree_bundle, tree_bundle_reference
        reference = tree_bundle_reference(open_tree_bundle(request.against, request.size, request.seed), run)
    return _tree_suite(run, port, reference, request.seed, log)


RUNNERS = {"cartpole": _run_cartpole, "lm": _run_lm, "tree": _run_tree}


def run_request(request: ParityRequest) -> tuple[Outcome, ...]:
    """Run the task's suite on the port once; its progress goes to the `parity.testing` logger."""
    log = lambda line: LOG.info("%s", line)   # noqa: E731
    log(f"parity: {request.label}, task {request.task}, size {request.size}, seed {request.seed}"
        + (f", against {request.against}" if request.against else ""))
    return RUNNERS[request.task](request, log)


class SuiteCache:
    """One suite run per port (ParityRequest.key), shared by every test that asks for it; the plugin keeps one per
    session. A run that fails to start is kept too, and raised again, fresh, to each test that asks."""

    def __init__(self, runner: Callable[[ParityRequest], tuple[Outcome, ...]] = run_request):
        self._runner = runner
        self._runs: dict[tuple, tuple[Any, Any]] = {}     # key -> (the adapter, kept alive for id(); outcomes | error)

    def __len__(self) -> int:
        return len(self._runs)

    def outcomes(self, request: ParityRequest) -> tuple[Outcome, ...]:
        if request.key not in self._runs:
            try:
                found: Any = self._runner(request)
            except Exception as err:    # kept so every item of this port says the same
                found = err
            self._runs[request.key] = (request.adapter, found)
        found = self._runs[request.key][1]
        if isinstance(found, UsageError):
            raise type(found)(str(found)) from found
        if isinstance(found, Exception):
            raise SuiteCrash(f"the parity suite crashed while checking {request.label} ({type(found).__name__}: "
                             f"{found}); a bug of the harness, not a verdict: please report it") from found
        return found


def warn_about(outcome: Outcome, request: ParityRequest) -> None:
    """Each of the suite's advice on this check as a ParityWarning (pytest lists them in its warnings summary)."""
    for text in outcome.warnings:
        warnings.warn(ParityWarning(f"{request.label}: {outcome.name}: {text}"), stacklevel=3)


def assert_port_parity(adapter: Any, task: str = "cartpole", size: str = "selftest", against: str | Path | None = None,
                       expect: Mapping[str, Any] | None = None, seed: int = 0,
                       cache: SuiteCache | None = None) -> tuple[Outcome, ...]:
    """Check a port against the EGGROLL reference in one call; AssertionError listing every failing check (verdict,
    observed, allowed, cause in the knob table's words) and every expected drift not seen. UsageError before any
    work for bad input (an unknown knob or value in `expect`, task, size, seed, bundle). Returns the outcomes."""
    request = parity_request(adapter, task, size, against, expect, seed)
    outcomes = (cache if cache is not None else SuiteCache()).outcomes(request)
    for outcome in outcomes:
        warn_about(outcome, request)
    failures = run_failures(outcomes, request)
    if failures:
        raise AssertionError("\n\n".join(failures))
    return outcomes
