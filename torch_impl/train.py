"""Train a CartPole-v1 policy with the functional torch EGGROLL: ask, roll out, tell, log. Stops when solved."""
from __future__ import annotations

import contextlib
import sys
import time
from typing import TextIO

import numpy as np
import torch

from rollout import cartpole
from rollout.episodes import run_episodes
from spec.config import SOLVED_RETURN, Config
from spec.knobs import Knobs
from spec.run import Progress, TrainResult, epoch_row
from torch_impl import es as es_mod
from torch_impl.model import forward
from torch_impl.noise import Noise


def evaluate(es: es_mod.ES, params: dict[str, torch.Tensor], noise: Noise, seed: int, epoch: int,
             device: str | torch.device) -> np.ndarray:
    """Every member's return (pop,) float32: one CartPole episode each, all members stepped together."""
    pop = es.cfg.pop
    init_state = cartpole.reset(seed + epoch + np.arange(pop))

    def policy(obs: np.ndarray) -> np.ndarray:   # obs (pop, 4) float32 -> logits (pop, 2)
        return forward(params, torch.from_numpy(obs).to(device), noise, es.activation).cpu().numpy()

    uniforms = es.plan.generator.action_uniforms(seed, epoch, pop)
    with torch.inference_mode():
        return run_episodes(policy, init_state, uniforms).returns


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
        return _train(cfg, knobs, seed, device, Progress(stream or sys.stdout, progress))


def _train(cfg: Config, knobs: Knobs, seed: int, device: str | torch.device, progress: Progress) -> TrainResult:
    es = es_mod.make(cfg, knobs)
    state = es_mod.init(es, seed, device)
    history: list[dict] = []
    env_steps, solved_at, start = 0, None, time.perf_counter()
    while env_steps < cfg.max_env_steps:
        epoch = state.epoch
        noise, state = es_mod.ask(es, state)
        returns = evaluate(es, state.params, noise, seed, epoch, device)
        env_steps += int(returns.sum())
        state, info = es_mod.tell(es, state, noise, torch.from_numpy(returns))
        row = epoch_row(epoch, env_steps, returns.mean(), returns.max(), info["sigma"], info["lr"],
                        info["grad_norm"], time.perf_counter() - start)
        history.append(row)
        progress.epoch(row)
        if row["mean_return"] >= SOLVED_RETURN:
            solved_at = env_steps
            break
    result = TrainResult(solved_at is not None, solved_at, len(history), env_steps, history)
    progress.done(result, time.perf_counter() - start)
    return result
