"""Re-export, so an old import path keeps working: the tree protocol (CheckedTreePort, PortSide, load_tree_port,
declared_run) now lives in parity/tree/adapter.py, the port-call plumbing it shares with every suite in
parity/core/port.py; import from those. Nothing is defined here."""
from parity.core.port import PortError, UsageError, call_port, finite_outputs, has_methods
from parity.tree.adapter import (GROUPS, REQUIRED, SETTINGS, SIGNATURES, CheckedTreePort, PortSide, built_tree_port,
                                 declared_run, declared_tree, dense_of, load_tree_port, port_tree)

__all__ = ["PortError", "UsageError", "call_port", "finite_outputs", "has_methods", "GROUPS", "REQUIRED", "SETTINGS",
           "SIGNATURES", "CheckedTreePort", "PortSide", "built_tree_port", "declared_run", "declared_tree",
           "dense_of", "load_tree_port", "port_tree"]
