"""The throughput benchmark: torch_impl against the JAX reference and the styles it replaced (`python -m bench`)."""
import torch_impl  # noqa: F401 - first, so its OpenMP setting is in place before torch loads
