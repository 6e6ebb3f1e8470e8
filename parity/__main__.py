"""`python -m parity check` (or `python -m parity`): the parity suite from the command line.

Exit codes: 0 every check within tolerance; 1 a mismatch; 2 bad usage or input (unknown knob,
value or profile, an unloadable port, a port that breaks the adapter protocol).
--profile / --torch configure the torch side (torch_impl through parity.mlp.torch_side); the
reference run keeps the preset's knobs, so e.g. `--torch noise_reuse=3` is a drift to be caught.
"""
from __future__ import annotations

import argparse
import contextlib
import dataclasses
import datetime
import shlex
import sys
import textwrap
import time
from pathlib import Path
from typing import Callable, Sequence

from parity.core.exits import EXIT_INTERNAL, EXIT_MISMATCH, EXIT_PASS, EXIT_USAGE, internal_error  # noqa: F401 (EXIT_INTERNAL: re-exported)
from parity.core.port import UsageError
from parity.mlp.suite import CHECKS, at_port_rank
from parity.mlp.sizes import SIZES, Sizes
from reporting import cpu_name, versions, xla_flags
from spec.config import for_profile
from spec.knobs import CHOICES, NUMERIC, PROFILES
from spec.limits import check_out_dir
from spec.platform import check_against_bundle, recorded_platform, request_of

SUITE_PACKAGES = ("torch", "jax", "numpy")


class _Parser(argparse.ArgumentParser):
    """argparse that raises instead of exiting, so main() owns the exit code and the message."""

    def error(self, message: str):
        raise UsageError(f"{message}\n\n{self.format_usage().strip()}")


# The study and the benchmark were subcommands here; they are sibling packages now.
MOVED = {"gap": "python -m gap", "bench": "python -m bench"}


def build_parser() -> argparse.ArgumentParser:
    from parity.core.flags import add_task_flags

    knob_help = "; ".join([f"{k}: {'|'.join(v)}" for k, v in CHOICES.items()]
                          + [f"{k}: {meaning}" for k, (_, meaning) in NUMERIC.items()])
    p = _Parser(prog="python -m parity check",
                description="Run the parity suite: does the port compute what the JAX reference computes?")
    size = add_task_flags(
        p, out="runs/parity", sizes=SIZES, size_help="a named size (selftest: tiny, for tests)",
        profiles=PROFILES, profile_default="jax", knob_help=knob_help, checks=CHECKS,
        port_help="check a foreign port through the adapter protocol (parity/mlp/adapter.py) instead of torch_impl",
        against_help="check against a recorded bundle (e.g. vectors/cartpole-quick, written by `python -m parity "
                     "record`) instead of the live JAX reference: no jax needed")
    size.add_argument("--quick", dest="size", action="store_const", const="quick",
                      help="the quick suite (default, or the bundle's size with --against)")
    size.add_argument("--full", dest="size", action="store_const", const="full", help="paper-sized, longer")
    return p


def reference_note(bundle) -> dict[str, str]:
    """The report's line on the reference side: a recorded bundle (which, its hash, versions, device) or none."""
    if bundle is None:
        return {}
    from parity.core.report import REFERENCE_SIDE
    from parity.mlp.vectors import describe

    return {REFERENCE_SIDE: describe(bundle)}


def device_description(device: str, bundle=None, platform=None) -> str:
    """Where each side ran: the torch side's device, JAX's backend (or the bundle's recording), the host CPU."""
    torch_dev = device
    if device.startswith("cuda"):
        import torch

        if torch.cuda.is_available():
            torch_dev = f"{device} ({torch.cuda.get_device_name(torch.device(device))})"
    if bundle is not None:
        return (f"torch side on {torch_dev}; reference side replayed from {bundle.folder} (recorded: "
                f"{bundle.manifest.get('device')}); host CPU {cpu_name()}")
    if platform is not None:
        return f"torch side on {torch_dev}; JAX reference on {platform.where()[len('JAX on '):]}; host CPU {cpu_name()}"
    import jax

    return f"torch side on {torch_dev}; JAX reference on {jax.default_backend()}; host CPU {cpu_name()}"


def split_task(argv: list[str]) -> tuple[str, list[str]]:
    """(--task's value, default cartpole; argv without it for cartpole, whole for the tree suite's own parser)."""
    task = next((argv[i + 1] for i, a in enumerate(argv[:-1]) if a == "--task"),
                next((a.split("=", 1)[1] for a in argv if a.startswith("--task=")), "cartpole"))
    if task in ("lm", "tree"):
        return task, argv
    return task, [a for i, a in enumerate(argv) if not (a == "--task" or a.startswith("--task=")
                                                         or (i and argv[i - 1] == "--task"))]


def _moved(name: str) -> Callable[[list[str]], int]:
    def say(argv: list[str]) -> int:
        print(f"python -m parity {name}: moved; run `{MOVED[name]}` (same options)", file=sys.stderr)
        return EXIT_USAGE
    return say


def _int8(argv: list[str]) -> int:
    from parity.int8 import cli as int8_cli
    return int8_cli.main(argv)


def _record(argv: list[str]) -> int:
    from parity.record import record_main
    return record_main(argv)


def _lm_or_tree(argv: list[str]) -> int:
    """`--task lm` and `--task tree`: one suite (the LM is a tree port), one parser (parity/tree/cli.py)."""
    from parity.tree import cli as tree_cli
    return tree_cli.main(argv)


def _unknown_task(task: str) -> int:
    print(f"parity check: unknown --task {task!r}; known tasks: cartpole, lm, tree, int8",
          file=sys.stderr)
    return EXIT_USAGE


SUBCOMMANDS: dict[str, Callable[[list[str]], int]] = {"int8": _int8, "record": _record, **{name: _moved(name) for name in MOVED}}
# lm and tree share one parser (parity/tree/cli.py); int8 is also `python -m parity int8` (parity/int8/cli.py)
TASKS: dict[str, Callable[[list[str]], int]] = {"lm": _lm_or_tree, "tree": _lm_or_tree, "int8": _int8}


def main(argv: Sequence[str] | None = None, stream=None) -> int:
    """Run `check` with argv (without the subcommand); returns the exit code."""
    stream = stream or sys.stdout
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "check":
        argv = argv[1:]
    elif argv and argv[0] in SUBCOMMANDS:
        return SUBCOMMANDS[argv[0]](argv[1:])
    task, argv = split_task(argv)
    if task != "cartpole":
        return TASKS[task](argv) if task in TASKS else _unknown_task(task)
    started = time.perf_counter()
    try:
        args, sizes, (port, configuration, label, session, recipe), checks = parse(argv)
    except (UsageError, ValueError) as err:     # ValueError: KnobError, Config and --out errors
        print(f"parity check: {err}", file=sys.stderr)
        return EXIT_USAGE

    from parity.core.repro import Collector, with_repros
    from parity.core.report import overall, write_report
    from parity.mlp.suite import run_suite

    text_out = sys.stderr if args.json else stream     # --json: stdout holds the JSON alone
    log = (lambda line: None) if args.quiet else (lambda line: print(line, file=text_out, flush=True))
    log(f"parity check: {label} vs {'the bundle ' + args.against if args.bundle else 'jax_reference'}, "
        f"sizes {sizes.name}, seed {args.seed}")
    collector = Collector()
    try:
        with session:
            results = run_suite(port, sizes, args.seed, checks=checks, log=log, against=args.bundle, repro=collector,
                                platform=args.platform)
    except Exception:   # a crash of the suite itself must not read as a mismatch (exit 1)
        return internal_error("parity check")
    command = "python -m parity check " + " ".join(shlex.quote(a) for a in argv)
    results = with_repros(Path(args.out), results, collector.evidence, recipe, command)
    info = run_info(args, sizes, command, label, configuration, time.perf_counter() - started)
    verdict = overall(results)
    code = {"pass": EXIT_PASS, "fail": EXIT_MISMATCH}.get(verdict, EXIT_USAGE)
    written = write_report(Path(args.out), results, info, code)
    log("")
    for line in terminal_lines(results) + repro_lines(results):
        log(line)
    summary = next(p for p in written if p.name == "summary.md")
    final = f"{verdict.upper()}: report in {summary} ({time.perf_counter() - started:.0f} s)"
    if args.json:
        print(next(p for p in written if p.name == "result.json").read_text(), file=stream, end="")
    print(final if args.quiet else "\n" + final, file=text_out, flush=True)
    print_notes(results, sys.stderr, tracebacks=args.quiet)
    return code


def run_info(args, sizes: Sizes, command: str, label: str, configuration: str, seconds: float):
    """What the report records about the run: command, port, sizes, seed, versions, device, the reference's platform."""
    from parity.core.report import RunInfo

    return RunInfo(
        command=command, port=label, configuration=configuration,
        sizes=f"{sizes.name}: pop {sizes.cfg.pop}, rank {sizes.cfg.rank}, sigma {sizes.cfg.sigma}, lr {sizes.cfg.lr}, "
              f"MLP {sizes.cfg.sizes}{declared_note(args, sizes)}, noise statistics over {sizes.noise_pop} members, "
              f"trajectory {sizes.traj_epochs} epochs, sigma schedule up to {sizes.sigma_epochs} epochs",
        seed=args.seed, versions=versions(SUITE_PACKAGES),
        device=device_description(args.device, args.bundle, None if args.bundle else args.platform),
        started=datetime.datetime.now().isoformat(timespec="seconds"), seconds=seconds,
        extra=reference_note(args.bundle), platform=args.platform, xla_flags=xla_flags())


def parse(argv: list[str]):
    """(args, sizes, (port, configuration, label, session, repro recipe), checks) or UsageError / ValueError: all
    before any work."""
    from parity.core.flags import selected_checks

    args = build_parser().parse_args(argv)
    check_out_dir(args.out)
    checks = selected_checks(args.checks, CHECKS)
    args.bundle = None
    if args.against:
        from parity.mlp.vectors import open_bundle

        args.bundle = open_bundle(args.against, args.size, args.seed)
        args.platform = recorded_platform(args.bundle.manifest)
        check_against_bundle(args, args.platform, args.against)
    else:
        from parity.core.platform import platform_for

        args.platform = platform_for(request_of(args))
    from parity.core.tape import run_size_and_seed

    args.size, args.seed = run_size_and_seed(args.bundle, args.size, args.seed)
    sizes = suite_sizes(args)
    made = _make_port(args, sizes)
    sizes = at_port_rank(sizes, made[0])        # a port of fixed rank (its `rank` attribute) is compared at it
    return args, sizes, made, checks


def terminal_lines(results) -> list[str]:
    """One line per check: verdict, headline (or, for a skipped or errored check, why) and likely cause."""
    width = max(len(r.name) for r in results)
    lines = []
    for r in results:
        cause = f"  <- {r.cause_text}" if r.cause_text else ""
        what = r.observed if r.verdict in ("skip", "error") else f"{r.observed} (allowed {r.allowed})"
        lines.append(f"  {r.name:<{width}}  {r.verdict:<5}  {what}{cause}")
    return lines


def repro_lines(results) -> list[str]:
    """One line per failed check with a repro folder: the command that reproduces it alone."""
    return [f"  repro of {r.name} (numpy and the port only): python {r.repro}/repro.py" for r in results if r.repro]


def print_notes(results, stream, tracebacks: bool = True) -> None:
    """After the verdict, on stderr: each warning with its advice (always) and, when the progress lines did not
    show them (--quiet), each port traceback."""
    for r in results:
        for warning in r.warnings:
            print(f"parity check: {r.name}: {warning}", file=stream)
        if r.trace and tracebacks:
            print(f"parity check: {r.name}: the port raised (its own frames):\n{textwrap.indent(r.trace, '    ')}",
                  file=stream)


def declared_note(args, sizes: Sizes) -> str:
    """' (the port declares rank 1, layers 2; the run's: rank 4, layers 3)' when a port's `rank`, `layers` or `hidden`
    attribute moved the suite's configuration, else ''."""
    run = SIZES[args.size].cfg
    if not args.port:               # a --profile's own configuration (functional-port: 2 layers) is no declaration
        return ""
    moved = [k for k in ("rank", "layers", "hidden") if getattr(sizes.cfg, k) != getattr(run, k)]
    if not moved:
        return ""
    return (f" (the port declares {', '.join(f'{k} {getattr(sizes.cfg, k)}' for k in moved)}; the run's: "
            f"{', '.join(f'{k} {getattr(run, k)}' for k in moved)})")


def follow_reference_rng(knobs, platform):
    """(knobs, the report's words): the torch side's rng=jax follows the reference's normals. Plain jax is JAX's CPU
    normals, so on a CPU-normals reference it stays; on a GPU-normals one it becomes rng=jax-gpu where spec.knobs
    has that value. A side pinned to one backend (jax-cpu, jax-gpu) stays as pinned."""
    from spec.knobs import CHOICES

    if knobs.rng != "jax":
        return knobs, ""
    if platform.normals == "cpu":
        return knobs, "; rng=jax: JAX's CPU normals, the reference's"
    if f"jax-{platform.normals}" not in CHOICES["rng"]:
        return knobs, f"; rng=jax: JAX's CPU normals (the reference draws its {platform.normals.upper()} normals)"
    value = f"jax-{platform.normals}"
    return (knobs.replace(rng=value),
            f"; rng=jax follows the reference's backend: rng={value} (JAX's {platform.normals.upper()} normals)")


def suite_sizes(args) -> Sizes:
    """The named size, with the configuration a --profile carries (functional-port: two Linear layers)."""
    sizes = SIZES[args.size]
    return sizes if args.port else dataclasses.replace(sizes, cfg=for_profile(sizes.cfg, args.profile))


def _make_port(args, sizes: Sizes):
    """(adapter, configuration text, label, the context to run the suite in, how a repro builds it) from --port or
    --profile/--torch."""
    from parity.core.repro import port_recipe, torch_recipe

    if args.port:
        if args.torch or args.profile != "jax":
            raise UsageError("--profile and --torch configure the torch side; they do not apply with --port")
        from parity.mlp.adapter import load_port

        cfg = sizes.cfg
        port = load_port(args.port, cfg)
        return (port, f"foreign port {args.port}", str(getattr(port, "name", args.port)), contextlib.nullcontext(),
                port_recipe(args.port, cfg))
    from spec.knobs import drifts, resolve

    knobs = resolve(args.profile, args.torch)
    changed = drifts(knobs)
    text = f"profile {args.profile}" + (f", knobs {' '.join(args.torch)}" if args.torch else "")
    text += "; departures from the reference: " + (", ".join(f"{k}={v[1]} (reference {v[0]})"
                                                             for k, v in changed.items()) or "none")
    followed, words = follow_reference_rng(knobs, args.platform)
    text += words
    pinned = args.torch + [f"rng={followed.rng}"] if followed.rng != knobs.rng else args.torch   # the repro's side
    from parity.mlp.torch_side import TorchPort, one_thread
    from parity.core.device import check_device

    check_device(args.device)
    port = TorchPort(sizes.cfg, followed, args.device)
    # The suite's tensors are small: one torch thread avoids oversubscription on shared CPUs.
    return port, text, port.name, one_thread(), torch_recipe(args.profile, pinned, args.device, sizes.cfg)


if __name__ == "__main__":
    sys.exit(main())
