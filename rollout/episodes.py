"""One episode per population member, all members stepped together.

The policy is any callable obs (n, 4) float32 -> logits (n, 2); actions come from a
shared table of uniforms, so both sides can be fed the very same action randomness.
A compact policy, `policy(obs (m, 4), rows (m,))`, is asked only for the members still alive
(`run_episodes(..., compact=True)`): a finished member's logits are never used, so skipping them
changes no number as long as the policy computes each row independently of the others.
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


def greedy_actions(logits: np.ndarray, u: np.ndarray) -> np.ndarray:
    """argmax(logits) (action 0 on a tie, as argmax takes the first); the uniforms are not used."""
    z = np.asarray(logits, dtype=np.float64)
    if z.ndim != 2 or z.shape[1] != 2:
        raise ValueError(f"policy must return logits of shape (n, 2), got {z.shape}")
    return (z[:, 1] > z[:, 0]).astype(np.int64)


def run_episodes(
    policy: Callable[..., np.ndarray],
    init_state: np.ndarray,          # (n, 4) float64 from cartpole.reset
    uniforms: np.ndarray,            # (max_steps, n) float32: action randomness of step t in row t
    max_steps: int = cartpole.MAX_STEPS,
    watch: Callable[[int, np.ndarray, np.ndarray, np.ndarray, np.ndarray], None] | None = None,
    choose: Callable[[np.ndarray, np.ndarray], np.ndarray] = sample_actions,
    compact: bool = False,
) -> Episodes:
    """Run every member until it terminates or reaches `max_steps`; finished members are masked.

    `choose(logits, u)` turns logits into actions (sample_actions: the reference's inverse CDF).
    `compact=True`: the policy is called as `policy(obs, rows)` for the alive rows only, and only they step.
    `watch(t, obs, logits, action, alive)`, when given (full mode only), sees every step before it is taken
    (the parity trajectory check judges a second policy there without a loop of its own).
    """
    n = init_state.shape[0]
    uniforms = np.asarray(uniforms)
    if uniforms.shape[0] < max_steps or uniforms.shape[1:] != (n,):
        raise ValueError(f"uniforms must have shape ({max_steps}, {n}), got {uniforms.shape}")
    if compact and watch is not None:
        raise ValueError("watch sees whole populations: use it with compact=False")
    lengths = (_compact_lengths if compact else _full_lengths)(policy, init_state, uniforms, max_steps, choose, watch)
    return Episodes(returns=lengths.astype(np.float32), steps=int(lengths.sum()))


def _full_lengths(policy, init_state, uniforms, max_steps, choose, watch) -> np.ndarray:
    """Episode lengths (n,) int64, every member computed and stepped at every step (finished ones masked)."""
    n = init_state.shape[0]
    state = init_state
    alive = np.ones(n, dtype=bool)
    lengths = np.zeros(n, dtype=np.int64)
    for t in range(max_steps):
        state, done = _full_step(policy, state, alive, uniforms[t], choose, None if watch is None else (watch, t))
        lengths += alive
        alive &= ~done
        if not alive.any():
            break
    return lengths


def _compact_lengths(policy, init_state, uniforms, max_steps, choose, watch=None) -> np.ndarray:
    """Episode lengths (n,) int64, only the alive members computed and stepped: their states are kept packed
    (the alive rows, in order), so a step touches nothing of the finished ones."""
    n = init_state.shape[0]
    rows = np.arange(n)                               # the alive members, ascending
    state = init_state                                # (rows.size, 4): their states
    lengths = np.full(n, max_steps, dtype=np.int64)   # a member still alive at the end ran every step
    for t in range(max_steps):
        logits = policy(cartpole.observe(state), rows)
        state, terminated = cartpole.step(state, choose(logits, uniforms[t, rows]))
        if terminated.any():
            lengths[rows[terminated]] = t + 1
            alive = ~terminated
            rows, state = rows[alive], state[alive]
            if not rows.size:
                break
    return lengths


def _full_step(policy, state, alive, u, choose, watched):
    """Every member computes and steps; finished members keep their state. Returns (state, terminated)."""
    obs = cartpole.observe(state)
    logits = policy(obs)
    action = choose(logits, u)
    if watched is not None:
        watch, t = watched
        watch(t, obs, logits, action, alive)
    nxt, terminated = cartpole.step(state, action)
    return np.where(alive[:, None], nxt, state), terminated


class Compaction:
    """Which members a compact policy computes as members finish: whole groups of `group` members (the members
    sharing a draw), never fewer than `min_rows`, shrunk only when fewer than `shrink` of the computed groups are
    still alive (so the policy re-gathers its noise a few times per episode, not every step), optionally to a
    power of two of rows (a few compiled shapes)."""

    def __init__(self, pop: int, group: int = 1, min_rows: int = 8, pow2: bool = False, shrink: float = 0.5):
        if pop % group:
            raise ValueError(f"pop {pop} is not a multiple of the group size {group}")
        if not 0.0 < shrink <= 1.0:
            raise ValueError(f"shrink must be in (0, 1], got {shrink}")
        self.pop, self.group, self.min_rows, self.pow2, self.shrink = pop, group, min_rows, pow2, shrink
        self.groups = np.arange(pop // group)          # the groups computed now, sorted
        self._computed(self.groups)

    def _computed(self, groups: np.ndarray) -> None:
        """Set the computed groups; their members (sorted) and each member's position among them."""
        self.groups = groups
        self.members = (groups[:, None] * self.group + np.arange(self.group)).reshape(-1)
        self.slot = np.full(self.pop, -1, dtype=np.int64)
        self.slot[self.members] = np.arange(self.members.size)
        self.members.flags.writeable = False          # handed out by every update until the next shrink

    def _size(self, alive_groups: int) -> int:
        """How many groups to compute for this many alive ones (at least min_rows rows)."""
        n = max(alive_groups, -(-self.min_rows // self.group))
        if self.pow2:
            n = 1 << max(n - 1, 0).bit_length()
        return min(n, self.pop // self.group)

    def update(self, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray, bool]:
        """(members computed (sorted, read-only), the position of each of `rows` among them, whether the set
        changed)."""
        groups = rows // self.group if self.group > 1 else rows
        n_alive = _count_unique(groups)
        size = self._size(n_alive)
        changed = n_alive < self.shrink * len(self.groups) and size < len(self.groups)
        if changed:
            alive = np.unique(groups)
            spare = np.setdiff1d(self.groups, alive)[:size - n_alive]
            self._computed(np.sort(np.concatenate([alive, spare])))
        return self.members, self.slot[rows], changed


def _count_unique(a: np.ndarray) -> int:
    """len(np.unique(a)), in one pass when `a` is sorted (the alive rows of a rollout are)."""
    if a.size < 2:
        return a.size
    step = a[1:] != a[:-1]
    return 1 + int(np.count_nonzero(step)) if (a[1:] >= a[:-1]).all() else len(np.unique(a))
