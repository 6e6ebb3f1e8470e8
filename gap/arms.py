"""Arms of the study: a side (the JAX reference or the torch port) with its knobs, under a readable name.

Names are a pure function of (side, knobs), so the same setting reached two ways (a ladder
rung that equals a single-drift arm) is one arm, run once:
`jax_reference`, `torch:jax`, `torch:oop-port` (a profile), `torch:jax+activation=tanh`
(a profile plus a departure), `torch:oop-port-rng-activation` (a profile with those knobs
switched back to the reference's value). The name is the shortest such description.
A port trained through the adapter protocol (`--port MODULE:ATTR`) is `port:<the adapter's name>`: the port's
name, its package version included, is part of every run's identity; `source` says where to import it from.
"""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass

from spec.knobs import KNOB_NAMES, PROFILES, KnobError, Knobs, RunSettings, as_knobs, profile, resolve

SIDES = ("jax", "torch", "port")
JAX_ARM = "jax_reference"
PORT_PREFIX = "port:"


@dataclass(frozen=True)
class Arm:
    """One thing the study trains over seeds: a side, its settings, and the Config changes it trains with."""

    name: str
    side: str      # "jax" (jax_reference.train), "torch" (torch_impl.train) or "port" (ports.train, an adapter)
    knobs: Knobs | RunSettings   # RunSettings for the jax side and a port (the reference run), Knobs for torch
    config: tuple[tuple[str, object], ...] = ()   # Config fields a profile carries, e.g. (("layers", 2),)
    source: str = ""   # a port arm's adapter, MODULE:ATTR (imported by name in each worker)

    def __post_init__(self) -> None:
        if self.side not in SIDES:
            raise ValueError(f"side must be one of {SIDES}, got {self.side!r}")
        if (self.side == "port") != bool(self.source):
            raise ValueError(f"an arm has a source (MODULE:ATTR) exactly when its side is 'port': {self.name!r}")


def departures_json(values: dict, defaults: dict) -> str:
    """Canonical text of the fields that differ from their defaults (sorted keys, no spaces): a run's identity
    on disk, which stays the same when a field is added later with a default."""
    return json.dumps({k: v for k, v in values.items() if k not in defaults or defaults[k] != v}, sort_keys=True,
                      separators=(",", ":"))


def knobs_json(knobs: Knobs | RunSettings | dict) -> str:
    """Canonical text of the knobs (a reference run as the Knobs of its settings; a dict as read from disk)."""
    if isinstance(knobs, dict):
        knobs = Knobs(**{k: v for k, v in knobs.items() if k in KNOB_NAMES})
    full = Knobs.from_run(knobs) if isinstance(knobs, RunSettings) else knobs
    return departures_json(asdict(full), asdict(Knobs()))


def _value_text(value) -> str:
    return repr(value) if isinstance(value, float) else str(value)


def _describe(knobs: Knobs, base: Knobs, reference: Knobs) -> tuple[list[str], list[str]]:
    """How `knobs` departs from `base`: knobs switched back to the reference, and other values set."""
    back, set_ = [], []
    for name in KNOB_NAMES:
        value = getattr(knobs, name)
        if value == getattr(base, name):
            continue
        if value == getattr(reference, name):
            back.append(name)
        else:
            set_.append(f"{name}={_value_text(value)}")
    return back, set_


def torch_name(knobs: Knobs, reference: RunSettings | Knobs | None = None) -> str:
    """Shortest readable name of a torch arm, from the named profiles (ties go to the first profile)."""
    reference = as_knobs(reference)
    best: tuple[int, str] | None = None
    for pname in PROFILES:
        back, set_ = _describe(knobs, profile(pname, reference), reference)
        text = "torch:" + pname + "".join("-" + b for b in back) + "".join("+" + s for s in set_)
        cost = len(back) + len(set_)
        if best is None or cost < best[0]:
            best = (cost, text)
    return best[1]


def torch_arm(knobs: Knobs, reference: RunSettings | Knobs | None = None) -> Arm:
    return Arm(torch_name(knobs, reference), "torch", knobs)


def jax_arm(reference: RunSettings | None = None) -> Arm:
    """The JAX reference run, configured by its run settings (activation, schedules, optimizer, noise_reuse)."""
    run = reference or RunSettings()
    name = JAX_ARM
    if run != RunSettings():   # a reference run with other settings than the default ones
        name += "".join("+" + s for s in _describe(Knobs.from_run(run), Knobs(), Knobs())[1])
    return Arm(name, "jax", run)


def port_arm(source: str, port_name: str, reference: RunSettings | None = None) -> Arm:
    """A port trained through its es_* methods under the reference run's settings: `port:<its name>`."""
    return Arm(PORT_PREFIX + port_name, "port", reference or RunSettings(), source=source)


def profile_arm(name: str, reference: RunSettings | None = None) -> Arm:
    """`jax_reference`, `torch:<profile>` (with the configuration the profile carries) or `torch:<profile>+KNOB=VALUE
    ...` (the profile with those departures, e.g. `torch:jax+matmul_precision=high`); anything else is a KnobError
    naming what exists."""
    if name == JAX_ARM:
        return jax_arm(reference)
    pname, *assignments = name[len("torch:"):].split("+") if name.startswith("torch:") else ("", )
    if pname in PROFILES:
        arm = torch_arm(resolve(pname, assignments, reference), reference)
        return arm if not PROFILES[pname].config else Arm(arm.name, "torch", arm.knobs,
                                                          tuple(sorted(PROFILES[pname].config.items())))
    known = [JAX_ARM] + [f"torch:{p}" for p in PROFILES]
    raise KnobError(f"unknown arm {name!r}; arms by profile: {', '.join(known)}, each optionally with +KNOB=VALUE "
                    "departures (e.g. torch:jax+matmul_precision=high), or a name the study plan lists")


def dedupe(arms) -> list[Arm]:
    """Arms in first-seen order, one per name (a name fixes side and knobs)."""
    seen: dict[str, Arm] = {}
    for arm in arms:
        if arm.name in seen and seen[arm.name] != arm:
            raise ValueError(f"two different arms share the name {arm.name!r}: {seen[arm.name]} and {arm}")
        seen.setdefault(arm.name, arm)
    return list(seen.values())
