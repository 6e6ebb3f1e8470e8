"""What every suite of the parity harness shares: calling a port, verdicts, tolerances, causes, reports, repros, the
recorded-call tape and bundle format, JAX's generator in numpy, the reference's platform. Imports no family."""
