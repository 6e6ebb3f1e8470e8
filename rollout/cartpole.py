"""CartPole-v1 for a whole population at once, step for step gymnasium's arithmetic.

State is float64 (as gymnasium keeps it), observations float32 (as gymnasium returns
them). tests/rollout/test_cartpole.py checks every step against `gymnasium.make("CartPole-v1")`.
"""
from __future__ import annotations

import functools
import math

import numpy as np
from gymnasium.utils import seeding

MAX_STEPS = 500                     # CartPole-v1's TimeLimit
GRAVITY, MASSCART, MASSPOLE = 9.8, 1.0, 0.1
TOTAL_MASS = MASSPOLE + MASSCART
LENGTH = 0.5                        # half the pole's length
POLEMASS_LENGTH = MASSPOLE * LENGTH
FORCE_MAG, TAU = 10.0, 0.02
THETA_THRESHOLD = 12 * 2 * math.pi / 360
X_THRESHOLD = 2.4


def reset(seeds: np.ndarray) -> np.ndarray:
    """Initial states (n, 4) float64: what `env.reset(seed=s)` draws for each seed s."""
    seeds = np.asarray(seeds)
    if seeds.ndim != 1:
        raise ValueError(f"seeds must be a 1-D integer array, got shape {seeds.shape}")
    if seeds.size and seeds.min() < 0:
        raise ValueError(f"reset seeds must be >= 0 (gymnasium's rule), got min {seeds.min()}")
    return np.array([_initial_state(int(s)) for s in seeds]) if seeds.size else np.zeros((0, 4))


@functools.lru_cache(maxsize=1 << 14)
def _initial_state(seed: int) -> tuple[float, ...]:
    """`env.reset(seed=seed)`'s state, kept: a trainer resets seeds seed + epoch + arange(pop), so consecutive
    epochs share all but one (creating a seeded generator per member was most of a reset's time)."""
    return tuple(seeding.np_random(seed)[0].uniform(-0.05, 0.05, size=(4,)).tolist())


def step(state: np.ndarray, action: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """One Euler step for every row: returns (next state (n, 4) float64, terminated (n,) bool)."""
    x, x_dot, theta, theta_dot = state.T
    force = np.where(action == 1, FORCE_MAG, -FORCE_MAG)
    costheta, sintheta = np.cos(theta), np.sin(theta)
    temp = (force + POLEMASS_LENGTH * np.square(theta_dot) * sintheta) / TOTAL_MASS
    thetaacc = (GRAVITY * sintheta - costheta * temp) / (
        LENGTH * (4.0 / 3.0 - MASSPOLE * np.square(costheta) / TOTAL_MASS)
    )
    xacc = temp - POLEMASS_LENGTH * thetaacc * costheta / TOTAL_MASS
    nxt = np.stack(
        [x + TAU * x_dot, x_dot + TAU * xacc, theta + TAU * theta_dot, theta_dot + TAU * thetaacc],
        axis=1,
    )
    terminated = (
        (nxt[:, 0] < -X_THRESHOLD) | (nxt[:, 0] > X_THRESHOLD)
        | (nxt[:, 2] < -THETA_THRESHOLD) | (nxt[:, 2] > THETA_THRESHOLD)
    )
    return nxt, terminated


def observe(state: np.ndarray) -> np.ndarray:
    """Observations as gymnasium returns them: float32 copies of the state."""
    return state.astype(np.float32)
