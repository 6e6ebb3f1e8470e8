"""Verdicts: one tidy row per measurement, a recorder that judges rows, and the result of a check.

A row is what the CSVs hold (check, quantity, side, size, value, tolerance, verdict, cause).
A check's verdict is the worst of its rows: error (the port broke the protocol) > fail > pass;
`skip` when the check could not run (an optional port method is absent) and `info` for
measurements reported without a verdict.
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Iterable, Sequence

from reporting import fmt, markdown_table

PASS, FAIL, SKIP, INFO, ERROR = "pass", "fail", "skip", "info", "error"
CSV_COLUMNS = ("check", "quantity", "side", "size", "value", "tolerance", "verdict", "cause")
KNOB_IN_CAUSE = re.compile(r"knob `(\w+)`")     # how every suite names a knob in a cause (parity.core.diagnose.cause)


@dataclass(frozen=True)
class Cause:
    """The most likely reason for a failure: a knob of DESIGN.md's knob table (None when no knob fits) and the sentence."""

    knob: str | None
    text: str


@dataclass(frozen=True)
class Row:
    """One measurement: `value` against `tolerance` (a readable allowed region), judged `verdict`."""

    check: str
    quantity: str
    side: str            # port | reference | both (a comparison) | <candidate name>
    size: str            # what the measurement was taken over, e.g. "pop=256 r=4"
    value: float
    tolerance: str
    verdict: str
    cause: str = ""
    margin: float = 0.0  # |value| as a fraction of what is allowed (> 1 fails); orders rows for the headline
    shown: str = ""      # the value as the CSV writes it, where a family keeps every digit (default: fmt, 4 digits)

    def as_csv(self) -> list[str]:
        return [self.check, self.quantity, self.side, self.size, self.shown or fmt(self.value), self.tolerance,
                self.verdict, self.cause]


@dataclass(frozen=True)
class CheckResult:
    """What one check found: verdict, headline (observed vs allowed), causes, rows and its Markdown section."""

    name: str
    verdict: str
    observed: str
    allowed: str
    causes: tuple[Cause, ...]
    rows: tuple[Row, ...]
    section: str
    alpha: float = 0.0       # false-alarm budget its statistical tests spent (Bonferroni sum)
    seconds: float = 0.0
    warnings: tuple[str, ...] = ()   # what the port does that is no drift but deserves advice (shown in the terminal)
    trace: str = ""          # an `error` verdict: the port's own frames of the exception it raised
    repro: str = ""          # a failed check: the folder parity.core.repro wrote (the failing port call, alone)
    repro_note: str = ""     # a failed check without one: why

    @property
    def cause_text(self) -> str:
        return "; ".join(dict.fromkeys(c.text for c in self.causes)) if self.causes else ""

    @property
    def knobs(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(c.knob for c in self.causes if c.knob))


@dataclass
class Recorder:
    """Collects a check's rows; each judging method returns True when the measurement passes."""

    check: str
    rows: list[Row] = field(default_factory=list)
    causes: list[Cause] = field(default_factory=list)
    alpha: float = 0.0
    notes: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)

    def _add(self, quantity: str, side: str, size: str, value: float, tolerance: str, ok: bool | None,
             margin: float, cause) -> bool:
        if ok is None:
            verdict = INFO
        else:
            verdict = PASS if ok else FAIL
        text = ""
        if verdict == FAIL:
            found = cause() if callable(cause) else cause
            if found is not None:
                self.causes.append(found)
                text = found.text
        self.rows.append(Row(self.check, quantity, side, size, float(value), tolerance, verdict, text,
                             float(margin) if math.isfinite(margin) else 1e300))
        return verdict != FAIL

    def bound(self, quantity: str, side: str, size: str, value: float, allowed: float, why: str = "",
              cause=None) -> bool:
        """Pass when value <= allowed (value and allowed are non-negative, e.g. an error and its bound)."""
        value = float(value)
        ok = math.isfinite(value) and value <= allowed
        margin = value / allowed if allowed > 0 else (0.0 if value == 0 else math.inf)
        tol = f"<= {fmt(allowed)}" + (f" ({why})" if why else "")
        return self._add(quantity, side, size, value, tol, ok, margin, cause)

    def interval(self, quantity: str, side: str, size: str, value: float, lo: float, hi: float, why: str = "",
                 cause=None) -> bool:
        """Pass when lo <= value <= hi."""
        value = float(value)
        ok = math.isfinite(value) and lo <= value <= hi
        centre, half = (lo + hi) / 2, (hi - lo) / 2
        margin = abs(value - centre) / half if half > 0 else (0.0 if value == centre else math.inf)
        tol = f"[{fmt(lo)}, {fmt(hi)}]" + (f" ({why})" if why else "")
        return self._add(quantity, side, size, value, tol, ok, margin, cause)

    def equal(self, quantity: str, side: str, size: str, value: float, expected: float, why: str = "",
              cause=None) -> bool:
        """Pass when value == expected exactly (counts, flags)."""
        ok = float(value) == float(expected)
        tol = f"== {fmt(expected)}" + (f" ({why})" if why else "")
        return self._add(quantity, side, size, value, tol, ok, 0.0 if ok else math.inf, cause)

    def stat(self, quantity: str, side: str, size: str, value: float, lo: float, hi: float, alpha: float,
             why: str = "", cause=None) -> bool:
        """A statistical interval at per-test false-alarm rate `alpha` (added to the check's budget)."""
        self.alpha += alpha
        return self.interval(quantity, side, size, value, lo, hi, why or f"two-sided test, alpha={alpha:.2g}", cause)

    def info(self, quantity: str, side: str, size: str, value: float, note: str = "") -> None:
        self._add(quantity, side, size, value, note, None, 0.0, None)

    def fail(self, quantity: str, side: str, size: str, value: float, tolerance: str, cause) -> bool:
        """An unconditional failure (e.g. a structural difference found by inspection)."""
        return self._add(quantity, side, size, value, tolerance, False, math.inf, cause)

    @property
    def failed(self) -> bool:
        return any(r.verdict == FAIL for r in self.rows)


def summarize(name: str, rec: Recorder, section: str, seconds: float = 0.0, verdict: str | None = None,
              observed: str | None = None, allowed: str | None = None) -> CheckResult:
    """A CheckResult whose headline is the first failing row, or the row closest to its tolerance."""
    judged = [r for r in rec.rows if r.verdict in (PASS, FAIL)]
    failing = [r for r in judged if r.verdict == FAIL]
    if verdict is None:
        verdict = FAIL if failing else (PASS if judged else SKIP)
    head = max(failing or judged, key=lambda r: r.margin) if judged else None
    if head is not None:
        observed = observed or f"{head.quantity} [{head.side}, {head.size}] = {fmt(head.value)}"
        allowed = allowed or head.tolerance
    return CheckResult(name, verdict, observed or "", allowed or "", tuple(rec.causes), tuple(rec.rows), section,
                       rec.alpha, seconds, tuple(rec.warnings))



def skipped(name: str, why: str) -> CheckResult:
    """A check that could not run (the port lacks an optional method): no rows, and its section says why."""
    return summarize(name, Recorder(name), f"Skipped: {why}")

def with_status_row(result: CheckResult) -> CheckResult:
    """A skipped or errored check without rows gets one row saying so (and why), so the CSVs list every check;
    a skip's headline is its reason."""
    if result.verdict not in (SKIP, ERROR):
        return result
    reason = result.observed or result.section.split("\n", 1)[0].removeprefix("Skipped: ").strip()
    observed = result.observed or f"skipped: {reason}"
    rows = result.rows or (Row(result.name, "skipped" if result.verdict == SKIP else "error", "port", "",
                               math.nan, result.allowed or "-", result.verdict, reason),)
    return CheckResult(result.name, result.verdict, observed, result.allowed or "-", result.causes, rows,
                       result.section, result.alpha, result.seconds)


def worst(verdicts: Iterable[str]) -> str:
    """The suite's verdict: error > fail > pass (skips and infos do not fail a run)."""
    seen = set(verdicts)
    for v in (ERROR, FAIL):
        if v in seen:
            return v
    return PASS


def rows_table(rows: Sequence[Row], limit: int = 60) -> str:
    """The rows of a check as Markdown (failures first, then the closest passes), at most `limit` rows."""
    order = sorted(rows, key=lambda r: (r.verdict != FAIL, r.verdict == INFO, -r.margin))
    shown = order[:limit]
    text = markdown_table(("quantity", "side", "size", "value", "allowed", "verdict", "cause"),
                          [(r.quantity, r.side, r.size, fmt(r.value), r.tolerance, r.verdict, r.cause) for r in shown])
    if len(order) > limit:
        text += f"\n\n({len(order) - limit} more rows in the CSV.)"
    return text
