"""Command-line overrides shared by `python -m torch_impl` and `python -m jax_reference` (argparse)."""
from __future__ import annotations

from spec.config import Config
from spec.knobs import CHOICES

# flag dest -> Config field, and flag dest -> run setting.
CONFIG_FLAGS = {"pop": "pop", "hidden": "hidden", "layers": "layers", "rank": "rank", "sigma": "sigma",
                "lr": "lr", "max_steps": "max_env_steps", "group_size": "group_size"}
RUN_FLAGS = {"sigma_decay": "sigma_decay", "lr_decay": "lr_decay", "noise_reuse": "noise_reuse",
             "activation": "activation", "optimizer": "optimizer"}


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
