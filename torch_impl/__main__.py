"""`python -m torch_impl`: train CartPole-v1 with the functional torch EGGROLL and print steps to solve, or
(`--task lm`) train the byte-level LM of spec/lm.py and print its validation bits/byte, or (`--task int8`) train
nano-egg's integer LM of spec/int8.py with the torch int8 port and print its validation bits/byte.

Exit status: 0 solved, 1 not solved within the step budget, 2 bad usage or input (checked before any work). With
--task lm: 0 the run finished with finite bits/byte, 1 they went NaN or inf. With --task int8: 0 the run finished
(integer bits/byte are always finite), 2 bad usage or input.
"""
from __future__ import annotations

import argparse
import math
import sys

from spec.cli import add_override_arguments, add_run_arguments, apply_overrides, cartpole_preset
from spec.config import check_pairing, for_profile
from spec.int8 import INT8_ONLY, add_int8_arguments, int8_config
from spec.int8_knobs import INT8_PROFILES, parse_int8_knobs
from spec.knobs import PROFILES, KnobError, resolve
from spec.limits import check_fits, device_arg
from spec.lm_run import TASKS, add_lm_arguments, check_corpus_path, check_task_flags, lm_config, lm_verdict_line
from spec.run import quiet_line
from spec.tree_knobs import TREE_PROFILES, resolve_tree


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m torch_impl", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    add_run_arguments(p)
    p.add_argument("--profile", choices=list(dict.fromkeys([*PROFILES, *TREE_PROFILES, *INT8_PROFILES])),
                   default="jax", help=f"knob profile (default jax); lm: {', '.join(TREE_PROFILES)}; int8: "
                                       f"{', '.join(INT8_PROFILES)} (default nano-egg)")
    p.add_argument("--torch", action="append", default=[], metavar="KNOB=VALUE",
                   help="set one drift knob (repeatable; applied after the profile); --task lm takes the tree "
                        "knobs of spec/tree_knobs.py, --task int8 egg.c's departures of spec/int8_knobs.py")
    p.add_argument("--device", type=device_arg, default="cpu", help="torch device: cpu, cuda or cuda:N (default cpu)")
    p.add_argument("--threads", type=int, default=1,
                   help="torch intra-op threads while training (default 1: faster for this small policy)")
    p.add_argument("--quiet", action="store_true", help="print only the final line (steps to solve, or not solved)")
    g = p.add_argument_group("explicit overrides (win over preset, profile and --torch)")
    add_override_arguments(g)
    add_lm_arguments(p, TASKS + ("int8",))
    add_int8_arguments(p)
    return p


def configure(args: argparse.Namespace):
    """(Config, Knobs) from preset, then profile, then --torch, then explicit flags; raises ValueError/KnobError."""
    cfg, run = cartpole_preset(args)
    cfg, knobs = apply_overrides(args, for_profile(cfg, args.profile), resolve(args.profile, args.torch, reference=run))
    check_pairing(cfg.pop, knobs.antithetic)
    if args.threads < 1:
        raise ValueError(f"--threads must be >= 1, got {args.threads}")
    if not args.device.startswith("cuda"):
        check_fits(cfg)
    return cfg, knobs


def configure_lm(args: argparse.Namespace):
    """(LMConfig, TreeKnobs, corpus) for --task lm; raises ValueError/KnobError (also for a bad corpus)."""
    if args.threads < 1:
        raise ValueError(f"--threads must be >= 1, got {args.threads}")
    check_task_flags(args, INT8_ONLY, "lm")
    cfg = lm_config(args)
    knobs = resolve_tree(args.profile, args.torch)
    path = check_corpus_path(args.corpus)
    from rollout.corpus import load_corpus    # numpy only: reading the corpus is part of checking the input

    return cfg, knobs, load_corpus(path, cfg.seq_len)    # refuses a corpus too short for windows of seq_len + 1


def check_cuda(parser: argparse.ArgumentParser, device: str) -> None:
    """Exit 2 (parser.error) when a CUDA device is asked for and torch sees none; torch imported only then."""
    if device.startswith("cuda"):
        import torch

        if not torch.cuda.is_available():
            parser.error(f"--device {device} asked for, but torch sees no CUDA device; use --device cpu")
    check_cuda_switches(parser, device)


def check_cuda_switches(parser: argparse.ArgumentParser, device: str) -> None:
    """Exit 2 when env TORCH_IMPL_CUDA_GRAPHS (read only there) or TORCH_IMPL_RNG holds a bad value and a CUDA device
    is asked for."""
    if device.startswith("cuda"):
        from torch_impl import cuda_graphs
        from torch_impl import random as rnd

        try:
            cuda_graphs.switch()
            rnd.switch()
        except ValueError as err:
            parser.error(str(err))


def main_lm(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    """--task lm: check the config, knobs and corpus (exit 2 on any), then train and print the verdict."""
    try:
        cfg, knobs, corpus = configure_lm(args)
    except (KnobError, OSError, ValueError) as err:
        parser.error(str(err))   # exits 2
    check_cuda(parser, args.device)
    from torch_impl.tree.train import train_lm   # torch import only once the arguments are known good

    if not args.quiet:
        print(f"torch EGGROLL  byte LM  seed {args.seed}  {cfg}  {knobs}  corpus {corpus.path}", flush=True)
    result = train_lm(cfg, args.seed, knobs, corpus, progress=not args.quiet, device=args.device,
                      threads=args.threads)
    if args.quiet:
        print(lm_verdict_line(result))    # the same verdict line as without --quiet and as the JAX side
    finite = all(math.isfinite(row["train_bpb"]) for row in result.history) and math.isfinite(result.val_bpb)
    return 0 if finite else 1


def configure_int8(args: argparse.Namespace):
    """(Int8Config, corpus, Int8Knobs) for --task int8; raises ValueError/OSError (a bad corpus or one too short
    included, an unknown knob, value or profile)."""
    if args.threads < 1:
        raise ValueError(f"--threads must be >= 1, got {args.threads}")
    knobs = parse_int8_knobs(args.torch, None if args.profile == "jax" else args.profile)
    cfg = int8_config(args)
    from rollout.int8_data import load_int8_corpus    # numpy only: the corpus is part of the input
    return cfg, load_int8_corpus(check_corpus_path(args.corpus), cfg), knobs


def main_int8(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    """--task int8: check the config and the corpus against nano-egg's layout (exit 2 on either), then train."""
    try:
        cfg, corpus, knobs = configure_int8(args)
    except (OSError, ValueError) as err:
        parser.error(str(err))   # exits 2
    check_cuda(parser, args.device)
    from torch_impl.int8.train import train_int8     # torch import only once the input is known good

    if not args.quiet:
        departures = ", ".join(f"{k}={v}" for k, v in knobs.departures().items()) or "nano-egg"
        print(f"torch int8 EGGROLL  int8 LM  seed {args.seed}  {cfg}  knobs {departures}  corpus {corpus.path}",
              flush=True)
    result = train_int8(cfg, args.seed, corpus, progress=not args.quiet, device=args.device, threads=args.threads,
                        knobs=knobs)
    if args.quiet:
        print(lm_verdict_line(result))
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    from torch_impl import random as rnd

    try:
        rnd.switch()             # env TORCH_IMPL_RNG, read at each draw: a bad value stops here
    except ValueError as err:
        parser.error(str(err))   # exits 2
    if args.task == "lm":
        return main_lm(parser, args)
    if args.task == "int8":
        return main_int8(parser, args)
    try:
        cfg, knobs = configure(args)
    except (KnobError, ValueError) as err:
        parser.error(str(err))   # exits 2
    check_cuda(parser, args.device)
    if args.device.startswith("cuda"):
        import torch

        try:
            check_fits(cfg, available=torch.cuda.mem_get_info(torch.device(args.device))[0], where=args.device)
        except (ValueError, RuntimeError) as err:
            parser.error(str(err))
    from torch_impl.train import train   # torch import only once the arguments are known good

    if not args.quiet:
        print(f"torch EGGROLL  seed {args.seed}  {cfg}  {knobs}", flush=True)
    result = train(cfg, knobs, args.seed, device=args.device, progress=not args.quiet, threads=args.threads)
    if args.quiet:
        print(quiet_line(result))
    return 0 if result.solved else 1


if __name__ == "__main__":
    sys.exit(main())
