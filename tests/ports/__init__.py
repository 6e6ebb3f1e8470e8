"""Ports used by the parity suite's self-tests: an outside numpy port with switchable drifts, and broken adapters."""
