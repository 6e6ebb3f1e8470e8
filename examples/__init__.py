"""Example ports and their parity adapters (run from the repository root: python -m parity check --port examples.hooks_adapter:adapter)."""
