"""The parity suite's checks: one module per check, each `run(ctx) -> CheckResult` (see parity.mlp.suite)."""
