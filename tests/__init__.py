"""The project's tests (a package, so that tests/ports never shadows the top-level ports package)."""
