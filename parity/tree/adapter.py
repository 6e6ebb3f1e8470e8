"""The tree adapter protocol: how the tree suite talks to ANY port of EGGROLL on a parameter tree, through
`python -m parity check --task tree --port module:attr` (the port's own declared tree: a GPT, or anything upstream's
noiser takes) or `--task lm --port module:attr` (a port of the project's byte-level LM, spec/lm.py).

Like parity/mlp/adapter.py's MLP protocol, every array crosses the boundary as numpy float32 (tokens and member
indices: int64). Parameters are a flat dict {path: array} with the tree's paths and shapes (nested dict keys joined
by "."; a stack of layers on the leading axes: "blocks.attn.q" (L, d, d) with scan axes (0,)).

The tree. An adapter says which class each leaf has (spec.tree.CLASSES: mm, tmm, param, embedding, excluded) in
one of two ways:
    tree: spec.tree.Tree                       the whole declaration (spec.lm.lm_tree(cfg) for a faithful LM port)
    leaf_classes: {path: class}                read with init_params(0)'s shapes through spec.tree.tree_from_maps,
    scan_axes: {path: (axis, ...)} (optional)  with the stacked leaves' scanned axes (the leading ones, in order)
    matrices: {path: (a, b)} (optional)        and the matrix each N-D mm leaf is perturbed through
An N-D weight (a conv's (out, in, kh, kw)) is an mm leaf with a declared matrix, Leaf(path, shape, "mm",
matrix=(out, in * kh * kw)): its noise is the reference's mm noise at (a, b) (drawn by the leaf's key index at that
shape), A B^T reshaped row-major to the slice; its factors, products, gradient and update are checked as an mm's at
(a, b). The matrix must be a row-major split of the slice (rows the product of its leading axes).
A tree that does not match init_params (a leaf path not in the params, a param not in the tree), an unknown class,
a scan axis out of range or not leading, an mm/tmm leaf that is not 2-D per slice and declares no matrix (or a matrix
that is no row-major split of its slice), an empty tree, or (--task tree)
a tree whose noise would not fit in memory is refused (exit 2) before any check runs; with --task lm so is a tree
whose paths or shapes are not the LM's (a leaf declared with another class than the LM's is noted in the report).

The run's settings (--task tree; optional attributes, else the suite size's defaults, parity.tree.check.TREE_SIZES):
    pop, rank, sigma, lr, group_size (members sharing a group mean), noise_reuse (epochs per noise generation),
    freeze_nonlora (True: param leaves neither perturbed nor updated), init_laws {path: "zeros" | "ones" |
    ("normal", std)} (the init laws the port states; init is checked on those leaves only).
With --task lm they are the LM preset's (spec.lm.LMConfig), and a class or factory is called with it.

The noise of members `members` (int64, into a population of pop) is a dict, absent path = no noise:
    mm / tmm leaf (and an embedding a port perturbs):
        (A (m, *stack, a, r) already times +-sigma/sqrt(r), B (m, *stack, b, r))
        a, b = the stored slice shape as upstream draws it (mm (out, in); tmm stored (in, out): a = in, b = out),
        so member i's perturbation of the slice is A_i B_i^T at the stored slice shape (an N-D mm leaf: a, b its
        declared matrix, the perturbation A_i B_i^T reshaped row-major to the slice)
    param leaf: eps (m, *shape) already times +-sigma, at the leaf's stored shape
Stack axes (*stack) are the leaf's scanned axes' sizes, first after the member axis.

Required methods (perturbed_mm only when the checked tree has an mm leaf, perturbed_tmm only when it has a tmm leaf:
checked once the tree is known, before any check runs)
    noise(seed, epoch, members, pop, sigma, rank) -> noise dict
        the port's own noise at that epoch (spec.tree's key scheme when jax_compatible_rng).
    perturbed_mm(W (a, b), A (m, a, r), B (m, b, r), x (m, *rows, b)) -> (m, *rows, a)
        member i's x @ (W + A_i B_i^T)^T, as the port computes an mm slice; rows are what a layer sees: (batch,) in
        the LM suite, (batch, seq) in the tree suite.
    perturbed_tmm(W (a, b) stored (in, out), A (m, a, r), B (m, b, r), x (m, *rows, a)) -> (m, *rows, b)
        member i's x @ (W + A_i B_i^T), as the port computes a tmm slice.
    shape_fitness(f (N,), group_size) -> (N,)      the port's fitness shaping with groups of group_size
    gradient(noise, shaped (N,), sigma) -> {path: array at the leaf's shape}
        the ES gradient in the reference's convention (ascent, before sqrt(N)): mm/tmm einsum of f*A and B / N at
        the stored shape, param mean(f * eps); zeros where the port gives no update. Members 0..N-1 in order.

Optional methods (a check that needs an absent one is reported as skipped)
    init_params(seed) -> params                    the port's initial parameters for a run seed
    forward(params, noise, tokens (m, T + 1), intermediates=False) -> scores (m,)      (--task lm only)
        each member's log2-likelihood per byte (noise None: unperturbed); intermediates=True returns
        (scores, {name: array}) keyed as spec.lm.intermediate_names (member axis first), so the suite can name
        the first block and leaf where the forward departs. Names the port does not produce are skipped.
        With --task tree the model is checked through the three methods below instead.
    batch(seed) -> an input the model takes, the same for every member (numpy arrays, or dicts/tuples of them)
    population_forward(params, noise, batch) -> (m, ...)  the port's own perturbed forward for noise's m members
    plain_forward(params, batch) -> (...)    one set of parameters, no EGGROLL code; float64 parameters give a
        float64 evaluation where the port can (the forward check's bound: parity/tree/forward.py)
        (--task tree: each member's population forward against the plain forward at theta + E_i; a port whose
        adapter has `module`, the torch nn.Module its population forward runs with the tree's paths as its
        named_parameters, also gets each layer's product checked as the model calls it: parity/tree/layers.py)
    update(params, noise, shaped (N,), sigma, lr) -> params
        one ES step: gradient(noise, shaped, sigma), -(g sqrt(N)) to optax.sgd(lr), applied.
    es_init(params, seed) -> state; es_ask(state, epoch) -> noise dict (all pop members);
    es_tell(state, noise, scores (pop,), epoch) -> state; es_params(state) -> params
        a training run, driven in lockstep by the trajectory check (--task tree: on synthetic fitness).

Attributes
    name: str                  shown in reports
    jax_compatible_rng: bool   True: the port draws JAX's numbers, so init and noise are compared element by element;
                               False (its own generator): checked in distribution (parity/tree/dist.py), the
                               reference's gradient, forward and step run on the noise the port hands out

Loading: `--port package.module:attr`; attr is an adapter object, or a class/factory that returns one: called with no
arguments (--task tree) or with the run's spec.lm.LMConfig (--task lm). examples/gpt_adapter.py (--task tree) and
examples/lm_adapter.py (--task lm) are the worked examples.
"""
from __future__ import annotations

import copy
import dataclasses
import inspect
import math
from typing import Any, Mapping

import numpy as np

from parity.core.port import PortError, UsageError, _array, call_port, finite_outputs, has_methods, imported_attr
from spec.lm import LMConfig, lm_tree
from spec.tree import CLASSES, ESSettings, Leaf, Tree, TreeError, TreeRun, check_params, leading_scan, tree_from_maps

REQUIRED = ("noise", "shape_fitness", "gradient")           # every tree port
PRODUCTS = {"mm": "perturbed_mm", "tmm": "perturbed_tmm"}    # required where the tree has a leaf of the class
SIGNATURES = {
    "noise": "noise(seed, epoch, members, pop, sigma, rank) -> {path: (A, B) or eps}",
    "perturbed_mm": "perturbed_mm(W (a, b), A (m, a, r), B (m, b, r), x (m, batch, b)) -> (m, batch, a)",
    "perturbed_tmm": "perturbed_tmm(W (a, b), A (m, a, r), B (m, b, r), x (m, batch, a)) -> (m, batch, b)",
    "shape_fitness": "shape_fitness(f (N,), group_size) -> (N,)",
    "gradient": "gradient(noise, shaped (N,), sigma) -> {path: array}",
    "init_params": "init_params(seed) -> {path: array}",
    "forward": "forward(params, noise, tokens (m, T + 1), intermediates=False) -> scores (m,) or (scores, dict)",
    "update": "update(params, noise, shaped (N,), sigma, lr) -> params",
    "es_init": "es_init(params, seed) -> state",
    "es_ask": "es_ask(state, epoch) -> noise dict",
    "es_tell": "es_tell(state, noise, scores (pop,), epoch) -> state",
    "es_params": "es_params(state) -> params",
    "population_forward": "population_forward(params, noise, batch) -> outputs (m, ...)",
    "plain_forward": "plain_forward(params, batch) -> outputs (...)",
    "batch": "batch(seed) -> an input the model takes (numpy arrays)",
}
GROUPS = {"es": ("es_init", "es_ask", "es_tell", "es_params"),
          "model": ("population_forward", "plain_forward", "batch")}


# ----------------------------------------------------------------------------- loading and the tree
def load_tree_port(spec: str, cfg: LMConfig | None) -> Any:
    """The adapter named by `package.module:attr` (a class or factory called with cfg, or with no arguments when cfg
    is None: --task tree), or UsageError."""
    example = "examples.lm_adapter:LMAdapter" if cfg is not None else "examples.gpt_adapter:GPTAdapter"
    obj, attr = imported_attr(spec, example)
    return built_tree_port(obj, cfg, spec, attr)


def built_tree_port(obj: Any, cfg: LMConfig | None, spec: str, attr: str = "adapter") -> Any:
    """`obj`, or what it builds when it is a class or factory (a callable without `noise`): obj(cfg), or obj() when
    cfg is None (--task tree); UsageError if that raises or the adapter lacks a required method."""
    if inspect.isclass(obj) or (callable(obj) and not hasattr(obj, "noise")):
        try:
            obj = obj(cfg) if cfg is not None else obj()
        except Exception as err:
            raise UsageError(f"--port {spec}: calling {attr}({'cfg' if cfg is not None else ''}) to build the adapter "
                             f"raised {type(err).__name__}: {err}") from err
    _require(obj, REQUIRED, f"--port {spec}: the tree adapter")
    return obj


def _require(port: Any, methods, who: str, why: str = "") -> None:
    """UsageError naming each of `methods` the port lacks, with its expected signature."""
    missing = [m for m in methods if not callable(getattr(port, m, None))]
    if missing:
        lines = "\n".join(f"  {SIGNATURES[m]}" for m in missing)
        raise UsageError(f"{who} lacks required method(s) {', '.join(missing)}{why}; expected:\n{lines}")


def require_products(port: Any, tree: Tree) -> None:
    """UsageError unless the port has the product method of every low-rank class the checked tree holds
    (perturbed_mm for mm leaves, perturbed_tmm for tmm leaves): a tree without tmm leaves needs no perturbed_tmm."""
    lacking = {cls: [leaf.path for leaf in tree.of_class(cls)] for cls, method in PRODUCTS.items()
               if tree.of_class(cls) and not callable(getattr(port, method, None))}
    leaves = "; ".join(f"{cls} leaves {', '.join(p[:3])}" + (f", ... ({len(p)} in all)" if len(p) > 3 else "")
                       for cls, p in lacking.items())
    _require(port, [PRODUCTS[cls] for cls in lacking], "the tree adapter", f" (its tree has {leaves})")


def _init_shapes(port: Any) -> dict[str, tuple[int, ...]] | None:
    """{path: shape} of init_params(0), or None when the port has no init_params; UsageError when it breaks."""
    if not callable(getattr(port, "init_params", None)):
        return None
    try:
        value = port.init_params(0)
    except Exception as err:
        raise UsageError(f"init_params(0) raised {type(err).__name__}: {err}") from err
    if not isinstance(value, Mapping):
        raise UsageError(f"init_params(0) returned a {type(value).__name__}; expected a dict {{path: array}}")
    return {k: tuple(np.shape(v)) for k, v in value.items()}


def declared_tree(port: Any) -> Tree:
    """The port's declared tree (`tree`, or `leaf_classes` and `scan_axes` read with init_params' shapes), checked
    against init_params when it has one; UsageError saying what would be right."""
    declared, classes = getattr(port, "tree", None), getattr(port, "leaf_classes", None)
    shapes = _init_shapes(port)
    try:
        if declared is not None:
            if not isinstance(declared, Tree):
                raise UsageError(f"the adapter's `tree` is a {type(declared).__name__}; expected a spec.tree.Tree "
                                 f"(e.g. spec.lm.lm_tree(cfg)) or give `leaf_classes` instead")
            if shapes is not None:
                check_params(declared, shapes, "init_params(0)'s parameters")
            return declared
        if classes is None:
            raise UsageError("the adapter declares no tree: give `tree` (spec.tree.Tree, e.g. spec.lm.lm_tree(cfg)) "
                             "or `leaf_classes` ({path: class}, read with init_params' shapes)")
        if shapes is None:
            raise UsageError("the adapter gives `leaf_classes` but no init_params to read the shapes from; "
                             "add init_params(seed) or declare `tree` (spec.tree.Tree)")
        unknown = sorted(f"{p}: {c!r}" for p, c in dict(classes).items() if c not in CLASSES)
        if unknown:
            raise UsageError(f"unknown leaf class(es) {', '.join(unknown)}; known: {', '.join(CLASSES)}")
        return tree_from_maps(shapes, classes, getattr(port, "scan_axes", None), getattr(port, "matrices", None))
    except TreeError as err:
        raise UsageError(f"the adapter's tree: {err}") from err


def port_tree(port: Any, cfg: LMConfig) -> tuple[Tree, list[str]]:
    """(the port's declared tree, notes on leaves it classes differently from the LM), or UsageError.

    The declaration must match init_params (when the port has it) and the LM's paths and shapes."""
    tree = declared_tree(port)
    lm = lm_tree(cfg)
    try:
        check_params(lm, tree.shapes, "@")
    except TreeError as err:
        detail = str(err).split("declared tree: ", 1)[-1]
        raise UsageError(f"the adapter's tree is not the byte-level LM's at this size (spec.lm.lm_tree(cfg), cfg "
                         f"d_model {cfg.d_model}, layers {cfg.layers}, d_hidden {cfg.d_hidden}): {detail}; the LM's "
                         f"leaves: {lm.shapes}") from err
    notes = [f"{leaf.path}: declared {leaf.cls} (scan axes {leaf.scan_axes}); the LM's is {ref.cls} "
             f"(scan axes {ref.scan_axes})" for leaf in tree.leaves for ref in [lm.leaf(leaf.path)]
             if (leaf.cls, leaf.scan_axes) != (ref.cls, ref.scan_axes)]
    require_products(port, lm)          # the checks run the LM's classes
    return tree, notes


SETTINGS = tuple(f.name for f in dataclasses.fields(ESSettings))      # the run settings a port may declare


def _init_laws(port: Any) -> tuple[tuple[str, str, float], ...]:
    """The port's `init_laws` {path: "zeros" | "ones" | ("normal", std)} as TreeRun's (path, law, scale) triples."""
    laws = getattr(port, "init_laws", None) or {}
    if not isinstance(laws, Mapping):
        raise UsageError(f"the adapter's `init_laws` is a {type(laws).__name__}; expected a dict {{path: 'zeros' | "
                         f"'ones' | ('normal', std)}}")
    out = []
    for path, law in laws.items():
        if isinstance(law, str):
            kind, scale = law, 0.0
        elif isinstance(law, (tuple, list)) and len(law) == 2 and isinstance(law[1], (int, float)):
            kind, scale = law
        else:
            raise UsageError(f"init law of {path!r}: {law!r}; give 'zeros', 'ones' or ('normal', std)")
        out.append((str(path), str(kind), float(scale)))
    return tuple(sorted(out))


def declared_run(port: Any, defaults: Mapping[str, Any]) -> tuple[TreeRun, list[str]]:
    """(the spec.tree.TreeRun the tree suite runs: the port's declared tree and settings, the size's `defaults` for
    the settings it leaves out; lines for the report), or UsageError saying what is wrong and what would be right:
    a tree that cannot be right (declared_tree), a stack that is not the leading axes, settings no run can have,
    a tree whose noise would not fit in this machine's memory."""
    from parity.tree import blocks
    from spec.limits import check_fits, estimate_tree_check_bytes
    tree = declared_tree(port)
    require_products(port, tree)
    odd = [f"{leaf.path} {leaf.scan_axes} (shape {leaf.shape})" for leaf in tree.leaves if not leading_scan(leaf)]
    if odd:
        raise UsageError(f"the adapter's tree: scan axes must be a leaf's leading axes in order ((0,), (0, 1), ...), "
                         f"as upstream's noiser scans a stack; not so for {'; '.join(odd)}: store the stacked axes "
                         f"first")
    given = {k: getattr(port, k) for k in SETTINGS if getattr(port, k, None) is not None}
    try:
        run = TreeRun(tree, **{**dict(defaults), **given}, init_laws=_init_laws(port))
        check_fits(estimate=estimate_tree_check_bytes(tree, run.pop, run.rank, blocks.BLOCK_ENTRIES,
                                                      run.freeze_nonlora), pop=run.pop, where="this machine")
    except ValueError as err:          # TreeError and the limits' refusals are ValueErrors
        raise UsageError(f"the adapter's tree and settings: {err}") from err
    said = ", ".join(f"{k} {getattr(run, k)}" + ("" if k in given else " (the size's)") for k in SETTINGS)
    n_params = sum(math.prod(leaf.shape) for leaf in tree.leaves)
    matricized = [f"{leaf.path} {leaf.slice_shape} as {leaf.matrix[0]} x {leaf.matrix[1]}" for leaf in tree.leaves
                  if leaf.matrix is not None]
    return run, [f"tree: {len(tree.leaves)} leaves, {n_params:,} parameters "
                 f"({', '.join(f'{c} {len(tree.of_class(c))}' for c in CLASSES)})"
                 + (f"; mm through a declared matrix: {', '.join(matricized)}" if matricized else ""),
                 f"settings: {said}"]


# ----------------------------------------------------------------------------- the checked wrapper
def _leaf_noise(method: str, leaf: Leaf, value: Any, m: int, rank: int):
    """One leaf's noise: (A, B) at the factored slice shape (the stored slice, or an N-D mm slice's declared matrix)
    for a low-rank leaf, or eps at the leaf's shape."""
    stack = leaf.stack_shape
    if isinstance(value, (tuple, list)):
        if len(value) != 2 or leaf.factor_dims is None and len(leaf.slice_shape) != 2:
            raise PortError(method, f"'{leaf.path}' ({leaf.cls}, slice {leaf.slice_shape}): low-rank noise is a pair "
                                    f"(A (m, *stack, a, r), B (m, *stack, b, r)) of a matrix slice")
        a, b = leaf.factor_dims or leaf.slice_shape
        if leaf.matrix is not None:
            _matrix_factors(method, leaf, value, m, rank)
        return (_array(method, f"A of '{leaf.path}'", value[0], (m, *stack, a, rank)),
                _array(method, f"B of '{leaf.path}'", value[1], (m, *stack, b, rank)))
    if leaf.cls in ("mm", "tmm"):
        a, b = leaf.factor_dims
        through = f" through its matrix {leaf.matrix}" if leaf.matrix is not None else ""
        full = (f": one array at the leaf's shape is a full-rank perturbation of '{leaf.path}', which the tree "
                f"declares low-rank{through} (perturb it as A B^T of that matrix, or class it param)"
                if tuple(np.shape(value)) == (m, *leaf.shape) else "")
        raise PortError(method, f"'{leaf.path}' is {leaf.cls}{through}: its noise is a pair (A {(m, *stack, a, rank)}, "
                                f"B {(m, *stack, b, rank)}), got one array of shape {np.shape(value)}{full}")
    return _array(method, f"eps of '{leaf.path}'", value, (m, *leaf.shape))


def _matrix_factors(method: str, leaf: Leaf, value, m: int, rank: int) -> None:
    """PortError naming the matricization a matricized mm leaf's factors are of when it is not the declared one (A's
    rows times B's rows the slice's size, in another split: e.g. (out * kh * kw, in) for a declared (out, in * kh *
    kw))."""
    shapes = [tuple(np.shape(v)) for v in value]
    if any(len(s) != 3 + len(leaf.stack_shape) or s[-1] != rank for s in shapes):
        return                                            # the shape check says what is wrong
    got = (shapes[0][-2], shapes[1][-2])
    if got != leaf.matrix and math.prod(got) == math.prod(leaf.slice_shape):
        raise PortError(method, f"'{leaf.path}' (mm, stored {leaf.slice_shape}) is declared perturbed through its "
                                f"matrix {leaf.matrix} (rows the product of its leading axes, row-major), but the "
                                f"port's factors A {shapes[0]}, B {shapes[1]} are of a {got[0]} x {got[1]} "
                                f"matricization: its noise is matricized in another order; form A B^T at "
                                f"{leaf.matrix} (A (m, {leaf.matrix[0]}, r), B (m, {leaf.matrix[1]}, r)), or declare "
                                f"the matrix the port uses")


@finite_outputs("noise", "perturbed_mm", "perturbed_tmm", "shape_fitness", "gradient", "init_params", "forward",
                "update", "es_ask", "es_params", "population_forward", "plain_forward")
class CheckedTreePort:
    """A tree adapter wrapped so that every call is validated against the run's tree (PortError when broken; NaN or
    inf in an output: parity.core.port.NonFinite, a failed check where the reference is finite, parity.tree.check); cfg:
    spec.lm.LMConfig (its tree the LM's) or spec.tree.TreeRun (the port's declared tree)."""

    def __init__(self, port: Any, cfg: LMConfig | TreeRun):
        self.port, self.cfg, self.tree = port, cfg, cfg.tree
        self.name = str(getattr(port, "name", type(getattr(port, "wrapped", port)).__name__))
        self.jax_compatible_rng = bool(getattr(port, "jax_compatible_rng", False))

    def has(self, method: str) -> bool:
        return has_methods(self.port, method, GROUPS)

    def _call(self, method: str, *args, **kwargs):
        self.last_call = (method, args, kwargs)          # a NonFinite's repro when the tape does not keep the call
        return call_port(self.port, method, SIGNATURES, *args, **kwargs)

    def _params(self, method: str, value: Any) -> dict[str, np.ndarray]:
        if not isinstance(value, Mapping):
            raise PortError(method, f"returned a {type(value).__name__}; expected a dict {{path: array}}")
        if set(value) != set(self.tree.paths):
            raise PortError(method, f"returned paths {sorted(value)}; expected {self.tree.paths}")
        return {p: _array(method, f"'{p}'", value[p], self.tree.leaf(p).shape) for p in self.tree.paths}

    def _noise(self, method: str, value: Any, m: int) -> dict:
        if not isinstance(value, Mapping):
            raise PortError(method, f"returned a {type(value).__name__}; expected a dict {{path: (A, B) or eps}}")
        unknown = sorted(set(value) - set(self.tree.paths))
        if unknown:
            raise PortError(method, f"returned unknown paths {unknown}; the tree's are {self.tree.paths}")
        return {p: _leaf_noise(method, self.tree.leaf(p), v, m, self.cfg.rank) for p, v in value.items()}

    # ---- required
    def noise(self, seed: int, epoch: int, members: np.ndarray, pop: int, sigma: float, rank: int) -> dict:
        members = np.asarray(members, dtype=np.int64)
        value = self._call("noise", int(seed), int(epoch), members, int(pop), float(sigma), int(rank))
        return self._noise("noise", value, members.size)

    def perturbed_mm(self, W, A, B, x) -> np.ndarray:
        return _array("perturbed_mm", "the product", self._call("perturbed_mm", W, A, B, x),
                      (*x.shape[:-1], W.shape[0]))

    def perturbed_tmm(self, W, A, B, x) -> np.ndarray:
        return _array("perturbed_tmm", "the product", self._call("perturbed_tmm", W, A, B, x),
                      (*x.shape[:-1], W.shape[1]))

    def shape_fitness(self, f: np.ndarray, group_size: int) -> np.ndarray:
        f = np.asarray(f, np.float32)
        return _array("shape_fitness", "the shaped fitness", self._call("shape_fitness", f, int(group_size)), f.shape)

    def gradient(self, noise: dict, shaped: np.ndarray, sigma: float) -> dict[str, np.ndarray]:
        return self._params("gradient", self._call("gradient", noise, np.asarray(shaped, np.float32), float(sigma)))

    # ---- optional
    def init_params(self, seed: int) -> dict[str, np.ndarray]:
        return self._params("init_params", self._call("init_params", int(seed)))

    def forward(self, params: dict, noise: dict | None, tokens: np.ndarray, intermediates: bool = False):
        tokens = np.asarray(tokens, np.int64)
        m = tokens.shape[0]
        value = self._call("forward", params, noise, tokens, intermediates=intermediates)
        if not intermediates:
            return _array("forward", "the scores", value, (m,))
        if not isinstance(value, tuple) or len(value) != 2 or not isinstance(value[1], Mapping):
            raise PortError("forward", "with intermediates=True it must return (scores (m,), {name: array})")
        inter = {str(k): _array("forward", f"intermediate '{k}'", v, None) for k, v in value[1].items()}
        bad = [k for k, v in inter.items() if v.ndim == 0 or v.shape[0] != m]
        if bad:
            raise PortError("forward", f"intermediates {bad} do not have the member axis ({m}) first")
        return _array("forward", "the scores", value[0], (m,)), inter

    def update(self, params: dict, noise: dict, shaped: np.ndarray, sigma: float, lr: float) -> dict:
        return self._params("update", self._call("update", params, noise, np.asarray(shaped, np.float32),
                                                 float(sigma), float(lr)))

    def es_init(self, params: dict, seed: int):
        return self._call("es_init", params, int(seed))

    def es_ask(self, state, epoch: int) -> dict:
        return self._noise("es_ask", self._call("es_ask", state, int(epoch)), self.cfg.pop)

    def es_tell(self, state, noise: dict, scores: np.ndarray, epoch: int):
        return self._call("es_tell", state, noise, np.asarray(scores, np.float32), int(epoch))

    def es_params(self, state) -> dict[str, np.ndarray]:
        return self._params("es_params", self._call("es_params", state))

    # ---- the model (parity/tree/forward.py)
    def batch(self, seed: int):
        """The port's input for a seed, as it gave it (numpy arrays, or dicts and tuples of them)."""
        value = self._call("batch", int(seed))
        _plain_data("batch", value)
        return value

    def population_forward(self, params: dict, noise: dict, batch, m: int) -> np.ndarray:
        """The port's own perturbed forward for the m members of `noise`: a float32 array (m, ...)."""
        out = _array("population_forward", "the outputs", self._call("population_forward", params, noise,
                                                                     copy.deepcopy(batch)), None)
        if out.ndim == 0 or out.shape[0] != m:
            raise PortError("population_forward", f"returned shape {out.shape}; expected the {m} members first "
                                                  f"(m, ...), as many as the noise has")
        return out

    def plain_forward(self, params: dict, batch) -> np.ndarray:
        """The plain model at one set of parameters: float32, or float64 where the port computes in the dtype of
        float64 parameters."""
        out = _array("plain_forward", "the outputs", self._call("plain_forward", params, copy.deepcopy(batch)),
                     None, dtype=None)
        if out.dtype not in (np.float32, np.float64):
            raise PortError("plain_forward", f"the outputs have dtype {out.dtype}; expected float32 (or float64 for "
                                             f"float64 parameters)")
        return out


def _plain_data(method: str, value: Any) -> None:
    """PortError unless `value` is numpy arrays, numbers and strings in dicts, tuples and lists (what a repro stores)."""
    if isinstance(value, Mapping):
        for v in value.values():
            _plain_data(method, v)
    elif isinstance(value, (tuple, list)):
        for v in value:
            _plain_data(method, v)
    elif not isinstance(value, (np.ndarray, np.generic, int, float, str, bool)):
        raise PortError(method, f"returned a {type(value).__name__}; expected numpy arrays (in dicts, tuples or "
                                f"lists), e.g. tensor.numpy()")


# ----------------------------------------------------------------------------- the suite's view of a port
def dense_of(leaf: Leaf, value) -> np.ndarray:
    """(m, *leaf.shape) perturbation from one leaf's protocol noise (A B^T per slice, an N-D slice's matrix reshaped
    row-major to the slice, stack axes put back)."""
    if not isinstance(value, tuple):
        return value
    A, B = value
    d = A @ np.swapaxes(B, -1, -2)                                       # (m, *stack, a, b)
    if leaf.matrix is not None:
        d = d.reshape(d.shape[:1] + leaf.stack_shape + leaf.slice_shape)
    rest = [ax for ax in range(len(leaf.shape)) if ax not in leaf.scan_axes]
    order = list(leaf.scan_axes) + rest                                  # stack-first position -> stored axis
    return np.moveaxis(d, list(range(1, d.ndim)), [1 + ax for ax in order])


class PortSide:
    """A checked tree port seen as the suite's side (parity.tree.check): init, dense noise per leaf, shaping,
    scores, gradients, products, updates; the port's noise drawn once per (seed, epoch)."""

    def __init__(self, port: CheckedTreePort, cfg: LMConfig | TreeRun):
        self.port, self.cfg = port, cfg
        self.name = port.name
        self._noise: dict = {}

    def has(self, method: str) -> bool:
        """Whether the port has what the suite's `method` needs (the required methods always)."""
        if method == "epoch_step":
            return self.port.has("forward") and (self.port.has("es_init") or self.port.has("update"))
        if method == "es":
            return self.port.has("es_init")
        return self.port.has({"init": "init_params", "scores": "forward"}.get(method, method)) \
            if method in ("init", "scores", "update") else True

    def noise(self, seed: int, epoch: int) -> dict:
        if (seed, epoch) not in self._noise:
            self._noise[(seed, epoch)] = self.port.noise(seed, epoch, np.arange(self.cfg.pop), self.cfg.pop,
                                                         self.cfg.sigma, self.cfg.rank)
        return self._noise[(seed, epoch)]

    def init(self, seed: int) -> dict[str, np.ndarray]:
        return self.port.init_params(seed)

    def protocol(self, seed: int, epoch: int) -> dict:
        """The port's noise dict at epoch (all members), as it handed it out."""
        return self.noise(seed, epoch)

    def leaf_noise(self, seed: int, epoch: int, leaf: Leaf):
        """One leaf's noise as the port gave it ((A, B) or eps), or None when the port does not perturb it."""
        return self.noise(seed, epoch).get(leaf.path)

    def dense_noise(self, seed: int, epoch: int, leaf: Leaf, block=None) -> np.ndarray | None:
        """(pop, *shape) perturbation of one leaf (None: not perturbed); `block` (a parity.tree.blocks.Block): only
        that block, (members, slices, rows, *rest), from the block's factors."""
        from parity.tree.blocks import dense_block
        value = self.noise(seed, epoch).get(leaf.path)
        if value is None:
            return None
        return dense_of(leaf, value) if block is None else dense_block(leaf, value, block)

    def shape(self, f: np.ndarray) -> np.ndarray:
        return self.port.shape_fitness(f, self.cfg.group_size)

    def scores(self, seed: int, params: dict, epoch: int, tokens: np.ndarray, noise: bool):
        return self.port.forward(params, self.noise(seed, epoch) if noise else None, tokens, intermediates=True)

    def grads(self, seed: int, epoch: int, shaped: np.ndarray) -> dict[str, np.ndarray]:
        return self.port.gradient(self.noise(seed, epoch), shaped, self.cfg.sigma)

    def products(self, W, A, B, x, form: str) -> np.ndarray:
        return (self.port.perturbed_mm if form == "mm" else self.port.perturbed_tmm)(W, A, B, x)

    def update(self, seed: int, epoch: int, params: dict, shaped: np.ndarray) -> tuple[dict, dict]:
        """(new params, the gradient the step used) from params, the port's noise at epoch and shaped fitness."""
        noise = self.noise(seed, epoch)
        return (self.port.update(params, noise, shaped, self.cfg.sigma, self.cfg.lr),
                self.port.gradient(noise, shaped, self.cfg.sigma))

    def epoch_step(self, seed: int, params: dict, epoch: int, tokens: np.ndarray) -> dict:
        """One training epoch from params: the port's own run (es_init/es_ask/es_tell/es_params) when it has one,
        else noise, forward, shape_fitness, gradient and update; its scores, shaped fitness, gradient, params and the
        noise it drew (the in-distribution mode runs the reference's step on it)."""
        if self.port.has("es_init"):
            state = self.port.es_init(params, seed)
            noise = self.port.es_ask(state, epoch)
            scores = self.port.forward(params, noise, tokens)
            new = self.port.es_params(self.port.es_tell(state, noise, scores, epoch))
        else:
            noise = self.noise(seed, epoch)
            scores = self.port.forward(params, noise, tokens)
            new = self.port.update(params, noise, self.port.shape_fitness(scores, self.cfg.group_size),
                                   self.cfg.sigma, self.cfg.lr)
        shaped = self.port.shape_fitness(scores, self.cfg.group_size)
        return {"scores": scores, "shaped": shaped, "grads": self.port.gradient(noise, shaped, self.cfg.sigma),
                "params": new, "noise": noise}
