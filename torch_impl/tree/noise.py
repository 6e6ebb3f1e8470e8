"""A population's ES noise for any parameter tree: one batched draw per leaf over draws x slices.

For a leaf's slice key k, draw p (members 2p, 2p+1) and generation g = true_epoch(epoch, noise_reuse), the
reference (EggRoll) draws Z = normal(fold_in(fold_in(k, g), p), (a + b, r)) on the factored slice shape (a, b),
B = Z[:b], A = Z[b:] * (+-sigma / sqrt(r)); a full-rank leaf gets eps * (+-sigma), eps = normal(same key,
slice shape). What each leaf gets is its `LeafRole`, resolved once from the tree and the knobs:
    mm          lowrank on the stored (out, in): forward x @ W.T + (x @ B) @ A.T          (form "mm")
                an N-D leaf (a conv's (out, in, kh, kw)) on its declared matrix (a, b), A B^T reshaped row-major
    tmm         tmm_layout=stored: lowrank on the stored (in, out): x @ W + (x @ A) @ B.T (form "tmm")
                tmm_layout=transposed: factored as the (out, in) mm: B = Z[:in], A = Z[in:] (form "mm")
    param       eps * sigma unless freeze_nonlora (frozen_leaves=perturbed: perturbed anyway)
    embedding   none (embedding=lowrank: lowrank on the (V, d) table as an mm, a = V, b = d; form "emb")
    excluded    none
Tensors are stack-first: (rows, *stack_shape, ...) where stack_shape is the leaf's scanned axes' sizes in scan
order; `dense` puts the axes back where the leaf keeps them.
"""
from __future__ import annotations

import math
from typing import Mapping, NamedTuple

import torch

from spec.tree import Leaf, Tree
from spec.tree_knobs import TreeKnobs
from torch_impl.keys import true_epoch
from torch_impl.tree.keys import TREE_GENERATORS, TreeGenerator, check_sources

SIGNS = (1.0, -1.0)          # members 2p, 2p+1 use draw p with + then - (interleaved antithetic pairs)


class LeafRole(NamedTuple):
    """What the noiser does with one leaf (resolved once from its class and the knobs)."""

    kind: str                      # "lowrank", "param" or "none"
    form: str = ""                 # lowrank: "mm" (x @ B @ A.T), "tmm" (x @ A @ B.T), "emb" (A[x] @ B.T)
    dims: tuple[int, int] = (0, 0)  # lowrank: (a, b) of the factored slice
    transposed: bool = False       # lowrank: the factored (a, b) is the stored slice transposed


def _lowrank(leaf: Leaf, form: str, transposed: bool = False) -> LeafRole:
    a, b = leaf.factor_dims or leaf.slice_shape          # an N-D mm slice: its declared matrix
    return LeafRole("lowrank", form, (b, a) if transposed else (a, b), transposed)


# knob tmm_layout -> role of a tmm leaf
TMM_LAYOUTS = {
    "stored": lambda leaf: _lowrank(leaf, "tmm"),
    "transposed": lambda leaf: _lowrank(leaf, "mm", transposed=True),
}
# knob frozen_leaves -> (freeze_nonlora) -> whether param leaves are frozen
FROZEN_LEAVES = {
    "frozen": lambda freeze_nonlora: bool(freeze_nonlora),
    "perturbed": lambda freeze_nonlora: False,
}
# knob embedding -> role of an embedding leaf
EMBEDDINGS = {
    "frozen": lambda leaf: LeafRole("none"),
    "lowrank": lambda leaf: _lowrank(leaf, "emb"),
}


def leaf_roles(tree: Tree, knobs: TreeKnobs, freeze_nonlora: bool) -> dict[str, LeafRole]:
    """path -> LeafRole for every leaf of the tree under these knobs."""
    frozen = FROZEN_LEAVES[knobs.frozen_leaves](freeze_nonlora)
    by_class = {
        "mm": lambda leaf: _lowrank(leaf, "mm"),
        "tmm": TMM_LAYOUTS[knobs.tmm_layout],
        "param": lambda leaf: LeafRole("none" if frozen else "param"),
        "embedding": EMBEDDINGS[knobs.embedding],
        "excluded": lambda leaf: LeafRole("none"),
    }
    return {leaf.path: by_class[leaf.cls](leaf) for leaf in tree.leaves}


class NoisePlan(NamedTuple):
    """How a tree's noise is drawn: the tree, each leaf's role, the generator (knob rng), population and rank."""

    tree: Tree
    roles: Mapping[str, LeafRole]
    generator: TreeGenerator
    noise_reuse: int
    pop: int
    rank: int


def make_plan(tree: Tree, knobs: TreeKnobs, pop: int, rank: int, noise_reuse: int,
              freeze_nonlora: bool) -> NoisePlan:
    if pop < 2 or pop % 2:
        raise ValueError(f"pop {pop} must be even and >= 2: members pair antithetically (2p, 2p+1)")
    if rank < 1:
        raise ValueError(f"rank must be >= 1 (the number of columns of A and B), got {rank}")
    return NoisePlan(tree, leaf_roles(tree, knobs, freeze_nonlora), TREE_GENERATORS[knobs.rng], noise_reuse, pop,
                     rank)


class TreeNoise(NamedTuple):
    """The population's noise, stack-first. signs (1.0, -1.0): one row per antithetic pair, member 2p + j uses
    row p times signs[j]; signs None: one row per member with its sign already applied.

    A: path -> (rows, *stack, a, r), already times sigma / sqrt(r); B: path -> (rows, *stack, b, r);
    eps: path -> (rows, *stack, *slice_shape), already times sigma. Only the leaves the roles perturb appear.
    """

    A: dict[str, torch.Tensor]
    B: dict[str, torch.Tensor]
    eps: dict[str, torch.Tensor]
    roles: Mapping[str, LeafRole]
    signs: tuple[float, ...] | None = SIGNS


def rows_per_draw(noise: TreeNoise) -> int:
    return 1 if noise.signs is None else len(noise.signs)


def population_of(noise: TreeNoise) -> int | None:
    first = next(iter({**noise.A, **noise.eps}.values()), None)
    return None if first is None else first.shape[0] * rows_per_draw(noise)


def float32_scales(sigma: float, rank: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    """(sigma / sqrt(r), sigma) in float32 as the reference forms them (sqrt(r) rounded, then the quotient)."""
    sigma32 = torch.tensor(sigma, dtype=torch.float32, device=device)
    return sigma32 / torch.sqrt(torch.tensor(float(rank), dtype=torch.float32, device=device)), sigma32


def draw_shape(role: LeafRole, leaf: Leaf, rank: int) -> tuple[int, ...]:
    return (role.dims[0] + role.dims[1], rank) if role.kind == "lowrank" else leaf.slice_shape


def sample(plan: NoisePlan, sources: Mapping[str, object], epoch: int, sigma: float,
           device: str | torch.device = "cpu") -> TreeNoise:
    """Every perturbed leaf's noise at `epoch` for the + member of each pair (one batched draw per leaf)."""
    if epoch < 0:
        raise ValueError(f"epoch must be >= 0, got {epoch}")
    check_sources(plan.tree, sources)
    generation = true_epoch(epoch, plan.noise_reuse)
    a_scale, p_scale = float32_scales(sigma, plan.rank, device)
    A, B, eps = {}, {}, {}
    for leaf in plan.tree.leaves:
        role = plan.roles[leaf.path]
        if role.kind == "none":
            continue
        z = plan.generator.draws(sources[leaf.path], leaf, generation, plan.pop // 2,
                                 draw_shape(role, leaf, plan.rank), device)        # (P, *stack, *draw_shape)
        if role.kind == "lowrank":
            b = role.dims[1]
            B[leaf.path] = z[..., :b, :]
            A[leaf.path] = z[..., b:, :] * a_scale
        else:
            eps[leaf.path] = z * p_scale
    return TreeNoise(A, B, eps, plan.roles, SIGNS)


def _signed(t: torch.Tensor, signs: tuple[float, ...]) -> torch.Tensor:
    """(rows, ...) -> (rows * k, ...): row d k + j is t[d] * signs[j] (exact)."""
    s = torch.tensor(signs, dtype=t.dtype, device=t.device).view(1, len(signs), *([1] * (t.dim() - 1)))
    return (t.unsqueeze(1) * s).flatten(0, 1)


def per_member(noise: TreeNoise) -> TreeNoise:
    """The same noise with one row per member (signs None): what adapters and per-member code read."""
    if noise.signs is None:
        return noise
    k = len(noise.signs)
    return TreeNoise({p: _signed(a, noise.signs) for p, a in noise.A.items()},
                     {p: b.repeat_interleave(k, dim=0) for p, b in noise.B.items()},
                     {p: _signed(e, noise.signs) for p, e in noise.eps.items()}, noise.roles, None)


def from_stack_first(t: torch.Tensor, leaf: Leaf, lead: int = 0) -> torch.Tensor:
    """(*lead, *stack_shape, *slice_shape) -> (*lead, *leaf.shape): the scanned axes back to their places."""
    n_scan = len(leaf.scan_axes)
    rest = iter(range(n_scan, len(leaf.shape)))
    perm = [leaf.scan_axes.index(ax) if ax in leaf.scan_axes else next(rest) for ax in range(len(leaf.shape))]
    return t.permute(*range(lead), *(lead + p for p in perm))


def to_stack_first(t: torch.Tensor, leaf: Leaf, lead: int = 0) -> torch.Tensor:
    """(*lead, *leaf.shape) -> (*lead, *stack_shape, *slice_shape)."""
    rest = [ax for ax in range(len(leaf.shape)) if ax not in leaf.scan_axes]
    return t.permute(*range(lead), *(lead + ax for ax in (*leaf.scan_axes, *rest)))


def lowrank_dense(A: torch.Tensor, B: torch.Tensor, role: LeafRole) -> torch.Tensor:
    """A @ B.T on the factored (a, b), transposed back to the stored slice when the role factored it transposed."""
    d = A @ B.transpose(-1, -2)
    return d.transpose(-1, -2) if role.transposed else d


def unmatrix(t: torch.Tensor, leaf: Leaf) -> torch.Tensor:
    """(*lead, *stack, a, b) -> (*lead, *stack, *slice_shape) for an N-D mm leaf (its matrix reshaped row-major to
    the slice); any other leaf's t unchanged."""
    if leaf.matrix is None:
        return t
    return t.reshape(*t.shape[:t.dim() - 2], *leaf.slice_shape)


def dense(noise: TreeNoise, leaf: Leaf) -> torch.Tensor:
    """Every member's perturbation of one leaf at its stored shape (pop, *leaf.shape); zeros when unperturbed."""
    noise = per_member(noise)
    role = noise.roles[leaf.path]
    if role.kind == "lowrank":
        d = unmatrix(lowrank_dense(noise.A[leaf.path], noise.B[leaf.path], role), leaf)
    elif role.kind == "param":
        d = noise.eps[leaf.path]
    else:
        pop = population_of(noise) or 0
        return torch.zeros(pop, *leaf.shape)
    return from_stack_first(d, leaf, lead=1)


def leaf_count(noise: TreeNoise) -> int:
    return len(noise.A) + len(noise.eps)


def n_draws(pop: int) -> int:
    return math.ceil(pop / 2)
