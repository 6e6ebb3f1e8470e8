"""`python -m torch_impl`: train CartPole-v1 with the functional torch EGGROLL and print steps to solve."""
from __future__ import annotations

import argparse
import sys

from torch_impl.config import PRESETS, check_pairing
from torch_impl.knobs import CHOICES, KnobError, resolve

# flag -> Config field
CONFIG_FLAGS = {"pop": "pop", "hidden": "hidden", "layers": "layers", "rank": "rank", "sigma": "sigma",
                "lr": "lr", "max_steps": "max_env_steps"}
# flag -> knob
KNOB_FLAGS = {"sigma_decay": "sigma_decay", "lr_decay": "lr_decay", "noise_reuse": "noise_reuse",
              "activation": "activation", "optimizer": "optimizer"}


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m torch_impl", description=__doc__)
    p.add_argument("--seed", type=int, default=0, help="run seed (default 0)")
    p.add_argument("--preset", choices=sorted(PRESETS), default="cpu", help="hyper-parameter preset (default cpu)")
    p.add_argument("--profile", default="jax", help="knob profile: jax, jax-torchrng, oop-port, functional-port")
    p.add_argument("--torch", action="append", default=[], metavar="KNOB=VALUE",
                   help="set one drift knob (repeatable; applied after the profile)")
    p.add_argument("--device", default="cpu", help="torch device (cpu, cuda)")
    p.add_argument("--threads", type=int, default=1,
                   help="torch intra-op threads while training (default 1: faster for this small policy)")
    p.add_argument("--quiet", action="store_true", help="print only the final line")
    g = p.add_argument_group("explicit overrides (win over preset, profile and --torch)")
    g.add_argument("--pop", type=int)
    g.add_argument("--hidden", type=int)
    g.add_argument("--layers", type=int, help="number of Linear layers")
    g.add_argument("--rank", type=int)
    g.add_argument("--sigma", type=float)
    g.add_argument("--lr", type=float)
    g.add_argument("--sigma-decay", type=float)
    g.add_argument("--lr-decay", type=float)
    g.add_argument("--noise-reuse", type=int)
    g.add_argument("--activation", choices=CHOICES["activation"])
    g.add_argument("--optimizer", choices=CHOICES["optimizer"])
    g.add_argument("--max-steps", type=int, help="environment-step budget")
    return p


def configure(args: argparse.Namespace):
    """(Config, Knobs) from preset, then profile, then --torch, then explicit flags; raises ValueError/KnobError."""
    cfg, preset_knobs = PRESETS[args.preset]
    knobs = resolve(args.profile, args.torch, reference=preset_knobs)
    cfg = cfg.replace(**{field: getattr(args, flag) for flag, field in CONFIG_FLAGS.items()
                         if getattr(args, flag) is not None})
    knobs = knobs.replace(**{knob: getattr(args, flag) for flag, knob in KNOB_FLAGS.items()
                             if getattr(args, flag) is not None})
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
