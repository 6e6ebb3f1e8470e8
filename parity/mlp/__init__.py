"""The CartPole MLP suite (`python -m parity check`): the MLP port protocol, its checks, the reference and torch
sides behind it, and its conformance vectors."""
