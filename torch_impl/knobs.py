"""The named ways a torch port drifts from the JAX reference, and the profiles built from them.

Pure Python (no torch import): the JAX side and the parity suite read the same table.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Iterable

# knob -> allowed values; the first is the reference's behaviour.
CHOICES: dict[str, tuple[str, ...]] = {
    "rng": ("jax", "torch"),
    "antithetic": ("interleaved", "halves", "off"),
    "fitness": ("jax", "std", "std_unbiased", "rank"),
    "bias_noise": ("jax", "fresh", "off"),
    "bias_grad": ("jax", "over_sigma"),
    "activation": ("pqn", "tanh", "relu"),
    "init": ("jax", "torch"),
    "optimizer": ("sgd", "adam", "adamw"),
}
# Numeric knobs: name -> (type, what a valid value is).
NUMERIC: dict[str, tuple[type, str]] = {
    "noise_reuse": (int, "an integer >= 0 (0 = the same noise every epoch)"),
    "lr_decay": (float, "a multiplicative factor per epoch in (0, 1]"),
    "sigma_decay": (float, "a multiplicative factor per epoch in (0, 1]"),
}
# Knobs that describe the reference run itself (the JAX side is configured by these too).
RUN_KNOBS = ("activation", "noise_reuse", "optimizer", "lr_decay", "sigma_decay")
# What each knob means, in the words the verdicts use.
DESCRIPTIONS: dict[str, str] = {
    "rng": "noise generator (JAX threefry keys vs torch's own generator)",
    "antithetic": "antithetic pairing layout",
    "fitness": "fitness shaping",
    "bias_noise": "bias noise",
    "bias_grad": "bias gradient scale",
    "noise_reuse": "noise_reuse schedule (how often the noise changes across epochs)",
    "activation": "hidden activation",
    "init": "weight init",
    "optimizer": "optimizer",
    "lr_decay": "learning-rate schedule",
    "sigma_decay": "sigma schedule",
}


class KnobError(ValueError):
    """A knob, value or profile that does not exist; the message says what would be right."""


@dataclass(frozen=True)
class Knobs:
    """One setting per known drift; the defaults are the reference's behaviour."""

    rng: str = "jax"
    antithetic: str = "interleaved"
    fitness: str = "jax"
    bias_noise: str = "jax"
    bias_grad: str = "jax"
    noise_reuse: int = 0
    activation: str = "pqn"
    init: str = "jax"
    optimizer: str = "sgd"
    lr_decay: float = 1.0
    sigma_decay: float = 0.999

    def __post_init__(self) -> None:
        for name, allowed in CHOICES.items():
            value = getattr(self, name)
            if value not in allowed:
                raise KnobError(f"unknown value {value!r} for knob {name!r}; allowed: {', '.join(allowed)}")
        if not isinstance(self.noise_reuse, int) or isinstance(self.noise_reuse, bool) or self.noise_reuse < 0:
            raise KnobError(f"noise_reuse must be {NUMERIC['noise_reuse'][1]}, got {self.noise_reuse!r}")
        for name in ("lr_decay", "sigma_decay"):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or not (0.0 < float(value) <= 1.0):
                raise KnobError(f"{name} must be {NUMERIC[name][1]}, got {value!r}")

    def replace(self, **changes: Any) -> "Knobs":
        unknown = sorted(set(changes) - set(KNOB_NAMES))
        if unknown:
            raise KnobError(f"unknown knob(s) {', '.join(unknown)}; known knobs: {', '.join(KNOB_NAMES)}")
        return dataclasses.replace(self, **changes)


KNOB_NAMES: tuple[str, ...] = tuple(f.name for f in dataclasses.fields(Knobs))

# Each profile is a set of departures applied to the reference run's knobs.
PROFILE_DRIFTS: dict[str, dict[str, Any]] = {
    "jax": {},
    "jax-torchrng": {"rng": "torch"},
    # The torch run of the published CartPole benchmark (REFERENCE.md, its table).
    "oop-port": {
        "rng": "torch",
        "activation": "tanh",
        "init": "torch",
        "bias_noise": "fresh",
        "bias_grad": "over_sigma",
        "fitness": "std",
        "lr_decay": 0.9995,
    },
    # The later functional port: halves pairing, ddof-1 shaping, unperturbed biases, and
    # one generator seeded seed + epoch (fresh noise every epoch: noise_reuse 1).
    "functional-port": {
        "rng": "torch",
        "antithetic": "halves",
        "fitness": "std_unbiased",
        "bias_noise": "off",
        "noise_reuse": 1,
    },
}


def parse_value(name: str, text: str) -> Any:
    """Turn the text of `KNOB=VALUE` into the knob's value, or raise KnobError."""
    if name in CHOICES:
        if text not in CHOICES[name]:
            raise KnobError(f"unknown value {text!r} for knob {name!r}; allowed: {', '.join(CHOICES[name])}")
        return text
    if name in NUMERIC:
        kind, meaning = NUMERIC[name]
        try:
            return kind(text)
        except ValueError:
            raise KnobError(f"knob {name!r} takes {meaning}, got {text!r}") from None
    raise KnobError(f"unknown knob {name!r}; known knobs: {', '.join(KNOB_NAMES)}")


def parse_assignment(text: str) -> tuple[str, Any]:
    """Parse one `KNOB=VALUE` string."""
    if "=" not in text:
        raise KnobError(f"expected KNOB=VALUE, got {text!r} (for example antithetic=halves)")
    name, value = text.split("=", 1)
    name = name.strip()
    return name, parse_value(name, value.strip())


def profile(name: str, reference: Knobs | None = None) -> Knobs:
    """The knobs of profile `name`, as departures from the reference run's knobs."""
    if name not in PROFILE_DRIFTS:
        raise KnobError(f"unknown profile {name!r}; known profiles: {', '.join(PROFILE_DRIFTS)}")
    return (reference or Knobs()).replace(**PROFILE_DRIFTS[name])


def resolve(profile_name: str = "jax", assignments: Iterable[str] = (), reference: Knobs | None = None) -> Knobs:
    """Profile first, then each `KNOB=VALUE` in order (a later one wins)."""
    knobs = profile(profile_name, reference)
    for text in assignments:
        name, value = parse_assignment(text)
        knobs = knobs.replace(**{name: value})
    return knobs


def drifts(knobs: Knobs, reference: Knobs | None = None) -> dict[str, tuple[Any, Any]]:
    """Knobs that depart from the reference: name -> (reference value, this value)."""
    reference = reference or Knobs()
    return {
        name: (getattr(reference, name), getattr(knobs, name))
        for name in KNOB_NAMES
        if getattr(knobs, name) != getattr(reference, name)
    }


def reference_only(knobs: Knobs) -> Knobs:
    """The reference run described by `knobs`: its run knobs kept, every torch-only knob at the reference value."""
    return Knobs(**{name: getattr(knobs, name) for name in RUN_KNOBS})
