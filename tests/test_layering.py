"""The layering DESIGN.md promises, enforced: which package may import which, and the knob tables' keys.

Imports are read with `ast` from every module (function-level imports included), so a lazy import breaks
a rule as surely as a top-level one.
"""
from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
OURS = {"spec", "reporting", "cbuild", "rollout", "torch_impl", "jax_reference", "c_int8", "c_rng", "parity", "gap", "bench", "ports",
        "examples",
        "tests"}
STDLIB = set(sys.stdlib_module_names) | {"__future__"}

# package -> (ours it may import, third-party it may import) anywhere in it
RULES: dict[str, tuple[set[str], set[str]]] = {
    "spec": ({"spec"}, set()),
    "reporting": (set(), {"numpy"}),
    "cbuild": (set(), set()),                                      # the C sides' compiler call: stdlib only
    "rollout": ({"rollout"}, {"numpy", "gymnasium"}),
    "torch_impl": ({"torch_impl", "spec", "rollout"}, {"torch", "numpy"}),
    "jax_reference": ({"jax_reference", "spec", "rollout"}, {"jax", "optax", "numpy"}),
    # the C side: ctypes (stdlib) and numpy; its normal look-up is passed in, so neither jax nor torch
    "c_int8": ({"c_int8", "spec", "rollout", "cbuild"}, {"numpy"}),
    # JAX's generator in C: ctypes on raw addresses, its constants from spec; no numpy, torch or jax
    "c_rng": ({"c_rng", "spec", "cbuild"}, set()),
    "parity": ({"parity", "spec", "rollout", "reporting"}, {"numpy", "scipy"}),
    "gap": ({"gap", "spec", "reporting"}, {"numpy", "scipy", "pandas", "matplotlib", "lifelines", "statsmodels", "pydoe"}),
    "bench": ({"bench", "spec", "reporting", "rollout", "torch_impl", "jax_reference"},
              {"torch", "numpy", "scipy", "jax", "matplotlib"}),
    # the PyPI ports' adapters and their survey: the protocol (parity), never the project's own EGGROLLs
    "ports": ({"ports", "parity", "spec", "rollout", "reporting"},
              {"numpy", "torch", "torcheggroll", "hyperfunc", "eggroll_trainer", "eggroll"}),
}
# The few modules that reach further, each for one stated reason.
EXCEPTIONS: dict[str, set[str]] = {
    "parity/mlp/reference_port.py": {"jax_reference", "jax", "optax"},      # the reference side of the suite
    "parity/mlp/torch_adapter.py": {"torch_impl", "torch"},            # the built-in torch side
    "torch_impl/random_native.py": {"c_rng"},                      # the C generator behind random.normal/bits
    "torch_impl/triton_rng.py": {"triton"},                        # the fused Triton kernel behind CUDA draws
    "torch_impl/__main__.py": {"c_rng"},                           # its env switch, checked before any work
    "parity/tree/reference.py": {"jax_reference", "jax"},          # the reference side of the LM suite
    "parity/tree/torch_side.py": {"torch_impl", "torch"},               # the torch side of the LM suite
    "parity/int8/reference.py": {"jax_reference", "jax"},          # the reference side of the int8 check
    "parity/int8/torch_side.py": {"torch_impl", "torch"},               # the torch side of the int8 check
    "parity/int8/c_side.py": {"c_int8"},                                # the C side (and the knob signatures)
    "parity/__main__.py": {"jax", "torch"},                        # device line; --device cuda check
    "parity/pytest_plugin.py": {"pytest"},                         # the pytest plugin for port authors
    "gap/runs.py": {"torch_impl", "jax_reference", "torch", "ports", "rollout"},   # the trainers, loaded lazily per run
    "gap/__main__.py": {"torch"},                                  # --device cuda check before any run
    "gap/executors.py": {"ray"},                                   # the optional cluster executor, imported on use
}


def _modules(package: str) -> list[Path]:
    path = ROOT / package
    return [path.with_suffix(".py")] if path.with_suffix(".py").exists() else sorted(path.rglob("*.py"))


def imported_roots(path: Path) -> set[str]:
    """Top-level names of every absolute import in a module, at any depth."""
    roots = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            roots |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            roots.add(node.module.split(".")[0])
    return roots


@pytest.mark.parametrize("package", sorted(RULES))
def test_each_package_imports_only_what_its_layer_allows(package):
    ours, third_party = RULES[package]
    broken = []
    for path in _modules(package):
        rel = path.relative_to(ROOT).as_posix()
        allowed = ours | third_party | STDLIB | EXCEPTIONS.get(rel, set())
        for root in sorted(imported_roots(path) - allowed):
            broken.append(f"{rel} imports {root}")
    assert not broken, broken


def test_the_rule_reader_sees_lazy_imports(tmp_path):
    """A function-level import counts: the check above could otherwise pass with a rule broken inside a function."""
    module = tmp_path / "m.py"
    module.write_text("import os\n\ndef f():\n    from torch_impl import es\n    import jax.numpy as jnp\n")
    assert imported_roots(module) == {"os", "torch_impl", "jax"}


def test_the_two_sides_never_import_each_other():
    for package, other in (("torch_impl", "jax_reference"), ("jax_reference", "torch_impl"),
                           ("jax_reference", "torch")):
        for path in _modules(package):
            assert other not in imported_roots(path), f"{path.relative_to(ROOT)} imports {other}"


# ----------------------------------------------------------------------------- knob tables
def test_every_knob_table_has_exactly_the_vocabularys_values():
    """Each table a knob resolves through holds one entry per value of spec.knobs.CHOICES (one place per side)."""
    from jax_reference.models import ACTIVATIONS as JAX_ACTIVATIONS
    from jax_reference.train import SOLVERS
    from spec.knobs import CHOICES
    from torch_impl.fitness import SHAPINGS
    from torch_impl.gradient import BIAS_GRADS
    from torch_impl.keys import GENERATORS
    from torch_impl.model import ACTIVATIONS, COMPILERS, INITS, PRECISIONS
    from torch_impl.noise import BIAS_SCHEDULES, LAYOUTS
    from torch_impl.optim import OPTIMIZERS
    from torch_impl.train import ACTIONS

    torch_tables = {"rng": GENERATORS, "antithetic": LAYOUTS, "fitness": SHAPINGS, "bias_noise": BIAS_SCHEDULES,
                    "bias_grad": BIAS_GRADS, "activation": ACTIVATIONS, "init": INITS, "optimizer": OPTIMIZERS,
                    "actions": ACTIONS, "compile": COMPILERS, "matmul_precision": PRECISIONS}
    assert set(torch_tables) == set(CHOICES)
    for knob, table in torch_tables.items():
        assert tuple(table) == CHOICES[knob], knob
    assert tuple(SOLVERS) == CHOICES["optimizer"]
    assert set(CHOICES["activation"]) <= set(JAX_ACTIVATIONS)      # the reference runs any activation a port may


def test_the_suites_input_streams_are_distinct():
    from parity.mlp.suite import RNG_PURPOSES

    assert len(set(RNG_PURPOSES.values())) == len(RNG_PURPOSES)


# The hot path may stay one function (its kernels are issued in order and read best in one place).
LONG_ALLOWED = {("torch_impl/model.py", "forward")}
MAX_FUNCTION_LINES = 60


def test_no_function_outside_the_hot_path_is_longer_than_60_lines():
    long = []
    for package in RULES:
        for path in _modules(package):
            rel = path.relative_to(ROOT).as_posix()
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and (rel, node.name) not in LONG_ALLOWED:
                    lines = node.end_lineno - node.lineno + 1
                    if lines > MAX_FUNCTION_LINES:
                        long.append(f"{rel}:{node.lineno} {node.name} ({lines} lines)")
    assert not long, long


def test_the_lm_replay_path_never_imports_the_reference():
    """`check --task lm --against BUNDLE` runs without jax: the numpy reference and the replay import neither jax nor
    jax_reference (the replay's recording side reaches tree_reference only inside record_lm / recording_reference)."""
    for rel in ("parity/tree/numpy_reference.py", "parity/core/tape.py", "parity/tree/dist.py", "parity/tree/adapter.py"):
        assert not imported_roots(ROOT / rel) & {"jax", "jax_reference", "optax"}, rel
    import inspect
    from parity.tree import vectors as tree_vectors
    source = inspect.getsource(tree_vectors.replay_reference) + inspect.getsource(tree_vectors.open_bundle)
    assert "tree_reference" not in source
