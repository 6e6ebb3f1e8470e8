"""The layering docs/layout.md's table states (DESIGN.md's contract), enforced: which package may import which, and the knob tables' keys.

Imports are read with `ast` from every module (function-level imports included), so a lazy import breaks
a rule as surely as a top-level one.
"""
from __future__ import annotations

import ast
import functools
import sys
from pathlib import Path

import numpy as np
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
    "parity/mlp/reference.py": {"jax_reference", "jax", "optax"},      # the reference side of the suite
    "parity/core/platform.py": {"jax_reference"},                 # the reference's platform for every suite
    "parity/core/device.py": {"torch"},                           # every suite's --device cuda check
    "parity/mlp/torch_side.py": {"torch_impl", "torch"},            # the built-in torch side
    "torch_impl/random/native.py": {"c_rng"},                      # the c backend: the C generator behind random.*
    "torch_impl/random/triton_kernel.py": {"triton"},              # the triton backend: one fused kernel for CUDA draws
    "spec/numpy_normal.py": {"numpy"},                             # the one numpy normal, for jax_reference and parity
    "parity/tree/reference.py": {"jax_reference", "jax"},          # the reference side of the LM suite
    "parity/tree/torch_side.py": {"torch_impl", "torch"},               # the torch side of the LM suite
    "parity/tree/torch_module.py": {"torch"},                      # most of an adapter, read from a port's nn.Module
    "parity/tree/hooks.py": {"torch"},                             # forward hooks on a port's own nn.Module
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
# Orchestration reads best whole, top to bottom, not as a chain of hops (issue 52): the command lines (every __main__
# and cli module), the plans (a suite's checks and their runner) and the report writers (every report and *_report
# module) may run to ORCHESTRATION_LINES; the math keeps MAX_FUNCTION_LINES.
ORCHESTRATION_LINES = 100
ORCHESTRATION_FILES = ("__main__.py", "cli.py", "report.py")
ORCHESTRATION_MODULES = {"parity/core/plan.py", "parity/mlp/suite.py", "parity/record.py"}


def function_cap(rel: str) -> int:
    """The most lines a function of the module at `rel` (a path from the root) may take."""
    name = rel.rsplit("/", 1)[-1]
    orchestration = name in ORCHESTRATION_FILES or name.endswith("_report.py") or rel in ORCHESTRATION_MODULES
    return ORCHESTRATION_LINES if orchestration else MAX_FUNCTION_LINES


def test_the_cap_is_100_lines_for_orchestration_and_60_elsewhere():
    for rel in ("parity/__main__.py", "parity/tree/cli.py", "parity/int8/cli.py", "parity/core/report.py",
                "gap/factorial_report.py", "parity/core/plan.py", "parity/mlp/suite.py", "parity/record.py"):
        assert function_cap(rel) == 100, rel
    for rel in ("parity/tree/check.py", "parity/core/tolerances.py", "torch_impl/es.py", "parity/tree/reference.py",
                "reporting.py"):
        assert function_cap(rel) == 60, rel
    assert all((ROOT / rel).is_file() for rel in ORCHESTRATION_MODULES), ORCHESTRATION_MODULES


def test_no_function_outside_the_hot_path_is_longer_than_its_cap():
    long = []
    for package in RULES:
        for path in _modules(package):
            rel = path.relative_to(ROOT).as_posix()
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and (rel, node.name) not in LONG_ALLOWED:
                    lines = node.end_lineno - node.lineno + 1
                    if lines > function_cap(rel):
                        long.append(f"{rel}:{node.lineno} {node.name} ({lines} lines, at most {function_cap(rel)})")
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


# ----------------------------------------------------------------------------- import cycles and families
def _module_name(path: Path, root: Path = ROOT) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def module_graph(root: Path = ROOT, packages=OURS) -> dict[str, dict[str, int]]:
    """{module: {project module it imports: first line}} over every module of `packages` under `root`, imports inside
    functions included. `from p import m` names the submodule p.m when there is one, else p; a relative import is
    resolved against the importing module's package."""
    files = {}
    for package in packages:
        single = root / f"{package}.py"
        for path in ([single] if single.exists() else sorted((root / package).rglob("*.py"))):
            files[_module_name(path, root)] = path

    def ours(name: str) -> str | None:
        while name and name not in files:
            name = name.rpartition(".")[0]
        return name or None

    graph: dict[str, dict[str, int]] = {}
    for module, path in files.items():
        edges = graph.setdefault(module, {})
        package = module if path.name == "__init__.py" else module.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    up = package.split(".")[:len(package.split(".")) - (node.level - 1)]
                    base = ".".join(up + ([node.module] if node.module else []))
                names = [f"{base}.{alias.name}" for alias in node.names]
            else:
                continue
            for name in names:
                target = ours(name)
                if target and target != module:
                    edges.setdefault(target, node.lineno)
    return graph


@functools.lru_cache(maxsize=1)
def project_graph() -> dict[str, dict[str, int]]:
    """module_graph() of this repository, parsed once per process (several tests read it; none changes it)."""
    return module_graph()


def import_cycles(graph: dict[str, dict[str, int]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm, iterative), each sorted."""
    index, low, stack, on_stack, cycles = {}, {}, [], set(), []
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, successors = work[-1]
            for nxt in successors:
                if nxt not in index:
                    index[nxt] = low[nxt] = len(index)
                    stack.append(nxt)
                    on_stack.add(nxt)
                    work.append((nxt, iter(sorted(graph.get(nxt, {})))))
                    break
                if nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.append(member)
                        if member == node:
                            break
                    if len(component) > 1:
                        cycles.append(sorted(component))
    return cycles


def describe_cycle(graph: dict[str, dict[str, int]], cycle: list[str]) -> str:
    """One cycle in words: its modules, then each import between them with its line."""
    arrows = [f"{a.replace('.', '/')}.py:{graph[a][b]} imports {b}" for a in cycle for b in cycle if b in graph[a]]
    return f"import cycle among {', '.join(cycle)}: " + "; ".join(arrows)


def test_no_import_cycle_among_the_projects_modules():
    """Module level or inside a function, no project module reaches itself through its imports: a cycle is broken by
    moving the shared part down a level, never by importing late (which this test sees through)."""
    graph = project_graph()
    cycles = import_cycles(graph)
    assert not cycles, "\n".join(describe_cycle(graph, c) for c in cycles)


def test_the_cycle_finder_names_a_cycle_closed_by_a_lazy_import(tmp_path):
    """The finder itself: a three-module cycle whose last arrow is a function-level `from pkg import a` is found and
    named with its lines; a diamond (no cycle) and a relative import are read right."""
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from pkg.b import x\n")
    (pkg / "b.py").write_text("import os\nfrom . import c\nx = 1\n")
    (pkg / "c.py").write_text("def f():\n    from pkg import a\n    return a\n")
    (pkg / "d.py").write_text("from pkg import b, c\n")
    graph = module_graph(tmp_path, ("pkg",))
    assert graph["pkg.b"] == {"pkg.c": 2} and graph["pkg.d"] == {"pkg.b": 1, "pkg.c": 1}
    assert import_cycles(graph) == [["pkg.a", "pkg.b", "pkg.c"]]
    assert describe_cycle(graph, ["pkg.a", "pkg.b", "pkg.c"]) == (
        "import cycle among pkg.a, pkg.b, pkg.c: pkg/a.py:1 imports pkg.b; pkg/b.py:2 imports pkg.c; "
        "pkg/c.py:2 imports pkg.a")
    (pkg / "c.py").write_text("x = 2\n")
    assert import_cycles(module_graph(tmp_path, ("pkg",))) == []



@pytest.mark.parametrize("seed", [0, 1])
def test_the_cycle_finder_agrees_with_scipys_strong_components(seed):
    """Our Tarjan against scipy.sparse.csgraph's strongly connected components: on the project's own import graph
    and on fresh random sparse graphs of two sizes, the same components of more than one module."""
    from scipy.sparse import csr_matrix
    from scipy.sparse.csgraph import connected_components

    def scipy_cycles(graph):
        names = sorted(set(graph) | {b for edges in graph.values() for b in edges})
        at = {n: i for i, n in enumerate(names)}
        rows = [at[a] for a in graph for b in graph[a]]
        cols = [at[b] for a in graph for b in graph[a]]
        m = csr_matrix((np.ones(len(rows)), (rows, cols)), shape=(len(names), len(names)))
        _, label = connected_components(m, directed=True, connection="strong")
        groups = {}
        for n in names:
            groups.setdefault(label[at[n]], []).append(n)
        return sorted(sorted(g) for g in groups.values() if len(g) > 1)

    rng = np.random.default_rng(seed)
    graphs = [project_graph()]
    for n, p in ((30, 0.05), (200, 0.008)):
        adj = rng.random((n, n)) < p
        graphs.append({f"m{i}": {f"m{j}": 1 for j in np.flatnonzero(adj[i]) if j != i} for i in range(n)})
    assert any(scipy_cycles(g) for g in graphs[1:])          # the random graphs do hold cycles
    for graph in graphs:
        assert sorted(import_cycles(graph)) == scipy_cycles(graph)

# Within the four packages laid out by family: which parts each part may import. A part is a family's folder (or
# parity's core), or the package's top-level modules ("top"). The commands (parity's top, each __main__) may import
# any part; a family imports the shared top (or core) and itself, never a sibling family except as listed.
FAMILIES: dict[str, dict[str, set[str]]] = {
    "parity": {"core": {"core"}, "mlp": {"core", "mlp"}, "tree": {"core", "tree"}, "int8": {"core", "int8"}},
    "torch_impl": {"top": {"top"}, "tree": {"top", "tree"},
                   "int8": {"top", "tree", "int8"}},               # the integer LM draws on the tree's key sources
    "jax_reference": {"top": {"top"}, "lm": {"top", "lm"}, "int8": {"top", "int8"}},
    "gap": {"top": {"top"}, "lm": {"top", "lm"}, "int8": {"top", "int8"}},   # both studies run on gap.study
}
COMMANDS = {"parity": "top"}         # parity's top is its commands and public surface: it may import any part
# Old import paths kept working for port authors (examples/, docs/, outside adapters): re-exports only.
REEXPORTS = {"parity/adapter.py", "parity/tree_adapter.py"}
FAMILY_PREFIXES = ("tree_", "lm_", "int8_")


def _part(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 2 and parts[1] in FAMILIES[parts[0]] else "top"


@pytest.mark.parametrize("package", sorted(FAMILIES))
def test_each_family_imports_only_the_shared_part_and_itself(package):
    broken = []
    for module, edges in project_graph().items():
        if module.split(".")[0] != package or module.endswith("__main__") or COMMANDS.get(package) == _part(module):
            continue
        allowed = FAMILIES[package][_part(module)]
        broken += [f"{module} imports {target}" for target in edges
                   if target.split(".")[0] == package and _part(target) not in allowed]
    assert not broken, broken


@pytest.mark.parametrize("package", sorted(FAMILIES))
def test_no_family_prefixed_module_is_left_beside_its_folder(package):
    """A file-name prefix is a package: no `tree_*`, `lm_*` or `int8_*` module at a package's top, other than the
    declared re-exports of old import paths."""
    left = [p.relative_to(ROOT).as_posix() for p in sorted((ROOT / package).glob("*.py"))
            if p.name.startswith(FAMILY_PREFIXES) and p.relative_to(ROOT).as_posix() not in REEXPORTS]
    assert not left, left


@pytest.mark.parametrize("rel", sorted(REEXPORTS))
def test_a_kept_old_import_path_is_a_thin_reexport(rel):
    """A kept old path says so in its docstring and holds imports only (no code of its own to drift)."""
    tree = ast.parse((ROOT / rel).read_text())
    doc = ast.get_docstring(tree) or ""
    assert "re-export" in doc.lower(), f"{rel}: its docstring should say it is a re-export, and of what"
    body = tree.body[1:]
    assert body and all(isinstance(n, (ast.ImportFrom, ast.Import)) or (
        isinstance(n, ast.Assign) and [t.id for t in n.targets if isinstance(t, ast.Name)] == ["__all__"])
        for n in body), f"{rel} holds more than imports"
