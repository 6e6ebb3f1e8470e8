"""The named ways a port drifts from the JAX reference, split into the reference run's own settings and the
knobs only a port has, plus the profiles of the ports that were published.

`RunSettings` configure the reference run itself (both sides obey them). `Knobs` is a torch port's whole
configuration: the run settings it uses plus its port-only knobs. Any value of a `Knobs` that departs from the
reference run's is a drift, `rng=torch` included (the suite treats that one as a different generator, not as
different math).
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Iterable, Mapping

# knob -> allowed values; the first is the reference's behaviour.
CHOICES: dict[str, tuple[str, ...]] = {
    "rng": ("jax", "torch", "jax-cpu", "jax-gpu"),
    "antithetic": ("interleaved", "halves", "off"),
    "fitness": ("jax", "std", "std_unbiased", "rank"),
    "bias_noise": ("jax", "fresh", "update_only", "off"),
    "bias_grad": ("jax", "over_sigma"),
    "activation": ("pqn", "tanh", "relu"),
    "init": ("jax", "torch", "normal"),
    "optimizer": ("sgd", "adam", "adamw"),
    "actions": ("sample", "greedy"),
    "compile": ("off", "on"),
    "matmul_precision": ("highest", "high"),
}
# Numeric knobs: name -> (type, what a valid value is).
NUMERIC: dict[str, tuple[type, str]] = {
    "noise_reuse": (int, "an integer >= 0 (0 = the same noise every epoch)"),
    "lr_decay": (float, "a multiplicative factor per epoch in (0, 1]"),
    "sigma_decay": (float, "a multiplicative factor per epoch in (0, 1]"),
}
# What each knob means, in the words the verdicts use.
DESCRIPTIONS: dict[str, str] = {
    "rng": "noise generator (JAX threefry keys vs torch's own generator, or JAX's normals as another JAX backend "
           "rounds them: jax-cpu, jax-gpu)",
    "antithetic": "antithetic pairing layout",
    "fitness": "fitness shaping",
    "bias_noise": "bias noise",
    "bias_grad": "bias gradient scale",
    "noise_reuse": "noise_reuse schedule (how often the noise changes across epochs)",
    "activation": "hidden activation",
    "init": "weight init",
    "optimizer": "optimizer",
    "actions": "action selection",
    "compile": "compiled forward (torch.compile)",
    "matmul_precision": "matmul precision (TF32)",
    "lr_decay": "learning-rate schedule",
    "sigma_decay": "sigma schedule",
}


class KnobError(ValueError):
    """A knob, value or profile that does not exist; the message says what would be right."""


def _check_values(obj: Any, names: Iterable[str]) -> None:
    """Raise KnobError for the first of `names` whose value on `obj` is not allowed."""
    for name in names:
        value = getattr(obj, name)
        if name in CHOICES and value not in CHOICES[name]:
            raise KnobError(f"unknown value {value!r} for knob {name!r}; allowed: {', '.join(CHOICES[name])}")
    if "noise_reuse" in names:
        value = obj.noise_reuse
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            raise KnobError(f"noise_reuse must be {NUMERIC['noise_reuse'][1]}, got {value!r}")
    for name in ("lr_decay", "sigma_decay"):
        if name in names:
            value = getattr(obj, name)
            if not isinstance(value, (int, float)) or not (0.0 < float(value) <= 1.0):
                raise KnobError(f"{name} must be {NUMERIC[name][1]}, got {value!r}")


@dataclass(frozen=True)
class RunSettings:
    """How the reference run is configured: both sides obey these (the defaults are the presets')."""

    noise_reuse: int = 0
    activation: str = "pqn"
    optimizer: str = "sgd"
    lr_decay: float = 1.0
    sigma_decay: float = 0.999

    def __post_init__(self) -> None:
        _check_values(self, RUN_KNOBS)

    def replace(self, **changes: Any) -> "RunSettings":
        unknown = sorted(set(changes) - set(RUN_KNOBS))
        if unknown:
            raise KnobError(f"unknown run setting(s) {', '.join(unknown)}; run settings: {', '.join(RUN_KNOBS)}")
        return dataclasses.replace(self, **changes)


RUN_KNOBS: tuple[str, ...] = tuple(f.name for f in dataclasses.fields(RunSettings))


@dataclass(frozen=True)
class Knobs:
    """A torch port's configuration, one setting per known drift; the defaults are the reference's behaviour."""

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
    actions: str = "sample"
    compile: str = "off"                 # on: the population forward runs torch.compile'd
    matmul_precision: str = "highest"    # high: TF32 matmuls (CUDA's, or its input rounding emulated on a CPU)

    def __post_init__(self) -> None:
        _check_values(self, KNOB_NAMES)

    @classmethod
    def from_run(cls, run: RunSettings, **port: Any) -> "Knobs":
        """The run settings of `run` with every port-only knob at the reference's value (or as given)."""
        return cls(**dataclasses.asdict(run)).replace(**port)

    @property
    def run(self) -> RunSettings:
        """The run settings these knobs use (what a reference run configured like this port would get)."""
        return RunSettings(**{name: getattr(self, name) for name in RUN_KNOBS})

    def replace(self, **changes: Any) -> "Knobs":
        unknown = sorted(set(changes) - set(KNOB_NAMES))
        if unknown:
            raise KnobError(f"unknown knob(s) {', '.join(unknown)}; known knobs: {', '.join(KNOB_NAMES)}")
        return dataclasses.replace(self, **changes)


KNOB_NAMES: tuple[str, ...] = tuple(f.name for f in dataclasses.fields(Knobs))
PORT_KNOBS: tuple[str, ...] = tuple(n for n in KNOB_NAMES if n not in RUN_KNOBS)


@dataclass(frozen=True)
class Profile:
    """A named port: its departures from the reference run (in the order the attribution switches them off),
    the configuration it trains with where that differs (Config fields), and the port it models."""

    name: str
    drifts: Mapping[str, Any]
    models: str
    config: Mapping[str, Any] = dataclasses.field(default_factory=dict)


PROFILES: dict[str, Profile] = {p.name: p for p in (
    Profile("jax", {}, "the reference itself: every knob at the reference's value"),
    Profile("jax-torchrng", {"rng": "torch"}, "the reference's math with torch's own generator"),
    # The torch run of the published CartPole benchmark: an object-oriented strategy with forward hooks.
    Profile("oop-port", {
        "rng": "torch",               # torch generators seeded per parameter (and per member for the biases)
        "activation": "tanh",         # the name pqn was mapped to tanh
        "init": "torch",              # nn.Linear's default
        "bias_noise": "update_only",  # fresh bias noise each epoch for the update, never added in the forward
        "bias_grad": "over_sigma",    # its bias gradient is 1/sigma times the reference's
        "fitness": "std",             # (f - mean) / std, ddof 0, no epsilon
        "lr_decay": 0.9995,           # lr x0.9995 per epoch
    }, "the torch run of the published CartPole benchmark"),
    # The later functional port (its core.py with the CartPole recipe).
    Profile("functional-port", {
        "rng": "torch",               # one torch generator seeded seed + 1000 epoch
        "antithetic": "halves",       # member i pairs with i + N/2
        "noise_reuse": 1,             # fresh weight noise every epoch
        "bias_noise": "off",          # biases neither perturbed nor updated
        "fitness": "std_unbiased",    # (f - mean) / (std(ddof 1) + 1e-8)
        "activation": "tanh",
        "init": "normal",             # weights normal with std 0.1, zero biases
        "lr_decay": 0.9995,
        "actions": "greedy",          # argmax: no action randomness
    }, "the later functional port of the same fork", config={"layers": 2}),   # a 4-H-2 network
)}
PROFILE_DRIFTS: dict[str, dict[str, Any]] = {name: dict(p.drifts) for name, p in PROFILES.items()}


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


def as_knobs(reference: RunSettings | Knobs | None) -> Knobs:
    """The Knobs of a reference run (its settings, every port-only knob at the reference value)."""
    if reference is None:
        return Knobs()
    return reference if isinstance(reference, Knobs) else Knobs.from_run(reference)


def profile(name: str, reference: RunSettings | Knobs | None = None) -> Knobs:
    """The knobs of profile `name`, as departures from the reference run's settings."""
    if name not in PROFILES:
        raise KnobError(f"unknown profile {name!r}; known profiles: {', '.join(PROFILES)}")
    return as_knobs(reference).replace(**PROFILES[name].drifts)


def resolve(profile_name: str = "jax", assignments: Iterable[str] = (),
            reference: RunSettings | Knobs | None = None) -> Knobs:
    """Profile first, then each `KNOB=VALUE` in order (a later one wins)."""
    knobs = profile(profile_name, reference)
    for text in assignments:
        name, value = parse_assignment(text)
        knobs = knobs.replace(**{name: value})
    return knobs


def drifts(knobs: Knobs, reference: RunSettings | Knobs | None = None) -> dict[str, tuple[Any, Any]]:
    """Knobs that depart from the reference run: name -> (reference value, this value)."""
    knobs, reference = as_knobs(knobs), as_knobs(reference)
    return {
        name: (getattr(reference, name), getattr(knobs, name))
        for name in KNOB_NAMES
        if getattr(knobs, name) != getattr(reference, name)
    }
