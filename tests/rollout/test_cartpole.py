"""The shared CartPole equals gymnasium's CartPole-v1 step for step, to the last bit."""
import gymnasium as gym
import numpy as np
import pytest

from rollout import cartpole
from rollout.episodes import run_episodes, sample_actions


@pytest.mark.parametrize("seeds", [[0, 1, 2, 3, 4, 5, 6, 7], [42, 1000, 123456789]])
def test_reset_matches_gymnasium(seeds):
    env = gym.make("CartPole-v1")
    ours = cartpole.reset(np.array(seeds))
    for row, s in zip(ours, seeds):
        obs, _ = env.reset(seed=s)
        np.testing.assert_array_equal(cartpole.observe(row[None])[0], obs)
        np.testing.assert_array_equal(row, env.unwrapped.state)


@pytest.mark.parametrize("n,seed", [(5, 0), (17, 3)])
def test_steps_match_gymnasium_exactly(n, seed):
    """Random actions until every env is done: state, reward, termination and truncation at 500."""
    rng = np.random.default_rng(seed)
    envs = [gym.make("CartPole-v1") for _ in range(n)]
    seeds = rng.integers(0, 2**31 - 1, size=n)
    state = cartpole.reset(seeds)
    for env, s in zip(envs, seeds):
        env.reset(seed=int(s))
    alive = np.ones(n, bool)
    # A biased-but-alternating action sequence keeps some poles up long enough to reach truncation.
    for t in range(cartpole.MAX_STEPS):
        action = rng.integers(0, 2, size=n)
        nxt, term = cartpole.step(state, action)
        for i in np.flatnonzero(alive):
            obs, reward, g_term, g_trunc, _ = envs[i].step(int(action[i]))
            assert reward == 1.0
            np.testing.assert_array_equal(nxt[i], envs[i].unwrapped.state)
            np.testing.assert_array_equal(cartpole.observe(nxt[i:i + 1])[0], obs)
            assert bool(term[i]) == g_term
            assert g_trunc == (t + 1 == cartpole.MAX_STEPS and not g_term)
        state = nxt
        alive &= ~term
        if not alive.any():
            break


def test_balanced_policy_truncates_at_500():
    """A stabilising linear controller survives to the time limit, as gymnasium's TimeLimit would stop it."""
    state = cartpole.reset(np.arange(6))
    policy = lambda obs: np.stack([np.zeros(len(obs)), 100 * (obs[:, 2] + obs[:, 3] + 0.1 * obs[:, 0] + 0.3 * obs[:, 1])], 1)
    ep = run_episodes(policy, state, np.full((500, 6), 0.5, np.float32))
    assert ep.returns.tolist() == [500.0] * 6 and ep.steps == 3000
    env = gym.make("CartPole-v1")
    obs, _ = env.reset(seed=0)
    for t in range(500):
        a = int(sample_actions(policy(obs[None]), np.array([0.5]))[0])
        obs, _, term, trunc, _ = env.step(a)
        if term or trunc:
            break
    assert trunc and not term and t == 499


def test_run_episodes_masks_finished_members():
    rng = np.random.default_rng(1)
    n = 32
    state = cartpole.reset(np.arange(n) + 7)
    u = rng.random((500, n), dtype=np.float32)
    w = rng.normal(size=(4, 2)).astype(np.float32)
    ep = run_episodes(lambda obs: obs @ w, state, u)
    # Re-run each member alone: masking must not change anyone's episode.
    for i in range(0, n, 7):
        solo = run_episodes(lambda obs: obs @ w, state[i:i + 1], u[:, i:i + 1])
        assert solo.returns[0] == ep.returns[i]
    assert ep.steps == int(ep.returns.sum())
    assert ep.returns.min() >= 1


def test_sample_actions_inverse_cdf():
    logits = np.array([[0.0, 0.0], [5.0, -5.0], [-5.0, 5.0]], np.float32)
    assert sample_actions(logits, np.array([0.49, 0.99, 0.01])).tolist() == [0, 0, 1]
    assert sample_actions(logits, np.array([0.51, 0.99999, 0.00004])).tolist() == [1, 1, 0]
    with pytest.raises(ValueError, match=r"\(n, 2\)"):
        sample_actions(np.zeros((3, 3)), np.zeros(3))


def test_bad_uniforms_shape_is_rejected():
    with pytest.raises(ValueError, match="uniforms must have shape"):
        run_episodes(lambda o: np.zeros((2, 2)), cartpole.reset(np.arange(2)), np.zeros((10, 2)))


def test_watch_sees_every_step_taken():
    """The watch hook sees each step before it is taken: live members per step add up to the env steps."""
    rng = np.random.default_rng(2)
    n = 16
    w = rng.normal(size=(4, 2)).astype(np.float32)
    seen = []
    ep = run_episodes(lambda obs: obs @ w, cartpole.reset(np.arange(n)), rng.random((500, n), dtype=np.float32),
                      watch=lambda t, obs, logits, action, alive: seen.append((t, int(alive.sum()), action.shape)))
    assert [t for t, _, _ in seen] == list(range(len(seen)))
    assert sum(live for _, live, _ in seen) == ep.steps
    assert all(shape == (n,) for _, _, shape in seen)
