"""What `python -m torch_impl` and `python -m jax_reference` share (argparse): --seed and --preset, the explicit
overrides, and the CartPole preset they start from."""
from __future__ import annotations

from spec.config import PRESETS, Config
from spec.int8 import INT8_ONLY, INT8_PRESETS
from spec.knobs import CHOICES, RunSettings
from spec.limits import seed_arg
from spec.lm import LM_PRESETS
from spec.lm_run import LM_ONLY, check_task_flags

# flag dest -> Config field, and flag dest -> run setting.
CONFIG_FLAGS = {"pop": "pop", "hidden": "hidden", "layers": "layers", "rank": "rank", "sigma": "sigma",
                "lr": "lr", "max_steps": "max_env_steps", "group_size": "group_size"}
RUN_FLAGS = {"sigma_decay": "sigma_decay", "lr_decay": "lr_decay", "noise_reuse": "noise_reuse",
             "activation": "activation", "optimizer": "optimizer"}


def add_run_arguments(parser) -> None:
    """--seed and --preset (every task's presets, default cpu)."""
    parser.add_argument("--seed", type=seed_arg, default=0, help="run seed in [0, 2**32 - 1] (default 0)")
    parser.add_argument("--preset", choices=sorted(set(PRESETS) | set(LM_PRESETS) | set(INT8_PRESETS)),
                        help=f"hyper-parameter preset (default cpu); cartpole: {', '.join(PRESETS)}; "
                             f"lm: {', '.join(LM_PRESETS)}; int8: {', '.join(INT8_PRESETS)}")


def cartpole_preset(args) -> tuple[Config, RunSettings]:
    """--task cartpole's preset (default cpu); ValueError for an LM or int8 preset, or their flags given."""
    preset = args.preset or "cpu"
    if preset not in PRESETS:
        raise ValueError(f"--preset {preset} is not a CartPole preset; --task cartpole takes {', '.join(PRESETS)}")
    check_task_flags(args, LM_ONLY | INT8_ONLY, "cartpole")
    return PRESETS[preset]


def add_override_arguments(group) -> None:
    """The explicit hyper-parameter and run-setting flags of both trainers' CLIs (argparse group or parser)."""
    group.add_argument("--pop", type=int)
    group.add_argument("--hidden", type=int)
    group.add_argument("--layers", type=int, help="number of Linear layers")
    group.add_argument("--rank", type=int)
    group.add_argument("--sigma", type=float)
    group.add_argument("--lr", type=float)
    group.add_argument("--sigma-decay", type=float)
    group.add_argument("--lr-decay", type=float)
    group.add_argument("--noise-reuse", type=int)
    group.add_argument("--group-size", type=int, help="fitness-shaping group size (0 = whole population)")
    group.add_argument("--activation", choices=CHOICES["activation"])
    group.add_argument("--optimizer", choices=CHOICES["optimizer"])
    group.add_argument("--max-steps", type=int, help="environment-step budget")


def apply_overrides(args, cfg: Config, settings):
    """(cfg, settings) with every override flag that was given (not None) applied; settings: RunSettings or Knobs."""
    cfg = cfg.replace(**{field: getattr(args, flag) for flag, field in CONFIG_FLAGS.items()
                         if getattr(args, flag) is not None})
    settings = settings.replace(**{knob: getattr(args, flag) for flag, knob in RUN_FLAGS.items()
                                   if getattr(args, flag) is not None})
    return cfg, settings
