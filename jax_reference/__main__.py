"""`python -m jax_reference`: train CartPole-v1 with the JAX reference EggRoll and print steps to solve, or
(`--task lm`) train the byte-level LM of spec/lm.py and print its validation bits/byte, or (`--task int8`) train
nano-egg's integer LM of spec/int8.py (QEggRoll) and print its validation bits/byte.

Exit status: 0 solved, 1 not solved within the step budget, 2 bad usage or input. With --task lm: 0 the run
finished with finite bits/byte, 1 they went NaN or inf, 2 bad usage or input. With --task int8: 0 the run
finished (integer bits/byte are always finite), 2 bad usage or input.
"""
from __future__ import annotations

import argparse
import sys

import numpy as np

from spec.cli import add_override_arguments, add_run_arguments, apply_overrides, cartpole_preset
from spec.config import check_pairing
from spec.int8 import INT8_ONLY, add_int8_arguments, int8_config
from spec.knobs import KnobError
from spec.limits import check_fits
from spec.lm_run import TASKS, add_lm_arguments, check_corpus_path, check_task_flags, lm_config, lm_verdict_line
from spec.run import quiet_line


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m jax_reference", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    add_run_arguments(p)
    p.add_argument("--quiet", action="store_true", help="print only the final line")
    p.add_argument("--exact-graph", action="store_true",
                   help="draw the noise inside every forward call, as upstream's graph does (slower; differs "
                        "from the default only by float32 rounding)")
    add_lm_arguments(p, TASKS + ("int8",))
    add_int8_arguments(p)
    g = p.add_argument_group("explicit overrides (win over the preset)")
    add_override_arguments(g)
    return p


def configure(args: argparse.Namespace):
    """(Config, RunSettings) from the preset, then the explicit flags; raises ValueError/KnobError."""
    cfg, run = apply_overrides(args, *cartpole_preset(args))
    check_pairing(cfg.pop, "interleaved")
    check_fits(cfg)
    return cfg, run


def main_corpus(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    """--task lm or int8: check the config and the corpus (exit 2 on either; int8's against nano-egg's layout),
    then train and print the verdict."""
    try:
        if args.task == "lm":
            check_task_flags(args, {"exact_graph": "--exact-graph"} | INT8_ONLY, "lm")
            cfg = lm_config(args)
            path = check_corpus_path(args.corpus)
            from rollout.corpus import load_corpus    # numpy only: reading the corpus is part of checking the input
            corpus = load_corpus(path, cfg.seq_len)   # refuses a corpus too short for windows of seq_len + 1 bytes
        else:
            cfg = int8_config(args)
            from rollout.int8_data import load_int8_corpus  # numpy only: the corpus is part of the input
            corpus = load_int8_corpus(check_corpus_path(args.corpus), cfg)
    except (OSError, ValueError) as err:
        parser.error(str(err))   # exits 2
    if args.task == "lm":                             # jax only once the input is known good
        from jax_reference.lm.train import train_lm as train
        what = "EggRoll  byte LM"
    else:
        from jax_reference.int8.train import train_int8 as train
        what = "QEggRoll  int8 LM"
    if not args.quiet:
        print(f"JAX reference {what}  seed {args.seed}  {cfg}  corpus {corpus.path}", flush=True)
    result = train(cfg, args.seed, corpus, progress=not args.quiet)
    if args.quiet:
        print(lm_verdict_line(result))    # `validation 3.800 bits/byte after 1000 epochs (...)`, as without --quiet
    if args.task == "int8":
        return 0                          # integer bits/byte are always finite
    finite = all(np.isfinite([row["train_bpb"] for row in result.history])) and np.isfinite(result.val_bpb)
    return 0 if finite else 1


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.task in ("lm", "int8"):
        return main_corpus(parser, args)
    try:
        cfg, run = configure(args)
    except (KnobError, ValueError) as err:
        parser.error(str(err))   # exits 2
    from jax_reference.train import train   # jax import only once the arguments are known good

    if not args.quiet:
        print(f"JAX reference EggRoll  seed {args.seed}  {cfg}  {run}", flush=True)
    result = train(cfg, run, args.seed, progress=not args.quiet, exact_graph=args.exact_graph)
    if args.quiet:
        print(quiet_line(result))
    return 0 if result.solved else 1


if __name__ == "__main__":
    sys.exit(main())
