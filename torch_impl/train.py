"""Train a CartPole-v1 policy with the functional torch EGGROLL: ask, roll out, tell, log. Stops when solved."""
from __future__ import annotations

import contextlib
import sys
import time
from typing import NamedTuple, TextIO

import numpy as np
import torch

from rollout import cartpole
from rollout.episodes import run_episodes
from torch_impl import es
from torch_impl.config import SOLVED_RETURN, Config, check_pairing
from torch_impl.knobs import Knobs
from torch_impl.model import forward, leaf_names
from torch_impl.noise import PURPOSE_ACTION, Noise, es_tree_keys, jax_random, torch_generator


class TrainResult(NamedTuple):
    solved: bool
    steps_to_solve: int | None
    epochs: int
    env_steps: int
    history: list[dict]   # per epoch: epoch, env_steps, mean_return, max_return, sigma, lr, grad_norm/<leaf>, wall_s


def action_uniforms(seed: int, epoch: int, pop: int, knobs: Knobs) -> np.ndarray:
    """(MAX_STEPS, pop) float32 in [0, 1): JAX's uniform(fold_in(action_key, epoch)) or torch's generator."""
    shape = (cartpole.MAX_STEPS, pop)
    if knobs.rng == "jax":
        rnd = jax_random()
        action_key = rnd.split(rnd.key(seed), 3)[2]
        return rnd.uniform(rnd.fold_in(action_key, epoch), shape).cpu().numpy()
    return torch.rand(shape, generator=torch_generator("cpu", seed, PURPOSE_ACTION, epoch)).numpy()


def evaluate(params: dict[str, torch.Tensor], noise: Noise, seed: int, epoch: int, pop: int, knobs: Knobs,
             device: str | torch.device) -> np.ndarray:
    """Every member's return (pop,) float32: one CartPole episode each, all members stepped together."""
    init_state = cartpole.reset(seed + epoch + np.arange(pop))

    def policy(obs: np.ndarray) -> np.ndarray:   # obs (pop, 4) float32 -> logits (pop, 2)
        return forward(params, torch.from_numpy(obs).to(device), noise, knobs.activation).cpu().numpy()

    with torch.inference_mode():
        return run_episodes(policy, init_state, action_uniforms(seed, epoch, pop, knobs)).returns


@contextlib.contextmanager
def intra_op_threads(n: int | None):
    """Run with torch's intra-op thread count set to n (None: leave it), restored afterwards."""
    if n is None:
        yield
        return
    previous = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(previous)


def train(cfg: Config, knobs: Knobs, seed: int, device: str | torch.device = "cpu", progress: bool = True,
          stream: TextIO | None = None, threads: int | None = 1) -> TrainResult:
    """Run ES epochs until the population's mean return reaches 475 or cfg.max_env_steps are spent.

    `threads`: torch intra-op threads while training (default 1: the rollout's kernels are tens of
    microseconds, where thread hand-offs cost more than they save; None leaves torch's setting).
    """
    with intra_op_threads(threads):
        return _train(cfg, knobs, seed, device, progress, stream or sys.stdout)


def _train(cfg: Config, knobs: Knobs, seed: int, device: str | torch.device, progress: bool,
           stream: TextIO) -> TrainResult:
    check_pairing(cfg.pop, knobs.antithetic)
    live = progress and stream.isatty()
    state = es.init_state(cfg, knobs, seed, device)
    keys = es_tree_keys(seed, cfg.layers) if knobs.rng == "jax" else seed   # the ES key tree, built once
    draws: dict = {}   # noise draws kept while their generation lasts (all run long with noise_reuse=0)
    history: list[dict] = []
    env_steps, solved_at, start = 0, None, time.perf_counter()
    while env_steps < cfg.max_env_steps:
        epoch = state.epoch
        noise = es.ask(state, cfg, knobs, keys, device, cache=draws)
        returns = evaluate(state.params, noise, seed, epoch, cfg.pop, knobs, device)
        env_steps += int(returns.sum())
        state, info = es.tell(state, noise, torch.from_numpy(returns), cfg, knobs)
        wall = time.perf_counter() - start
        row = {"epoch": epoch, "env_steps": env_steps, "mean_return": float(returns.mean()),
               "max_return": float(returns.max()), "sigma": info["sigma"], "lr": info["lr"]}
        row.update({f"grad_norm/{name}": info["grad_norm"][name] for name in leaf_names(cfg.layers)})
        row["wall_s"] = wall
        history.append(row)
        if progress:
            line = (f"epoch {epoch:5d}  steps {env_steps:>11,d}  mean {row['mean_return']:6.1f}  "
                    f"max {row['max_return']:5.0f}  {env_steps / max(wall, 1e-9):>9,.0f} steps/s")
            print(("\r" + line) if live else line, end="" if live else "\n", file=stream, flush=True)
        if row["mean_return"] >= SOLVED_RETURN:
            solved_at = env_steps
            break
    result = TrainResult(solved_at is not None, solved_at, len(history), env_steps, history)
    if progress:
        wall = time.perf_counter() - start
        verdict = (f"solved in {result.steps_to_solve:,d} env steps ({result.epochs} epochs, {wall:.1f} s)"
                   if result.solved else f"not solved within {env_steps:,d} env steps ({result.epochs} epochs, {wall:.1f} s)")
        print(("\n" if live else "") + verdict, file=stream, flush=True)
    return result
