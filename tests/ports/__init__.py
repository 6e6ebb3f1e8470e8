"""Ports used by the parity suite's self-tests (an outside numpy port with switchable drifts, planted drifts of the
examples, broken adapters: the `*_ports.py` modules), and the tests of the `ports` package (the PyPI ports' adapters,
their survey and training: `test_*.py`)."""
