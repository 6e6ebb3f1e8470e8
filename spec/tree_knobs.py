"""The ways a port of a tree model (an LLM-style network) drifts from the reference, as knobs.

Separate from `spec.knobs` (the CartPole MLP's knobs): a tree port is configured by `TreeKnobs`, whose first
value of each knob is the reference's behaviour. `rng` has the CartPole knob's meaning.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Iterable

from spec.knobs import KnobError

TREE_CHOICES: dict[str, tuple[str, ...]] = {
    "rng": ("jax", "torch", "jax-cpu", "jax-gpu"),
    "stack_keys": ("split", "shared"),
    "tmm_layout": ("stored", "transposed"),
    "frozen_leaves": ("frozen", "perturbed"),
    "group_fitness": ("global_var", "group_var"),
    "embedding": ("frozen", "lowrank"),
    "leaf_order": ("sorted", "insertion"),
}
# In the words the verdicts use.
TREE_DESCRIPTIONS: dict[str, str] = {
    "rng": "noise generator (JAX threefry keys vs torch's own generator, or JAX's normals as another JAX backend "
           "rounds them: jax-cpu, jax-gpu)",
    "stack_keys": "keys of stacked slices (one key per slice, split along the scan axis)",
    "tmm_layout": "layout of (in, out) weights (factored on the stored shape)",
    "frozen_leaves": "full-rank leaves under freeze_nonlora (neither perturbed nor updated)",
    "group_fitness": "group fitness shaping (group means, the global variance)",
    "embedding": "embedding leaves (neither perturbed nor updated)",
    "leaf_order": "leaf key order (JAX's flatten order: dict keys sorted)",
}
TREE_MEANINGS: dict[str, dict[str, str]] = {
    "stack_keys": {"split": "slice l of a stacked leaf gets split(leaf key, L)[l]",
                   "shared": "every slice drawn from the leaf's own key, so the layers get the same noise"},
    "tmm_layout": {"stored": "an (in, out) weight factored on its stored shape: Z (in + out, r), B = Z[:out]",
                   "transposed": "an (in, out) weight transposed and factored as an mm: B = Z[:in]"},
    "frozen_leaves": {"frozen": "param leaves neither perturbed nor updated when freeze_nonlora",
                      "perturbed": "param leaves perturbed and updated despite freeze_nonlora"},
    "group_fitness": {"global_var": "(f - group mean) / sqrt(var(all f) + 1e-5)",
                      "group_var": "(f - group mean) / sqrt(var(group) + 1e-5): each group by its own spread"},
    "embedding": {"frozen": "embedding leaves neither perturbed nor updated",
                  "lowrank": "embedding tables perturbed and updated like an mm (low-rank noise on the table)"},
    "leaf_order": {"sorted": "leaf i of JAX's flatten order gets split(es_key, n_leaves)[i]",
                   "insertion": "keys assigned in the model's declaration (registration) order"},
}


@dataclass(frozen=True)
class TreeKnobs:
    """A tree port's configuration; the defaults are the reference's behaviour."""

    rng: str = "jax"
    stack_keys: str = "split"
    tmm_layout: str = "stored"
    frozen_leaves: str = "frozen"
    group_fitness: str = "global_var"
    embedding: str = "frozen"
    leaf_order: str = "sorted"

    def __post_init__(self) -> None:
        for name, allowed in TREE_CHOICES.items():
            if getattr(self, name) not in allowed:
                raise KnobError(f"unknown value {getattr(self, name)!r} for knob {name!r}; "
                                f"allowed: {', '.join(allowed)}")

    def replace(self, **changes: Any) -> "TreeKnobs":
        unknown = sorted(set(changes) - set(TREE_CHOICES))
        if unknown:
            raise KnobError(f"unknown knob(s) {', '.join(unknown)} for a tree model; "
                            f"known: {', '.join(TREE_CHOICES)}")
        return dataclasses.replace(self, **changes)


TREE_PROFILES: dict[str, dict[str, str]] = {"jax": {}, "jax-torchrng": {"rng": "torch"}}


def parse_tree_assignment(text: str) -> tuple[str, str]:
    """Parse one `KNOB=VALUE` for a tree port, or raise KnobError saying what would be right."""
    if "=" not in text:
        raise KnobError(f"expected KNOB=VALUE, got {text!r} (for example stack_keys=shared)")
    name, value = (part.strip() for part in text.split("=", 1))
    if name not in TREE_CHOICES:
        raise KnobError(f"unknown knob {name!r} for --task lm; known: {', '.join(TREE_CHOICES)}")
    if value not in TREE_CHOICES[name]:
        raise KnobError(f"unknown value {value!r} for knob {name!r}; allowed: {', '.join(TREE_CHOICES[name])}")
    return name, value


def resolve_tree(profile_name: str = "jax", assignments: Iterable[str] = ()) -> TreeKnobs:
    """A profile's knobs, then each `KNOB=VALUE` in order (a later one wins)."""
    if profile_name not in TREE_PROFILES:
        raise KnobError(f"unknown profile {profile_name!r} for --task lm; known: {', '.join(TREE_PROFILES)}")
    knobs = TreeKnobs(**TREE_PROFILES[profile_name])
    for text in assignments:
        name, value = parse_tree_assignment(text)
        knobs = knobs.replace(**{name: value})
    return knobs


def tree_drifts(knobs: TreeKnobs) -> dict[str, tuple[str, str]]:
    """Knobs that depart from the reference: name -> (reference value, this value)."""
    ref = TreeKnobs()
    return {n: (getattr(ref, n), getattr(knobs, n)) for n in TREE_CHOICES if getattr(knobs, n) != getattr(ref, n)}
