"""One leaf's per-member noise in blocks of bounded size, so that the tree suite's memory grows with the parameters,
not with population x parameters (a GPT-2-sized head at pop 16 is 617M entries: 4.9 GB per float64 copy).

A leaf's noise for m members is laid out (m, *stack, *slice), the scanned axes leading (spec.tree.leading_scan), which
is the grid (m, S, R, *rest): S = n_slices, R = the slice's first axis (1 for a scalar slice), rest its other axes. A
`Block` selects members, slices and rows of that grid. `blocks(leaf, m)` covers the grid with blocks of at most
BLOCK_ENTRIES entries, always whole antithetic pairs (an even number of members), splitting slices only when one pair's
leaf is larger, and rows only when one pair's slice is; it is one block, the whole leaf, whenever that fits, so a small
leaf is computed exactly as it was without blocks (the same arrays, the same calls, the same bits).

Low-rank noise is kept as factors (A (m, *stack, a, r), B (m, *stack, b, r)): a block's A B^T is formed from the
block's rows of A, and sums over the members (the gradient's estimate and its bound) are one matmul of the factors
(`weighted_sum`), never a (m, *shape) array.
"""
from __future__ import annotations

import math
from typing import Callable, NamedTuple

import numpy as np

from spec.tree import Leaf

BLOCK_ENTRIES = 2 ** 24      # entries per block: 128 MiB per float64 array of it


class Block(NamedTuple):
    """Members, slices (flat over the stack) and rows (the slice's first axis) of one leaf's noise grid."""

    members: slice
    slices: slice
    rows: slice


def grid(leaf: Leaf) -> tuple[int, int, int]:
    """(slices S, rows R, entries per row) of one member's perturbation of the leaf (an N-D mm slice: its declared
    matrix's rows and columns)."""
    shape = leaf.matrix or leaf.slice_shape or (1,)
    return leaf.n_slices, shape[0], math.prod(shape[1:])


def whole(leaf: Leaf, m: int) -> Block:
    S, R, _ = grid(leaf)
    return Block(slice(0, m), slice(0, S), slice(0, R))


def _steps(n: int, step: int) -> list[slice]:
    return [slice(i, min(i + step, n)) for i in range(0, n, step)]


def blocks(leaf: Leaf, m: int, budget: int | None = None) -> list[Block]:
    """Blocks covering all m members' perturbation of the leaf, each of at most `budget` entries (or one pair's single
    row where even that is larger); members in whole pairs, the first block first. One block when the leaf fits."""
    budget = BLOCK_ENTRIES if budget is None else budget
    S, R, per_row = grid(leaf)
    per_member = S * R * per_row
    if m * per_member <= budget:
        return [whole(leaf, m)]
    pair = min(2, m)
    if pair * per_member <= budget:
        step = max(pair, budget // per_member // pair * pair)
        return [Block(ms, slice(0, S), slice(0, R)) for ms in _steps(m, step)]
    if pair * R * per_row <= budget:
        s_step = max(1, budget // (pair * R * per_row))
        return [Block(ms, ss, slice(0, R)) for ms in _steps(m, pair) for ss in _steps(S, s_step)]
    r_step = max(1, budget // (pair * per_row))
    return [Block(ms, slice(s, s + 1), rs) for ms in _steps(m, pair) for s in range(S) for rs in _steps(R, r_step)]


def head(leaf: Leaf, m: int, budget: int | None = None) -> Block:
    """All m members, and the leading slices and rows that fit in `budget` (at least one row): what a failure's
    diagnosis looks at (pairings need every member); the whole leaf when it fits."""
    budget = BLOCK_ENTRIES if budget is None else budget
    S, R, per_row = grid(leaf)
    if m * S * R * per_row <= budget:
        return whole(leaf, m)
    if m * R * per_row <= budget:
        return Block(slice(0, m), slice(0, budget // (m * R * per_row)), slice(0, R))
    return Block(slice(0, m), slice(0, 1), slice(0, max(1, budget // (m * per_row))))


def probe(leaf: Leaf, m: int) -> Block:
    """The first row of the first slice of the first pair: a cheap first look before comparing whole blocks."""
    return Block(slice(0, min(2, m)), slice(0, 1), slice(0, 1))


# ----------------------------------------------------------------------------- arrays on the grid
def grouped(leaf: Leaf, x: np.ndarray) -> np.ndarray:
    """(m, *stack, *rest) -> (m, S, *rest) (a view; a scalar slice gets a unit row axis; an N-D mm slice at its
    stored shape its declared matrix (a, b), row-major, as the factors' rows and columns index it)."""
    rest = x.shape[1 + len(leaf.stack_shape):]
    if leaf.matrix is not None and tuple(rest) == leaf.slice_shape:
        rest = leaf.matrix
    return x.reshape(x.shape[0], leaf.n_slices, *(rest or (1,)))


def take(leaf: Leaf, x: np.ndarray, block: Block, rows: bool = True) -> np.ndarray:
    """A block of an array laid out (m, *stack, R, ...): (members, slices, rows, ...); rows=False keeps every row (B
    of a low-rank leaf, whose rows are the slice's columns)."""
    g = grouped(leaf, x)[block.members, block.slices]
    return g[:, :, block.rows] if rows else g


def dense_block(leaf: Leaf, value, block: Block | None = None, dtype=None) -> np.ndarray:
    """A block of the members' perturbation from protocol noise ((A, B): the block's rows of A times B^T; or eps):
    (members, slices, rows, *rest), in the noise's dtype or `dtype` (the block's factors converted before their
    product: float64 gives each r-term sum rounded once); block None: the whole leaf at its stored shape
    (m, *leaf.shape)."""
    first = value[0] if isinstance(value, tuple) else value
    blk = whole(leaf, first.shape[0]) if block is None else block
    cast = (lambda t: t) if dtype is None else (lambda t: t.astype(dtype))      # noqa: E731
    if isinstance(value, tuple):
        A, B = value
        out = cast(take(leaf, A, blk)) @ np.swapaxes(cast(take(leaf, B, blk, rows=False)), -1, -2)
    else:
        out = cast(take(leaf, np.asarray(value), blk))
    return out.reshape((out.shape[0],) + leaf.shape) if block is None else out


def same(a, b, block: Block, leaf: Leaf) -> bool:
    """Whether two protocol noises hold bit-equal values (factors or eps) in the block: then any perturbation formed
    from them alike is equal, and any two float32 formings are within 2 gamma_r |A||B|^T of each other."""
    if isinstance(a, tuple) != isinstance(b, tuple):
        return False
    if isinstance(a, tuple):
        return np.array_equal(take(leaf, a[0], block), take(leaf, b[0], block)) and \
            np.array_equal(take(leaf, a[1], block, rows=False), take(leaf, b[1], block, rows=False))
    return np.array_equal(take(leaf, a, block), take(leaf, b, block))


def mirrored(value, block: Block, leaf: Leaf) -> bool:
    """Whether member 2k + 1's noise is member 2k's negated bit for bit in the block (A or eps negated and B equal,
    or B negated): then E_2k + E_2k+1 is exactly 0 in any arithmetic that rounds symmetrically."""
    if not isinstance(value, tuple):
        e = take(leaf, value, block)
        return np.array_equal(e[1::2], -e[0::2])
    A, B = take(leaf, value[0], block), take(leaf, value[1], block, rows=False)
    return (np.array_equal(A[1::2], -A[0::2]) and np.array_equal(B[1::2], B[0::2])) or \
        (np.array_equal(A[1::2], A[0::2]) and np.array_equal(B[1::2], -B[0::2]))


def worst_over(leaf: Leaf, m: int, skip: Callable[[Block], bool], value: Callable[[Block], float],
               budget: int | None = None) -> tuple[float, int, int]:
    """(max of value(block) over the leaf's blocks, blocks evaluated, blocks): a block after the first for which
    skip(block) holds is not evaluated (the caller has shown its value cannot exceed the bound there); the first
    block always is, so a one-block leaf is computed in full."""
    budget = BLOCK_ENTRIES if budget is None else budget
    worst, done, every = -math.inf, 0, blocks(leaf, m, budget)
    for i, blk in enumerate(every):
        if i and skip(blk):
            continue
        worst, done = max(worst, value(blk)), done + 1
    return worst, done, len(every)


def equal_dense(leaf: Leaf, m: int, a, b, dtype=np.float64) -> bool:
    """Whether two protocol noises give bit-equal perturbations (np.array_equal of dense_block in `dtype`), without
    forming them where that is settled sooner: bit-equal values give equal products; a first row that differs
    answers at once; else block by block."""
    if all(same(a, b, blk, leaf) for blk in blocks(leaf, m)):
        return True
    first = probe(leaf, m)
    if not np.array_equal(dense_block(leaf, a, first, dtype), dense_block(leaf, b, first, dtype)):
        return False
    return all(np.array_equal(dense_block(leaf, a, blk, dtype), dense_block(leaf, b, blk, dtype))
               for blk in blocks(leaf, m))


def slice_rows(leaf: Leaf, m: int, s: int, budget: int | None = None) -> list[Block]:
    """Blocks of slice s alone, all m members, split by rows to fit `budget` (the same rows for every s)."""
    budget = BLOCK_ENTRIES if budget is None else budget
    _, R, per_row = grid(leaf)
    return [Block(slice(0, m), slice(s, s + 1), rs) for rs in _steps(R, max(1, budget // (m * per_row)))]


def identical_slices(leaf: Leaf, value, dtype=np.float64) -> tuple[int, int]:
    """(pairs of slices whose perturbation is the same for every member, pairs compared) of a stacked leaf's
    protocol noise, as np.array_equal of the dense slices in `dtype`: first rows compared first (slices that differ
    differ there almost always), then bit-equal factors, then the slices block by block."""
    m = (value[0] if isinstance(value, tuple) else value).shape[0]
    S = leaf.n_slices
    first = [dense_block(leaf, value, Block(slice(0, m), slice(s, s + 1), slice(0, 1)), dtype) for s in range(S)]

    def equal(i: int, j: int) -> bool:
        if not np.array_equal(first[i], first[j]):
            return False
        bi, bj = slice_rows(leaf, m, i), slice_rows(leaf, m, j)
        if isinstance(value, tuple) and np.array_equal(grouped(leaf, value[0])[:, i], grouped(leaf, value[0])[:, j]) \
                and np.array_equal(grouped(leaf, value[1])[:, i], grouped(leaf, value[1])[:, j]):
            return True
        return all(np.array_equal(dense_block(leaf, value, x, dtype), dense_block(leaf, value, y, dtype))
                   for x, y in zip(bi, bj))
    pairs = [(i, j) for i in range(S) for j in range(i + 1, S)]
    return sum(equal(i, j) for i, j in pairs), len(pairs)


def skipped_words(done: int, every: int) -> str:
    """'' when every block was compared, else how many were, and why the others need not be."""
    if done == every:
        return ""
    return (f"; {done} of {every} blocks of {BLOCK_ENTRIES:,} entries formed, the others' values bit-equal on both "
            f"sides (within the bound by construction)")


# ----------------------------------------------------------------------------- sums over the members, as factors
class Magnitude(NamedTuple):
    """|noise| of every member of one leaf, float64: low-rank as factors (|A| (m, *stack, a, r), |B| (m, *stack, b,
    r)), so that |A||B|^T is never formed for all members at once; else |eps| (m, *shape) (B None)."""

    A: np.ndarray
    B: np.ndarray | None = None


def magnitude_of(value) -> Magnitude:
    """The Magnitude of protocol noise ((A, B) or eps), in float64."""
    if isinstance(value, tuple):
        return Magnitude(*(np.abs(np.asarray(v, np.float64)) for v in value))
    return Magnitude(np.abs(np.asarray(value, np.float64)))


def magnitude_block(leaf: Leaf, mag: Magnitude, block: Block | None = None) -> np.ndarray:
    """|A||B|^T (or |eps|) of one block, float64: dense_block of the magnitude's factors."""
    return dense_block(leaf, (mag.A, mag.B) if mag.B is not None else mag.A, block)


def weighted_sum(leaf: Leaf, value, w: np.ndarray) -> np.ndarray:
    """sum_n w_n E_n at the leaf's shape, float64, for protocol noise or a Magnitude (w (m,)): low-rank as one matmul
    of the factors, (S, a, m r) @ (S, m r, b), the sum over members and rank columns together; eps as
    np.tensordot."""
    if isinstance(value, Magnitude):
        value = (value.A, value.B) if value.B is not None else value.A
    w = np.asarray(w, np.float64)
    if not isinstance(value, tuple):
        return np.tensordot(w, np.asarray(value, np.float64), axes=1)
    A, B = (grouped(leaf, np.asarray(v, np.float64)) for v in value)          # (m, S, a, r), (m, S, b, r)
    m, S, a, r = A.shape
    wa = np.moveaxis(A * w.reshape(m, 1, 1, 1), 0, 2).reshape(S, a, m * r)
    bt = np.moveaxis(B, 0, 2).reshape(S, B.shape[2], m * r)
    return (wa @ np.swapaxes(bt, -1, -2)).reshape(leaf.shape)


def mean_abs(leaf: Leaf, mag: Magnitude, w: np.ndarray) -> np.ndarray:
    """mean_n w_n |noise_n| at the leaf's shape (w (m,) >= 0): what the gradients' float32 bounds scale with; eps
    leaves as np.mean of the weighted magnitudes (the members' axis reduced in order), low-rank ones as
    weighted_sum / m."""
    if mag.B is None:
        return np.mean(np.asarray(w, np.float64).reshape((-1,) + (1,) * (mag.A.ndim - 1)) * mag.A, 0)
    return weighted_sum(leaf, mag, w) / mag.A.shape[0]


def flat_max(fn: Callable[..., np.ndarray], *arrays) -> float:
    """max of fn(*chunks) over the arrays' entries taken BLOCK_ENTRIES at a time (the arrays flattened, all of one
    size): an elementwise fn's float64 temporaries stay a block's, and each entry's value is the one fn gives on the
    whole arrays."""
    flat = [np.asarray(a).reshape(-1) for a in arrays]
    return max(float(np.max(fn(*(f[c] for f in flat)))) for c in chunks(flat[0].size))


def chunks(n: int, budget: int | None = None) -> list[slice]:
    """Ranges covering [0, n) of at most `budget` each (one when n fits)."""
    budget = BLOCK_ENTRIES if budget is None else budget
    return _steps(n, max(budget, 1))


# ----------------------------------------------------------------------------- an N-D slice's matricization
def axis_names(n: int) -> tuple[str, ...]:
    """A slice's axes by name: a conv weight's (out, in, kh, kw), else axis 0, axis 1, ..."""
    return ("out", "in", "kh", "kw") if n == 4 else ("out", "in", "kd", "kh", "kw") if n == 5 else \
        tuple(f"axis {k}" for k in range(n))


def matricization_words(slice_shape: tuple[int, ...], matrix: tuple[int, int], perm: tuple[int, ...]) -> str:
    """How a port that lays the declared matrix over the slice's axes in the order `perm` reads, against the
    declared row-major one."""
    names = axis_names(len(slice_shape))
    said = ", ".join(names[k] for k in perm)
    return (f"its perturbation is A B^T matricized in another order: the port lays the {matrix[0]} x {matrix[1]} "
            f"matrix over the stored axes as ({said}), the tree declares the row-major ({', '.join(names)}) "
            f"(W.reshape{matrix}, im2col's order): reshape A B^T to {slice_shape} directly, or declare the weight in "
            f"the port's order")


def matricizations(slice_shape: tuple[int, ...]) -> list[tuple[int, ...]]:
    """The orders a port may lay an N-D slice's matrix over its axes in, other than row-major: every permutation of
    the slice's axes, those that keep the leading (out) axis first before the others (the likelier mistakes: (in,
    kw, kh), channels last (kh, kw, in))."""
    import itertools
    n = len(slice_shape)
    perms = [p for p in itertools.permutations(range(n)) if p != tuple(range(n))]
    return sorted(perms, key=lambda p: (p[0] != 0, p))


def laid_out(M: np.ndarray, slice_shape: tuple[int, ...], perm: tuple[int, ...]) -> np.ndarray:
    """The matrix M (*lead, a, b) laid over the slice's axes in the order `perm`, at the stored layout (*lead,
    *slice_shape): what a port that reshapes A B^T to the permuted shape and transposes back perturbs with."""
    lead = M.shape[:-2]
    shape = tuple(slice_shape[k] for k in perm)
    return np.ascontiguousarray(np.moveaxis(M.reshape(lead + shape), [len(lead) + i for i in range(len(perm))],
                                            [len(lead) + k for k in perm]))


def other_order(leaf: Leaf, port: np.ndarray, ref: np.ndarray) -> str:
    """Words for a port's array at an N-D mm leaf's stored shape (a gradient, an update) that is the reference's
    matrix laid over the slice's axes in another order (within 1e-5 of its largest entry), else ''."""
    if leaf.matrix is None or leaf.scan_axes:
        return ""
    p, r = np.asarray(port, np.float64), np.asarray(ref, np.float64).reshape(leaf.matrix)
    tol = 1e-5 * max(float(np.max(np.abs(r))), 1e-30)
    for perm in matricizations(leaf.slice_shape):
        if float(np.max(np.abs(p - laid_out(r, leaf.slice_shape, perm)))) <= tol:
            return matricization_words(leaf.slice_shape, leaf.matrix, perm).replace("its perturbation is A B^T",
                                                                                    "is the reference's")
    return ""
