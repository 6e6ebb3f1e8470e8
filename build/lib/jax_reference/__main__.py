"""`python -m jax_reference`: train CartPole-v1 with the JAX reference EggRoll and print steps to solve.

Exit status: 0 solved, 1 not solved within the step budget, 2 bad usage or input.
"""
from __future__ import annotations

import argparse
import sys

from spec.cli import add_override_arguments, apply_overrides
from spec.config import PRESETS, check_pairing
from spec.knobs import KnobError
from spec.limits import check_fits, seed_arg

def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m jax_reference", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seed", type=seed_arg, default=0, help="run seed in [0, 2**32 - 1] (default 0)")
    p.add_argument("--preset", choices=sorted(PRESETS), default="cpu", help="hyper-parameter preset (default cpu)")
    p.add_argument("--quiet", action="store_true", help="print only the final line")
    p.add_argument("--exact-graph", action="store_true",
                   help="draw the noise inside every forward call, as upstream's graph does (slower; differs "
                        "from the default only by float32 rounding)")
    g = p.add_argument_group("explicit overrides (win over the preset)")
    add_override_arguments(g)
    return p


def configure(args: argparse.Namespace):
    """(Config, RunSettings) from the preset, then the explicit flags; raises ValueError/KnobError."""
    cfg, run = PRESETS[args.preset]
    cfg, run = apply_overrides(args, cfg, run)
    check_pairing(cfg.pop, "interleaved")
    check_fits(cfg)
    return cfg, run


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        cfg, run = configure(args)
    except (KnobError, ValueError) as err:
        parser.error(str(err))   # exits 2
    from jax_reference.train import train   # jax import only once the arguments are known good

    if not args.quiet:
        print(f"JAX reference EggRoll  seed {args.seed}  {cfg}  {run}", flush=True)
    result = train(cfg, run, args.seed, progress=not args.quiet, exact_graph=args.exact_graph)
    if args.quiet:
        print(f"steps_to_solve {result.steps_to_solve}" if result.solved else f"not solved ({result.env_steps} steps)")
    return 0 if result.solved else 1


if __name__ == "__main__":
    sys.exit(main())
