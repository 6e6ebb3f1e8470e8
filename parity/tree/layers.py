"""Each layer's product as the model calls it (`--task tree`, a port whose adapter exposes its torch `module`).

The products check feeds perturbed_mm and perturbed_tmm inputs the suite makes, and never knows which leaf it tests.
Where the port's population forward runs an nn.Module whose named_parameters are the tree's paths
(parity.tree.torch_module gives one), forward hooks on the module that owns each mm and tmm leaf capture every call's
input x and output y during a population forward of SUBSET members (fresh parameters, the port's own noise, its
batch), whatever the input's rank (2-D, 3-D, 4-D) and wherever the members are: the leading axis, folded into the
batch member-major or batch-major, or another axis of their size. Each call must give, per member i,

    y_i = x_i (W + A_i B_i^T)^T + b + eps_i        (tmm, stored (in, out): x_i (W + A_i B_i^T) + b + eps_i)

with b the owner's bias leaf (eps_i its noise, where the port perturbs it), within gamma_{in + r + 2} times the same
expression in absolute values: the product's longest float32 chain (x B, then A^T, then the sum: in + r + 1
roundings, as parity.core.tolerances.linear_bound) and the bias's addition; forming W + A B^T first is within it too
(gamma_r |A||B|^T, one rounding of the sum, then gamma_in). A layer that fails is named with its leaf and input shape
and, where one of these reproduces it within the same bound, how: the low-rank term left out, member 0's input in
every member's base product, x and B summed over the input separately (an einsum's index), the low-rank term at
another scale. A module that does not compute x W^T + b of its input with every perturbation zero is not a plain
linear layer and is not judged here (the forward check judges it); one never called is reported as such.
An N-D mm leaf owned by an nn.Conv2d (one group, zero padding) is judged as the mm of its declared matrix (out, in *
kh * kw) on im2col's patches of the hooked input (F.unfold: a patch's entries in (in, kh, kw) order, the row-major
order the matrix declares), its output's pixels as rows: y_i = conv2d(x_i, W + (A_i B_i^T).reshape(W.shape)) + b
within the same bound (in = in * kh * kw). Any other owner of an N-D leaf is skipped, saying so.

"""
from __future__ import annotations

from typing import Callable, NamedTuple

import numpy as np

from parity.core.tolerances import gamma
from parity.tree.base import Row
from parity.tree.blocks import laid_out, matricization_words, matricizations
from parity.tree.forward import SUBSET, forward_params, named_scales, restrict, take
from parity.tree.hooks import capturing, conv2d_of, im2col, module_of, owner_name, population


# ----------------------------------------------------------------------------- one layer's calls
class Layout(NamedTuple):
    """Where the members sit in a layer's input: words for the report, and (array, m) -> (m, rows, features)."""

    words: str
    gather: Callable


def layouts(shape: tuple[int, ...], m: int) -> list[Layout]:
    """The ways the members may sit in an input of `shape`: leading, folded into the batch (member-major or
    batch-major), or on another axis of size m."""
    out = []
    if shape[0] == m:
        out.append(Layout("the members on the leading axis", lambda a: a.reshape(m, -1, a.shape[-1])))
    elif shape[0] % m == 0:
        out.append(Layout("the members folded into the batch", lambda a: a.reshape(m, -1, a.shape[-1])))
        out.append(Layout("the members folded into the batch, batch-major",
                          lambda a: np.moveaxis(a.reshape(a.shape[0] // m, m, *a.shape[1:]), 1, 0)
                          .reshape(m, -1, a.shape[-1])))
    for axis in range(1, len(shape) - 1):
        if shape[axis] == m:
            out.append(Layout(f"the members on axis {axis}",
                              lambda a, axis=axis: np.moveaxis(a, axis, 0).reshape(m, -1, a.shape[-1])))
    return out


class Layer(NamedTuple):
    """One mm/tmm leaf's layer: W as stored, its noise (A, B) or None, its bias per member (m, 1, out) with and
    without the bias's noise."""

    path: str
    cls: str
    W: np.ndarray
    A: np.ndarray | None
    B: np.ndarray | None
    bias: np.ndarray
    bias_plain: np.ndarray
    slice_shape: tuple[int, ...] = ()      # an N-D mm leaf's stored slice (W, A, B are its declared matrix's)

    def parts(self, xm: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(x W^T or x W, the low-rank term, gamma_{in + r + 2}'s magnitude) for xm (m, rows, in)."""
        base = xm @ (self.W.T if self.cls == "mm" else self.W)
        ax, aw = np.abs(xm), np.abs(self.W.T if self.cls == "mm" else self.W)
        magnitude = ax @ aw + np.abs(self.bias)
        if self.A is None:
            return base, np.zeros_like(base), gamma(xm.shape[-1] + 2) * magnitude
        inner, outer = (self.B, self.A) if self.cls == "mm" else (self.A, self.B)     # x @ inner @ outer^T
        low = (xm @ inner) @ np.swapaxes(outer, -1, -2)
        magnitude = magnitude + (ax @ np.abs(inner)) @ np.swapaxes(np.abs(outer), -1, -2)
        return base, low, gamma(xm.shape[-1] + inner.shape[-1] + 2) * magnitude

    def summed(self, xm: np.ndarray) -> np.ndarray:
        """The low-rank term with x and the input-side factor summed over the input apart: (x 1)(1^T inner) outer^T."""
        inner, outer = (self.B, self.A) if self.cls == "mm" else (self.A, self.B)
        return (xm.sum(-1, keepdims=True) * inner.sum(1)[:, None, :]) @ np.swapaxes(outer, -1, -2)


def _ratio(y: np.ndarray, want: np.ndarray, bound: np.ndarray) -> float:
    return float(np.max(np.abs(y - want) / np.maximum(bound, 1e-300))) if y.size else 0.0


def gathered(layer: Layer, x: np.ndarray, y: np.ndarray, m: int):
    """For each layout the members may have in x and y: (layout, xm, ym, x W^T, the low-rank term, the bound), all
    (m, rows, features)."""
    for lay in layouts(x.shape, m):
        try:
            xm, ym = lay.gather(x), lay.gather(y)
        except ValueError:
            continue
        base, low, bound = layer.parts(xm)
        if ym.shape == base.shape:
            yield lay, xm, ym, base, low, bound


def _judged(layer: Layer, x: np.ndarray, y: np.ndarray, m: int) -> tuple[float, Layout | None]:
    """(the best ratio over the member layouts, that layout)."""
    return min(((_ratio(ym, base + low + layer.bias, bound), lay) for lay, _, ym, base, low, bound in
                gathered(layer, x, y, m)), key=lambda t: t[0], default=(np.inf, None))


def diagnosis(layer: Layer, x: np.ndarray, y: np.ndarray, m: int, scales: dict[str, float]) -> str:
    """How a layer's output departs from x (W + A B^T)^T + b: the first known mistake that reproduces it within the
    bound under some layout of the members, else that it differs."""
    for _, xm, ym, base, low, bound in gathered(layer, x, y, m):
        found = _mistake(layer, xm, ym, base, low, bound, scales)
        if found:
            return found
    form = "x (W + A B^T)^T" if layer.cls == "mm" else "x (W + A B^T)"
    return f"differs from {form} + b per member"


def _mistake(layer: Layer, xm, ym, base, low, bound, scales: dict[str, float]) -> str:
    """The known mistake that reproduces ym within bound, or ''."""
    if layer.A is not None:
        for bias in (layer.bias, layer.bias_plain):
            if _ratio(ym, base + bias, bound) <= 1:
                return "leaves out the low-rank term A B^T"
        if _ratio(ym, np.broadcast_to(base[:1], base.shape) + low + layer.bias, bound) <= 1:
            return ("uses member 0's input for every member in its base product x W^T (the members' own inputs reach "
                    "only the low-rank term)")
        if _ratio(ym, base + layer.summed(xm) + layer.bias, bound) <= 1:
            return ("sums x and the input-side factor over the input separately (an einsum naming their input index "
                    "differently): (x 1)(1^T B) A^T, the all-ones direction")
        d, lr = (ym - base - layer.bias).ravel(), low.ravel()
        c = float(d @ lr / max(float(lr @ lr), 1e-300))
        for name, v in scales.items():
            if abs(c / v - 1) < 0.1 and _ratio(ym, base + v * low + layer.bias, bound) <= 1:
                return f"applies the low-rank term at {name} times its scale ({v:.6g}x)"
        if layer.slice_shape:
            M = layer.A @ np.swapaxes(layer.B, -1, -2)                                  # (m, a, b)
            for perm in matricizations(layer.slice_shape):
                E = laid_out(M, layer.slice_shape, perm).reshape(M.shape)
                if _ratio(ym, base + xm @ np.swapaxes(E, -1, -2) + layer.bias, bound) <= 1:
                    return matricization_words(layer.slice_shape, M.shape[1:], perm).replace("its perturbation is",
                                                                                              "perturbs with")
        rank = solved_rank(xm, ym - base - layer.bias)
        r = layer.A.shape[-1]
        if rank is not None and rank > r:
            return (f"perturbs the weight at rank {rank} (of at most {min(layer.W.shape)}), not the rank {r} of "
                    f"A_i B_i^T: a full-rank perturbation in place of the low-rank one (member 0's perturbation solved "
                    f"from its calls' inputs and outputs)")
    return ""


def solved_rank(xm: np.ndarray, d: np.ndarray) -> int | None:
    """The rank of member 0's perturbation D (in, out) solved from d = x D by least squares (x (rows, in), d (rows,
    out), rows >= in): the singular values above 1e-3 of the largest (a normal matrix's spread its singular values
    within a factor of a few, float32 rounding leaves them below 1e-5); None when the rows cannot determine D."""
    x, y = xm[0], d[0]
    if x.shape[0] < x.shape[1] or np.linalg.matrix_rank(x) < x.shape[1]:
        return None
    D = np.linalg.lstsq(x, y, rcond=None)[0]
    sv = np.linalg.svd(D, compute_uv=False)
    return int(np.sum(sv > 1e-3 * sv[0])) if sv.size and sv[0] > 0 else None


def check_layers(side, cfg, seed: int) -> list[Row]:
    """Rows of the products check for each mm/tmm leaf as the model calls it (the module's docstring); [] for a port
    without a torch module or a population forward (the synthetic products stand alone)."""
    module = module_of(side)
    if module is None or not side.port.has("population_forward"):
        return []
    rng = np.random.default_rng([seed, 24])
    params = forward_params(side, cfg, seed)
    members = rng.choice(cfg.pop, size=min(SUBSET, cfg.pop), replace=False)
    noise = take(side.port.noise(seed, 0, np.arange(cfg.pop), cfg.pop, cfg.sigma, cfg.rank), members)
    batch = side.port.batch(int(rng.integers(0, 2 ** 31)))
    m = len(members)
    leaves = [leaf for leaf in cfg.tree.of_class("mm", "tmm") if owner_name(module, leaf.path) is not None]
    owners = {leaf.path: owner_name(module, leaf.path) for leaf in leaves}
    zero = restrict(noise, [])
    captured = {}
    for label, given in (("noise", noise), ("zero", zero)):
        with capturing(module, owners.values()) as calls:
            population(side, params, given, batch)
        captured[label] = calls
    scales, rows = named_scales(cfg), []
    for leaf in leaves:
        layer = _layer(cfg.tree, leaf, owners[leaf.path], params, noise, m)
        plain_layer = _layer(cfg.tree, leaf, owners[leaf.path], params, zero, m)
        calls, zero_calls = ([c for c in captured[k] if c[0] == owners[leaf.path]] for k in ("noise", "zero"))
        if leaf.matrix is not None:
            conv = module.get_submodule(owners[leaf.path]) if owners[leaf.path] else module
            why = conv_unjudged(leaf, conv)
            if why:
                rows.append(Row("products", f"{leaf.path} (mm through its matrix {leaf.matrix}) as the model calls "
                                            f"it", float("nan"), "-", "skip", why))
                continue
            calls, zero_calls = (as_matrix_calls(conv, c) for c in (calls, zero_calls))
        rows.append(_layer_row(layer, plain_layer, calls, zero_calls, m, scales))
    return rows


def conv_unjudged(leaf, owner) -> str:
    """Why an N-D mm leaf's layer cannot be judged as the mm of its matrix on im2col patches ('' when it can: an
    nn.Conv2d, one group, zero padding, its weight's matrix (out, in * kh * kw))."""
    conv = conv2d_of(owner)
    if conv is None:
        return (f"{leaf.path}: its owner is a {type(owner).__name__}, not an nn.Conv2d, so its input's matrix (im2col "
                f"patches) is not known here; the forward check judges it")
    if conv.groups != 1 or conv.padding_mode != "zeros" or isinstance(conv.padding, str):
        return (f"{leaf.path}: its nn.Conv2d has groups {conv.groups}, padding {conv.padding!r} "
                f"({conv.padding_mode}); the layer check forms patches for one group and numeric zero padding; the "
                f"forward check judges it")
    if leaf.scan_axes or leaf.matrix != (conv.out_channels, int(np.prod(leaf.slice_shape[1:]))):
        return f"{leaf.path}: matrix {leaf.matrix} is not its conv's (out, in * kh * kw); the forward check judges it"
    return ""


def as_matrix_calls(conv, calls: list) -> list:
    """A conv's calls (name, x (n, in, H, W), y (n, out, H', W')) as an mm's: (name, im2col patches (n, L, in kh kw)
    in the row-major (in, kh, kw) order of its weight's matrix, y (n, L, out)); a call that is no plain 4-D tensor
    kept as (name, None, None)."""
    out = []
    for name, x, y in calls:
        if x is None or x.ndim != 4 or y is None or y.ndim != 4:
            out.append((name, None, None))
            continue
        out.append((name, im2col(conv, x), np.moveaxis(y, 1, -1).reshape(y.shape[0], -1, y.shape[1])))
    return out


def _layer(tree, leaf, owner: str, params: dict, noise: dict, m: int) -> Layer:
    bias_path = f"{owner}.bias" if owner else "bias"
    out = leaf.shape[0] if leaf.cls == "mm" else leaf.shape[1]
    b = np.asarray(params[bias_path], np.float64) if bias_path in params else np.zeros(out)
    eps = np.asarray(noise[bias_path], np.float64) if bias_path in noise else np.zeros((m, out))
    A, B = (np.asarray(t, np.float64) for t in noise[leaf.path]) if leaf.path in noise else (None, None)
    if A is not None and not np.any(A):
        A = B = None
    W = np.asarray(params[leaf.path], np.float64)
    W = W if leaf.matrix is None else W.reshape(leaf.matrix)                       # an N-D slice: its declared matrix
    return Layer(leaf.path, leaf.cls, W, A, B,
                 (b + eps)[:, None, :], np.broadcast_to(b, (m, 1, out)), leaf.slice_shape if leaf.matrix else ())


def _layer_row(layer: Layer, plain_layer: Layer, calls: list, zero_calls: list, m: int, scales) -> Row:
    """One leaf's row: the worst of its calls, or a skip saying why it cannot be judged as a layer."""
    q = f"{layer.path} ({layer.cls}) as the model calls it"
    if not calls or all(x is None for _, x, _ in calls):
        return Row("products", q, float("nan"), "-", "skip",
                   f"{layer.path}: its module was never called with a plain tensor during the population forward "
                   f"(the model computes with the weight some other way, or under vmap), so its product as the model "
                   f"calls it is not seen; the forward check judges the result")
    for _, x, y in zero_calls:
        if x is not None and _judged(plain_layer, x, y, m)[0] > 1:
            return Row("products", q, float("nan"), "-", "skip",
                       f"{layer.path}: its module does not compute x W^T + b of its input even with every "
                       f"perturbation zero (input {x.shape}): not a plain linear layer; the forward check judges it")
    worst = max(((_judged(layer, x, y, m), x, y) for _, x, y in calls if x is not None), key=lambda t: t[0][0])
    (ratio, lay), x, y = worst
    shape = f"input {tuple(x.shape)}, {x.ndim}-D" + (f", {lay.words}" if lay is not None else "")
    if lay is None:
        return Row("products", f"{q} (input {tuple(x.shape)})", float("nan"), "-", "skip",
                   f"{layer.path}: no axis of its input {tuple(x.shape)} holds the {m} members")
    ok = ratio <= 1
    why = "" if ok else f"{layer.path}: the layer as the model calls it {diagnosis(layer, x, y, m, scales)}"
    return Row("products", f"{q} ({shape}), {len(calls)} call(s): max |y - x (W + A_i B_i^T)^T - b| / bound", ratio,
               "<= 1 (gamma_{in + r + 2} |x| (|W| + |A||B|^T) + |b|)", "pass" if ok else "fail", why)
