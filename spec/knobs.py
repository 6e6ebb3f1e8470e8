"""The named ways a port drifts from the JAX reference, split into the reference run's own settings and the
knobs only a port has, plus the profiles of the ports that were published.

`RunSettings` configure the reference run itself (both sides obey them). `Knobs` is a torch port's whole
configuration: the run settings it uses plus its port-only knobs. Any value of a `Knobs` that departs from the
reference run's is a drift, `rng=torch` included (the suite treats that one as a different generator, not as
different math). Both are values classes of the one knob type (spec.knob): `CARTPOLE` is the table, `RUN` its
run-side knobs; CHOICES, NUMERIC and DESCRIPTIONS are views of it.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Iterable, Mapping

from spec.knob import Knob, KnobError, KnobTable, KnobValues, Words  # noqa: F401  (KnobError: callers import it here)


def _count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _factor(value: Any) -> bool:
    return isinstance(value, (int, float)) and 0.0 < float(value) <= 1.0


# The knobs in the order of Knobs's fields; a choice's first value is the reference's behaviour.
RNG = Knob("rng", ("jax", "torch", "jax-cpu", "jax-gpu"),
           "noise generator (JAX threefry keys vs torch's own generator, or JAX's normals as another JAX backend "
           "rounds them: jax-cpu, jax-gpu)",
           {"jax": "JAX's threefry numbers (torch_impl.random; in torch_impl the CPU's float32 normals)",
            "torch": "torch's own generator",
            "jax-cpu": "JAX's numbers with the float32 normals of JAX's CPU backend, whatever the reference runs on",
            "jax-gpu": "JAX's numbers with the float32 normals of JAX's NVIDIA GPU backend, whatever the reference "
                       "runs on"})
KNOBS: tuple[Knob, ...] = (
    RNG,
    Knob("antithetic", ("interleaved", "halves", "off"), "antithetic pairing layout",
         {"interleaved": "pairs (2k, 2k+1)", "halves": "pairs (i, i + N/2)", "off": "no pairs"}),
    Knob("fitness", ("jax", "std", "std_unbiased", "rank"), "fitness shaping",
         {"jax": "(f - mean) / sqrt(var + 1e-5)", "std": "(f - mean) / std (ddof 0, zeros when std < 1e-8)",
          "std_unbiased": "(f - mean) / (std(ddof 1) + 1e-8)", "rank": "centred ranks"}),
    Knob("bias_noise", ("jax", "fresh", "update_only", "off"), "bias noise",
         {"jax": "the weights' schedule", "fresh": "new every epoch",
          "update_only": "new every epoch and used in the update but never added in the forward",
          "off": "biases not perturbed"}),
    Knob("bias_grad", ("jax", "over_sigma"), "bias gradient scale",
         {"jax": "mean(f * sigma * eps)", "over_sigma": "the same divided by sigma once more"}),
    Knob("noise_reuse", about="noise_reuse schedule (how often the noise changes across epochs)", side="run",
         number=int, valid="an integer >= 0 (0 = the same noise every epoch)", accepts=_count, default=0),
    Knob("activation", ("pqn", "tanh", "relu"), "hidden activation",
         {"pqn": "relu of a parameter-free layer norm"}, side="run"),
    Knob("init", ("jax", "torch", "normal"), "weight init",
         {"jax": "normal / sqrt(in) and zero biases", "torch": "nn.Linear's uniform default",
          "normal": "normal with std 0.1 and zero biases"}),
    Knob("optimizer", ("sgd", "adam", "adamw"), "optimizer", side="run"),   # optax's semantics and defaults
    Knob("lr_decay", about="learning-rate schedule", side="run", number=float,
         valid="a multiplicative factor per epoch in (0, 1]", accepts=_factor, default=1.0),
    Knob("sigma_decay", about="sigma schedule", side="run", number=float,
         valid="a multiplicative factor per epoch in (0, 1]", accepts=_factor, default=0.999),
    Knob("actions", ("sample", "greedy"), "action selection",
         {"sample": "action 1 when u >= softmax(logits)[0] (the shared uniforms)", "greedy": "argmax(logits)"}),
    Knob("compile", ("off", "on"), "compiled forward (torch.compile)",
         {"off": "the population forward eager", "on": "the population forward torch.compile'd (dynamic=True)"}),
    Knob("matmul_precision", ("highest", "high"), "matmul precision (TF32)",
         {"highest": "float32 matmuls",
          "high": "TF32 matmuls (CUDA's TF32 mode; on a CPU every matmul operand rounded to TF32's 10 mantissa bits)"}),
)
_WORDS = Words(not_assignment="expected KNOB=VALUE, got {text!r} (for example antithetic=halves)",
               unknown_knob="unknown knob {name!r}; known knobs: {known}",
               unknown_knobs="unknown knob(s) {names}; known knobs: {known}",
               unknown_profile="unknown profile {name!r}; known profiles: {known}")
# The reference run's own settings (both sides obey them): the run-side knobs.
RUN = KnobTable(tuple(k for k in KNOBS if k.side == "run"), {},
                _WORDS._replace(unknown_knobs="unknown run setting(s) {names}; run settings: {known}"))
RunSettings = RUN.values_class("RunSettings", __name__, "How the reference run is configured: both sides obey these "
                               "(the defaults are the presets').")
RUN_KNOBS: tuple[str, ...] = RUN.names


class _Knobs(KnobValues):
    """What a port's Knobs add to the table's values: the run settings they use, and knobs from run settings."""

    @classmethod
    def from_run(cls, run: RunSettings, **port: Any) -> "Knobs":
        """The run settings of `run` with every port-only knob at the reference's value (or as given)."""
        return cls(**dataclasses.asdict(run)).replace(**port)

    @property
    def run(self) -> RunSettings:
        """The run settings these knobs use (what a reference run configured like this port would get)."""
        return RunSettings(**{name: getattr(self, name) for name in RUN_KNOBS})


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

CARTPOLE = KnobTable(KNOBS, PROFILE_DRIFTS, _WORDS)
Knobs = CARTPOLE.values_class("Knobs", __name__, "A torch port's configuration, one setting per known drift; the "
                              "defaults are the reference's behaviour.", base=_Knobs)
KNOB_NAMES: tuple[str, ...] = CARTPOLE.names
PORT_KNOBS: tuple[str, ...] = tuple(n for n in KNOB_NAMES if n not in RUN_KNOBS)
# The table's views by kind: choice knob -> its values; numeric knob -> (type, what a valid value is); the words.
CHOICES: dict[str, tuple[str, ...]] = {k.name: k.values for k in KNOBS if k.number is None}
NUMERIC: dict[str, tuple[type, str]] = {k.name: (k.number, k.valid) for k in KNOBS if k.number is not None}
DESCRIPTIONS: dict[str, str] = {k.name: k.about for k in KNOBS}


def parse_value(name: str, text: str) -> Any:
    """Turn the text of `KNOB=VALUE` into the knob's value, or raise KnobError."""
    return CARTPOLE.parse_value(name, text)


def parse_assignment(text: str) -> tuple[str, Any]:
    """Parse one `KNOB=VALUE` string."""
    return CARTPOLE.parse(text)


def as_knobs(reference: RunSettings | Knobs | None) -> Knobs:
    """The Knobs of a reference run (its settings, every port-only knob at the reference value)."""
    if reference is None:
        return Knobs()
    return reference if isinstance(reference, Knobs) else Knobs.from_run(reference)


def profile(name: str, reference: RunSettings | Knobs | None = None) -> Knobs:
    """The knobs of profile `name`, as departures from the reference run's settings."""
    return CARTPOLE.resolve(as_knobs(reference), name)


def resolve(profile_name: str = "jax", assignments: Iterable[str] = (),
            reference: RunSettings | Knobs | None = None) -> Knobs:
    """Profile first, then each `KNOB=VALUE` in order (a later one wins)."""
    return CARTPOLE.resolve(as_knobs(reference), profile_name, assignments)


def drifts(knobs: Knobs, reference: RunSettings | Knobs | None = None) -> dict[str, tuple[Any, Any]]:
    """Knobs that depart from the reference run: name -> (reference value, this value)."""
    return CARTPOLE.drifts(as_knobs(knobs), as_knobs(reference))
