"""A suite's plan: its checks as named records, run in order over one shared state.

Every family lists its checks as `Check` records (parity/mlp/suite.py, parity/tree/check.py, parity/int8/cli.py):
the check's name (its rows, its report line), what it needs (names of inputs or of earlier checks' results), and the
function that computes its result from the family's shared state, a typed record (`Context`, `TreeState`,
`Int8State`) that earlier checks may write into and later ones read. `run_plan` runs them in order: a check one of
whose needs is not met is skipped with the family's reason instead of run, and every check is timed.
"""
from __future__ import annotations

import time
from typing import Any, Callable, Generic, Iterator, NamedTuple, Sequence, TypeVar

S = TypeVar("S")      # the family's shared state
R = TypeVar("R")      # what one of its checks returns


class Check(NamedTuple, Generic[S, R]):
    """One check of a plan: `name`, `needs` (inputs or earlier results it cannot run without), `run(state) -> R`."""

    name: str
    needs: tuple[str, ...]
    run: Callable[[S], R]


class Ran(NamedTuple, Generic[R]):
    """A check's outcome: its name, its result (computed or the skip's), and how long it took, in seconds."""

    name: str
    result: R
    seconds: float


def run_plan(plan: Sequence[Check[S, R]], state: S, unmet: Callable[[str, S], str] | None = None,
             skipped: Callable[[str, str], R] | None = None, attempt: Callable[[Check[S, R], S], R] | None = None,
             start: Callable[[str], Any] | None = None) -> Iterator[Ran[R]]:
    """Each check of `plan` in order on `state`, yielded as it finishes (so the caller logs it, or stores its result
    for the next check, before the next one runs). `start(name)` is told first (a progress line, a repro collector's
    next check); then the first of its needs that `unmet(need, state)` gives a reason for (a method the port lacks,
    an earlier check that parted) makes it `skipped(name, reason)`; else `attempt(check, state)` (default
    `check.run(state)`; a family's own turns the exceptions it knows into results) computes it. Timed from start.
    Without `unmet` the needs are the attempt's to judge (CartPole's run_check skips a check whose optional port
    method is missing, for a check run alone too)."""
    for check in plan:
        if start is not None:
            start(check.name)
        t0 = time.perf_counter()
        needs = check.needs if unmet is not None else ()
        reason = next((why for why in (unmet(need, state) for need in needs) if why), "")
        if reason:
            result = skipped(check.name, reason)
        else:
            result = check.run(state) if attempt is None else attempt(check, state)
        yield Ran(check.name, result, time.perf_counter() - t0)
