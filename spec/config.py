"""Run hyper-parameters (what both sides share), the environment's constants and the named presets."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from spec.knobs import PROFILES, KnobError, RunSettings

OBS_DIM, N_ACTIONS = 4, 2   # CartPole-v1
SOLVED_RETURN = 475.0        # population mean return that counts as solved


@dataclass(frozen=True)
class Config:
    """Hyper-parameters of one ES run; how each side behaves lives in `RunSettings` and `Knobs`."""

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
        if self.max_env_steps < 1:
            raise ValueError(f"max_env_steps (--max-steps) must be >= 1, got {self.max_env_steps}")

    @property
    def sizes(self) -> list[int]:
        return [OBS_DIM] + [self.hidden] * (self.layers - 1) + [N_ACTIONS]

    def replace(self, **changes) -> "Config":
        return dataclasses.replace(self, **changes)


# The `gap` preset caps a run at 10 M env steps: at the `cpu` preset a run solves in about 3-5 M
# (35-50 s of one core) while a drift that stops learning would run to the 20 M budget; a run that
# has not solved by then is censored (its steps a lower bound).
GAP_BUDGET = 10_000_000

PRESETS: dict[str, tuple[Config, RunSettings]] = {
    "cpu": (Config(), RunSettings()),
    "paper": (Config(pop=2048, hidden=256, max_env_steps=60_000_000), RunSettings()),
    "gap": (Config(max_env_steps=GAP_BUDGET), RunSettings()),
}
PRESET_NOTES = {
    "cpu": "pop 256, 3 x 64: a CartPole run in under a minute of one core",
    "paper": "the published CartPole benchmark's settings (pop 2048, rank 4, sigma 0.2, lr 0.1, 3 x 256)",
    "gap": f"`cpu` with the budget cut to {GAP_BUDGET:,} env steps, so a study fits 30 minutes on 2 cores",
}


def for_profile(cfg: Config, profile_name: str) -> Config:
    """cfg with the configuration profile `profile_name` carries (e.g. functional-port's two Linear layers)."""
    if profile_name not in PROFILES:
        raise KnobError(f"unknown profile {profile_name!r}; known profiles: {', '.join(PROFILES)}")
    return cfg.replace(**PROFILES[profile_name].config)


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
