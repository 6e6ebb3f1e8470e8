"""The throughput benchmark: torch_impl against the JAX reference and the styles it replaced (`python -m bench`)."""
