"""`python -m torch_impl`: train CartPole-v1 with the functional torch EGGROLL and print steps to solve.

Exit status: 0 solved, 1 not solved within the step budget, 2 bad usage or input.
"""
from __future__ import annotations

import argparse
import sys

from spec.cli import add_override_arguments, apply_overrides
from spec.config import PRESETS, check_pairing, for_profile
from spec.knobs import PROFILES, KnobError, resolve
from spec.limits import check_fits, device_arg, seed_arg


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m torch_impl", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seed", type=seed_arg, default=0, help="run seed in [0, 2**32 - 1] (default 0)")
    p.add_argument("--preset", choices=sorted(PRESETS), default="cpu", help="hyper-parameter preset (default cpu)")
    p.add_argument("--profile", choices=list(PROFILES), default="jax", help="knob profile (default jax)")
    p.add_argument("--torch", action="append", default=[], metavar="KNOB=VALUE",
                   help="set one drift knob (repeatable; applied after the profile)")
    p.add_argument("--device", type=device_arg, default="cpu", help="torch device: cpu, cuda or cuda:N (default cpu)")
    p.add_argument("--threads", type=int, default=1,
                   help="torch intra-op threads while training (default 1: faster for this small policy)")
    p.add_argument("--quiet", action="store_true", help="print only the final line (steps to solve, or not solved)")
    g = p.add_argument_group("explicit overrides (win over preset, profile and --torch)")
    add_override_arguments(g)
    return p


def configure(args: argparse.Namespace):
    """(Config, Knobs) from preset, then profile, then --torch, then explicit flags; raises ValueError/KnobError."""
    cfg, run = PRESETS[args.preset]
    cfg, knobs = apply_overrides(args, for_profile(cfg, args.profile), resolve(args.profile, args.torch, reference=run))
    check_pairing(cfg.pop, knobs.antithetic)
    if args.threads < 1:
        raise ValueError(f"--threads must be >= 1, got {args.threads}")
    if not args.device.startswith("cuda"):
        check_fits(cfg)
    return cfg, knobs


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        cfg, knobs = configure(args)
    except (KnobError, ValueError) as err:
        parser.error(str(err))   # exits 2
    if args.device.startswith("cuda"):
        import torch

        if not torch.cuda.is_available():
            parser.error(f"--device {args.device} asked for, but torch sees no CUDA device; use --device cpu")
        try:
            check_fits(cfg, available=torch.cuda.mem_get_info(torch.device(args.device))[0], where=args.device)
        except (ValueError, RuntimeError) as err:
            parser.error(str(err))
    from torch_impl.train import train   # torch import only once the arguments are known good

    if not args.quiet:
        print(f"torch EGGROLL  seed {args.seed}  {cfg}  {knobs}", flush=True)
    result = train(cfg, knobs, args.seed, device=args.device, progress=not args.quiet, threads=args.threads)
    if args.quiet:
        print(f"steps_to_solve {result.steps_to_solve}" if result.solved else f"not solved ({result.env_steps} steps)")
    return 0 if result.solved else 1


if __name__ == "__main__":
    sys.exit(main())
