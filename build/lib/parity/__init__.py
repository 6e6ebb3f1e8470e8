"""The parity suite: does a port compute what the JAX reference computes (`python -m parity check`), and the port adapter protocol through which any port is checked."""
