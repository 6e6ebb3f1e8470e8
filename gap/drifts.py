"""A profile's drifts: the knobs where it departs from the reference, in the profile's own order, and each in the
verdicts' words. What the ladder (gap.attribution) and the fractional factorial (gap.factorial) both build on."""
from __future__ import annotations

from spec.knobs import DESCRIPTIONS, PROFILES, KnobError, Knobs, RunSettings, as_knobs, profile


def drift_order(profile_name: str, reference: RunSettings | Knobs | None = None) -> list[str]:
    """Knobs where the profile departs from the reference, in the order the profile lists them."""
    if profile_name not in PROFILES:
        raise KnobError(f"unknown profile {profile_name!r}; known profiles: {', '.join(PROFILES)}")
    reference = as_knobs(reference)
    drifted = profile(profile_name, reference)
    return [k for k in PROFILES[profile_name].drifts if getattr(drifted, k) != getattr(reference, k)]


def describe_drift(knob: str, profile_name: str, reference: RunSettings | Knobs | None = None) -> str:
    """`hidden activation (pqn -> tanh)`: the knob in the verdicts' words with both values."""
    reference = as_knobs(reference)
    drifted = profile(profile_name, reference)
    return f"{DESCRIPTIONS.get(knob, knob)} ({getattr(reference, knob)} -> {getattr(drifted, knob)})"
