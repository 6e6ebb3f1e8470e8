"""`python -m parity record`: the JAX reference's answers to a suite recorded as a bundle that `check --against`
replays without JAX, for every task (cartpole: parity.mlp.recording; lm and tree: parity.tree.vectors). Bad usage
exits 2 before any work, with nothing written.
"""
from __future__ import annotations

from pathlib import Path

from parity.core import tape
from parity.core.port import UsageError
from parity.mlp.recording import record, recording_manifest
from spec.platform import ReferencePlatform


def _record_parser():
    import argparse

    from parity.mlp.sizes import SIZES
    from spec.limits import device_arg, seed_arg
    from spec.platform import add_reference_flags

    class Parser(argparse.ArgumentParser):
        def error(self, message: str):
            raise UsageError(f"{message}\n\n{self.format_usage().strip()}")

    p = Parser(prog="python -m parity record",
               description="Record the JAX reference's answers to every call of the parity suite as a bundle "
                           "(arrays.npz + manifest.json) that `python -m parity check --against BUNDLE` replays "
                           "without JAX.")
    p.add_argument("--task", choices=("cartpole", "lm", "tree"), default="cartpole",
                   help="which suite (default cartpole; tree: a port's own declared tree, with --port)")
    p.add_argument("--port", metavar="MODULE:ATTR", help="--task tree: the port whose declared tree and settings "
                                                         "the bundle is recorded for (e.g. examples.gpt_adapter:GPTAdapter)")
    p.add_argument("--size", default="quick", help=f"the suite's size: {', '.join(sorted(SIZES))} for cartpole, "
                                                   "quick or selftest for lm and tree (default quick)")
    p.add_argument("--seed", type=seed_arg, default=0, help="run seed in [0, 2**32 - 1] (default 0)")
    p.add_argument("--out", required=True, help="the bundle folder to write (e.g. runs/vectors/cartpole-quick)")
    p.add_argument("--device", type=device_arg, default=None,
                   help="where the JAX reference records: cpu (JAX's CPU) or cuda / cuda:N (JAX's GPU); default: "
                        "--reference-platform decides (auto: where JAX runs)")
    add_reference_flags(p)
    p.add_argument("--quiet", action="store_true", help="no progress lines")
    return p


def _record_tree(args, platform: ReferencePlatform) -> int:
    """`record --task tree --port X`: the port's tree and settings checked before any work (UsageError, exit 2)."""
    from parity.tree import vectors as tree_vectors
    log = (lambda line: None) if args.quiet else (lambda line: print(line, flush=True))
    written = tree_vectors.record_tree(args.port, args.size, args.seed, Path(args.out), log, platform)
    size = sum(p.stat().st_size for p in Path(written).iterdir())
    print(f"parity record: wrote {written} ({size / 1e6:.2f} MB)")
    return 0


def record_platform(args) -> ReferencePlatform:
    """The platform the bundle is recorded on, from --device and the reference flags (UsageError, exit 2, for a
    contradiction or a CUDA device JAX does not see), before any work."""
    from parity.core.platform import PlatformError, platform_for
    from spec.limits import cuda_missing
    from spec.platform import PlatformRequest, request_of

    request = request_of(args)
    cuda = (args.device or "").startswith("cuda")
    if args.device and request.platform != "auto" and (cuda or request.platform == "gpu-sim"):
        raise UsageError(f"--device {args.device} with --reference-platform {request.platform}: one place to record; "
                         "give one of them (--device cuda records on JAX's GPU, gpu-sim simulates one on the CPU)")
    if args.device == "cpu":
        request = PlatformRequest("cpu", request.precision)
    try:
        return platform_for(request, gpu=cuda)
    except PlatformError:
        raise UsageError(cuda_missing(args.device, " (JAX sees no GPU: install jax[cuda])")) from None


def record_main(argv: list[str]) -> int:
    """`python -m parity record`: exit 0 with the bundle written, 2 on bad usage (nothing written)."""
    import sys

    from parity.mlp.suite import CHECKS
    from parity.mlp.sizes import SIZES
    from spec.limits import check_out_dir

    try:
        args = _record_parser().parse_args(argv)
        check_out_dir(args.out)
        platform = record_platform(args)
        if args.task == "cartpole" and args.size not in SIZES:
            raise UsageError(f"--size {args.size}: unknown; known: {', '.join(sorted(SIZES))}")
        if args.task == "lm":
            from parity.tree.vectors import lm_sizes
            if args.size not in lm_sizes():
                raise UsageError(f"--task lm --size {args.size}: unknown; the LM suite's sizes: "
                                 f"{', '.join(lm_sizes())}")
        if (args.task == "tree") != bool(args.port):
            raise UsageError("--port goes with --task tree: the bundle is recorded for the port's declared tree "
                             "(e.g. --task tree --port examples.gpt_adapter:GPTAdapter)")
        if args.task == "tree":
            return _record_tree(args, platform)
    except ValueError as err:       # UsageError and the limits' errors
        print(f"parity record: {err}", file=sys.stderr)
        return 2
    log = (lambda line: None) if args.quiet else (lambda line: print(line, flush=True))
    if args.task == "lm":
        from parity.tree import vectors as tree_vectors

        written = tree_vectors.record_lm(args.size, args.seed, Path(args.out), log, platform,
                                         tree_vectors.faithful_knobs(platform))
    else:
        sizes = SIZES[args.size]
        command = "python -m parity record " + " ".join(argv)
        store, results = record(sizes, args.seed, CHECKS, log, platform)
        bad = [r.name for r in results if r.verdict != "pass"]
        if bad:
            print(f"parity record: the reference against itself did not pass {', '.join(bad)}; the bundle records "
                  "what it computed all the same", file=sys.stderr)
        written = tape.write_bundle(args.out, store, recording_manifest(sizes, args.seed, CHECKS, command, platform))
    size = sum(p.stat().st_size for p in Path(written).iterdir())
    print(f"parity record: wrote {written} ({size / 1e6:.2f} MB)")
    return 0
