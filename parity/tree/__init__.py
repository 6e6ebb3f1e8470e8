"""The tree suite (`python -m parity check --task lm|tree`): EGGROLL on a parameter tree, the byte-level LM or any
tree a port declares, through the tree protocol; its exact and in-distribution checks, the reference and torch
sides, and its conformance vectors."""
