"""`python -m parity check --task lm` and `--task tree` (one parser, so every flag reaches both): argument parsing,
input checks (exit 2 before any work), the run, the report. --task lm checks torch_impl or a port of the project's
LM; --task tree a port on its own declared tree (parity/tree/adapter.py), with the LM's checks and bounds."""
from __future__ import annotations

import argparse
import datetime
import shlex
import sys
import time
from pathlib import Path

from parity.core.exits import internal_error
from parity.core.report import RESULT, Family, write_report
from spec.knobs import KnobError
from spec.limits import check_out_dir
from spec.platform import check_against_bundle, recorded_platform, request_of
from spec.tree_knobs import TREE_CHOICES, TREE_PROFILES, resolve_tree, tree_drifts


def build_parser() -> argparse.ArgumentParser:
    """--task lm|tree and the flags every task takes (parity.core.flags), with the LM's defaults."""
    from parity.core.flags import add_task_flags
    from parity.tree.check import CHECKS
    p = argparse.ArgumentParser(prog="python -m parity check --task lm|tree",
                                description="the tree ES against the JAX reference: on the byte-level LM (lm), or on "
                                            "a port's own declared tree (tree, with --port)")
    p.add_argument("--task", choices=("lm", "tree"), default="lm")
    add_task_flags(
        p, out="runs/parity-lm", sizes=("quick", "selftest"), profiles=TREE_PROFILES, profile_default="jax",
        knob_help="; ".join(f"{k}: {'|'.join(v)}" for k, v in TREE_CHOICES.items()), checks=CHECKS,
        size_help="LM preset, or (--task tree) the defaults of the settings a port leaves undeclared (default quick, "
                  "or the bundle's with --against)",
        port_help="check a foreign tree port through the tree protocol (parity/tree/adapter.py; worked examples "
                  "examples.lm_adapter:LMAdapter for --task lm, examples.gpt_adapter:GPTAdapter for --task tree) "
                  "instead of torch_impl",
        against_help="check against a recorded bundle (e.g. vectors/lm-quick, written by `python -m parity record "
                     "--task lm`; --task tree: `record --task tree --port ...`) instead of the live JAX reference: "
                     "no jax needed")
    return p


def parse(argv: list[str]):
    """(args with size and seed settled, knobs, bundle or None, the replayed reference or None); SystemExit from
    argparse, KnobError or ValueError (UsageError: a bundle that cannot be used) before any work."""
    args = build_parser().parse_args(argv)
    knobs = resolve_tree(args.profile, args.torch)
    check_out_dir(args.out)
    from parity.core.flags import selected_checks
    from parity.tree.check import CHECKS
    args.checks = selected_checks(args.checks, CHECKS)     # the checks to run; each other one a 'not selected' row
    if args.port and (args.torch or args.profile != "jax"):
        raise ValueError("--torch and --profile configure torch_impl; with --port the port is checked as it is "
                         "(drop them, or drop --port)")
    if args.task == "tree" and not args.port:
        raise ValueError("--task tree checks a port on its own declared tree: give --port module:attr (e.g. "
                         "examples.gpt_adapter:GPTAdapter); torch_impl's own tree is the LM: --task lm")
    if args.port and args.device != "cpu":
        raise ValueError("--device places torch_impl's tensors; with --port the port places its own (drop --device)")
    reference, bundle = None, None
    if args.against and args.task == "tree":       # its reference is made once the port declares its tree
        from parity.tree.vectors import open_tree_bundle
        bundle = open_tree_bundle(args.against, args.size, args.seed)
        check_against_bundle(args, recorded_platform(bundle.manifest), args.against)
    elif args.against:
        from parity.tree.vectors import open_bundle, replay_reference
        bundle = open_bundle(args.against, args.size, args.seed)
        check_against_bundle(args, recorded_platform(bundle.manifest), args.against)
        reference = replay_reference(bundle)
    else:
        from parity.core.platform import platform_for
        from parity.tree import reference as tree_reference
        reference = tree_reference.on_platform(platform_for(request_of(args)))
    if args.device.startswith("cuda"):
        from parity.core.device import check_device
        check_device(args.device)
    from parity.tree.base import follow_reference_rng
    platform = recorded_platform(bundle.manifest) if reference is None else reference.platform
    knobs, args.followed = follow_reference_rng(knobs, platform)
    args.pinned = args.torch + [f"rng={knobs.rng}"] if args.followed else args.torch    # what a repro rebuilds
    from parity.core.tape import run_size_and_seed
    args.size, args.seed = run_size_and_seed(bundle, args.size, args.seed)
    return args, knobs, bundle, reference


def main(argv: list[str]) -> int:
    try:
        args, knobs, bundle, reference = parse(argv)
    except SystemExit as exit_:
        return int(exit_.code or 0)
    except (KnobError, ValueError) as err:         # UsageError (a bundle that cannot be used) is a ValueError
        print(f"parity check: {err}", file=sys.stderr)
        return 2
    from parity.tree import check as tree_check
    from parity.tree.base import merged_causes
    from parity.core.port import PortError
    cfg = tree_check.sizes()[args.size]
    side, notes, who = None, [], "torch_impl"
    collector, recipe = repro_setup(args, cfg)
    if args.port:
        from parity.tree.adapter import CheckedTreePort, PortSide
        try:
            port, cfg, notes, reference = load_port(args, cfg, bundle, reference)
        except ValueError as err:                      # UsageError: the port cannot be checked as declared
            print(f"parity check: {err}", file=sys.stderr)
            return 2
        side = PortSide(CheckedTreePort(collector.recorded(port), cfg), cfg)
        who = f"port {side.name} ({args.port})"
    text = sys.stderr if args.json else sys.stdout          # --json: stdout holds result.json alone
    log = (lambda line: None) if args.quiet else (lambda line: print(line, file=text, flush=True))
    started, began = time.perf_counter(), datetime.datetime.now().isoformat(timespec="seconds")
    drifts = dict((k, v[1]) for k, v in tree_drifts(knobs).items()) or "(faithful)"
    against = f"the bundle {args.against}" if bundle else "jax_reference"
    log(f"parity check --task {args.task}: {who if args.port else f'torch_impl {drifts}'} vs {against}, "
        f"size {args.size}, seed {args.seed}")
    seconds: dict[str, float] = {}
    try:
        rows = tree_check.run(cfg, knobs, args.seed, log, side=side, repro=collector, reference=reference,
                              device=args.device, seconds=seconds, checks=args.checks)
    except PortError as err:
        print(f"parity check: {err}\n  the port breaks the tree protocol (parity/tree/adapter.py)", file=sys.stderr)
        return 2
    except Exception:                # the suite's own crash: exit 3, never the mismatch code
        return internal_error(f"parity check --task {args.task}")
    failed = [r for r in rows if r.verdict == "fail"]
    verdict, code = ("FAIL", 1) if failed else ("PASS", 0)
    title, lead, facts = report_header(args, argv, verdict, cfg, knobs, who, notes, bundle, reference,
                                       time.perf_counter() - started)
    unseen = [f"{r.quantity}: {r.cause}" for r in rows if r.verdict == "skip" and r.quantity.startswith("knob `")]
    facts += [f"- in distribution (the side does not draw JAX's numbers), {u}" for u in unseen]
    written = write_repros(args, argv, rows, collector, recipe)
    try:
        results = check_results(rows, seconds, written, cfg.tree.paths, args.size)
    except Exception:                # the report's own crash is the suite's too: exit 3, no summary written
        return internal_error(f"parity check --task {args.task}")
    info = run_info(args, argv, cfg, knobs, who, bundle, reference, began, time.perf_counter() - started)
    write_report(Path(args.out), results, info, code, Family(task=args.task, title=title, lead=lead, run=tuple(facts)))
    for u in unseen:
        log(f"note: {u}")
    causes = merged_causes((r.cause for r in failed if r.cause), cfg.tree.paths)     # one line per fact
    if args.json:
        print((Path(args.out) / RESULT).read_text(), end="")
    print(f"{verdict}: report in {args.out}/summary.md" + ("\n  " + "\n  ".join(causes) if causes else ""),
          file=text)
    return code


def report_header(args, argv, verdict: str, cfg, knobs, who: str, notes, bundle, reference,
                  seconds: float) -> tuple[str, tuple[str, ...], list[str]]:
    """summary.md's title (with the verdict), its lead (the reference's platform in one sentence) and the run's facts
    (the `## Run` bullets)."""
    from parity.tree import check as tree_check, dist as tree_dist, forward as tree_forward
    from reporting import versions, xla_flags, xla_flags_text
    packages = ("torch", "numpy") if bundle else ("torch", "jax", "numpy")
    platform = reference.platform
    title = "byte-level LM" if args.task == "lm" else "the port's declared tree"
    return f"Parity check, {title}: {verdict}", (platform.sentence(),), [
            f"- command: `python -m parity check {shlex.join(argv)}`",
            (f"- port: {who}" if args.port else f"- torch side: torch_impl, knobs {knobs}"
             + (f" ({args.followed})" if args.followed else "")),
            *(f"- declared differently from the LM's tree: {n}" if args.task == "lm" else f"- {n}" for n in notes),
            f"- size: {args.size}: {cfg if args.task == 'lm' else 'the settings above'}", f"- seed: {args.seed}",
            f"- versions: {', '.join(f'{k} {v}' for k, v in versions(packages).items())}",
            *(bundle_lines(bundle, reference) if bundle else []),
            f"- device: {device_text(args, platform)}; reference platform: {platform.fields_text()}",
            f"- XLA_FLAGS: {xla_flags_text(xla_flags())}",
            f"- took {seconds:.1f} s",
            "- tolerances: see parity/tree/check.py's docstring (float32 product and shaping bounds, exact draws, "
            + (f"{tree_check.FORWARD_ULPS} ulps of scale for the forward" if args.task == "lm" else
               f"the model's forward within {tree_forward.FORWARD_SPREAD} x its plain forward's own float32 rounding "
               f"(parity/tree/forward.py), each layer's product as the model calls it (parity/tree/layers.py)")
            + "; a TF32 reference's own bounds and measured rounding); a side without JAX's draws is checked in "
            f"distribution: parity/tree/dist.py's docstring (each test's alpha, {tree_dist.FALSE_ALARM:.2g} per run "
            "in all)"]


def device_text(args, platform) -> str:
    """Where each side ran: the torch side's device and the JAX reference's platform."""
    return f"torch side on {args.device}; JAX reference on {platform.where()[len('JAX on '):]}"


def run_info(args, argv, cfg, knobs, who: str, bundle, reference, began: str, seconds: float):
    """What result.json records about the run (parity.core.report.RunInfo, as the CartPole suite's)."""
    from parity.core.report import REFERENCE_SIDE, RunInfo
    from parity.core.tape import recording_of
    from reporting import versions, xla_flags
    configuration = (f"foreign port {args.port}" if args.port else f"profile {args.profile}, knobs {knobs}"
                     + (f" ({args.followed})" if args.followed else ""))
    sizes = (f"{args.size}: {cfg}" if args.task == "lm" else f"{args.size}: pop {cfg.pop}, rank {cfg.rank}, sigma "
             f"{cfg.sigma}, lr {cfg.lr}, group_size {cfg.group_size}, noise_reuse {cfg.noise_reuse}, freeze_nonlora "
             f"{cfg.freeze_nonlora}, {len(cfg.tree.leaves)} leaves")
    return RunInfo(command=f"python -m parity check {shlex.join(argv)}", port=who, configuration=configuration,
                   sizes=sizes, seed=args.seed,
                   versions=versions(("torch", "numpy") if bundle else ("torch", "jax", "numpy")),
                   device=device_text(args, reference.platform), started=began, seconds=seconds,
                   extra={REFERENCE_SIDE: f"the {recording_of(bundle)}"} if bundle else {},
                   platform=reference.platform, xla_flags=xla_flags())


def check_results(rows, seconds: dict, written: dict, paths, size: str) -> list:
    """The tree suite's rows (parity.tree.base.Row) as the one report's check results (parity.core.verdict): per check
    its verdict and headline (parity.tree.check.verdicts), causes with the knob each names (those differing only in
    their leaf as one, listing the leaves `paths` names), time, repro, and its rows with every digit of their value
    (side: both, a comparison; size: the run's)."""
    from parity.core.verdict import KNOB_IN_CAUSE, Cause, CheckResult, Row
    from parity.tree import check as tree_check
    from parity.tree.base import merged_causes
    results = []
    for name, verdict, shown in tree_check.verdicts(rows):
        texts = merged_causes((r.cause for r in rows if r.check == name and r.verdict == "fail" and r.cause), paths)
        causes = tuple(Cause(next(iter(KNOB_IN_CAUSE.findall(t)), None), t) for t in texts)
        observed = f"skipped: {shown.cause}" if verdict == "skip" else f"{shown.quantity} = {shown.value:.4g}"
        core_rows = tuple(Row(r.check, r.quantity, "port" if r.verdict == "skip" else "both", size, r.value,
                              r.allowed, r.verdict, r.cause, shown=str(r.value)) for r in rows if r.check == name)
        done = written.get(name)
        results.append(CheckResult(name, verdict, observed, "-" if verdict == "skip" else shown.allowed, causes,
                                   core_rows, "", seconds=seconds.get(name, 0.0),
                                   repro=done.folder if done and done.folder else "",
                                   repro_note=done.note if done and not done.folder else ""))
    return results


def bundle_lines(bundle, reference) -> list[str]:
    """The report's lines on a replayed reference: which bundle, what recorded it, what numpy answered."""
    from parity.core.tape import recording_of
    misses = reference.misses
    if bundle.manifest.get("task") == "tree":
        return [f"- reference: the {recording_of(bundle)}",
                "- JAX's draws replayed from the bundle; the rest of the reference (the noise from them, shaping, "
                "gradients, the step, the products) is numpy arithmetic on them (parity/tree/numpy_reference.py)"]
    return [f"- reference: the {recording_of(bundle)}",
            "- answered by the reference's math in numpy (inputs from the port, parity/tree/numpy_reference.py): "
            + (", ".join(f"{k} x{misses.count(k)}" for k in dict.fromkeys(misses)) or "none")
            + "; update and the forward on the port's own noise always are"]


def load_port(args, cfg, bundle, reference):
    """(the port, the run's configuration, the report's lines on its tree, the reference) for --port; UsageError
    before any work. --task lm: the port built with the LM's cfg, its tree the LM's; --task tree: built with no
    arguments, the run its declared tree and settings (the size's defaults for the rest), a bundle held to them."""
    from parity.tree import check as tree_check
    from parity.tree.adapter import declared_run, load_tree_port, port_tree
    if args.task == "lm":
        port = load_tree_port(args.port, cfg)
        return port, cfg, port_tree(port, cfg)[1], reference
    port = load_tree_port(args.port, None)
    run, lines = declared_run(port, tree_check.TREE_SIZES[args.size])
    if bundle is not None:
        from parity.tree.vectors import tree_bundle_reference
        reference = tree_bundle_reference(bundle, run)
    return port, run, lines + [f"forward: {tree_check.FOREIGN_FORWARD}"], reference


def repro_setup(args, cfg):
    """(the repro collector, with a tape of the port's methods or the torch side's; how a repro builds the port)."""
    from parity.core.repro import TAPED_TREE, TAPED_TREE_TORCH, Collector, Tape, port_recipe, tree_torch_recipe
    collector = Collector(Tape(methods=TAPED_TREE if args.port else TAPED_TREE_TORCH))
    if args.task == "tree":                 # the port is built with no arguments
        return collector, port_recipe(args.port, None)
    return collector, port_recipe(args.port, cfg) if args.port else tree_torch_recipe(args.profile, args.pinned, cfg)


def write_repros(args, argv: list[str], rows, collector, recipe) -> dict:
    """Write each failed check's repro (parity.core.repro) beside the report; {failed check: Written}."""
    from parity.core import repro
    verdicts = {}
    for r in rows:
        verdicts[r.check] = "fail" if r.verdict == "fail" or verdicts.get(r.check) == "fail" else "pass"
    command = f"python -m parity check {shlex.join(argv)}"
    return repro.write_repros(Path(args.out), verdicts, collector.evidence, recipe, command)
