"""A parameter tree as both sides see it: each leaf's path, shape, class, scanned axes and place in JAX's order.

Upstream's noiser takes any pytree of parameters with two maps beside it: `es_map` (what the noiser does with
a leaf) and `scan_map` (which axes of a leaf are a stack of independent slices). This module is the one
statement of that description for every model the harness knows (the CartPole MLP is one tree among others).

Paths join nested dict keys with "." ("blocks.wz"). JAX flattens a dict pytree with its keys sorted as strings
at every level, so the flatten order is the order of the paths' key tuples; leaf i in that order gets ES key
`split(es_key, n_leaves)[i]`, and a leaf scanned along axes (a0, a1, ...) is split further, once per axis in
that order (`recursive_scan_split`): slice (i0, i1, ...) gets `split(...split(k, shape[a0])[i0]..., shape[a1])[i1]`.
"""
from __future__ import annotations

import dataclasses
import difflib
import math
from dataclasses import dataclass
from typing import Iterable, Mapping, Sequence

# Leaf classes and upstream's es_map value for each (tmm shares MM_PARAM: the model, not the noiser, knows the
# stored orientation).
CLASSES: tuple[str, ...] = ("mm", "tmm", "param", "embedding", "excluded")
ES_MAP: dict[str, int] = {"param": 0, "mm": 1, "tmm": 1, "embedding": 2, "excluded": 3}
CLASS_NOTES: dict[str, str] = {
    "mm": "matrix stored (out, in), used as x @ W.T: low-rank noise (an N-D weight through its declared `matrix`)",
    "tmm": "matrix stored (in, out), used as x @ W: low-rank noise on the stored shape",
    "param": "any other tensor: full-rank noise, frozen when freeze_nonlora",
    "embedding": "lookup table: no noise, no update",
    "excluded": "no noise, no update",
}
LOWRANK = ("mm", "tmm")


class TreeError(ValueError):
    """A tree description that cannot be right; the message says what would be."""


@dataclass(frozen=True)
class Leaf:
    """One parameter leaf: its path, full (stacked) shape, class and scanned axes; `matrix` (mm only): the (a, b) an
    N-D slice is perturbed as, its row-major reshape (a conv weight (out, in, kh, kw) as (out, in * kh * kw), the
    matrix torch's W.reshape(out, -1) and im2col's patches use): the reference's mm noise at (a, b), reshaped."""

    path: str
    shape: tuple[int, ...]
    cls: str
    scan_axes: tuple[int, ...] = ()
    matrix: tuple[int, int] | None = None
    KEY_OPTIONAL = ("matrix",)     # a recorded call's key (parity.core.tape) holds `matrix` only when one is declared

    def __post_init__(self) -> None:
        if self.cls not in CLASSES:
            raise TreeError(f"leaf {self.path!r}: unknown leaf class {self.cls!r}; known: {', '.join(CLASSES)}")
        if not self.path or any(not part for part in self.path.split(".")):
            raise TreeError(f"leaf path {self.path!r} must be dict keys joined by '.' with none empty")
        if any(not isinstance(n, int) or n < 1 for n in self.shape):
            raise TreeError(f"leaf {self.path!r}: shape {self.shape} must hold positive integers")
        for axis in self.scan_axes:
            if not isinstance(axis, int) or not 0 <= axis < len(self.shape):
                raise TreeError(f"leaf {self.path!r}: scan axis {axis} is out of range for shape {self.shape} "
                                f"(axes 0..{len(self.shape) - 1})")
        if len(set(self.scan_axes)) != len(self.scan_axes):
            raise TreeError(f"leaf {self.path!r}: scan axes {self.scan_axes} repeat an axis")
        if self.matrix is not None:
            if isinstance(self.matrix, list):
                object.__setattr__(self, "matrix", tuple(self.matrix))
            check_matrix(self)
        elif self.cls in LOWRANK and len(self.slice_shape) != 2:
            hint = (f"; an N-D weight perturbed through its matricization declares it: matrix="
                    f"{matrix_hint(self.slice_shape)} (the row-major reshape, a conv weight's (out, in * kh * kw))"
                    if self.cls == "mm" and len(self.slice_shape) > 2 else "")
            raise TreeError(f"leaf {self.path!r}: a {self.cls} slice must be a matrix, got slice shape "
                            f"{self.slice_shape} (shape {self.shape}, scan axes {self.scan_axes}); declare a stack's "
                            f"axes as scan axes (e.g. (0,)), or class a leaf that is no weight matrix param{hint}")

    @property
    def slice_shape(self) -> tuple[int, ...]:
        """The shape of one slice: the shape without its scanned axes."""
        return tuple(n for axis, n in enumerate(self.shape) if axis not in self.scan_axes)

    @property
    def stack_shape(self) -> tuple[int, ...]:
        """The scanned axes' sizes in scan order (() for an unscanned leaf)."""
        return tuple(self.shape[axis] for axis in self.scan_axes)

    @property
    def n_slices(self) -> int:
        return math.prod(self.stack_shape)

    @property
    def es_class(self) -> int:
        return ES_MAP[self.cls]

    @property
    def factor_dims(self) -> tuple[int, int] | None:
        """(a, b) of a low-rank slice as upstream draws it: the stored slice shape (mm: (out, in), tmm: (in, out)),
        or the declared matrix of an N-D mm slice."""
        if self.cls not in LOWRANK:
            return None
        return self.matrix if self.matrix is not None else tuple(self.slice_shape)

    @property
    def matrix_shape(self) -> tuple[int, ...]:
        """The leaf's shape as the noiser sees it: the stack, then the declared matrix (the stored shape when none)."""
        return self.shape if self.matrix is None else (*self.stack_shape, *self.matrix)

    @property
    def noised(self) -> bool:
        """Whether the reference ever perturbs it (param leaves only when freeze_nonlora is off)."""
        return self.cls in ("mm", "tmm", "param")


def matrix_hint(slice_shape: Sequence[int]) -> tuple[int, int]:
    """(first axis, the rest's product): the matricization of an (out, in, kh, kw) conv weight."""
    return (int(slice_shape[0]), math.prod(slice_shape[1:]))


def matrix_splits(slice_shape: Sequence[int]) -> list[tuple[int, int]]:
    """The row-major matricizations of a slice: (product of its first k axes, product of the rest), k = 1 .. n - 1."""
    return [(math.prod(slice_shape[:k]), math.prod(slice_shape[k:])) for k in range(1, len(slice_shape))]


def check_matrix(leaf: Leaf) -> None:
    """TreeError, saying what would be right, unless the leaf's `matrix` declares a row-major matricization of an N-D
    mm slice (two positive integers whose product is the slice's size, the scanned axes leading)."""
    m, where = leaf.matrix, f"leaf {leaf.path!r} (shape {leaf.shape}, slice {leaf.slice_shape})"
    if leaf.cls != "mm":
        raise TreeError(f"{where}: `matrix` declares an mm leaf's matricization; a {leaf.cls} leaf has none (class "
                        f"it mm, or drop `matrix`)")
    if not isinstance(m, tuple) or len(m) != 2 or any(isinstance(n, bool) or not isinstance(n, int) or n < 1
                                                      for n in m):
        raise TreeError(f"{where}: matrix {m!r} must be a pair of positive integers (a, b), e.g. "
                        f"{matrix_hint(leaf.slice_shape)}")
    if len(leaf.slice_shape) < 3:
        raise TreeError(f"{where}: matrix {m} is for a slice of 3 or more axes; a {len(leaf.slice_shape)}-D slice "
                        f"is {'its own matrix' if len(leaf.slice_shape) == 2 else 'no matrix'}: drop `matrix`")
    splits = matrix_splits(leaf.slice_shape)
    if m not in splits:
        raise TreeError(f"{where}: matrix {m} is no row-major matricization of the slice ({math.prod(m)} entries, the "
                        f"slice {math.prod(leaf.slice_shape)}): rows are the product of its leading axes and columns "
                        f"of the rest, one of {', '.join(map(str, splits))} ({splits[0]} for a conv weight (out, in, "
                        f"kh, kw)); a port whose matrix permutes the axes reshapes to this order at its boundary")
    if not leading_scan(leaf):
        raise TreeError(f"{where}: a matricized leaf's scanned axes must lead ((0,), (0, 1), ...), got "
                        f"{leaf.scan_axes}")


def key_tuple(path: str) -> tuple[str, ...]:
    return tuple(path.split("."))


def nest(flat: Mapping[str, object]) -> dict:
    """{"a.b": v} -> {"a": {"b": v}}: leaves at dotted paths as the nested dicts upstream's params are; a ValueError
    where one path is a leaf and the prefix of another."""
    out: dict = {}
    for path, value in flat.items():
        *head, last = key_tuple(path)
        node = out
        for part in head:
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                raise ValueError(f"name {path!r} nests under a leaf; names must be like '0.weight'")
        if last in node:
            raise ValueError(f"duplicate parameter name {path!r}")
        node[last] = value
    return out


def flatten_order(paths: Iterable[str]) -> list[str]:
    """Paths in JAX's flatten order of the nested dict they name: keys sorted as strings at every level."""
    return sorted(paths, key=key_tuple)


@dataclass(frozen=True)
class Tree:
    """Leaves in JAX's flatten order; `declared` keeps the order the model declared them (its registration order)."""

    leaves: tuple[Leaf, ...]
    declared: tuple[str, ...]

    @property
    def paths(self) -> list[str]:
        return [leaf.path for leaf in self.leaves]

    @property
    def shapes(self) -> dict[str, tuple[int, ...]]:
        return {leaf.path: leaf.shape for leaf in self.leaves}

    def leaf(self, path: str) -> Leaf:
        for leaf in self.leaves:
            if leaf.path == path:
                return leaf
        raise TreeError(f"no leaf {path!r} in the tree; leaves: {', '.join(self.paths)}")

    def index(self, path: str, order: str = "sorted") -> int:
        """The leaf's ES key index: its place in JAX's flatten order, or in declaration order (`insertion`)."""
        names = self.paths if order == "sorted" else list(self.declared)
        return names.index(path)

    def of_class(self, *classes: str) -> list[Leaf]:
        return [leaf for leaf in self.leaves if leaf.cls in classes]


def make_tree(leaves: Sequence[Leaf]) -> Tree:
    """A Tree from leaves in declaration order; refuses duplicate paths and a path that is also a prefix."""
    paths = [leaf.path for leaf in leaves]
    dupes = sorted({p for p in paths if paths.count(p) > 1})
    if dupes:
        raise TreeError(f"duplicate leaf path(s): {', '.join(dupes)}")
    for p in paths:
        for q in paths:
            if q != p and q.startswith(p + "."):
                raise TreeError(f"leaf {p!r} is also a dict holding {q!r}; a path names a leaf or a dict, not both")
    by_path = {leaf.path: leaf for leaf in leaves}
    return Tree(tuple(by_path[p] for p in flatten_order(paths)), tuple(paths))


def did_you_mean(name: str, unmatched: Iterable[str]) -> str:
    """' (did you mean 'x'?)' for the closest of `unmatched` (the paths nothing else claims) to a path that names no
    leaf, else '': a typo in a map or a tree is told its leaf."""
    close = difflib.get_close_matches(name, list(unmatched), n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""


def _unknown(names: Iterable[str], unmatched: Iterable[str]) -> str:
    unmatched = list(unmatched)
    return ", ".join(f"{n}{did_you_mean(n, unmatched)}" for n in names)


def tree_from_maps(shapes: Mapping[str, Sequence[int]], classes: Mapping[str, str],
                   scan_axes: Mapping[str, Sequence[int]] | None = None,
                   matrices: Mapping[str, Sequence[int]] | None = None) -> Tree:
    """A Tree from {path: shape} (e.g. an adapter's init_params), a class map, and optionally the scanned axes and
    the matrices of N-D mm leaves; every path needs a class, and a map's path that names no parameter is refused
    with the closest one it may mean."""
    scan_axes, matrices = scan_axes or {}, matrices or {}
    missing = sorted(set(shapes) - set(classes))
    extra = [f"{_unknown(sorted(set(m) - set(shapes)), sorted(set(shapes) - set(m)))} in `{what}`"
             for what, m in (("leaf_classes", classes), ("scan_axes", scan_axes), ("matrices", matrices))
             if set(m) - set(shapes)]
    if extra:
        raise TreeError(f"the class or scan map names leaves the parameters do not hold: {'; '.join(extra)}"
                        + (f"; no leaf class for {', '.join(missing)}" if missing else ""))
    if missing:
        raise TreeError(f"no leaf class for {', '.join(missing)}; give each one of {', '.join(CLASSES)}")
    return make_tree([Leaf(p, tuple(int(n) for n in shapes[p]), classes[p], tuple(scan_axes.get(p, ())),
                           tuple(matrices[p]) if p in matrices else None) for p in shapes])


def check_params(tree: Tree, shapes: Mapping[str, Sequence[int]], who: str = "params") -> None:
    """Raise TreeError unless `shapes` ({path: shape}) holds exactly the tree's leaves at the tree's shapes."""
    missing = sorted(set(tree.paths) - set(shapes))
    extra = sorted(set(shapes) - set(tree.paths))
    wrong = [f"{p} {tuple(shapes[p])} (tree: {tree.leaf(p).shape})" for p in tree.paths
             if p in shapes and tuple(shapes[p]) != tree.leaf(p).shape]
    problems = ([f"missing {_unknown(missing, extra)}"] if missing else []) + \
               ([f"not in the tree {', '.join(extra)}"] if extra else []) + \
               ([f"shapes differ: {'; '.join(wrong)}"] if wrong else [])
    if problems:
        raise TreeError(f"{who} do not match the declared tree: {'; '.join(problems)} (declare every parameter in "
                        f"the tree at its shape, and only those)")


def slice_index(leaf: Leaf) -> list[tuple[int, ...]]:
    """Every slice's index along the scanned axes, in key order (row-major over the scan axes as listed)."""
    out: list[tuple[int, ...]] = [()]
    for n in leaf.stack_shape:
        out = [idx + (i,) for idx in out for i in range(n)]
    return out


def leading_scan(leaf: Leaf) -> bool:
    """Whether the leaf's scanned axes are its leading axes in order ((), (0,), (0, 1), ...): the stacks upstream's
    noiser takes (its update scans a stacked leaf along axis 0, slice by slice, axis after axis)."""
    return leaf.scan_axes == tuple(range(len(leaf.scan_axes)))


def check_es_settings(pop: int, group_size: int, rank: int, noise_reuse: int, sigma: float, lr: float) -> None:
    """Raise ValueError, saying what would be right, for ES settings no run can have."""
    for name, value in (("pop", pop), ("rank", rank)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
    if pop % 2:
        raise ValueError(f"pop {pop} is odd but members pair antithetically (2k, 2k+1); use an even "
                         f"population such as {pop + 1}")
    if isinstance(group_size, bool) or not isinstance(group_size, int) or group_size < 0 or \
            (group_size and pop % group_size):
        raise ValueError(f"group_size {group_size!r} does not divide the population {pop}; use 0 "
                         f"(one stream for all) or a divisor of {pop}")
    if group_size % 2:
        raise ValueError(f"group_size {group_size} is odd: an antithetic pair (2k, 2k+1) must share its "
                         f"stream; use an even group size or 0")
    if isinstance(noise_reuse, bool) or not isinstance(noise_reuse, int) or noise_reuse < 0:
        raise ValueError(f"noise_reuse must be an integer >= 0 (0 = the same noise every epoch), got {noise_reuse!r}")
    if not isinstance(sigma, (int, float)) or not isinstance(lr, (int, float)) or not sigma > 0 or not lr > 0:
        raise ValueError(f"sigma and lr must be numbers > 0, got sigma={sigma!r}, lr={lr!r}")


INIT_LAWS = ("normal", "zeros", "ones")


@dataclass(frozen=True)
class ESSettings:
    """An EGGROLL run's settings on a tree, with the tree suite's defaults: population, rank, sigma, learning rate,
    group size (0: one noise stream), epochs per noise draw (0: the same noise every epoch), frozen non-LoRA leaves.
    A port declares these to the suite (examples.gpt_port.ESConfig); TreeRun checks them (check_es_settings)."""

    pop: int = 16
    rank: int = 2
    sigma: float = 0.02
    lr: float = 0.01
    group_size: int = 4
    noise_reuse: int = 1
    freeze_nonlora: bool = True


@dataclass(frozen=True)
class _DeclaredTree:
    """TreeRun's first field, the tree, kept first (TreeRun(tree, pop=...); a recorded call's key feeds the fields
    in order, parity.core.tape): a base listed after ESSettings puts its fields before ESSettings' ones."""

    tree: Tree


@dataclass(frozen=True)
class TreeRun(ESSettings, _DeclaredTree):
    """A declared tree and the ES settings the tree suite runs on it (spec.lm.LMConfig is the LM's own: the same
    fields, its tree `lm_tree(cfg)`). init_laws: (path, law, scale) for the leaves whose initial values the port
    states (law "normal": value / scale is N(0, 1); "zeros", "ones": exactly); the others' init is not checked."""

    init_laws: tuple[tuple[str, str, float], ...] = ()

    def __post_init__(self) -> None:
        check_es_settings(self.pop, self.group_size, self.rank, self.noise_reuse, self.sigma, self.lr)
        if not isinstance(self.freeze_nonlora, bool):
            raise ValueError(f"freeze_nonlora must be True or False, got {self.freeze_nonlora!r}")
        if not self.tree.leaves:
            raise TreeError("the tree has no leaves; declare at least one (path, shape, class)")
        for path, law, scale in self.init_laws:
            if path not in self.tree.paths:
                free = [p for p in self.tree.paths if p not in {q for q, _, _ in self.init_laws}]
                raise TreeError(f"init law of {path!r}: no leaf {path!r} in the tree{did_you_mean(path, free)}; "
                                f"leaves: {', '.join(self.tree.paths)}")
            if law not in INIT_LAWS or (law == "normal" and not scale > 0):
                raise TreeError(f"init law of {path!r}: {law!r} (scale {scale!r}); give 'zeros', 'ones' or "
                                f"('normal', std) with std > 0")

    @property
    def n_streams(self) -> int:
        return self.pop // self.group_size if self.group_size else 1

    def replace(self, **changes) -> "TreeRun":
        return dataclasses.replace(self, **changes)


def mlp_tree(sizes: Sequence[int], bias: bool = True) -> Tree:
    """The CartPole MLP: layer t is "{t}.weight" mm (out, in) and "{t}.bias" param (out,)."""
    leaves: list[Leaf] = []
    for t in range(len(sizes) - 1):
        leaves.append(Leaf(f"{t}.weight", (sizes[t + 1], sizes[t]), "mm"))
        if bias:
            leaves.append(Leaf(f"{t}.bias", (sizes[t + 1],), "param"))
    return make_tree(leaves)
