"""The parity harness: the suite (`python -m parity check`), the port adapter protocol, the gap study, the benchmark."""
