"""One episode per population member, all members stepped together.

The policy is any callable obs (n, 4) float32 -> logits (n, 2); actions come from a
shared table of uniforms, so both sides can be fed the very same action randomness.
"""
from __future__ import annotations

from typing import Callable, NamedTuple

import numpy as np

from rollout import cartpole


class Episodes(NamedTuple):
    returns: np.ndarray   # (n,) float32: episode lengths (reward 1 per step)
    steps: int            # environment steps taken: returns.sum()


def sample_actions(logits: np.ndarray, u: np.ndarray) -> np.ndarray:
    """Categorical draw by inverse CDF: action 1 when u >= p0, p0 = softmax(logits)[:, 0] in float64."""
    z = np.asarray(logits, dtype=np.float64)
    if z.ndim != 2 or z.shape[1] != 2:
        raise ValueError(f"policy must return logits of shape (n, 2), got {z.shape}")
    p0 = 1.0 / (1.0 + np.exp(z[:, 1] - z[:, 0]))
    return (np.asarray(u) >= p0).astype(np.int64)


def run_episodes(
    policy: Callable[[np.ndarray], np.ndarray],
    init_state: np.ndarray,          # (n, 4) float64 from cartpole.reset
    uniforms: np.ndarray,            # (max_steps, n) float32: action randomness of step t in row t
    max_steps: int = cartpole.MAX_STEPS,
    watch: Callable[[int, np.ndarray, np.ndarray, np.ndarray, np.ndarray], None] | None = None,
) -> Episodes:
    """Run every member until it terminates or reaches `max_steps`; finished members are masked.

    `watch(t, obs, logits, action, alive)`, when given, sees every step before it is taken
    (the parity trajectory check judges a second policy there without a loop of its own).
    """
    n = init_state.shape[0]
    uniforms = np.asarray(uniforms)
    if uniforms.shape[0] < max_steps or uniforms.shape[1:] != (n,):
        raise ValueError(f"uniforms must have shape ({max_steps}, {n}), got {uniforms.shape}")
    state = init_state
    alive = np.ones(n, dtype=bool)
    lengths = np.zeros(n, dtype=np.int64)
    for t in range(max_steps):
        obs = cartpole.observe(state)
        logits = policy(obs)
        action = sample_actions(logits, uniforms[t])
        if watch is not None:
            watch(t, obs, logits, action, alive)
        nxt, terminated = cartpole.step(state, action)
        lengths += alive
        state = np.where(alive[:, None], nxt, state)
        alive &= ~terminated
        if not alive.any():
            break
    return Episodes(returns=lengths.astype(np.float32), steps=int(lengths.sum()))
