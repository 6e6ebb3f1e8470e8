"""The ways a port of a tree model (an LLM-style network) drifts from the reference, as knobs.

A table of the one knob type (spec.knob), apart from `spec.knobs` (the CartPole MLP's knobs): a tree port is configured
by `TreeKnobs`, whose first value of each knob is the reference's behaviour. `rng` is the CartPole knob itself.
"""
from __future__ import annotations

from typing import Iterable

from spec.knob import Knob, KnobTable, Words
from spec.knobs import RNG

# knob: (what it is, in the words the verdicts use; {value: what it does}, the reference's value first)
_TREE_KNOBS: dict[str, tuple[str, dict[str, str]]] = {
    "stack_keys": ("keys of stacked slices (one key per slice, split along the scan axis)",
                   {"split": "slice l of a stacked leaf gets split(leaf key, L)[l]",
                    "shared": "every slice drawn from the leaf's own key, so the layers get the same noise"}),
    "tmm_layout": ("layout of (in, out) weights (factored on the stored shape)",
                   {"stored": "an (in, out) weight factored on its stored shape: Z (in + out, r), B = Z[:out]",
                    "transposed": "an (in, out) weight transposed and factored as an mm: B = Z[:in]"}),
    "frozen_leaves": ("full-rank leaves under freeze_nonlora (neither perturbed nor updated)",
                      {"frozen": "param leaves neither perturbed nor updated when freeze_nonlora",
                       "perturbed": "param leaves perturbed and updated despite freeze_nonlora"}),
    "group_fitness": ("group fitness shaping (group means, the global variance)",
                      {"global_var": "(f - group mean) / sqrt(var(all f) + 1e-5)",
                       "group_var": "(f - group mean) / sqrt(var(group) + 1e-5): each group by its own spread"}),
    "embedding": ("embedding leaves (neither perturbed nor updated)",
                  {"frozen": "embedding leaves neither perturbed nor updated",
                   "lowrank": "embedding tables perturbed and updated like an mm (low-rank noise on the table)"}),
    "leaf_order": ("leaf key order (JAX's flatten order: dict keys sorted)",
                   {"sorted": "leaf i of JAX's flatten order gets split(es_key, n_leaves)[i]",
                    "insertion": "keys assigned in the model's declaration (registration) order"}),
}
TREE = KnobTable(
    (RNG, *(Knob(name, tuple(meanings), about, meanings) for name, (about, meanings) in _TREE_KNOBS.items())),
    {"jax": {}, "jax-torchrng": {"rng": "torch"}},
    Words(not_assignment="expected KNOB=VALUE, got {text!r} (for example stack_keys=shared)",
          unknown_knob="unknown knob {name!r} for --task lm; known: {known}",
          unknown_knobs="unknown knob(s) {names} for a tree model; known: {known}",
          unknown_profile="unknown profile {name!r} for --task lm; known: {known}"))
TreeKnobs = TREE.values_class("TreeKnobs", __name__, "A tree port's configuration; the defaults are the reference's "
                              "behaviour.")
# The table's views: knob -> its values, what it is (in the words the verdicts use), what each value means.
TREE_CHOICES: dict[str, tuple[str, ...]] = {k.name: k.values for k in TREE.knobs}
TREE_DESCRIPTIONS: dict[str, str] = {k.name: k.about for k in TREE.knobs}
TREE_MEANINGS: dict[str, dict[str, str]] = {k.name: dict(k.meanings) for k in TREE.knobs if k is not RNG}
TREE_PROFILES: dict[str, dict[str, str]] = {name: dict(drifts) for name, drifts in TREE.profiles.items()}


def parse_tree_assignment(text: str) -> tuple[str, str]:
    """Parse one `KNOB=VALUE` for a tree port, or raise KnobError saying what would be right."""
    return TREE.parse(text)


def resolve_tree(profile_name: str = "jax", assignments: Iterable[str] = ()) -> TreeKnobs:
    """A profile's knobs, then each `KNOB=VALUE` in order (a later one wins)."""
    return TREE.resolve(TreeKnobs(), profile_name, assignments)


def tree_drifts(knobs: TreeKnobs) -> dict[str, tuple[str, str]]:
    """Knobs that depart from the reference: name -> (reference value, this value)."""
    return TREE.drifts(knobs, TreeKnobs())
