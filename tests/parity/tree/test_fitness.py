"""A fitness shaping other than the reference's is named by what differs (parity/tree/shaping.py), in the fitness
check, the es_* lockstep's shaping row and the LM trajectory: the epsilon's place and value, ddof, centring only,
groups ignored, ranks, each group by its own spread. Each variant is planted on the worked GPT example
(tests/ports/fitness_ports.py) at two sizes; the faithful examples are never flagged at ten seeds."""
from __future__ import annotations

import re

import numpy as np
import pytest
import torch

from examples.gpt_adapter import GPTAdapter
from examples.module_adapter import Adapter
from parity.tree import check as tree_check
from parity.tree import shaping
from parity.tree.adapter import CheckedTreePort, PortSide, declared_run
from spec.lm import LMConfig
import tests.ports.fitness_ports as FP
import tests.ports.gpt_ports as ports
from tests.parity.tree.test_check import SIZES, knobs_named, rows_of

G = 4


def _torch(cls):
    """A planted port's shaping as a numpy function (n,) float32 -> (n,) float32, at groups of G."""
    return lambda f: cls.formula(torch.as_tensor(np.asarray(f, np.float32)), G).numpy()


@pytest.mark.slow
@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("name", FP.PLANTED)
def test_each_fitness_variant_is_caught_and_named_by_what_differs(name, size):
    rows = rows_of(getattr(FP, name)(**SIZES[size]), seed=2)
    fails = [r for r in rows if r.verdict == "fail"]
    assert fails and fails[0].check == "fitness", [(r.check, r.cause) for r in fails[:3]]
    shaped = [r for r in fails if r.check == "fitness" or "shaped fitness" in r.quantity]
    assert any(r.check == "trajectory" for r in shaped) or name == "EpsInside1e8"   # the lockstep's row names it too
    for r in shaped:
        assert all(phrase in r.cause for phrase in FP.PLANTED[name]), (r.quantity, r.cause)
    assert knobs_named(rows) == (set(re.findall(r"knob `(\w+)`", " ".join(FP.PLANTED[name]))) or {"fitness"})


@pytest.mark.parametrize("pop", [8, 16])
@pytest.mark.parametrize("name", FP.PLANTED)
def test_the_diagnosis_names_each_variant_on_the_tiny_spread_trial_at_ten_seeds(name, pop):
    """The fitness check's tiny-spread trial (its own stream, [seed, 21]) with the probes: every seed named alike."""
    shape = _torch(getattr(FP, name))
    for seed in range(10):
        f = (1e-3 * np.random.default_rng([seed, 21]).standard_normal(pop)).astype(np.float32)
        text = shaping.describe(f, shape(f), G, shape)
        assert all(phrase in text for phrase in FP.PLANTED[name]), (seed, text)


def test_a_fitted_epsilon_is_stated_as_fitted_and_a_single_vector_still_places_a_round_one():
    f = (1e-3 * np.random.default_rng(4).standard_normal(16)).astype(np.float32)
    odd = lambda q: ((q - q.mean()) / (q.std() + np.float32(3.7e-5))).astype(np.float32)          # noqa: E731
    text = shaping.describe(f, odd(f), 0, odd)
    assert "eps 3.7e-05 (fitted) added to the standard deviation, not inside the square root" in text, text
    outside = _torch(FP.EpsOutsideStd)
    alone = shaping.describe(f, outside(f), G)            # no probes: the round epsilon is the one placed
    assert "(f - group mean) / (std + 1e-05): eps 1e-05 added to the standard deviation" in alone, alone


def test_each_group_by_its_own_spread_and_an_unknown_shaping_are_named():
    f = (np.random.default_rng(1).standard_normal(16) * 2).astype(np.float32)
    x = f.astype(np.float64).reshape(-1, G)
    own = ((x - x.mean(1, keepdims=True)) / np.sqrt(x.var(1, keepdims=True) + 1e-5)).ravel().astype(np.float32)
    assert "(knob `group_fitness`): each group is divided by its own spread" in shaping.describe(f, own, G)
    squared = np.sign(f - f.mean()) * (f - f.mean()) ** 2
    text = shaping.describe(f, squared, G, lambda q: np.sign(q - q.mean()) * (q - q.mean()) ** 2)
    assert "(knob `fitness`): the port's shaped fitness is none of" in text and "scale against the reference's" in text


def test_the_lm_trajectory_names_the_shaping_by_what_differs():
    cfg = LMConfig(pop=16, group_size=G)
    shape = _torch(FP.LayerNormFitness)
    scores = (1e-3 * np.random.default_rng(3).standard_normal(cfg.pop)).astype(np.float32)
    x = scores.astype(np.float64).reshape(-1, G)
    ref = {"scores": scores, "shaped": ((x - x.mean(1, keepdims=True)) / np.sqrt(scores.astype(np.float64).var() + 1e-5))
           .ravel().astype(np.float32)}
    rows, f_err = tree_check._trajectory_fitness(cfg, ref, {"scores": scores, "shaped": shape(scores)}, "epoch 0",
                                                 shape=shape)
    assert f_err is None and rows[-1].verdict == "fail"
    assert all(phrase in rows[-1].cause for phrase in FP.PLANTED["LayerNormFitness"]), rows[-1].cause


FAITHFUL = {"gpt": lambda size: GPTAdapter(**SIZES[size]), "torch_rng": lambda size: ports.TorchRng(),
            "module": lambda size: Adapter()}


@pytest.mark.slow
@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("example", FAITHFUL)
def test_the_faithful_examples_fitness_check_passes_at_ten_seeds(example, size):
    from parity.tree import reference
    R = reference.on_platform()
    port = FAITHFUL[example](size)
    run, _ = declared_run(port, tree_check.TREE_SIZES["quick"])
    side = PortSide(CheckedTreePort(port, run), run)
    for seed in range(10):
        rows = tree_check.check_fitness(R, side, run, np.random.default_rng([seed, 20]),
                                        spread_rng=np.random.default_rng([seed, 21]))
        assert len(rows) == 4 and all(r.verdict == "pass" for r in rows), (seed, [(r.quantity, r.value) for r in rows])
