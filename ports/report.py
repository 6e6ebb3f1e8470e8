"""The survey's summary.md and CSVs: one row per port, its verdicts and the drifts named, what could not be
checked, and the suite's verdicts set beside what each package's code was read to do."""
from __future__ import annotations

import csv
import io
from pathlib import Path
from typing import NamedTuple, Sequence

from parity.core.report import likely_causes
from parity.mlp.suite import CHECKS
from ports.survey import PortResult
from reporting import atomic_write, fmt, markdown_table

KNOBS = ("rng", "antithetic", "fitness", "bias_noise", "bias_grad", "noise_reuse", "init", "optimizer", "lr_decay",
         "sigma_decay")


class SurveyInfo(NamedTuple):
    command: str
    size: str
    seed: int
    versions: dict[str, str]
    device: str
    started: str
    seconds: float


def _csv(header: Sequence[str], rows) -> str:
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow(header)
    writer.writerows(rows)
    return buf.getvalue()


def _short(items: Sequence[tuple[str, str]]) -> str:
    return "; ".join(what for what, _ in items) or "-"


def agreement_cell(a) -> str:
    """One knob of one port: does the suite's verdict agree with the code reading?"""
    if a is None:
        return ""
    if a.agrees is None:
        return "not judged"
    if a.agrees:
        return "agrees (named)" if a.suite == "named" else "agrees"
    return "MISSED" if a.code.startswith("drift") else "FALSE ALARM"


# ---------------------------------------------------------------- CSVs
def csv_files(ports: Sequence[PortResult]) -> dict[str, str]:
    head = ["port", "spec", "dist", "pinned", "installed", "status", "name", "verdict", *CHECKS, "knobs_named",
            "could_not_check", "seconds"]
    return {
        "ports.csv": _csv(head, [[p.entry.key, p.entry.spec, p.entry.dist, p.entry.pinned, p.installed, p.status,
                                  p.name, p.verdict, *(p.verdict_of(c) for c in CHECKS), " ".join(p.knobs),
                                  _short(p.unchecked), f"{p.seconds:.1f}"] for p in ports]),
        "checks.csv": _csv(["port", "check", "verdict", "observed", "allowed", "likely_cause"],
                           [[p.entry.key, r.name, r.verdict, r.observed, r.allowed, likely_causes(r)]
                            for p in ports for r in p.results]),
        "readings.csv": _csv(["port", "knob", "code", "where", "what", "suite", "agrees", "note"],
                             [[p.entry.key, a.knob, a.code, a.where, _what(p, a.knob), a.suite,
                               "" if a.agrees is None else a.agrees, a.note] for p in ports for a in p.agreements]),
        "unchecked.csv": _csv(["port", "what", "why"], [[p.entry.key, w, y] for p in ports for w, y in p.unchecked]),
        "probes.csv": _csv(["port", "probe", "leaf", "value", "expected", "consistent", "note"],
                           [[p.entry.key, q.probe, q.leaf, fmt(q.value), q.expected,
                             "" if q.consistent is None else q.consistent, q.note] for p in ports for q in p.probes]),
    }


def _what(p: PortResult, knob: str) -> str:
    return next((r.what for r in p.entry.readings if r.knob == knob), "")


# ---------------------------------------------------------------- summary.md
def _header(info: SurveyInfo, ports: Sequence[PortResult]) -> list[str]:
    pkgs = ", ".join(f"{p.entry.dist} {p.installed} (pinned {p.entry.pinned})"
                     for p in {p.entry.dist: p for p in ports}.values())
    return ["# Survey: the EGGROLL ports on PyPI through the parity suite", "",
            "Each port is checked through an adapter in `ports/` that only translates: every number comes from the "
            "installed package, configured as its README shows, with the user's network built as the reference's "
            "(pqn, normal/sqrt(in) init) so that what the suite finds is the package's own. The verdicts are the "
            "suite's (`python -m parity check --port ...`, quick size); the code readings are this survey's, from "
            "each wheel's source (file:line).", "",
            f"- command: `{info.command}`",
            f"- suite size: {info.size}; run seed: {info.seed} (noise keys, init, fitness vectors, resets and "
            "action uniforms derive from it)",
            f"- versions: {', '.join(f'{k} {v}' for k, v in info.versions.items())}",
            f"- ports: {pkgs}",
            f"- device: {info.device}",
            f"- started {info.started}; took {info.seconds / 60:.1f} min", ""]


def _survey_table(ports: Sequence[PortResult]) -> list[str]:
    rows = [[f"`{p.entry.key}`", f"{p.entry.dist} {p.installed}", *(p.verdict_of(c) for c in CHECKS),
             ", ".join(f"`{k}`" for k in p.knobs) or "-", _short(p.unchecked)] for p in ports]
    return ["## Verdicts", "", markdown_table(["port", "package", *CHECKS, "drifts named (knobs)", "could not check"],
                                              rows), "",
            "A `fail` is a finding about the port, not a fault of the survey; `skip` means the package has no such "
            "method; `not run` means the protocol cannot carry what the check needs (see the port's section). The "
            "full report of each port is in its folder (`<port>/summary.md`).", ""]


def _agreement_table(ports: Sequence[PortResult]) -> list[str]:
    rows = []
    for p in ports:
        by_knob = {a.knob: a for a in p.agreements}
        rows.append([f"`{p.entry.key}`", *(agreement_cell(by_knob.get(k)) for k in KNOBS)])
    lines = ["## The suite's verdicts against the code", "",
             "Per knob: what the package's code was read to do (each port's section gives the value and file:line) "
             "against what the suite named. `agrees (named)`: a drift in the code that the suite named; `agrees`: "
             "no drift in the code and none named; `MISSED`: a drift in the code the suite did not name; `FALSE "
             "ALARM`: named without a drift in the code; `not judged`: the checks that would judge it did not run; "
             "blank: no reading (the user's model decides it, e.g. the init of a port that takes an nn.Module).",
             "", markdown_table(["port", *KNOBS], rows), ""]
    misses = [(p, a) for p in ports for a in p.agreements if a.agrees is False]
    if misses:
        lines += ["Disagreements, investigated:", ""]
        lines += [f"- `{p.entry.key}` `{a.knob}` ({a.code}, {a.where}): the suite "
                  f"{'named' if a.suite == 'named' else 'did not name'} it. "
                  f"{a.note or 'Not yet investigated: an adapter bug or a blind spot of the suite.'}"
                  for p, a in misses]
        lines.append("")
    return lines


def _port_section(p: PortResult) -> list[str]:
    e = p.entry
    lines = [f"## `{e.key}`: {p.name or e.dist}", "",
             f"- adapter: `{e.spec}`; package {e.dist} {p.installed} (pinned {e.pinned}); status: {p.status}"
             + (f"; suite verdict: **{p.verdict}**; {p.seconds:.0f} s" if p.results else ""),
             f"- configured: {e.configured}"]
    if p.results:
        lines += [f"- report: [`{e.key}/summary.md`]({e.key}/summary.md)", "", "| check | verdict | likely cause |",
                  "| --- | --- | --- |"]
        lines += [f"| {r.name} | {r.verdict} | {likely_causes(r).replace('|', '/') or '-'} |" for r in p.results]
    if p.error:
        lines += ["", "```", p.error.rstrip(), "```"]
    if p.agreements:
        lines += ["", "Code reading against the suite:", "",
                  markdown_table(["knob", "code", "where", "suite", "agrees"],
                                 [[a.knob, a.code, a.where, a.suite, agreement_cell(a)] for a in p.agreements])]
    if p.findings:
        lines += ["", "Other findings of the suite (no knob): " + "; ".join(p.findings) + "." + _clipped(p)]
    if p.unchecked:
        lines += ["", "What the protocol could not check:", ""] + [f"- {w}: {y}" for w, y in p.unchecked]
    if p.probes:
        lines += ["", "Probes of its noise (not verdicts of the suite):", "",
                  markdown_table(["probe", "leaf", "value", "EGGROLL", "consistent", "note"],
                                 [[q.probe, q.leaf, fmt(q.value), q.expected,
                                   "" if q.consistent is None else ("yes" if q.consistent else "NO"), q.note]
                                  for q in p.probes])]
    return lines + [""]


def _clipped(p: PortResult) -> str:
    """Where the probes show a clipped rank, say what the suite's scale and distribution findings then are."""
    leaves = [q.leaf for q in p.probes if q.probe.startswith("columns of A that are zero") and q.value > 0]
    if not leaves:
        return ""
    return (f" The probes below show the rank clipped on {', '.join(leaves)} (columns of A zero for every member): "
            "findings of scale or distribution on those leaves are the zero columns the adapter pads the package's "
            "min(rank, out, in) columns with; the suite has no words for a clipped rank.")


def summary_markdown(ports: Sequence[PortResult], info: SurveyInfo) -> str:
    lines = _header(info, ports) + _survey_table(ports) + _agreement_table(ports)
    for p in ports:
        lines += _port_section(p)
    lines += ["## Files", "",
              "- `ports.csv`: one row per port (verdict per check, knobs named, what could not be checked).",
              "- `checks.csv`: every check of every port (verdict, observed, allowed, likely cause).",
              "- `readings.csv`: the code readings (knob, value, file:line) against the suite's verdicts.",
              "- `unchecked.csv`, `probes.csv`: what could not be checked and why; the probes' numbers.",
              "- `<port>/`: the parity suite's own report for that port (summary.md and its CSVs).", ""]
    return "\n".join(lines)


def write(out: Path, ports: Sequence[PortResult], info: SurveyInfo) -> Path:
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    for name, text in csv_files(ports).items():
        atomic_write(out / name, text)
    atomic_write(out / "summary.md", summary_markdown(ports, info))
    return out / "summary.md"
