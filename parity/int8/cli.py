"""`python -m parity int8` (`make int8`): integer EGGROLL three ways — JAX reference, torch port, C side — bit for bit.

Every side computes every piece of one Case (parity/int8/pieces.py: init, window starts, member noise, each op of the
forward, logits, scores, fitness signs, votes Z, the update, a K-epoch trajectory) and each is compared with the
reference for equality. A side that parts is reported at its first differing piece and element; a departing torch
side (--torch KNOB=VALUE, --profile egg.c) is then named by the C side's knob signatures: the smallest set of egg.c's
departures with which the C side reproduces the torch side's every piece exactly.

Exit codes: 0 every side equal to the reference at every piece; 1 a side parts; 2 bad usage or input (nothing is
run and nothing written): an unknown knob, value, profile or size, a configuration nano-egg's arithmetic cannot take
(a width not a power of 4, an odd population, sigma_shift out of range), a missing corpus, a C side whose build failed
(the compiler's error is printed). No C compiler is no error: the C row says why it was skipped.
"""
from __future__ import annotations

import argparse
import csv
import datetime
import functools
import io
import shlex
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from parity.core.plan import Check, run_plan
from parity.int8.pieces import GROUPS, Case, Naming, first_parting, group, group_table, make_case, name_knobs
from spec.int8 import EGG_C_ORIGINAL, INT8_PRESETS, NANO_EGG_ORIGINAL, Int8Config
from spec.int8_knobs import ALL_INT8_KNOBS, INT8_PROFILES, Int8KnobError, Int8Knobs, parse_int8_knobs
from reporting import cpu_name, fmt, versions, xla_flags, xla_flags_text
from spec.limits import check_out_dir
from spec.platform import request_of

SIZES = ("selftest", "quick")
EXIT_PASS, EXIT_PARTS, EXIT_USAGE = 0, 1, 2


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):
        raise ValueError(f"{message}\n\n{self.format_usage().strip()}")


def build_parser() -> argparse.ArgumentParser:
    """The flags every task takes (parity.core.flags; --port and --against are refused in `refused`), then int8's
    own: the trajectory's epochs, the configuration's overrides, the corpus, --no-c."""
    from parity.core.flags import add_task_flags
    p = _Parser(prog="python -m parity int8",
                description="integer EGGROLL three ways (JAX reference, torch port, C side), compared for equality")
    add_task_flags(
        p, out="runs/int8", sizes=SIZES, size_default="quick", size_choices=False, seed_default=0,
        size_help=f"int8 preset: {', '.join(SIZES)} (default quick)", profiles=INT8_PROFILES,
        profile_default="nano-egg", knob_help="; ".join(f"{k.name}: {k.nano_egg}|{k.egg_c}"
                                                        for k in ALL_INT8_KNOBS.values()),
        checks=GROUPS, port_help=f"not taken by int8: {REFUSED['--port']}",
        against_help=f"not taken by int8: {REFUSED['--against']}")
    p.add_argument("--epochs", type=int, default=4, help="trajectory epochs K (default 4; at most the preset's)")
    p.add_argument("--hidden", type=int, help="width d (a power of 4)")
    p.add_argument("--layers", type=int, help="layers")
    p.add_argument("--pop", type=int, help="population (even)")
    p.add_argument("--tokens", type=int, help="tokens per member per epoch T")
    p.add_argument("--sigma-shift", type=int, help="noise shift (sigma = 2^-s)")
    p.add_argument("--corpus", help="text file for the trajectory (default: the shipped corpus)")
    p.add_argument("--no-c", action="store_true", help="leave the C side out (two sides, and no knob naming)")
    return p


REFUSED = {   # the flags every task takes that int8 cannot honour, and why
    "--port": "the int8 suite checks torch_impl's integer port and the C side against the JAX reference; a foreign "
              "int8 port has no adapter protocol (use --profile or --torch KNOB=VALUE for a departing torch side)",
    "--against": "int8 has no recorded bundles; its JAX reference runs live (drop --against)",
}


def refused(args) -> None:
    """ValueError, before any work, for a flag every task takes that int8 cannot honour (--port, --against) and for
    a --checks subset: every piece is computed in one pass over one Case, so the groups are checked together."""
    from parity.core.flags import refuse, selected_checks
    refuse(args, "int8", REFUSED)
    if set(selected_checks(args.checks, GROUPS)) != set(GROUPS):
        raise ValueError(f"--checks {args.checks}: --task int8 computes every piece of one Case in one pass and "
                         f"checks every group ({', '.join(GROUPS)}), the first parting naming the cause; it takes no subset (cartpole, lm and tree do; drop --checks)")


class Plan:
    """Everything checked before any work: the config, the torch side's knobs, the corpus, the C side's state."""

    def __init__(self, args):
        if args.size not in SIZES:
            raise ValueError(f"--size {args.size!r}: use one of {', '.join(SIZES)}")
        overrides = {"n_embd": args.hidden, "n_layer": args.layers, "pop": args.pop,
                     "tokens_per_update": args.tokens, "sigma_shift": args.sigma_shift}
        self.cfg: Int8Config = INT8_PRESETS[args.size].replace(**{k: v for k, v in overrides.items() if v is not None})
        if not 1 <= args.epochs <= self.cfg.epochs:
            raise ValueError(f"--epochs {args.epochs}: the trajectory runs 1..{self.cfg.epochs} epochs at size "
                             f"{args.size}")
        self.knobs: Int8Knobs = parse_int8_knobs(args.torch, args.profile)
        check_out_dir(args.out)
        from rollout.int8_data import load_int8_corpus    # numpy only: the corpus is part of the input
        from spec.lm_run import check_corpus_path
        self.corpus = load_int8_corpus(check_corpus_path(args.corpus), self.cfg)
        self.device = args.device
        if args.device.startswith("cuda"):
            from parity.core.device import check_device
            check_device(args.device)
        from parity.core.platform import platform_for
        self.platform = platform_for(request_of(args))
        self.c_reason = None
        if args.no_c:
            self.c_reason = "C side left out (--no-c)"
        else:
            from parity.int8.c_side import unavailable_reason
            reason = unavailable_reason()
            if reason is not None and not reason.startswith("C side skipped: no C compiler"):
                raise ValueError(f"{reason}\n  fix the C side's build (make c-side shows it), or run with --no-c")
            self.c_reason = reason


def describe_knobs(knobs: Int8Knobs) -> str:
    dep = knobs.departures()
    return ", ".join(f"{k}={v}" for k, v in dep.items()) if dep else "nano-egg (faithful)"


def cause_text(naming: Naming) -> str:
    """The knobs in the knob table's words."""
    if not naming.knobs.departures():
        return "no egg.c knob explains it"
    return "; ".join(f"{k}={v}: {ALL_INT8_KNOBS[k].means}" for k, v in naming.knobs.departures().items())


@dataclass
class Int8State:
    """What the int8 checks share: the inputs (Plan), the seed, the case every side computes, the progress log, and
    the reference's pieces (the first check's, which every other side is compared with)."""

    plan: Plan
    seed: int
    case: Case
    log: Callable[[str], None]
    want: dict | None = None

    @functools.cached_property
    def lookups(self) -> tuple:
        """The reference's own int8 look-ups on its platform (noise, init), which the C side is given."""
        from parity.int8.reference import lookups
        return lookups(self.plan.platform)

    def c_signature(self, knobs: Int8Knobs) -> dict:
        """The C side's pieces under `knobs` (egg.c's departures): a knob signature the torch side is named by."""
        from parity.int8.c_side import CSide
        return CSide(self.plan.cfg, self.seed, *self.lookups, knobs).pieces(self.case)


def compare_side(s: Int8State, side, knobs: Int8Knobs, name_by_c: bool) -> dict:
    """A side's row: its pieces, its first parting from the reference's and, where it parts and name_by_c (the torch
    side, with the C side built), the smallest set of egg.c's knobs with which the C side reproduces it."""
    t0 = time.perf_counter()
    s.log(f"  {side.name}: computing every piece")
    got = side.pieces(s.case)
    parting = first_parting(s.want, got, s.case.threads)
    row = {"side": side.name, "knobs": describe_knobs(knobs), "seconds": time.perf_counter() - t0,
           "parting": parting, "naming": None, "table": group_table(s.want, got), "pieces": got}
    if parting is not None:
        s.log(f"    parts from the reference at {parting.text()}")
        if name_by_c:
            s.log("    naming it by the C side's knob signatures")
            row["naming"] = name_knobs(got, s.c_signature, s.case.threads, log=s.log)
    return row


def reference_pieces(s: Int8State) -> dict:
    """The JAX reference's every piece: the row every other side is compared with (kept as s.want)."""
    from parity.int8.reference import ReferenceSide
    t0 = time.perf_counter()
    ref = ReferenceSide(s.plan.cfg, s.seed, s.plan.platform)
    s.log(f"  {ref.name}: computing every piece")
    s.want = ref.pieces(s.case)
    return {"side": ref.name, "knobs": "nano-egg (the reference)", "seconds": time.perf_counter() - t0,
            "parting": None, "naming": None, "table": group_table(s.want, s.want), "pieces": s.want}


def torch_pieces(s: Int8State) -> dict:
    """The torch port under the torch-side knobs against the reference, named by the C side's knobs if it parts."""
    from parity.int8.torch_side import TorchSide
    side = TorchSide(s.plan.cfg, s.seed, s.plan.knobs, s.plan.device)
    return compare_side(s, side, s.plan.knobs, name_by_c=s.plan.c_reason is None)


def c_pieces(s: Int8State) -> dict | None:
    """The C side (egg.c's arithmetic at nano-egg's knobs, the reference's look-ups) against the reference; None where
    it is left out (no C compiler, --no-c: the report's skipped line gives Plan.c_reason)."""
    from parity.int8.c_side import CSide
    if s.plan.c_reason is not None:
        return None
    return compare_side(s, CSide(s.plan.cfg, s.seed, *s.lookups), Int8Knobs(), name_by_c=False)


# The int8 suite's plan, a check per side: the reference first (its pieces are what the others are compared with),
# then the torch port and the C side. None needs another's verdict: each is compared with the reference's pieces.
SIDES: tuple[Check, ...] = (
    Check("reference", (), reference_pieces),
    Check("torch", (), torch_pieces),
    Check("C", (), c_pieces))


def run(plan: Plan, seed: int, epochs: int, log) -> dict:
    """The three sides' pieces, their partings from the reference and, for a departing torch side, the named knobs.
    A side left out (no C compiler, --no-c) has no row: the report's skipped line gives plan.c_reason."""
    state = Int8State(plan, seed, make_case(plan.cfg, seed, epochs, plan.corpus), log)
    return {"case": state.case, "rows": [ran.result for ran in run_plan(SIDES, state) if ran.result is not None]}


def naming_line(row: dict, c_reason: str | None) -> str:
    naming: Naming | None = row["naming"]
    if row["parting"] is None:
        return "equal at every piece"
    if naming is None:
        why = c_reason or "only the torch side is named (by the C side's signatures)"
        return f"not named: {why}"
    if naming.exact:
        return (f"{cause_text(naming)} (the C side with exactly these knobs reproduces every piece; "
                f"{naming.tried} signatures computed)")
    return (f"no knob set reproduces it exactly; the closest ({describe_knobs(naming.knobs)}) still parts at "
            f"{naming.left.text()}")


def side_tables(rows: list[dict], c_reason: str | None) -> list[str]:
    """The Markdown tables: a row per side (pieces equal, first parting, cause), then pieces equal by group."""
    lines = ["| side | knobs | pieces equal | first parting from the reference | cause | s |",
             "|---|---|---|---|---|---|"]
    for row in rows:
        n_eq = sum(a for a, _ in row["table"].values())
        n = sum(b for _, b in row["table"].values())
        parting = row["parting"].text() if row["parting"] is not None else "none"
        cause = "the reference" if row is rows[0] else naming_line(row, c_reason)
        lines.append(f"| {row['side']} | {row['knobs']} | {n_eq} of {n} | {parting} | {cause} | "
                     f"{row['seconds']:.1f} |")
    if c_reason is not None:
        lines.append(f"| C (c_int8) | - | - | skipped: {c_reason} | - | - |")
    groups = list(rows[0]["table"])
    lines += ["", "Pieces equal to the reference, by group (equal / compared):", "",
              "| side | " + " | ".join(groups) + " |", "|---|" + "---|" * len(groups)]
    for row in rows[1:]:
        lines.append(f"| {row['side']} | " + " | ".join(f"{row['table'].get(g, (0, 0))[0]}/"
                                                        f"{row['table'].get(g, (0, 0))[1]}" for g in groups) + " |")
    return lines


def pieces_csv(rows: list[dict], members: tuple[int, ...]) -> str:
    """A row per piece and side: shape, equal, how many elements differ, the first differing element."""
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(["side", "piece", "shape", "equal", "differing", "first_element"])
    for row in rows[1:]:
        for piece, value in rows[0]["pieces"].items():
            got = {piece: row["pieces"][piece]} if piece in row["pieces"] else {}
            p = first_parting({piece: value}, got, members)
            w.writerow([row["side"], piece, "x".join(map(str, value.shape)), p is None,
                        0 if p is None else p.differing, "" if p is None else p.element])
    return buf.getvalue()


INTEGER_NOTE = ("The integer LM's products take int8 operands and sum in int32: exact under any matmul precision, so "
                "TF32 or float32 changes nothing here.")


def lookup_lines(platform) -> list[str]:
    """Where the reference draws another backend's normals than JAX's CPU ones: how many entries of its two int8
    look-ups that changes (measured here), so that every side is seen to use the same look-up."""
    if platform.normals == "cpu":
        return []
    from parity.int8.reference import lookups_differ
    noise, init = lookups_differ(platform)
    return [f"- JAX's {platform.normals.upper()} normals against its CPU normals: {noise} of 2^23 noise look-up "
            f"entries int8(normal * 16) and {init} of 2^23 init look-up entries round(normal * 16) differ; the C side "
            "gets the reference's own look-ups, the torch side builds its own from JAX's CPU normals"
            + (", which are therefore the same" if noise == init == 0 else ""), ""]


def side_causes(row: dict, c_reason: str | None) -> tuple:
    """A parted side's causes (parity.core.verdict.Cause): its naming line, under each knob an exact naming names."""
    from parity.core.verdict import Cause
    line = naming_line(row, c_reason)
    naming: Naming | None = row["naming"]
    knobs = list(naming.knobs.departures()) if naming is not None and naming.exact else []
    return tuple(Cause(k, line) for k in knobs) or (Cause(None, line),)


def check_results(result: dict, c_reason: str | None) -> list:
    """The three sides as the one report's check results (parity.core.verdict): a check per group of pieces
    (parity.int8.pieces.GROUPS), a row per piece and side (value: the elements that differ, allowed none), the side's
    cause on the piece where it first parts, and a skipped row for a C side left out."""
    from parity.core.verdict import FAIL, PASS, SKIP, CheckResult, Row
    case: Case = result["case"]
    reference, sides = result["rows"][0], result["rows"][1:]
    results, by_group = [], {}
    for piece, value in reference["pieces"].items():       # the reference's pieces by group, in their order
        by_group.setdefault(group(piece), []).append((piece, value))
    for g in [g for g in GROUPS if g in by_group]:
        rows, causes, observed = [], (), ""
        for row in sides:
            for piece, value in by_group[g]:
                got = {piece: row["pieces"][piece]} if piece in row["pieces"] else {}
                p = first_parting({piece: value}, got, case.threads)
                first = row["parting"] is not None and row["parting"].piece == piece
                rows.append(Row(g, piece, row["side"], "x".join(map(str, value.shape)), 0 if p is None else p.differing,
                                "== 0 (equal at every element, same shape)", PASS if p is None else FAIL,
                                naming_line(row, c_reason) if first else ""))
                if first:
                    causes += side_causes(row, c_reason)
                    observed = observed or f"{row['side']} parts at {row['parting'].text()}"
        if c_reason is not None:
            rows.append(Row(g, "-", "C (c_int8)", "", float("nan"), "-", SKIP, c_reason))
        fails = [r for r in rows if r.verdict == FAIL]
        compared = [r for r in rows if r.verdict != SKIP]
        if fails and not observed:
            observed = f"{fails[0].side}: {fails[0].quantity}: {fmt(fails[0].value)} elements differ"
        pieces = len(by_group[g])
        observed = observed or (f"{pieces} of {pieces} pieces equal on each side "
                                f"({', '.join(dict.fromkeys(r.side for r in compared))})")
        results.append(CheckResult(g, FAIL if fails else PASS, observed, "equality at every element of every piece",
                                   causes, tuple(rows), ""))
    return results


def report_family(result: dict, plan: Plan, argv: list[str], seed: int, code: int, seconds: float):
    """What only int8's report says (parity.core.report.Family): the title, the platform's sentence, the run's facts,
    the table of sides, pieces.csv and result.json's details (each side's parting and naming, the C side's state)."""
    from parity.core.report import Family
    case: Case = result["case"]
    rows = result["rows"]
    facts = (*[line for line in lookup_lines(plan.platform) if line],
             f"- command: `python -m parity int8 {shlex.join(argv)}`",
             f"- size: {plan.cfg}",
             f"- seed: {seed}; case epoch {case.epoch}; traced members {', '.join(map(str, case.threads))}; update "
             f"threshold {case.threshold}; trajectory {case.trajectory_epochs} epochs on "
             f"{getattr(case.corpus, 'path', None) or 'the shipped corpus'}",
             f"- versions: {', '.join(f'{k} {v}' for k, v in versions(INT8_PACKAGES).items())}; CPU {cpu_name()}",
             f"- device: {device_text(plan)}; reference platform: {plan.platform.fields_text()}",
             f"- XLA_FLAGS: {xla_flags_text(xla_flags())}",
             f"- took {seconds:.1f} s",
             "- the bar: equality at every element of every piece (integer arithmetic has no rounding); pieces and "
             "their order: parity/int8/pieces.py",
             f"- the originals (conformance tests, skipped where the source is absent): {NANO_EGG_ORIGINAL[0]} "
             f"{NANO_EGG_ORIGINAL[1]} at {NANO_EGG_ORIGINAL[2][:7]} is reproduced by the JAX reference "
             f"(tests/jax_reference/test_int8_nano_egg.py); {EGG_C_ORIGINAL[0]} {EGG_C_ORIGINAL[1]} at "
             f"{EGG_C_ORIGINAL[2][:7]} by the C side and the torch port with profile egg.c-cpumulti "
             "(tests/c_int8/test_egg_c_conformance.py)")
    details = {"config": str(plan.cfg), "c_side": plan.c_reason or "ran",
               "sides": [{"side": r["side"], "knobs": r["knobs"],
                          "parting": None if r["parting"] is None else r["parting"]._asdict(),
                          "named": None if r["naming"] is None else {"knobs": r["naming"].knobs.departures(),
                                                                     "exact": r["naming"].exact}}
                         for r in rows]}
    return Family(task="int8", title=f"Integer parity, three ways: {'PASS' if code == EXIT_PASS else 'FAIL'}",
                  lead=(plan.platform.sentence(bounds=False) + " " + INTEGER_NOTE,), run=facts,
                  sections=("## Sides", "", *side_tables(rows, plan.c_reason), ""),
                  files=(("pieces.csv", pieces_csv(rows, case.threads)),), details=details)


INT8_PACKAGES = ("torch", "jax", "numpy")


def device_text(plan: Plan) -> str:
    return f"torch side on {plan.device}; JAX reference on {plan.platform.where()[len('JAX on '):]}"


def run_info(plan: Plan, args, argv: list[str], began: str, seconds: float):
    """What result.json records about the run (parity.core.report.RunInfo, as every task's)."""
    from parity.core.report import RunInfo
    sides = "torch_impl's int8 port" + ("" if plan.c_reason else " and the C side (c_int8)")
    return RunInfo(command=f"python -m parity int8 {shlex.join(argv)}", port=sides,
                   configuration=f"profile {args.profile}" + (f", knobs {' '.join(args.torch)}" if args.torch else "")
                   + f"; departures from the reference: {describe_knobs(plan.knobs)}",
                   sizes=f"{args.size}: {plan.cfg}; trajectory {args.epochs} epochs", seed=args.seed,
                   versions=versions(INT8_PACKAGES), device=device_text(plan), started=began, seconds=seconds,
                   platform=plan.platform, xla_flags=xla_flags())


def main(argv: list[str]) -> int:
    started = time.perf_counter()
    try:
        args = build_parser().parse_args(argv)
        refused(args)
        plan = Plan(args)
    except (ValueError, Int8KnobError, OSError) as err:
        print(f"parity int8: {err}", file=sys.stderr)
        return EXIT_USAGE
    text = sys.stderr if args.json else sys.stdout          # --json: stdout holds result.json alone
    log = (lambda line: None) if args.quiet else (lambda line: print(line, file=text, flush=True))
    log(f"parity int8: JAX reference vs torch ({describe_knobs(plan.knobs)}) vs C, size {args.size}, seed "
        f"{args.seed}, trajectory {args.epochs} epochs")
    if plan.c_reason is not None:
        log(f"  {plan.c_reason}")
    began = datetime.datetime.now().isoformat(timespec="seconds")
    try:
        result = run(plan, args.seed, args.epochs, log)
        code = EXIT_PARTS if any(r["parting"] is not None for r in result["rows"]) else EXIT_PASS
        results = check_results(result, plan.c_reason)
        family = report_family(result, plan, argv, args.seed, code, time.perf_counter() - started)
    except Exception:                # the suite's own crash: exit 3, never the parting code, and nothing written
        from parity.core.exits import internal_error
        return internal_error("parity int8")
    from parity.core.report import write_report
    info = run_info(plan, args, argv, began, time.perf_counter() - started)
    write_report(Path(args.out), results, info, code, family)
    summary = Path(args.out) / "summary.md"
    for row in result["rows"][1:]:
        state = "equal at every piece" if row["parting"] is None else f"parts at {row['parting'].text()}"
        log(f"  {row['side']}: {state}")
        if row["parting"] is not None:
            log(f"    cause: {naming_line(row, plan.c_reason)}")
    if args.json:
        print((summary.parent / "result.json").read_text(), end="")
    print(f"{'PASS' if code == EXIT_PASS else 'FAIL'}: report in {summary} ({time.perf_counter() - started:.0f} s)",
          file=text)
    return code
