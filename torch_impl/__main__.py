"""`python -m torch_impl`: train CartPole-v1 with the functional torch EGGROLL and print steps to solve."""
from __future__ import annotations

import argparse
import sys

from spec.cli import add_override_arguments, apply_overrides
from spec.config import PRESETS, check_pairing, for_profile
from spec.knobs import PROFILES, KnobError, resolve


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m torch_impl", description=__doc__)
    p.add_argument("--seed", type=int, default=0, help="run seed (default 0)")
    p.add_argument("--preset", choices=sorted(PRESETS), default="cpu", help="hyper-parameter preset (default cpu)")
    p.add_argument("--profile", choices=list(PROFILES), default="jax", help="knob profile (default jax)")
    p.add_argument("--torch", action="append", default=[], metavar="KNOB=VALUE",
                   help="set one drift knob (repeatable; applied after the profile)")
    p.add_argument("--device", default="cpu", help="torch device (cpu, cuda)")
    p.add_argument("--threads", type=int, default=1,
                   help="torch intra-op threads while training (default 1: faster for this small policy)")
    p.add_argument("--quiet", action="store_true", help="print only the final line")
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
    from torch_impl.train import train   # torch import only once the arguments are known good

    if not args.quiet:
        print(f"torch EGGROLL  seed {args.seed}  {cfg}  {knobs}", flush=True)
    result = train(cfg, knobs, args.seed, device=args.device, progress=not args.quiet, threads=args.threads)
    if args.quiet:
        print(f"steps_to_solve {result.steps_to_solve}" if result.solved else f"not solved ({result.env_steps} steps)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
