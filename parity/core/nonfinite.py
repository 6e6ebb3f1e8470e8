"""A port's NaN or inf where the reference's answer is finite: a failed check (exit 1), not a protocol break.

The checked wrappers (parity.mlp.adapter.CheckedPort, parity.tree.adapter.CheckedTreePort) raise parity.core.port.NonFinite when
an output of the right form holds NaN or inf. The check that made the call then fails (parity.mlp.suite.run_check, or
parity.tree.check.run for the LM suite) with a row per array that holds them, the call's input in words, where the
NaN / inf lie and the likely cause (parity.core.diagnose.nonfinite_cause); the repro folder holds that input (the call as
the port received it, for the methods the tape keeps). The reference is asked the same call first: where its answer
is non-finite too, nothing here judges the port and it stays the protocol error it was. Calls on the port's own state
(its optimizer, its ES loop) cannot be put to the reference; the reference's own run is validated the same way.
"""
from __future__ import annotations

import inspect
from typing import Any, NamedTuple

import numpy as np

from parity.core import diagnose
from parity.core.port import NonFinite, PortError
from parity.core.repro import Call, Evidence
from parity.core.tape import NotRecorded
from parity.core.verdict import Recorder, fmt, summarize

# The CheckedPort methods the reference answers on the same arguments (the others carry the port's own state).
RECALLED = frozenset({"noise", "perturbed_linear", "shape_fitness", "gradient", "forward", "init_params",
                      "action_uniforms"})
FINITE_ALLOWED = 2.0 * float(np.finfo(np.float32).max)     # |port - reference| of any two finite float32 values
FINITE_WHY = ("any finite value: during the check this call returned NaN or inf where the reference's answer is "
              "finite; once it is finite, the check's own bound applies (run the suite again)")
SHOWN_ROWS = 8


class Answer(NamedTuple):
    """The reference's answer to the port's call: `finite` True / False (non-finite: not judged here) / None
    (not asked, `note` says why), and the output when it was had."""

    finite: bool | None
    output: Any
    note: str


# ----------------------------------------------------------------------------- the input in words
def describe(value: Any, depth: int = 0) -> str:
    """An argument in a few words: an array's dtype, shape and values (constant, range), a dict's first entries."""
    if isinstance(value, np.ndarray):
        return _array_words(value)
    if isinstance(value, dict):
        items = [f"{k}: {describe(v, depth + 1)}" for k, v in list(value.items())[:3 if depth else 4]]
        return "{" + ", ".join(items) + (", ..." if len(value) > len(items) else "") + "}"
    if isinstance(value, (tuple, list)) and depth < 2:
        return "(" + ", ".join(describe(v, depth + 1) for v in value[:4]) + (", ..." if len(value) > 4 else "") + ")"
    if isinstance(value, (bool, int, float, str, np.generic)) or value is None:
        return repr(value.item() if isinstance(value, np.generic) else value)
    return f"a {type(value).__name__}"


def _array_words(x: np.ndarray) -> str:
    head = f"{x.dtype}{list(x.shape)}"
    if x.size == 0:
        return head
    finite = x[np.isfinite(x)] if np.issubdtype(x.dtype, np.floating) else x
    if finite.size < x.size:
        return f"{head} holding {diagnose.nonfinite_count(x)}"
    if x.size > 1 and np.all(x == x.flat[0]):
        return f"{head}, every value {fmt(float(x.flat[0]))}"
    return f"{head} in [{fmt(float(finite.min()))}, {fmt(float(finite.max()))}]"


def named_args(err: NonFinite) -> list[tuple[str, Any]]:
    """The call's arguments by the names of the wrapper's method (its signature), as the suite passed them."""
    try:
        names = [p for p in inspect.signature(getattr(type(err.source), err.method)).parameters if p != "self"]
    except (TypeError, ValueError, AttributeError):
        names = []
    named = [(names[i] if i < len(names) else f"arg{i}", v) for i, v in enumerate(err.args)]
    return named + list(err.kwargs.items())


def call_words(err: NonFinite) -> str:
    """`method(name = words, ...)`: the input that triggers the NaN or inf."""
    return f"{err.method}(" + "; ".join(f"{k} = {describe(v)}" for k, v in named_args(err)) + ")"


def where_words(path: tuple, array: np.ndarray) -> str:
    """'NaN at 3 of 256 values of '0.weight' A (rows 1, 4 of 8)': the rows on the first axis where not all."""
    bad = ~np.isfinite(array)
    rows = np.nonzero(bad.reshape(bad.shape[0], -1).any(1))[0] if array.ndim > 1 else np.zeros(0, int)
    at = ""
    if 0 < rows.size < array.shape[0]:
        shown = ", ".join(map(str, rows[:6].tolist())) + (" ..." if rows.size > 6 else "")
        at = f" ({'row' if rows.size == 1 else 'rows'} {shown} of {array.shape[0]})"
    return f"{diagnose.nonfinite_count(array)} of {diagnose.path_words(path)}{at}"


# ----------------------------------------------------------------------------- the reference's answer
def reference_answer(ref: Any, err: NonFinite) -> Answer:
    """The reference wrapper (CheckedPort) asked the port's call, on the same arguments, where it can be."""
    if err.method not in RECALLED:
        return Answer(None, None, f"not asked: `{err.method}` takes the port's own state")
    try:
        return Answer(True, getattr(ref, err.method)(*err.args, **err.kwargs), "finite")
    except NonFinite:
        return Answer(False, None, "non-finite too")
    except (PortError, NotRecorded) as other:
        return Answer(None, None, f"not had ({other})")


def reference_at(answer: Answer, path: tuple, like: np.ndarray) -> np.ndarray:
    """The reference's array at the port's path, where its output has one of that shape; else zeros."""
    value = answer.output
    try:
        for key in path:
            value = value[key]
        value = np.asarray(value, np.float64)
    except (KeyError, IndexError, TypeError):
        return np.zeros(like.shape)
    return value if value.shape == like.shape else np.zeros(like.shape)


def witness(repro: Any, check: str, err: NonFinite, answer: Answer) -> None:
    """The repro collector's evidence for the check, in place of any it kept: the call whose output held NaN or inf,
    its inputs as the tape copied them, else as the port was given them (err.port_call)."""
    call = None if repro is None else repro.tape.producing(err.output)
    if call is None and repro is not None and err.port_call is not None:
        call = Call(*err.port_call, err.output)
    if call is None:
        return
    path, array = err.where[0]
    why = FINITE_WHY + ("" if answer.finite else f" (the reference's answer: {answer.note}; shown as zeros)")
    repro.keep(Evidence(check, f"{err.method}: {diagnose.path_words(path)}", call, path, np.array(array),
                        reference_at(answer, path, array), np.full(array.shape, FINITE_ALLOWED), why, np.inf))


# ----------------------------------------------------------------------------- what a check reports
def cause(err: NonFinite, answer: Answer):
    """The diagnosis' Cause for this call (parity.core.diagnose.nonfinite_cause)."""
    return diagnose.nonfinite_cause(err.method, named_args(err), err.where, answer.note)


def check_result(name: str, err: NonFinite, ctx: Any):
    """The failed CheckResult of the CartPole check `name` whose port call returned NaN or inf, or None where the
    reference's answer to the same call is non-finite too (the caller keeps it a protocol error)."""
    answer = reference_answer(ctx.ref, err)
    if answer.finite is False:
        return None
    found = cause(err, answer)
    rec = Recorder(name)
    for path, array in err.where[:SHOWN_ROWS]:
        rec.fail(f"NaN or inf in `{err.method}`'s output", "port", diagnose.path_words(path),
                 float(np.sum(~np.isfinite(array))), "0 (the reference's answer is finite)", found)
    witness(ctx.repro, name, err, answer)
    observed = f"port method `{err.method}` returned {where_words(*err.where[0])} on finite input"
    return summarize(name, rec, section(err, answer), observed=observed,
                     allowed="finite, as the reference's answer to the same call")


def section(err: NonFinite, answer: Answer) -> str:
    """The check's section: the call, where the NaN / inf lie, the reference's answer (the report adds the cause)."""
    more = len(err.where) - SHOWN_ROWS
    return "\n".join([
        f"The port's `{err.method}` returned NaN or inf on finite input, so this check stopped there: a numerical "
        "failure of the port (exit 1), not a protocol break.", "",
        f"- the call: {call_words(err)}",
        *[f"- {where_words(p, a)}" for p, a in err.where[:SHOWN_ROWS]],
        *([f"- and {more} more arrays"] if more > 0 else []),
        f"- the reference's answer to the same call: {answer.note}", "",
        "The repro folder, where one is named below, holds this call's input (inputs.npz) and makes the call alone.",
    ])


def tree_reference_answer(R: Any, cfg: Any, err: NonFinite) -> Answer:
    """The LM reference (parity.tree.reference, or a bundle's) asked a tree port's call where it has the same one:
    shaping at the run's group size, the mm / tmm products."""
    args = err.args
    try:
        if err.method == "shape_fitness" and args[1] == cfg.group_size:
            out = R.shape(cfg, args[0])
        elif err.method in ("perturbed_mm", "perturbed_tmm"):
            out = R.product(*args[:4], err.method.removeprefix("perturbed_"))
        else:
            return Answer(None, None, f"not asked: the LM reference has no `{err.method}` on the same arguments")
    except NotRecorded as other:
        return Answer(None, None, f"not had ({other})")
    finite = bool(np.all(np.isfinite(np.asarray(out, np.float64))))
    return Answer(finite, out, "finite" if finite else "non-finite too")


def tree_rows(name: str, err: NonFinite, R: Any, cfg: Any, repro: Any, row: Any) -> list | None:
    """The LM check's failing rows (parity.tree.check.Row, passed as `row`) for a tree port's NaN or inf, or None
    where the reference's answer is non-finite too (the caller keeps it a protocol error)."""
    answer = tree_reference_answer(R, cfg, err)
    if answer.finite is False:
        return None
    found = cause(err, answer)
    witness(repro, name, err, answer)
    text = f"{found.text}; the call: {call_words(err)}"
    return [row(name, f"`{err.method}` returns {where_words(p, a)}", float(np.sum(~np.isfinite(a))),
                "0 (finite, as the reference's answer to the same call)", "fail", text)
            for p, a in err.where[:SHOWN_ROWS]]
