"""Run hyper-parameters (what both sides share) and the named presets. Pure Python."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from torch_impl.knobs import Knobs

OBS_DIM, N_ACTIONS = 4, 2   # CartPole-v1
SOLVED_RETURN = 475.0        # population mean return that counts as solved


@dataclass(frozen=True)
class Config:
    """Hyper-parameters of one ES run; the drift knobs live in `Knobs`."""

    pop: int = 256
    rank: int = 4
    sigma: float = 0.2
    lr: float = 0.1
    hidden: int = 64
    layers: int = 3            # Linear layers: sizes = [4] + [hidden] * (layers - 1) + [2]
    max_env_steps: int = 20_000_000
    group_size: int = 0

    def __post_init__(self) -> None:
        if self.pop < 1:
            raise ValueError(f"pop must be >= 1, got {self.pop}")
        if self.rank < 1:
            raise ValueError(f"rank must be >= 1 (the number of columns of A and B), got {self.rank}")
        if not self.sigma > 0:
            raise ValueError(f"sigma must be > 0, got {self.sigma}")
        if not self.lr > 0:
            raise ValueError(f"lr must be > 0, got {self.lr}")
        if self.layers < 1 or self.hidden < 1:
            raise ValueError(f"layers and hidden must be >= 1, got layers={self.layers}, hidden={self.hidden}")
        if self.group_size < 0 or (self.group_size and self.pop % self.group_size):
            raise ValueError(f"group_size must be 0 or divide pop={self.pop}, got {self.group_size}")

    @property
    def sizes(self) -> list[int]:
        return [OBS_DIM] + [self.hidden] * (self.layers - 1) + [N_ACTIONS]

    def replace(self, **changes) -> "Config":
        return dataclasses.replace(self, **changes)


PRESETS: dict[str, tuple[Config, Knobs]] = {
    "cpu": (Config(), Knobs()),
    "paper": (Config(pop=2048, hidden=256, max_env_steps=60_000_000), Knobs()),
}


def check_pairing(pop: int, antithetic: str) -> None:
    """Antithetic pairs need an even population: say so before anything runs."""
    if antithetic != "off" and pop % 2:
        raise ValueError(
            f"population {pop} is odd but antithetic={antithetic} pairs members; "
            f"use an even population (e.g. {pop + 1}) or antithetic=off"
        )


def schedule(base: float, decay: float, epoch: int) -> float:
    """Per-epoch value `base * decay**epoch`, computed in float64 (cast to float32 where used)."""
    return float(base) * float(decay) ** int(epoch)


# Command-line overrides shared by `python -m torch_impl` and `python -m jax_reference`:
# flag dest -> Config field, and flag dest -> run knob (the knobs that describe the reference run).
CONFIG_FLAGS = {"pop": "pop", "hidden": "hidden", "layers": "layers", "rank": "rank", "sigma": "sigma",
                "lr": "lr", "max_steps": "max_env_steps", "group_size": "group_size"}
KNOB_FLAGS = {"sigma_decay": "sigma_decay", "lr_decay": "lr_decay", "noise_reuse": "noise_reuse",
              "activation": "activation", "optimizer": "optimizer"}


def add_override_arguments(group) -> None:
    """The explicit hyper-parameter and run-knob flags of both trainers' CLIs (argparse group or parser)."""
    from torch_impl.knobs import CHOICES

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


def apply_overrides(args, cfg: Config, knobs: Knobs) -> tuple[Config, Knobs]:
    """(cfg, knobs) with every override flag that was given (not None) applied."""
    cfg = cfg.replace(**{field: getattr(args, flag) for flag, field in CONFIG_FLAGS.items()
                         if getattr(args, flag) is not None})
    knobs = knobs.replace(**{knob: getattr(args, flag) for flag, knob in KNOB_FLAGS.items()
                             if getattr(args, flag) is not None})
    return cfg, knobs
