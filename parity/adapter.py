"""Re-export, so an old import path keeps working: `parity.adapter` was the CartPole port protocol and the port-call
plumbing in one module. The protocol (its text, CheckedPort, load_port) now lives in parity/mlp/adapter.py, what every
suite's port calls share in parity/core/port.py; import from those. Nothing is defined here."""
from parity.core.port import (SUITE_DIR, NonFinite, PortError, SplitNoise, UsageError, call_port, defined_at,
                              finite_outputs, has_methods, nonfinite_arrays, port_frames, port_trace)
from parity.mlp.adapter import (DECLARABLE, GROUPS, OPTIONAL, REQUIRED, SIGNATURES, CheckedPort, Noise, Shapes,
                                built_adapter, check_adapter, check_declarations, check_noise, declared_config,
                                load_port)
from parity.mlp.noiseform import dense_of, forward_of, is_dense, to_dense, update_of

__all__ = ["SUITE_DIR", "NonFinite", "PortError", "SplitNoise", "UsageError", "call_port", "defined_at",
           "finite_outputs", "has_methods", "nonfinite_arrays", "port_frames", "port_trace", "DECLARABLE", "GROUPS",
           "OPTIONAL", "REQUIRED", "SIGNATURES", "CheckedPort", "Noise", "Shapes", "built_adapter", "check_adapter",
           "check_declarations", "check_noise", "declared_config", "load_port", "dense_of", "forward_of", "is_dense",
           "to_dense", "update_of"]
