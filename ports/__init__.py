"""Adapters for the EGGROLL ports people install from PyPI, the survey that checks them (`python -m ports`), and a
trainer that runs any adapter through its es_* methods on CartPole (`ports.train`, the gap study's `--port` arm)."""
