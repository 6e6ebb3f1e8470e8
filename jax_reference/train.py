"""Train a CartPole-v1 policy with the JAX reference (EggRoll + MLP): roll out, shape, update. Stops when solved.

The run follows DESIGN.md's key scheme so the torch trainer can be fed the very same draws:
master = key(seed); model_key, es_key, action_key = split(master, 3).
"""
from __future__ import annotations

import sys
import time
from functools import lru_cache
from typing import Callable, NamedTuple, TextIO

import jax
import jax.numpy as jnp
import numpy as np
import optax

from jax_reference.models import MLP, CommonInit, simple_es_tree_key
from jax_reference.noiser import EggRoll, apply_grads, es_grads
from jax_reference.population import (leaf_names, make_cached_population_forward, make_population_forward,
                                      member_noise_tree, population_iterinfos)
from rollout import cartpole
from rollout.episodes import Compaction, run_episodes
from spec.config import N_ACTIONS, OBS_DIM, Config, check_pairing, schedule
from spec.knobs import RunSettings
from spec.run import Progress, TrainResult, epoch_row, until_solved

# knob optimizer -> the optax solver the noiser is given (upstream's default is optax.sgd)
SOLVERS = {"sgd": optax.sgd, "adam": optax.adam, "adamw": optax.adamw}


class RunKeys(NamedTuple):
    model: jax.Array
    es: jax.Array
    action: jax.Array


def run_keys(seed: int) -> RunKeys:
    """model_key, es_key, action_key = split(key(seed), 3)."""
    return RunKeys(*jax.random.split(jax.random.key(seed), 3))


def action_uniforms(action_key, epoch: int, pop: int) -> np.ndarray:
    """(MAX_STEPS, pop) float32 in [0, 1): uniform(fold_in(action_key, epoch))."""
    return np.asarray(jax.random.uniform(jax.random.fold_in(action_key, epoch), (cartpole.MAX_STEPS, pop)))


def check_returns(returns: np.ndarray, epoch: int) -> None:
    """Raise a ValueError naming the members whose return is NaN or inf: EggRoll (like upstream) would take them."""
    bad = np.flatnonzero(~np.isfinite(np.asarray(returns, dtype=np.float64)))
    if bad.size:
        shown = ", ".join(map(str, bad[:8].tolist())) + (" ..." if bad.size > 8 else "")
        raise ValueError(f"epoch {epoch}: returns must be finite; {bad.size} are NaN or inf, at member(s) {shown}")


def lr_schedule(lr: float, lr_decay: float, max_epochs: int):
    """optax schedule: count -> float32(lr * lr_decay**count), the power taken in Python float64 (DESIGN.md).

    A constant lr is passed as the plain float (what a user of upstream would pass).
    """
    if lr_decay == 1.0:
        return float(lr)
    table = jnp.asarray(np.array([schedule(lr, lr_decay, e) for e in range(max_epochs)], dtype=np.float32))
    return lambda count: table[jnp.minimum(count, max_epochs - 1)]


class Compiled(NamedTuple):
    """What a run's seed does not change: the model's structure, the noiser's settings, the jitted functions."""

    frozen_params: dict
    scan_map: dict
    es_map: dict
    frozen_noiser_params: dict
    step: Callable            # (noiser_params, params, es_tree_key, returns, epoch) -> (noiser_params, params, norms)
    policy_for: Callable      # (noiser_params, params, es_tree_key, epoch) -> policy(obs) -> logits


def _stepper(frozen_noiser_params, es_map, pop: int):
    """Jitted (noiser_params, params, es_tree_key, returns, epoch) -> (noiser_params, params, grad norms)."""
    @jax.jit
    def step(noiser_params, params, es_tree_key, returns, epoch):
        iterinfos = population_iterinfos(epoch, pop)      # (full(pop, epoch), arange(pop))
        shaped = EggRoll.convert_fitnesses(frozen_noiser_params, noiser_params, returns)
        # EggRoll.do_updates in its two halves, so the g it computes can be logged.
        grads = es_grads(frozen_noiser_params, noiser_params, params, es_tree_key, shaped, iterinfos, es_map)
        noiser_params, params = apply_grads(frozen_noiser_params, noiser_params, params, grads, pop)
        return noiser_params, params, jax.tree.map(jnp.linalg.norm, grads)

    return step


MIN_ROWS = 8   # a compact forward computes at least this many rows (and a power of two: a few compiled shapes)
_take = jax.jit(lambda tree, rows: jax.tree.map(lambda a: a[rows], tree))


def _compact(forward: Callable, noise, pop: int) -> Callable:
    """policy(obs (m, 4), rows (m,)) -> logits (m, 2): only the members rollout's Compaction keeps (the alive
    ones, padded to a power of two), their noise taken from the population's a few times per episode.

    A member's logits depend only on its own input and noise, so computing fewer rows changes no value.
    `forward(noise, x)` is the cached population forward; `noise` None: upstream's graph (the whole population).
    """
    plan = Compaction(pop, 1, MIN_ROWS, pow2=True)
    current = {"noise": noise}

    def policy(obs: np.ndarray, rows: np.ndarray) -> np.ndarray:
        members, position, changed = plan.update(rows) if noise is not None else (np.arange(pop), rows, False)
        if changed:
            current["noise"] = _take(noise, jnp.asarray(members, jnp.int32))
        x = np.zeros((members.size, obs.shape[1]), np.float32)
        x[position] = obs
        return np.asarray(forward(current["noise"], x))[position]
    return policy


def _policy_maker(frozen_params, es_map, frozen_noiser_params, pop: int, exact_graph: bool):
    """(noiser_params, params, es_tree_key, epoch) -> compact policy(obs (m, 4), rows (m,)) -> logits (m, 2).

    Default: each member's noise drawn once per epoch by the noiser's functions
    (`member_noise_tree`) and handed to the forward; `exact_graph=True` runs upstream's graph
    (vmap of MLP.forward with EggRoll drawing the noise inside every call, 5-10x slower). The two
    differ only by float32 rounding: XLA fuses the draw with the ±sigma product differently.
    """
    if exact_graph:
        forward = make_population_forward(frozen_params, frozen_noiser_params)

        def for_epoch(noiser_params, params, es_tree_key, epoch):
            e = jnp.int32(epoch)
            return _compact(lambda _, x: forward(noiser_params, params, es_tree_key, e, x), None, pop)
        return for_epoch

    forward = make_cached_population_forward(frozen_params, frozen_noiser_params)
    draw = jax.jit(lambda noiser_params, params, es_tree_key, epoch: member_noise_tree(
        frozen_noiser_params, noiser_params, params, es_tree_key, es_map, epoch, pop))

    def for_epoch(noiser_params, params, es_tree_key, epoch):
        noise = draw(noiser_params, params, es_tree_key, jnp.int32(epoch))
        return _compact(lambda tree, x: forward(noiser_params, params, tree, x), noise, pop)
    return for_epoch


def init_model(cfg: Config, run: RunSettings, model_key) -> CommonInit:
    """MLP.rand_init(model_key, 4, 2, [hidden] * (layers - 1), True, activation, float32)."""
    return MLP.rand_init(model_key, OBS_DIM, N_ACTIONS, [cfg.hidden] * (cfg.layers - 1), True, run.activation,
                         jnp.float32)


@lru_cache(maxsize=8)
def compiled(cfg: Config, run: RunSettings) -> Compiled:
    """Built once per (cfg, run settings): runs with other seeds reuse the compiled functions."""
    template = init_model(cfg, run, jax.random.key(0))
    max_epochs = -(-cfg.max_env_steps // cfg.pop)     # every member takes >= 1 step per epoch
    frozen_noiser_params, _ = EggRoll.init_noiser(
        template.params, cfg.sigma, lr_schedule(cfg.lr, run.lr_decay, max_epochs), solver=SOLVERS[run.optimizer],
        group_size=cfg.group_size, noise_reuse=run.noise_reuse, rank=cfg.rank)
    return Compiled(template.frozen_params, template.scan_map, template.es_map, frozen_noiser_params,
                _stepper(frozen_noiser_params, template.es_map, cfg.pop),
                _policy_maker(template.frozen_params, template.es_map, frozen_noiser_params, cfg.pop, False))


@lru_cache(maxsize=8)
def exact_policy(cfg: Config, run: RunSettings) -> Callable:
    """The plan's policy maker for upstream's graph (built on first use only)."""
    p = compiled(cfg, run)
    return _policy_maker(p.frozen_params, p.es_map, p.frozen_noiser_params, cfg.pop, True)


def train(cfg: Config, run: RunSettings, seed: int, progress: bool = True, stream: TextIO | None = None,
          exact_graph: bool = False, compact: bool = True) -> TrainResult:
    """Run ES epochs until the population's mean return reaches 475 or cfg.max_env_steps are spent.

    `compact`: compute only the members still alive at each step (the same numbers; False computes all).
    """
    if not isinstance(run, RunSettings):
        raise TypeError(f"jax_reference runs the reference EggRoll, configured by RunSettings; got {type(run).__name__} "
                        "(a port's Knobs: pass knobs.run for the reference run it describes)")
    check_pairing(cfg.pop, "interleaved")       # EggRoll always pairs members 2k, 2k+1
    show = Progress(stream or sys.stdout, progress)
    keys = run_keys(seed)
    p = compiled(cfg, run)
    policy_for = exact_policy(cfg, run) if exact_graph else p.policy_for
    params = init_model(cfg, run, keys.model).params
    es_tree_key = simple_es_tree_key(params, keys.es, p.scan_map)
    # what EggRoll.init_noiser returns for these params (the solver is the plan's, built once)
    noiser_params = {"sigma": cfg.sigma, "opt_state": p.frozen_noiser_params["solver"].init(params)}
    names = leaf_names(params)

    def epochs(noiser_params, params):
        """The ES epochs, one epoch_row each (until_solved stops them)."""
        env_steps, epoch = 0, 0
        while True:
            sigma_e = np.float32(schedule(cfg.sigma, run.sigma_decay, epoch))
            lr_e = np.float32(schedule(cfg.lr, run.lr_decay, epoch))
            noiser_params = {**noiser_params, "sigma": jnp.float32(sigma_e)}
            init_state = cartpole.reset(seed + epoch + np.arange(cfg.pop))
            policy = policy_for(noiser_params, params, es_tree_key, epoch)
            uniforms = action_uniforms(keys.action, epoch, cfg.pop)
            returns = (run_episodes(policy, init_state, uniforms, compact=True) if compact else
                       run_episodes(lambda obs: policy(obs, np.arange(cfg.pop)), init_state, uniforms)).returns
            check_returns(returns, epoch)
            env_steps += int(returns.sum())
            noiser_params, params, norms = p.step(noiser_params, params, es_tree_key, jnp.asarray(returns), jnp.int32(epoch))
            yield epoch_row(epoch, env_steps, returns.mean(), returns.max(), sigma_e, lr_e,
                            dict(zip(names, map(float, jax.tree.leaves(norms)))), time.perf_counter() - start)
            epoch += 1

    start = time.perf_counter()
    return until_solved(epochs(noiser_params, params), cfg.max_env_steps, show, start)
