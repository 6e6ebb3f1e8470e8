"""The lockstep trajectory: after the first parting it keeps comparing, so every drift of a run is named.

Each run draws a fresh seed (shown in every failure message) and runs at two sizes: the suite's `selftest`
size and a wider two-layer one with another population. Pairs of drifts must each be named in the
trajectory's own causes (where the trajectory can see them at all: `fitness=std` differs from the
reference's shaping by ~1e-8 relative on CartPole returns, below float32 rounding, so only the fitness check
names it); the faithful sides (torch, its torch generator, the numpy port, the hooks example, stateful
reference optimizers) are never flagged. The tolerances of parity.mlp.lockstep are tested against float64.
"""
from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[3]
if str(ROOT) not in sys.path:        # tests.ports and examples import from the repository root
    sys.path.insert(0, str(ROOT))

from examples.hooks_adapter import HooksAdapter  # noqa: E402
from parity.mlp import lockstep  # noqa: E402
from parity.mlp.sizes import SELFTEST  # noqa: E402
from parity.mlp.suite import run_suite
from parity.core.tolerances import U32  # noqa: E402
from parity.mlp.torch_side import TorchPort  # noqa: E402
from spec.config import Config  # noqa: E402
from spec.knobs import Knobs, RunSettings  # noqa: E402
from tests.ports.numpy_port import Drift, NumpyPort  # noqa: E402

pytestmark = pytest.mark.slow

WIDE = dataclasses.replace(SELFTEST, name="selftest-wide", cfg=Config(pop=48, hidden=16, layers=2), noise_pop=96,
                           grad_pops=(48,), synthetic_pops=(48,), traj_epochs=3, traj_max_steps=120)
SIZES = {"selftest": SELFTEST, "wide": WIDE}
CHECKS = ("fitness", "products", "noise", "gradients", "updates", "trajectory")
# drifts -> the knobs the trajectory itself must name (the run as a whole must name every knob of the pair)
PAIRS = {
    "bias_noise=off,sigma_decay=0.99": ({"bias_noise": "off", "sigma_decay": 0.99}, {"bias_noise", "sigma_decay"}),
    "activation=tanh,lr_decay=0.9995": ({"activation": "tanh", "lr_decay": 0.9995}, {"activation", "lr_decay"}),
    "fitness=std,sigma_decay=0.99": ({"fitness": "std", "sigma_decay": 0.99}, {"sigma_decay"}),
    "bias_grad=over_sigma,sigma_decay=0.99": ({"bias_grad": "over_sigma", "sigma_decay": 0.99},
                                              {"bias_grad", "sigma_decay"}),
    "optimizer=adam,sigma_decay=1.0": ({"optimizer": "adam", "sigma_decay": 1.0}, {"optimizer", "sigma_decay"}),
    "optimizer=adamw,lr_decay=0.9": ({"optimizer": "adamw", "lr_decay": 0.9}, {"optimizer", "lr_decay"}),
    "noise_reuse=1,lr_decay=0.9": ({"noise_reuse": 1, "lr_decay": 0.9}, {"noise_reuse", "lr_decay"}),
    "rng=torch,antithetic=halves,sigma_decay=0.99,lr_decay=0.9995": (
        {"rng": "torch", "antithetic": "halves", "sigma_decay": 0.99, "lr_decay": 0.9995},
        {"sigma_decay", "lr_decay"}),     # an own generator's pairing is the noise check's (in distribution)
}


@pytest.fixture
def seed() -> int:
    """A fresh run seed per test (printed on failure through the assertion messages)."""
    return int(np.random.default_rng().integers(0, 1_000_000))


def _trajectory(results):
    return next(r for r in results if r.name == "trajectory")


def _knobs(results) -> set[str]:
    return {k for r in results for k in r.knobs}


# (stateful optimizers at the wide size cost a JAX compile of their own for little: selftest covers them)
PAIR_RUNS = [(p, s) for p in sorted(PAIRS) for s in sorted(SIZES) if not (s == "wide" and "optimizer" in p)]
SIDES = ["torch", "torch rng=torch", "numpy", "numpy rng", "hooks example", "torch adam", "numpy adamw"]
SIDE_RUNS = [(side, s) for side in SIDES for s in sorted(SIZES) if not (s == "wide" and side == "torch adam")]


@pytest.mark.parametrize("pair, size", PAIR_RUNS)
def test_every_drift_of_a_combination_is_named(pair, size, seed):
    drifts, in_trajectory = PAIRS[pair]
    sizes = SIZES[size]
    results = run_suite(TorchPort(sizes.cfg, Knobs(**drifts)), sizes, seed, checks=CHECKS)
    traj = _trajectory(results)
    named = set(drifts) - {"rng"}
    assert traj.verdict == "fail", (seed, traj.rows)
    assert in_trajectory <= set(traj.knobs), (seed, traj.knobs, traj.cause_text)
    assert named <= _knobs(results), (seed, _knobs(results))
    assert set(traj.knobs) <= named, (seed, traj.cause_text)     # and nothing the port does not do


@pytest.mark.parametrize("side, size", SIDE_RUNS)
def test_faithful_sides_are_never_flagged(side, size, seed):
    cfg = SIZES[size].cfg
    port, run = {
        "torch": (lambda: TorchPort(cfg, Knobs()), None),
        "torch rng=torch": (lambda: TorchPort(cfg, Knobs(rng="torch")), None),
        "numpy": (lambda: NumpyPort(cfg, Drift()), None),
        "numpy rng": (lambda: NumpyPort(cfg, Drift(rng="numpy")), None),
        "hooks example": (lambda: HooksAdapter(cfg), None),
        "torch adam": (lambda: TorchPort(cfg, Knobs(optimizer="adam")), RunSettings(optimizer="adam")),
        "numpy adamw": (lambda: NumpyPort(cfg, Drift(optimizer="adamw")), RunSettings(optimizer="adamw")),
    }[side]
    traj = _trajectory(run_suite(port(), SIZES[size], seed, reference_run=run, checks=("trajectory",)))
    assert traj.verdict == "pass", (seed, [r for r in traj.rows if r.verdict == "fail"])
    judged = {r.quantity.split(":")[0] for r in traj.rows if r.verdict == "pass"}
    assert {"fitness", "gradient", "step", "lr", "sigma", "sigma schedule", "outputs"} <= judged, judged


class ShapesDifferentlyInItsLoop(NumpyPort):
    """Its shape_fitness is the reference's, but its training loop ranks the returns: only es_tell shows it."""

    def es_tell(self, state, noise, fitness, epoch):
        ranked = np.argsort(np.argsort(fitness)).astype(np.float32) / np.float32(len(fitness) - 1) - np.float32(0.5)
        params, opt = self.optimizer_step(state["params"], state["opt"], noise, ranked, self.sigma_at(epoch), epoch)
        return {**state, "params": params, "opt": opt}


def test_a_training_loop_that_differs_from_its_methods_is_caught(seed):
    results = run_suite(ShapesDifferentlyInItsLoop(SELFTEST.cfg), SELFTEST, seed, checks=CHECKS)
    verdicts = {r.name: r.verdict for r in results}
    traj = _trajectory(results)
    assert verdicts == {**{c: "pass" for c in CHECKS}, "trajectory": "fail"}, (seed, verdicts)
    assert "parameters after es_tell" in traj.cause_text and not traj.knobs, (seed, traj.cause_text)
    assert {r.quantity.split(":")[0] for r in traj.rows if r.verdict == "fail"} == {"step", "lr"}


def test_a_port_without_forward_still_gets_its_schedules_checked(seed):
    """No `forward`: the logits are not compared, but sigma, shaping, gradient and the es_tell step still are."""
    port = NumpyPort(SELFTEST.cfg, Drift(sigma_decay=1.0, lr_decay=0.9), omit=("forward",))
    traj = _trajectory(run_suite(port, SELFTEST, seed, checks=("trajectory",)))
    assert set(traj.knobs) == {"sigma_decay", "lr_decay"}, (seed, traj.cause_text)
    assert not any(r.quantity.startswith("outputs") for r in traj.rows)
    assert "no `forward`" in traj.section


# ----------------------------------------------------------------------------- parity.mlp.lockstep's readings
def _factors(rng, pop: int, shapes, sigma: float, rank: int = 4, mirrored: bool = True) -> dict:
    """Interleaved-antithetic factor noise with A = z * sigma / sqrt(r) in float32."""
    out = {}
    for name, (o, i) in shapes.items():
        z = rng.standard_normal(((pop + 1) // 2 if mirrored else pop, i + o, rank)).astype(np.float32)
        z = np.repeat(z, 2, axis=0)[:pop] if mirrored else z
        sign = np.where(np.arange(pop) % 2 == 0, 1, -1).astype(np.float32) if mirrored else np.ones(pop, np.float32)
        out[name] = (z[:, i:] * (sign * np.float32(np.float32(sigma) / np.sqrt(np.float32(rank))))[:, None, None],
                     np.ascontiguousarray(z[:, :i]))
    return out


@pytest.mark.parametrize("pop, shapes", [(16, {"0.weight": (8, 4)}), (64, {"0.weight": (32, 4), "1.weight": (2, 32)})])
def test_sigma_read_from_repeated_draws_is_exact_to_its_bound(pop, shapes):
    rng = np.random.default_rng()
    sigma0 = float(np.float32(0.2))
    for decay, faithful in ((0.999, True), (0.999 * (1 + 20 * U32), False), (0.99, False)):
        seed = int(rng.integers(1 << 30))
        sigma_e = float(np.float32(0.2 * decay ** 2))
        own0 = _factors(np.random.default_rng(seed), pop, shapes, sigma0)
        own = _factors(np.random.default_rng(seed), pop, shapes, sigma_e)
        reading = lockstep.read_sigma(own, own0, own0, own0, float(np.float32(0.2 * 0.999 ** 2)), sigma0, pop, 1e-4)
        assert reading.exact and (reading.value <= reading.limit[1]) == faithful, (decay, reading)


@pytest.mark.parametrize("pop", [64, 256])
def test_sigma_read_from_fresh_draws_is_an_f_test(pop):
    """Fresh draws every epoch: faithful passes, a 10% smaller sigma fails (n = pop/2 x 136 independent entries), and
    the ratio read is within 5 standard deviations (sd of log sqrt(F) ~ 1/sqrt(n))."""
    rng = np.random.default_rng()
    shapes = {"0.weight": (32, 4), "1.weight": (2, 32)}
    for scale, faithful in ((1.0, True), (0.9, False)):
        own0 = _factors(rng, pop, shapes, 0.2)
        own = _factors(rng, pop, shapes, 0.2 * 0.999 * scale)
        reading = lockstep.read_sigma(own, own0, own0, own0, 0.2 * 0.999, 0.2, pop, 1e-4)
        assert not reading.exact
        assert (reading.limit[1] <= reading.value <= reading.limit[2]) == faithful, (scale, reading)
        assert abs(reading.ratio - scale) < 5 / np.sqrt(pop // 2 * 136), reading


def _adam32(grads, b1=0.9, b2=0.999, eps=1e-8, lr=0.1, wd=0.0, pop=64):
    """optax adam(w) in float32 as numpy rounds it, and the same in float64; returns the updates (lr applied)."""
    out = []
    for dtype in (np.float32, np.float64):
        c = lambda x: np.asarray(x, dtype)  # noqa: E731
        m = v = c(np.zeros_like(grads[0]))
        p = c(np.linspace(-1, 1, grads[0].size).reshape(grads[0].shape))
        ups = []
        for t, g in enumerate(grads, 1):
            d = -(c(g) * c(np.sqrt(c(pop))))
            m, v = c(1 - b1) * d + c(b1) * m, c(1 - b2) * (d * d) + c(b2) * v
            q = (m / (c(1) - c(b1) ** t)) / (np.sqrt(v / (c(1) - c(b2) ** t)) + c(eps)) + c(wd) * p
            ups.append(-c(lr) * q)
        out.append(ups)
    return out


@pytest.mark.parametrize("optimizer", ["adam", "adamw"])
@pytest.mark.parametrize("shape", [(3, 5), (40,)])
def test_adam_step_bound_holds_and_is_tight_enough_for_an_lr_drift(optimizer, shape):
    """The bound of parity.mlp.lockstep's moments recursion contains float32 adam's error at every step, and stays
    under the 5e-4 relative step change of lr_decay=0.9995 after the first epoch."""
    rng = np.random.default_rng()
    pop, lr, t_max = 64, 0.1, 6
    grads = [(rng.standard_normal(shape) * 10.0 ** rng.uniform(-3, 0)).astype(np.float32) for _ in range(t_max)]
    wd = lockstep.ADAMW_DECAY if optimizer == "adamw" else 0.0
    f32, f64 = _adam32(grads, wd=wd, lr=lr, pop=pop)
    moments = lockstep.moments_init({"w": np.zeros(shape)})
    p = np.linspace(-1, 1, int(np.prod(shape))).reshape(shape)
    for t in range(t_max):
        new = p + f64[t]
        one, moments = lockstep._adam_allowance(moments, optimizer, {"w": p}, {"w": grads[t]}, {"w": new}, pop, lr)
        err = np.abs(f32[t].astype(np.float64) - f64[t])
        assert np.all(err <= one["w"] - U32 * np.abs(new)), (t, float(np.max(err / one["w"])))
        if t >= 1:      # what the lr row allows: |bound|_2 / |update|_2
            assert np.linalg.norm(one["w"] - U32 * np.abs(new)) / np.linalg.norm(f64[t]) < 5e-4, t


def test_step_causes_read_the_lr_schedule_and_the_optimizer():
    steps = [lockstep.Step(e, 0.0 if e == 0 else 50.0, 0.9995 ** e, 1e-6, 1.0, 1.0) for e in range(4)]
    (cause,) = lockstep.step_causes(steps, {}, {}, "sgd", 1.0)
    assert cause.knob == "lr_decay" and "0.9995" in cause.text
    first_off = [s._replace(worst=9.0, lr_ratio=3.0, cosine=0.8) for s in steps]
    candidates = {"sgd": 0.9, "adam": 1e-7, "adamw": 4e-5}
    (cause,) = lockstep.step_causes(first_off, candidates, {0: 1.0, 1: 1.0}, "sgd", 1.0)
    assert cause.knob == "optimizer" and "adam" in cause.text
    both = lockstep.step_causes(first_off, candidates, {0: 1.0, 1: 0.9, 2: 0.81}, "sgd", 1.0)
    assert [c.knob for c in both] == ["optimizer", "lr_decay"] and "0.9 " in both[1].text
    assert lockstep.step_causes(first_off, {"sgd": 0.9, "adam": 0.5, "adamw": 0.5}, {}, "sgd", 1.0) == []
    assert lockstep.step_causes([s._replace(worst=0.5) for s in steps], {}, {}, "sgd", 1.0) == []


def test_a_step_off_by_rounding_with_the_right_size_names_no_schedule():
    """A failing es_tell step whose size matches the expected one within the lr row's allowance is not a schedule
    (the survey's hyperfunc LoRA path: 2.3 bounds off at epoch 1, size 1.000000x): no lr_decay, no knob at all."""
    rng = np.random.default_rng()
    allowed = float(10.0 ** rng.uniform(-7, -5))
    steps = [lockstep.Step(e, 0.5 if e != 1 else float(rng.uniform(1.5, 5)), 1 + allowed * rng.uniform(-0.9, 0.9),
                           allowed, 1 - 1e-9, 1.0) for e in range(3)]
    (cause,) = lockstep.step_causes(steps, {}, {}, "sgd", 1.0)
    assert cause.knob is None and "es_tell step differs" in cause.text and "not a schedule" in cause.text
    drifted = [s._replace(lr_ratio=1 + 20 * allowed) if s.epoch == 1 else s for s in steps]
    (cause,) = lockstep.step_causes(drifted, {}, {}, "sgd", 1.0)
    assert cause.knob == "lr_decay"
