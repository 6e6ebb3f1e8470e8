"""The JAX reference trainer: DESIGN.md's key scheme, history rows, schedules, knob checks and the CLI.

Runs are tiny (population 8, a 4-6-2 MLP, a few hundred environment steps) so that the test is about
the plumbing, not about learning; learning is what `python -m jax_reference` shows.
"""
import io
import math

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from jax_reference import __main__ as cli
from jax_reference import train as train_module
from jax_reference.models import simple_es_tree_key
from jax_reference.noiser import EggRoll, es_grads
from jax_reference.population import population_iterinfos
from jax_reference.train import (action_uniforms, check_returns, compiled, init_model, lr_schedule, run_keys,
                                 train)
from rollout import cartpole
from rollout.episodes import run_episodes
from spec.config import Config
from spec.knobs import Knobs, RunSettings

# One Linear layer (4 -> 2) keeps the jitted step and draw small to compile; the MLP's hidden
# layers and activations are tested in tests/jax_reference/test_mlp.py.
TINY = Config(pop=8, rank=2, hidden=6, layers=1, max_env_steps=300)
LEAVES = ["0.bias", "0.weight"]


KNOBS = RunSettings(lr_decay=0.9, sigma_decay=0.95)


@pytest.fixture(scope="module")
def tiny_run():
    """One tiny run (seed 3) with its progress output; the plan it compiles is reused by later runs."""
    out = io.StringIO()
    return train(TINY, KNOBS, seed=3, progress=True, stream=out), out.getvalue()


def test_history_rows_schedules_and_progress(tiny_run):
    result, output = tiny_run
    h = result.history
    assert result.epochs == len(h) >= 2 and not result.solved and result.steps_to_solve is None
    assert result.env_steps == h[-1]["env_steps"] >= TINY.max_env_steps > h[-2]["env_steps"]   # stops at the budget
    for e, row in enumerate(h):
        assert list(row) == ["epoch", "env_steps", "mean_return", "max_return", "sigma", "lr",
                             *[f"grad_norm/{n}" for n in LEAVES], "wall_s"]
        assert row["epoch"] == e
        assert row["sigma"] == float(np.float32(0.2 * 0.95 ** e)) and row["lr"] == float(np.float32(0.1 * 0.9 ** e))
        assert 1 <= row["mean_return"] <= row["max_return"] <= cartpole.MAX_STEPS
        assert all(math.isfinite(row[f"grad_norm/{n}"]) and row[f"grad_norm/{n}"] > 0 for n in LEAVES)
    steps = [row["env_steps"] for row in h]
    assert all(b > a for a, b in zip(steps, steps[1:]))
    lines = output.splitlines()
    assert lines[0].startswith("epoch     0  steps") and "steps/s" in lines[0]
    assert lines[-1].startswith(f"not solved within {result.env_steps:,d} env steps ({result.epochs} epochs")
    # same seed, same numbers
    again = train(TINY, KNOBS, seed=3, progress=False)
    strip = lambda rows: [{k: v for k, v in r.items() if k != "wall_s"} for r in rows]
    assert strip(again.history) == strip(h)
    other = train(TINY, KNOBS, seed=4, progress=False)
    assert strip(other.history) != strip(h)


def test_every_epoch_replays_by_hand_from_the_design_key_scheme(tiny_run):
    """Keys, init, uniforms, reset seeds, schedules, shaping, g and the update, rebuilt here epoch by epoch."""
    seed, cfg = 3, TINY
    model_key, es_key, action_key = jax.random.split(jax.random.key(seed), 3)
    init = init_model(cfg, KNOBS, model_key)
    keys = simple_es_tree_key(init.params, es_key, init.scan_map)
    frozen, nparams = EggRoll.init_noiser(init.params, cfg.sigma, lr_schedule(0.1, 0.9, 10), rank=cfg.rank)
    params = init.params
    history = tiny_run[0].history
    assert len(history) >= 3                     # so lr_1 (count 1 of the schedule) shows in epoch 2's numbers
    for epoch, row in enumerate(history):
        nparams = {**nparams, "sigma": jnp.float32(np.float32(0.2 * 0.95 ** epoch))}      # sigma_e
        u = np.asarray(jax.random.uniform(jax.random.fold_in(action_key, epoch), (cartpole.MAX_STEPS, cfg.pop)))
        np.testing.assert_array_equal(action_uniforms(run_keys(seed).action, epoch, cfg.pop), u)
        policy = compiled(cfg, KNOBS).policy_for(nparams, params, keys, epoch)   # the forward itself: other tests
        episodes = run_episodes(policy, cartpole.reset(seed + epoch + np.arange(cfg.pop)), u, compact=True)
        assert row["env_steps"] - (history[epoch - 1]["env_steps"] if epoch else 0) == episodes.steps
        assert row["mean_return"] == float(episodes.returns.mean())
        assert row["max_return"] == float(episodes.returns.max())
        shaped = EggRoll.convert_fitnesses(frozen, nparams, jnp.asarray(episodes.returns))
        iterinfos = population_iterinfos(epoch, cfg.pop)
        grads = es_grads(frozen, nparams, params, keys, shaped, iterinfos, init.es_map)
        for name, g in zip(LEAVES, jax.tree.leaves(grads)):
            # the trainer's jitted step vs these eager ops: same sums, possibly fused differently (a few ulps)
            assert row[f"grad_norm/{name}"] == pytest.approx(float(jnp.linalg.norm(g)), rel=1e-5), (epoch, name)
        nparams, params = EggRoll.do_updates(frozen, nparams, params, keys, shaped, iterinfos, init.es_map)


def test_exact_graph_run_matches_the_default_run(tiny_run):
    """Upstream's graph (noise drawn inside every forward) and the default (drawn once per epoch) agree.

    They differ by float32 rounding only, which flips an action only if a uniform falls within ~1e-7
    of the action probability: about 1e-7 per step, so identical returns here are expected.
    """
    exact = train(TINY, KNOBS, seed=3, progress=False, exact_graph=True)
    assert len(exact.history) == len(tiny_run[0].history)
    for a, b in zip(tiny_run[0].history, exact.history):
        for key in ("env_steps", "mean_return", "max_return", "sigma", "lr"):
            assert a[key] == b[key]
        for name in LEAVES:
            assert a[f"grad_norm/{name}"] == pytest.approx(b[f"grad_norm/{name}"], rel=1e-5)


def test_lr_schedule_is_float64_power_cast_to_float32_and_drives_the_update():
    sched = lr_schedule(0.1, 0.5, 10)
    for count in (0, 1, 3, 9, 12):
        assert float(sched(jnp.int32(count))) == float(np.float32(0.1 * 0.5 ** min(count, 9)))
    assert lr_schedule(0.1, 1.0, 10) == 0.1                                   # constant: a plain float
    # the trainer's solver steps by lr_e at its e-th update (sgd: update = -lr_e * direction)
    solver = compiled(TINY, KNOBS).frozen_noiser_params["solver"]
    direction = {"w": jnp.asarray([-1.5, 2.0])}
    state = solver.init(direction)
    for e in range(3):
        update, state = solver.update(direction, state)
        np.testing.assert_array_equal(np.asarray(update["w"]), np.float32(-0.1 * 0.9 ** e) * np.asarray(direction["w"]))
    # two sgd updates through the noiser: the second moves by lr_1 = 0.05, the first by lr_0 = 0.1
    init = init_model(TINY, RunSettings(), jax.random.key(2))
    keys = simple_es_tree_key(init.params, jax.random.key(3), init.scan_map)
    frozen, nparams = EggRoll.init_noiser(init.params, 0.2, sched, rank=TINY.rank)
    f = jnp.asarray(np.random.default_rng(0).standard_normal(TINY.pop).astype(np.float32))
    params = init.params
    for lr_e in (0.1, 0.05):
        g = es_grads(frozen, nparams, params, keys, f, population_iterinfos(0, TINY.pop), init.es_map)
        nparams, new = EggRoll.do_updates(frozen, nparams, params, keys, f, population_iterinfos(0, TINY.pop),
                                          init.es_map)
        moved = np.asarray(new["0"]["weight"], np.float64) - np.asarray(params["0"]["weight"], np.float64)
        want = lr_e * math.sqrt(TINY.pop) * np.asarray(g["0"]["weight"], np.float64)
        # three float32 roundings (the solver input, the lr product, the add) of these magnitudes
        assert np.all(np.abs(moved - want) <= 3 * 2.0 ** -24 * (np.abs(want) + np.abs(np.asarray(new["0"]["weight"]))))
        params = new


def test_a_ports_knobs_are_refused_with_what_to_pass_instead():
    """The reference is configured by RunSettings: a port's Knobs (with knobs only a port has) cannot reach it."""
    with pytest.raises(TypeError, match="RunSettings.*knobs.run"):
        train(TINY, Knobs(fitness="std"), seed=0, progress=False)
    with pytest.raises(Exception, match="unknown run setting.*fitness"):
        RunSettings().replace(fitness="std")


def test_bad_population_and_run_knobs_in_the_plan():
    with pytest.raises(ValueError, match="odd"):
        train(TINY.replace(pop=7), RunSettings(), seed=0, progress=False)
    p = compiled(TINY, RunSettings(optimizer="adamw", noise_reuse=3))
    assert p.frozen_noiser_params["noise_reuse"] == 3 and p.frozen_noiser_params["rank"] == TINY.rank
    state = p.frozen_noiser_params["solver"].init({"w": jnp.ones(3)})
    assert any(isinstance(s, optax.ScaleByAdamState) for s in jax.tree.leaves(
        state, is_leaf=lambda s: isinstance(s, optax.ScaleByAdamState)))


def test_cli_presets_overrides_and_exit_codes(capsys):
    args = cli.build_parser().parse_args(["--preset", "paper", "--hidden", "32", "--sigma-decay", "0.99"])
    cfg, knobs = cli.configure(args)
    assert (cfg.pop, cfg.hidden, cfg.layers, cfg.rank) == (2048, 32, 3, 4) and knobs.sigma_decay == 0.99
    with pytest.raises(SystemExit) as err:
        cli.main(["--pop", "7"])
    assert err.value.code == 2 and "odd" in capsys.readouterr().err
    code = cli.main(["--pop", "8", "--rank", "2", "--hidden", "6", "--layers", "1", "--max-steps", "300",
                     "--seed", "3", "--quiet", "--lr-decay", "0.9", "--sigma-decay", "0.95"])
    assert code == 1 and capsys.readouterr().out.startswith("not solved (")


@pytest.mark.parametrize("value", [np.nan, np.inf, -np.inf])
def test_check_returns_names_the_nonfinite_members(value):
    rng = np.random.default_rng(7)
    for pop in (8, 20):
        returns = rng.integers(8, 500, size=pop).astype(np.float32)
        check_returns(returns, 3)                                        # finite: silent
        bad = rng.choice(pop, size=3, replace=False)
        returns[bad] = value
        with pytest.raises(ValueError, match=r"epoch 3: returns must be finite; 3 are NaN or inf, at member\(s\) "
                                             + ", ".join(map(str, sorted(bad)))):
            check_returns(returns, 3)


def test_the_trainer_rejects_a_nonfinite_return_before_the_update(monkeypatch):
    # The trainer owns this error (EggRoll, like upstream's, need not validate fitness).
    def poisoned(policy, init_state, uniforms, **kwargs):
        result = run_episodes(policy, init_state, uniforms, **kwargs)
        returns = np.asarray(result.returns, np.float32).copy()
        returns[5] = np.nan
        return result._replace(returns=returns)

    monkeypatch.setattr(train_module, "run_episodes", poisoned)
    with pytest.raises(ValueError, match=r"epoch 0: returns must be finite; 1 are NaN or inf, at member\(s\) 5"):
        train(TINY, KNOBS, seed=4, progress=False)
