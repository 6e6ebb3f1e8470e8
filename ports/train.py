"""Train any port on CartPole-v1 through the adapter protocol's es_* methods: the gap study's `--port` arm.

The loop is the trainers' (DESIGN.md "Trainers"): per epoch, es_ask -> one episode per member with the shared
rollout (`rollout.episodes`, resets seed + epoch + member) -> es_tell with the raw returns; solved when the
population's mean return reaches 475, else stopped at cfg.max_env_steps. The port's own `forward` is the policy
(only the members still alive are computed). What a port does not offer comes from the reference, so the port
arm differs from the reference arm only where the port does: its initial parameters (`init_params`, else the
reference's for the run seed), its action randomness (`action_uniforms`, else the reference's uniforms) and its
action choice (`actions`, else the reference's inverse-CDF sample). A port's sigma and lr are not observable
through the protocol: the history records them as NaN, and no gradient norms.
"""
from __future__ import annotations

import math
import time
from typing import Protocol

import numpy as np

from parity.mlp.adapter import CheckedPort, load_port
from parity.core.port import UsageError
from rollout import cartpole
from rollout.episodes import run_episodes, sample_actions
from spec.config import SOLVED_RETURN, Config
from spec.layout import param_shapes
from spec.run import TrainResult, epoch_row
from ports._noise import select

NEEDED = ("forward", "es_init", "es_ask", "es_tell", "es_params")


class Fallback(Protocol):
    """The reference's pieces a port may lack (DESIGN.md's key scheme for a run seed)."""

    def init_params(self, shapes: dict, seed: int) -> dict: ...

    def action_uniforms(self, seed: int, epoch: int, pop: int) -> np.ndarray: ...


def missing_methods(port: CheckedPort) -> list[str]:
    """The protocol methods a port needs to be trained, that it lacks."""
    return [m for m in NEEDED if not port.has(m)]


def load_trainable(spec: str, cfg: Config) -> CheckedPort:
    """The adapter named `MODULE:ATTR`, checked to be trainable; UsageError naming what is missing otherwise."""
    port = CheckedPort(load_port(spec, cfg))
    lacking = missing_methods(port)
    if lacking:
        raise UsageError(f"--port {spec}: {port.name} cannot be trained: it lacks {', '.join(lacking)} (training "
                         "runs the adapter's es_init/es_ask/es_tell/es_params and uses forward as the policy)")
    return port


def _policy(port: CheckedPort, params: dict, noise: dict, n_out: int):
    """policy(obs (m, 4), rows (m,)) -> logits: the port's forward on the alive members' noise only."""
    def policy(obs: np.ndarray, rows: np.ndarray) -> np.ndarray:
        return port.forward(params, select(noise, rows), np.asarray(obs, np.float32), n_out)
    return policy


def evaluate(port: CheckedPort, fallback: Fallback, params: dict, noise: dict, seed: int, epoch: int,
             pop: int) -> np.ndarray:
    """Every member's return (pop,) float32: one CartPole episode each, the shared resets and rollout."""
    n_out = params[f"{sum(k.endswith('.weight') for k in params) - 1}.weight"].shape[0]
    uniforms = (port.action_uniforms(seed, epoch, pop, cartpole.MAX_STEPS) if port.has("action_uniforms")
                else fallback.action_uniforms(seed, epoch, pop))
    choose = port.actions if port.has("actions") else sample_actions
    init_state = cartpole.reset(seed + epoch + np.arange(pop))
    return run_episodes(_policy(port, params, noise, n_out), init_state, uniforms, choose=choose, compact=True).returns


def train(port: CheckedPort, cfg: Config, seed: int, fallback: Fallback, log=None) -> TrainResult:
    """Run the port's ES epochs until the population's mean return reaches 475 or cfg.max_env_steps are spent."""
    lacking = missing_methods(port)
    if lacking:
        raise ValueError(f"{port.name} cannot be trained: it lacks {', '.join(lacking)}")
    shapes = param_shapes(cfg.sizes)
    params = port.init_params(shapes, seed) if port.has("init_params") else fallback.init_params(shapes, seed)
    state = port.es_init(params, seed)
    history: list[dict] = []
    env_steps, epoch, solved_at, start = 0, 0, None, time.perf_counter()
    while env_steps < cfg.max_env_steps:
        noise = port.es_ask(state, epoch, shapes, cfg.pop, cfg.rank)
        returns = evaluate(port, fallback, port.es_params(state, shapes), noise, seed, epoch, cfg.pop)
        env_steps += int(returns.sum())
        state = port.es_tell(state, noise, returns, epoch)
        row = epoch_row(epoch, env_steps, returns.mean(), returns.max(), math.nan, math.nan, {},
                        time.perf_counter() - start)
        history.append(row)
        if log is not None:
            log(row)
        epoch += 1
        if row["mean_return"] >= SOLVED_RETURN:
            solved_at = env_steps
            break
    return TrainResult(solved_at is not None, solved_at, len(history), env_steps, history)


def train_spec(spec: str, cfg: Config, seed: int, fallback: Fallback) -> TrainResult:
    """Load `MODULE:ATTR` (in this process: the gap study's workers re-import it by name) and train it."""
    return train(load_trainable(spec, cfg), cfg, seed, fallback)
