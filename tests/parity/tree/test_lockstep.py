"""The trajectory's lockstep judges every epoch on its own, and tells optimizer state from a gradient scale (issue
53, items 4 and 7): planted on the worked GPT example at two sizes, each departure is caught and named in its own
words (sgd with momentum, nesterov or not, and weight decay, in torch's and optax's conventions; Adam beside a wrong
noise reuse; lr_decay on a scaled gradient; a constant scale still as the scale); the faithful example, also
stepping through torch's own SGD, is never flagged."""
from __future__ import annotations

import math

import numpy as np
import pytest

from examples.gpt_adapter import GPTAdapter
from parity.core import momentum
from parity.tree import check as tree_check
from parity.tree import lockstep
from parity.tree.adapter import CheckedTreePort, PortSide, declared_run
from spec.tree_knobs import TreeKnobs
from tests.parity.tree.test_check import SIZES, knobs_named, rows_of
import tests.ports.lockstep_ports as ports


def lockstep_rows(port, seed: int):
    """The trajectory check alone (lockstep.check) on the live reference."""
    from parity.tree import reference as tree_reference
    run, _ = declared_run(port, tree_check.TREE_SIZES["quick"])
    side = PortSide(CheckedTreePort(port, run), run)
    return lockstep.check(tree_reference.on_platform(None), side, run, seed, port.jax_compatible_rng)


def failing(rows):
    return [r for r in rows if r.verdict == "fail"]


# (planted port, what its step rows' cause says, what it must not say)
PLANTS = [
    ("NesterovWeightDecay", "(knob `optimizer`): the port's steps over epochs 0 to 4 are sgd with momentum 0.1 "
                            "(nesterov) and weight decay 0.01 on the reference's gradient", "times the reference's"),
    ("Momentum09", "are sgd with momentum 0.9 (not nesterov) on the reference's gradient", "weight decay"),
    ("WeightDecayOnly", "are sgd with weight decay 0.01 on the reference's gradient", "momentum 0"),
    ("OptaxTrace", "are sgd with momentum 0.5 (not nesterov) on the reference's gradient", "weight decay"),
    ("ScaledGradient", "optimizer step differs: the port's parameter updates match optax sgd on a gradient 2 times "
                       "the reference's", "momentum"),
    ("LrDecayOnScaledGradient", "(knob `lr_decay`): the port's update size relative to the reference's is epoch 0: "
                                "2.000000, epoch 1: 1.800000", "(knob `optimizer`)"),
]


@pytest.mark.slow
@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("attr, says, never", PLANTS, ids=[p[0] for p in PLANTS])
def test_optimizer_state_is_told_from_a_gradient_scale(attr, says, never, size):
    rows = rows_of(getattr(ports, attr)(**SIZES[size]), seed=3)
    fails = failing(rows)
    assert fails and {r.check for r in fails} == {"trajectory"}, [(r.check, r.cause) for r in fails[:3]]
    assert all(says in r.cause and never not in r.cause for r in fails), {r.cause for r in fails}
    assert knobs_named(rows) <= {"optimizer", "lr_decay"}


def test_lr_decay_on_a_scaled_gradient_names_both():
    cause = failing(lockstep_rows(ports.LrDecayOnScaledGradient(**SIZES["small"]), 5))[0].cause
    assert "a per-epoch factor of 0.9 (lr_decay=0.9)" in cause and "on a gradient 2 times the reference's" in cause


@pytest.mark.slow
@pytest.mark.parametrize("size", SIZES)
def test_the_lockstep_goes_on_past_a_failure_and_names_each_departure(size):
    """A wrong fresh draw at epoch 1 and Adam's steps: the noise rows name noise_reuse at epoch 1 alone, every epoch's
    step (judged on the port's own noise at epoch 1) names adam, each as one line."""
    rows = rows_of(ports.ReusesWronglyAndAdam(**SIZES[size]), seed=4)
    traj = failing([r for r in rows if r.check == "trajectory"])
    noise = [r for r in traj if "es_ask noise" in r.quantity]
    steps = [r for r in traj if "params after es_tell" in r.quantity]
    assert noise and {r.quantity.split(":")[0] for r in noise} == {"epoch 1"}, [r.quantity for r in noise]
    assert all("(knob `noise_reuse`): es_ask's noise of" in r.cause and "at epoch 1 is the reference's generation 1"
               in r.cause for r in noise)
    assert {r.quantity.split(":")[0] for r in steps} == {f"epoch {e}" for e in range(5)}
    assert all("(knob `optimizer`): the port's parameter updates match optax adam" in r.cause and
               "at every epoch, its moments carried" in r.cause for r in steps), {r.cause for r in steps}
    assert any("on the port's es_ask noise" in r.allowed for r in steps if r.quantity.startswith("epoch 1"))
    assert knobs_named(rows) == {"noise_reuse", "optimizer"}
    assert len({r.cause.split(":", 1)[1] for r in steps}) == 1          # one fact: the leaves merge into one line


def test_a_departing_shaping_leaves_the_step_judged_on_the_ports_own_shaping():
    class StdShaping(GPTAdapter):      # shape_fitness and es_tell both by (f - mean) / std: the step follows it
        def shape_fitness(self, f, group_size):
            f = np.asarray(f, np.float64)
            return ((f - f.mean()) / f.std()).astype(np.float32)

        def es_tell(self, state, noise, scores, epoch):
            import torch
            from examples.gpt_adapter import _t
            with torch.inference_mode():
                grads = self.port.gradients(self._from_protocol(noise), _t(self.shape_fitness(scores, 0)))
                return self.port.step(state[0], grads), state[1]
    rows = lockstep_rows(StdShaping(**SIZES["small"]), 2)
    fails = failing(rows)
    assert fails and all("shaped fitness" in r.quantity for r in fails), [(r.quantity, r.cause) for r in fails]
    assert all(r.verdict == "pass" and "on the port's shaping" in r.allowed for r in rows
               if "params after es_tell" in r.quantity)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_faithful_loops_are_never_flagged(seed):
    for port in (GPTAdapter(**SIZES["small"]), ports.PlainTorchSGD(**SIZES["small"]),
                 GPTAdapter(TreeKnobs(rng="torch"), **SIZES["small"])):
        rows = lockstep_rows(port, seed)
        assert failing(rows) == [], [(r.quantity, r.cause) for r in failing(rows)]


def test_momentum_in_distribution_too():
    rows = lockstep_rows(ports.NesterovWeightDecay(TreeKnobs(rng="torch"), **SIZES["small"]), 1)
    steps = [r for r in failing(rows) if "params after es_tell" in r.quantity]
    assert steps and all("sgd with momentum 0.1 (nesterov) and weight decay 0.01" in r.cause for r in steps)


# ----------------------------------------------------------------------------- the fit alone
def _torch_sgd(mu, nesterov, wd, c, unit, p0, lr):
    """torch.optim.SGD's recursion in float64 on the loss gradient -c unit / lr: the port's steps and params."""
    p, buf, steps, params = p0.copy(), None, [], []
    for s in unit:
        g = -c * s / lr + wd * p
        buf = g if buf is None else mu * buf + g
        step = -lr * (g + mu * buf if nesterov else buf)
        params.append(p.copy())
        steps.append(step)
        p = p + step
    return np.array(steps), np.array(params)


@pytest.mark.parametrize("mu, nesterov, wd", [(0.1, True, 1e-2), (0.9, False, 0.0), (0.0, False, 1e-2),
                                              (0.5, True, 0.0), (0.3, False, 3e-3)])
def test_the_fit_recovers_momentum_nesterov_and_decay_on_fresh_steps(mu, nesterov, wd):
    rng = np.random.default_rng([int(mu * 10), int(nesterov), 7])
    E, K, lr = momentum.MIN_EPOCHS, 400, 0.02
    unit = rng.standard_normal((E, K)) * 1e-2
    steps, params = _torch_sgd(mu, nesterov, wd, 1.0, unit, rng.standard_normal(K) * 0.1, lr)
    bounds = 1e-8 * (np.abs(unit) + 1e-3)
    best, tried = momentum.simplest(steps, unit, params, bounds, lr)
    assert best is not None and best.verified, tried
    assert math.isclose(best.mu, mu, abs_tol=1e-5) and math.isclose(best.wd, wd, abs_tol=1e-6)
    assert best.nesterov == (nesterov and mu > 0) and math.isclose(best.c, 1, rel_tol=1e-6)
    # the constant scale the first step reads does not reproduce the later steps
    assert not momentum.fit(steps, unit, params, bounds, lr, momentum=False, decay=False).verified


def test_two_epochs_cannot_tell_nesterov_three_can():
    """The docstring's identification: nesterov mu and plain mu^2 / (1 + mu) at scale 1 + mu agree on two epochs."""
    rng = np.random.default_rng(11)
    unit, lr, mu = rng.standard_normal((3, 300)) * 1e-2, 0.02, 0.2
    steps, params = _torch_sgd(mu, True, 0.0, 1.0, unit, rng.standard_normal(300) * 0.1, lr)
    bounds = 1e-9 * np.ones_like(unit)
    two = momentum.fit(steps[:2], unit[:2], params[:2], bounds[:2], lr, decay=False, nesterov=False)
    assert two.verified and math.isclose(two.mu, mu ** 2 / (1 + mu), rel_tol=1e-4)
    assert math.isclose(two.c, 1 + mu, rel_tol=1e-4)
    assert not momentum.fit(steps, unit, params, bounds, lr, decay=False, nesterov=False).verified
    assert momentum.fit(steps, unit, params, bounds, lr, decay=False, nesterov=True).verified


@pytest.mark.slow
@pytest.mark.parametrize("pop", [8, 16])
def test_a_tf32_references_own_rounding_is_allowed_and_a_drift_still_caught(pop):
    """gpu-sim (TF32 products, JAX's GPU normals): a faithful loop on the GPU normals passes the lockstep draw by draw
    (the reference's einsum with TF32 operands is allowed for: without it the steps failed at 7 to 21 x their bound),
    and a learning-rate decay in es_tell still fails it, named."""
    from examples import gpt_port
    from parity.core.platform import platform_for
    from parity.tree import reference
    from spec.platform import PlatformRequest
    from tests.ports.gpt_ports import LrDecay
    platform = platform_for(PlatformRequest("gpu-sim", "default"))
    small = dict(model=gpt_port.GPTConfig(vocab=32, block_size=6, n_layer=3, n_head=2, n_embd=8)) if pop == 8 else {}
    for port, fails in ((GPTAdapter(TreeKnobs(rng="jax-gpu"), pop=pop, **small), False),
                        (LrDecay(TreeKnobs(rng="jax-gpu"), pop=pop, **small), True)):
        run, _ = declared_run(port, tree_check.TREE_SIZES["quick"])
        rows = tree_check.run(run, TreeKnobs(), 1, lambda line: None, side=PortSide(CheckedTreePort(port, run), run),
                              reference=reference.on_platform(platform), platform=platform)
        failed = [r for r in rows if r.verdict == "fail"]
        if not fails:
            assert failed == [], [(r.check, r.quantity, r.value) for r in failed[:3]]
            assert any(r.check == "trajectory" and "params after es_tell" in r.quantity for r in rows)
        else:
            assert failed and {r.check for r in failed} == {"trajectory"} and "knob `lr_decay`" in failed[0].cause
