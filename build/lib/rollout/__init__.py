"""The environment both sides share: CartPole-v1 dynamics and the population episode loop."""
