"""Computing only the members still alive (rollout's Compaction) changes no number: whole training runs with
and without it give identical histories on both sides, for every pairing layout and the knobs that touch the
forward. The gain in speed is measured by `make bench`, not here."""
from __future__ import annotations

import numpy as np
import pytest

from rollout.episodes import Compaction
from spec.config import Config
from spec.knobs import Knobs, RunSettings

CFG = Config(pop=32, hidden=16, layers=3, max_env_steps=25_000)


def _history(result) -> list[tuple]:
    return [tuple(sorted(row.items())) for row in ({k: v for k, v in h.items() if k != "wall_s"}
                                                    for h in result.history)]


@pytest.mark.parametrize("knobs", [Knobs(), Knobs(antithetic="halves"), Knobs(antithetic="off", rng="torch"),
                                   Knobs(bias_noise="update_only", activation="tanh"), Knobs(actions="greedy")],
                         ids=["faithful", "halves", "off-torchrng", "update_only-tanh", "greedy"])
@pytest.mark.parametrize("seed", [0, 7])
def test_torch_runs_are_identical_with_and_without_compaction(knobs, seed):
    from torch_impl.train import train

    full = train(CFG, knobs, seed, progress=False, compact=False)
    compact = train(CFG, knobs, seed, progress=False, compact=True)
    assert full.epochs > 1 and _history(compact) == _history(full)


@pytest.mark.parametrize("exact_graph", [False, True])
@pytest.mark.parametrize("seed", [0, 7])
def test_jax_runs_are_identical_with_and_without_compaction(exact_graph, seed):
    from jax_reference.train import train

    full = train(CFG, RunSettings(), seed, progress=False, compact=False, exact_graph=exact_graph)
    compact = train(CFG, RunSettings(), seed, progress=False, compact=True, exact_graph=exact_graph)
    assert full.epochs > 1 and _history(compact) == _history(full)


def test_compaction_keeps_whole_groups_and_shrinks_by_halves():
    plan = Compaction(pop=16, group=2, min_rows=4)
    members, position, changed = plan.update(np.arange(16))
    assert not changed and members.tolist() == list(range(16)) and position.tolist() == list(range(16))
    members, position, changed = plan.update(np.array([1, 2, 3, 9]))        # groups 0, 1, 4 alive of 8
    assert changed and set(members[::2] // 2) >= {0, 1, 4} and len(members) % 2 == 0
    assert members[position].tolist() == [1, 2, 3, 9]                        # each row found where it is computed
    kept = members.tolist()
    members, _, changed = plan.update(np.array([2, 9]))                      # 2 of 3 groups: not below half
    assert not changed and members.tolist() == kept
    members, _, changed = plan.update(np.array([9]))                         # the floor: min_rows rows
    assert len(members) >= 4 and 9 in members


def test_compaction_rounds_to_powers_of_two():
    plan = Compaction(pop=64, group=1, min_rows=8, pow2=True)
    for alive in (30, 9, 3):
        members, position, _ = plan.update(np.arange(alive) * 2)
        assert len(members) & (len(members) - 1) == 0 and len(members) >= 8
        assert members[position].tolist() == (np.arange(alive) * 2).tolist()


def test_compaction_shrinks_at_the_given_fraction_and_finds_unsorted_rows():
    rows = np.array([r for r in range(16) if r // 2 != 3])                  # 7 of 8 groups alive
    assert not Compaction(pop=16, group=2, min_rows=2).update(rows)[2]     # default: below half only
    plan = Compaction(pop=16, group=2, min_rows=2, shrink=0.9)
    members, position, changed = plan.update(rows)
    assert changed and members.tolist() == rows.tolist() and position.tolist() == list(range(14))
    shuffled = np.array([9, 2, 13, 1])
    members, position, _ = plan.update(shuffled)
    assert members[position].tolist() == shuffled.tolist()
    with pytest.raises(ValueError, match="shrink"):
        Compaction(pop=16, group=2, shrink=0.0)
