"""`python -m parity check --task lm`: the torch tree ES against the JAX reference on the byte-level LM, leaf by
leaf and class by class, with each tree drift named in the knob table's words (spec.tree_knobs). `--task tree`: the
same checks and bounds on a port's own declared tree (cfg a spec.tree.TreeRun; _tree_plan): init on the laws the port
states (parity.tree.dist.check_init_laws), every mm/tmm leaf's product with rows (batch, seq) as a transformer layer's, one
more fitness vector of tiny spread, the forward reported as the port's own, the trajectory as the port's es_* loop on
synthetic fitness (parity/tree/lockstep.py); failures also name the MLP suite's knobs (pairing, fitness, optimizer up to
a gradient scale: parity.core.optscale) and the noise and gradient scales.

Two modes. A side that draws JAX's numbers (rng=jax, or a port with jax_compatible_rng True) is checked draw by draw
(below). A side on its own generator (`--torch rng=torch`, or jax_compatible_rng False: most real torch ports) is
checked in distribution (parity/tree/dist.py, whose docstring states each test, bound and alpha): init and noise
against their laws (exact KS and chi-square at init's, noise's and trajectory's shares of the false-alarm budget,
6.5e-4 per run in all) and exact structure (antithetic pairs, one key per stacked slice, fresh noise per epoch,
leaves the reference never perturbs unperturbed); gradients, forward and the lockstep trajectory with the reference
run on the side's own noise, within this module's bounds. products, fitness and updates are draw-free and the same
in both modes. `stack_keys`, `frozen_leaves`, `embedding` and `group_fitness` are named in both; `tmm_layout` and
`leaf_order` only relabel i.i.d. draws, so in distribution the report says they cannot be seen (a skipped row each).

Checks (rng=jax: the sides share keys, so draws are compared element by element):
- init: every leaf equal (exact; both draw JAX's normals and scale in float32 alike).
- noise: every leaf and stacked slice, at two epochs (noise_reuse 1: a fresh generation each). Low-rank leaves are
  compared as each member's A B^T at the stored shape: both sides form it from the same factors, so they may differ
  by at most 2 gamma_r |A||B|^T (one float32 product of r terms per side, Higham's bound); param leaves exactly. A
  leaf one side perturbs and the other does not names `embedding` or `frozen_leaves`; a difference that matches the
  reference's draw with shared slice keys, declaration-order keys or a transposed tmm split names `stack_keys`,
  `leaf_order` or `tmm_layout`. The comparison runs block by block (parity/tree/blocks.py: at most BLOCK_ENTRIES
  entries of the members' perturbation at once; one block, the whole leaf, when it fits); a block after the first
  where the side's factors (or eps) equal the reference's bit for bit is within the bound by construction (each
  side's float32 product of the same factors is within gamma_r |A||B|^T of the exact one) and is not formed: the row
  then says how many blocks were, and its value is their worst (for a large faithful leaf, its first block's).
- fitness: fresh random fitness vectors with groups, against the sum of both sides' float32 shaping bounds; a side
  that differs is named by what differs (parity/tree/shaping.py: the epsilon's place and value, ddof, centring only,
  groups ignored, ranks, each group by its own spread: `group_fitness`).
- gradients: per leaf on the same shaped fitness, each side with its own noise (skipped for leaves whose noise
  already differs), within both sides' einsum bounds (gamma_{N r + 3} sum |f||A||B|^T / N per side, the sum over the
  members one matmul of |A| and |B|: parity.tree.blocks.mean_abs); frozen, embedding and excluded leaves must be
  exactly zero. A failing leaf is diagnosed as in distribution (parity.tree.base.gradient_texts): the port's gradient
  fitted to the reference's, c = <p, r> / <r, r>, is "the same direction" when |p - c r| stays within c times this
  bound plus the scaling's own rounding (parity.core.optscale.fit_leaf), and c is then named in sigma, N and r, or
  the leaf said to be clipped at a norm (a round one, or one several leaves share).
- products: mm (x @ W.T + (x @ B) @ A.T) and tmm (x @ W + (x @ A) @ B.T) at the LM's slice shapes and three more
  (wide, tall, square), fresh W, factors and inputs, against the expression's float64 value within one side's float32
  bound (parity.core.tolerances.linear_bound, gamma_{in + r + 1}); the reference's jitted product is held to it too.
- updates: one optax-sgd step from fresh params on the side's own gradient, against the reference's apply_grads on
  that gradient, within base.leaf_step_bound (the step added once or in up to N per-member adds, both sides) plus
  lr sqrt(N) x the gradient's bound; on zero fitness the params must come back bit for bit (an in-place perturb and
  restore drifts them by rounding, named so); leaves the reference never updates must come back bit for bit
  (an updated param or embedding leaf names `frozen_leaves` or `embedding`).
- trajectory: TRAJECTORY_EPOCHS training epochs on the corpus in lockstep (each from the reference's params): scores,
  shaped fitness, per-leaf gradients and new params, each stage's bound derived from the one before (see
  check_trajectory); skipped when the noise or the forward already departs.
- forward: the members' scores and every intermediate on the reference's params and each side's own noise. Bound:
  64 float32 ulps of each intermediate's scale (max |entry| per member). Why 64: each block applies about ten
  correctly rounded or few-ulp operations per entry (XLA rewrites the norm's x / sqrt(m) as x * rsqrt(m), and exp,
  log and the sigmoid differ by a few ulps between XLA and torch), and the score sums T terms; measured agreement is
  within 11 ulps at every size here, and any drift of the noise or the math moves entries by sigma-sized amounts,
  orders above the bound. The first intermediate beyond it, in the forward's order (spec.lm.intermediate_names),
  names the block and leaf where the sides part; after noise that already differs (draw by draw), a forward that
  departs with noise on only restates the noise check's cause (forward_after_noise).

A reference on TF32 (its platform's default precision on NVIDIA GPUs of compute capability >= 8.0, or gpu-sim: each
matmul operand rounded to 10 mantissa bits, u = 2^-11) is held to its own bounds: products with_operands(gamma_{in + r
+ 1}, 4, u) (x and B, then x @ B and A), gradients with_operands(gamma_{N r + 3}, 2, u) on its side (the einsum's f A
and B), the port keeping its float32 bound. The forward and the trajectory have no closed-form bound (FORWARD_ULPS is
a measured allowance), so there the reference's own rounding is measured exactly: the same call on the reference
pinned to float32 (--reference-precision highest), and the port may differ from the TF32 reference by its float32
allowance plus |reference - reference at float32| (the triangle inequality); that gap itself is a row, within
FORWARD_ULPS of TF32's ulps (2^-10) of each intermediate's scale. A replayed TF32 bundle cannot be evaluated at
float32, so those two checks are skipped there with the reason. The port is never blamed for the reference's rounding.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Callable, NamedTuple, Sequence

import numpy as np

from parity.core import diagnose
from parity.core.plan import Check, run_plan
from parity.core.tolerances import U32, U_TF32, gamma, linear_bound, linear_exact, with_operands
from parity.tree import dist as D
from parity.tree import lockstep
from parity.tree.base import (EPOCHS, IN_PLACE, Row, cause, fitness_text, float32_of, fresh_params, gradient_roundings,
                              leaf_step_bound, merged_causes, noise_excess, noise_mean, pairing_text,
                              ref_perturbs, ref_u, reference_magnitude, reference_update, shaping_pair_bound,
                              step_texts, unchanged_cause, with_gradient_causes, zero_step_row)
from parity.tree import blocks as B
from spec.lm import LM_PRESETS, LMConfig, intermediate_leaf, intermediate_names, lm_tree
from spec.platform import ReferencePlatform
from spec.tree import slice_index
from spec.tree_knobs import TreeKnobs

FORWARD_ULPS = 64
PRODUCT_MEMBERS, PRODUCT_BATCH = 3, 5
EXTRA_PRODUCT_SHAPES = ((5, 7), (33, 17), (12, 12))   # beside the LM's own slices: wide, tall and square
TREE_PRODUCT_ROWS = (2, 3)      # a declared tree's products: (batch, seq) rows per member, as a transformer layer's
PRODUCT_SLICES = 3              # slices of a stacked leaf fed to the products check (first, middle, last)
TRAJECTORY_EPOCHS = 2
# The checks in the order run() runs them (LM_PLAN, TREE_PLAN): what the pytest plugin parametrizes its items over.
CHECKS = ("init", "noise", "products", "fitness", "gradients", "updates", "forward", "trajectory")


def no_witness(*args, **kwargs) -> None:
    """The default witness: no repro collected (parity.core.repro.Collector.witness when the CLI writes repros)."""


# ----------------------------------------------------------------------------- checks
def other_normals(R):
    """The reference on the other backend's normals (R.on_other_normals()), or None (a bundle, a missing table)."""
    flip = getattr(R, "on_other_normals", None)
    return flip() if callable(flip) else None


def backend_cause(R, detail: str) -> str:
    """knob rng: the side draws the other backend's normals of the reference's bits."""
    from spec.platform import backend_sentence
    platform = R.platform
    other = "cpu" if platform.normals == "gpu" else "gpu"
    return cause("rng", f"{backend_sentence(other, platform)}; {detail}")


def check_init(R, side, cfg, seed, witness=no_witness) -> list[Row]:
    ref, port = R.init(cfg, seed), side.init(seed)
    rows, seen = [], {}
    for path in cfg.tree.paths:
        witness(f"seed {seed} {path}", port, port[path], ref[path], 0.0, "exact: the same keys and float32 scaling",
                (path,))
        diff = float(np.max(np.abs(ref[path] - port[path])))
        why = "" if diff == 0 else _init_cause(R, cfg, seed, path, port, seen)
        rows.append(Row("init", f"{path}: max |port - ref|", diff, "== 0 (same keys, same float32 scaling)",
                        "pass" if diff == 0 else "fail", why))
    return rows


def _init_cause(R, cfg, seed, path: str, port: dict, seen: dict) -> str:
    """knob rng when the side's init of `path` is the reference's on the other backend's normals, else 'init
    differs'; `seen` keeps that other init once drawn."""
    if "other" not in seen:
        other = other_normals(R)
        seen["other"] = None if other is None else other.init(cfg, seed)
    if seen["other"] is not None and np.array_equal(seen["other"][path], port[path]):
        return backend_cause(R, f"{path}'s init equals the reference's on those normals")
    return "init differs"


def _noise_cause(R, cfg, seed, epoch, leaf, port, block) -> str:
    """Why a leaf's noise differs, from one block of it (parity.tree.blocks.head: every member, the whole leaf when
    it fits): port is the side's perturbation there, compared with the reference's drifted draws there."""
    other = other_normals(R)
    if other is not None:                      # the same draws through the other backend's float32 normal
        alt = other.dense_noise(cfg, seed, epoch, leaf, block=block)
        bound = 0.0 if leaf.cls == "param" else \
            2 * gamma(cfg.rank) * R.factors_abs_product(cfg, seed, epoch, leaf, block=block)
        if np.all(np.abs(port.astype(np.float64) - alt) <= bound):
            return backend_cause(R, f"{leaf.path}'s noise equals the reference's draw on those normals")
    for variant, knob, detail in (
            ("shared", "stack_keys", "every slice of the stack drawn from the leaf's own key (the layers share noise)"),
            ("insertion", "leaf_order", "the leaf's key index is its place in declaration order, not JAX's "
                                        "flatten order"),
            ("tmm_transposed", "tmm_layout", "the (in, out) weight was transposed and factored as an mm")):
        if variant == "shared" and not leaf.scan_axes or variant == "tmm_transposed" and leaf.cls != "tmm":
            continue
        alt = R.dense_noise(cfg, seed, epoch, leaf, variant, block=block)
        if np.allclose(alt, port, rtol=0, atol=1e-6 * max(1.0, float(np.abs(alt).max()))):
            return cause(knob, f"{leaf.path}'s noise equals the reference's draw when {detail}")
    ref = R.dense_noise(cfg, seed, epoch, leaf, block=block)
    return pairing_text(leaf, port) or scale_text(leaf, port, ref, cfg) or \
        f"{leaf.path}: noise differs and matches no known tree drift (rng or key scheme)"


def scale_text(leaf, port: np.ndarray, ref: np.ndarray, cfg) -> str:
    """'noise scaling differs' when the port's noise is the reference's times one factor c != 1 (named when it is
    sqrt(r), 1/sqrt(r), sigma or 1/sigma), else ''."""
    p, r = np.asarray(port, np.float64).ravel(), np.asarray(ref, np.float64).ravel()
    c = float(p @ r / max(float(r @ r), 1e-300))
    if not (np.allclose(p, c * r, rtol=1e-4, atol=1e-6 * float(np.abs(p).max() + 1e-300)) and abs(c - 1) > 1e-3):
        return ""
    names = {"sqrt(r)": math.sqrt(cfg.rank), "1/sqrt(r)": 1 / math.sqrt(cfg.rank), "sigma": cfg.sigma,
             "1/sigma": 1 / cfg.sigma}
    named = [n for n, v in names.items() if abs(c / v - 1) < 1e-3]
    return (f"noise scaling differs: {leaf.path}'s noise is {c:.6g} x the reference's" +
            (f" (= {named[0]}: sigma/sqrt(r) on A is the reference's, r={cfg.rank}, sigma={cfg.sigma:g})" if named
             else " (the same draws at another scale)"))


def check_noise(R, side, cfg, seed) -> tuple[list[Row], set[str]]:
    """Every leaf's noise at EPOCHS against the reference's draws, block by block (parity.tree.blocks: members,
    slices and rows of at most BLOCK_ENTRIES entries; one block, the whole leaf, when it fits)."""
    rows, parted = [], set()
    for epoch in EPOCHS:
        for leaf in cfg.tree.leaves:
            value = side.leaf_noise(seed, epoch, leaf)
            q = f"{leaf.path} ({leaf.cls}) epoch {epoch}"
            if not ref_perturbs(cfg, leaf):
                worst = 0.0 if value is None else max(float(np.abs(side.dense_noise(seed, epoch, leaf, blk)).max())
                                                      for blk in B.blocks(leaf, cfg.pop))
                ok = worst == 0
                why = ""
                if not ok:
                    knob = "embedding" if leaf.cls == "embedding" else "frozen_leaves"
                    why = cause(knob, f"{leaf.path} is perturbed (max |noise| {worst:.3g}); the reference "
                                      f"leaves {leaf.cls} leaves" + (" under freeze_nonlora" if leaf.cls == "param" else "")
                                      + " unperturbed")
                    parted.add(leaf.path)
                rows.append(Row("noise", f"{q}: max |noise|", worst, "== 0 (not perturbed)", "pass" if ok else "fail",
                                why))
                continue
            if value is None:
                parted.add(leaf.path)
                rows.append(Row("noise", f"{q}: perturbed", 0.0, "perturbed as the reference", "fail",
                                f"{leaf.path} is not perturbed; the reference perturbs {leaf.cls} leaves"))
                continue
            worst, done, every = noise_excess(R, cfg, seed, epoch, leaf, value,
                                              lambda blk: side.dense_noise(seed, epoch, leaf, blk))
            ok = worst <= 0
            why = ""
            if not ok:
                parted.add(leaf.path)
                head = B.head(leaf, cfg.pop)
                why = _noise_cause(R, cfg, seed, epoch, leaf, side.dense_noise(seed, epoch, leaf, head), head)
            rows.append(Row("noise", f"{q}: max (|port - ref| - bound)", worst,
                            "<= 0 (2 gamma_r |A||B|^T; param leaves exact)" + B.skipped_words(done, every),
                            "pass" if ok else "fail", why))
    return rows, parted


def fitness_trials(cfg, rng, spread_rng=None) -> list[tuple[str, np.ndarray]]:
    """(label, f (pop,) float32): three fresh fitness vectors with group offsets; with spread_rng (the tree task)
    one more of tiny spread (variance about 1e-6, where the reference's + 1e-5 inside the root dominates, so a
    shaping by the plain standard deviation shows)."""
    g = cfg.group_size
    out = [(f"trial {trial}, groups of {g}",
            (rng.standard_normal(cfg.pop) * 2.0 + rng.standard_normal(cfg.pop // (g or cfg.pop)).repeat(g or cfg.pop)
             * 3.0).astype(np.float32)) for trial in range(3)]
    if spread_rng is not None:
        out.append((f"tiny spread (variance ~1e-6), groups of {g}",
                    (1e-3 * spread_rng.standard_normal(cfg.pop)).astype(np.float32)))
    return out


def check_fitness(R, side, cfg, rng, witness=no_witness, spread_rng=None) -> list[Row]:
    rows = []
    g = cfg.group_size
    for label, f in fitness_trials(cfg, rng, spread_rng):
        ref, port = R.shape(cfg, f), side.shape(f)
        bound = shaping_pair_bound(f, g)
        witness(label, port, port, ref, bound, "both sides' float32 shaping bounds")
        ratio = float(np.max(np.abs(port.astype(np.float64) - ref) / bound))
        ok = ratio <= 1
        rows.append(Row("fitness", f"{label}: max |port - ref| / bound", ratio,
                        "<= 1 (both sides' float32 shaping bounds)", "pass" if ok else "fail",
                        "" if ok else fitness_text(f, port, g, side.shape)))
    return rows


def check_gradients(R, side, cfg, seed, rng, parted: set[str], witness=no_witness) -> list[Row]:
    shaped = R.shape(cfg, rng.standard_normal(cfg.pop).astype(np.float32))
    u = ref_u(R)
    ref, port = R.grads(cfg, seed, 0, shaped), side.grads(seed, 0, shaped)
    rows, failing = [], []
    for leaf in cfg.tree.leaves:
        q = f"{leaf.path} ({leaf.cls}): max |port - ref|"
        if leaf.path in parted:
            rows.append(Row("gradients", q, float("nan"), "-", "skip", f"{leaf.path}'s noise already differs"))
            continue
        diff = np.abs(port[leaf.path].astype(np.float64) - ref[leaf.path])
        if not ref_perturbs(cfg, leaf):
            witness(f"{leaf.path} ({leaf.cls})", port, port[leaf.path], np.zeros(leaf.shape), 0.0,
                    "exact: the reference never updates this leaf", (leaf.path,))
            ok = not np.any(port[leaf.path])
            rows.append(Row("gradients", q, float(diff.max()), "== 0 (no update)", "pass" if ok else "fail",
                            "" if ok else f"{leaf.path} gets an update the reference never gives it"))
            continue
        w = np.abs(shaped).astype(np.float64)                                  # |f_n|
        if leaf.cls == "param":     # mean_n f_n eps_n: N products and sums, one rounding each, both sides
            bound = 2 * gamma(cfg.pop + 2) * B.mean_abs(leaf, reference_magnitude(R, cfg, seed, 0, leaf), w)
        else:                       # einsum over N members and r columns, then / N: gamma_{N r + 3} per side
            g = gamma(cfg.pop * cfg.rank + 3)                           # the reference's with TF32 operands if any
            bound = (g + with_operands(g, 2, u)) * B.mean_abs(leaf, reference_magnitude(R, cfg, seed, 0, leaf), w)
        witness(f"{leaf.path} ({leaf.cls})", port, port[leaf.path], ref[leaf.path], bound,
                "both sides' float32 einsum/mean bounds", (leaf.path,))
        ratio = float(np.max(diff / np.maximum(bound, 1e-30)))
        ok = ratio <= 1
        rows.append(Row("gradients", f"{leaf.path} ({leaf.cls}): max |port - ref| / bound", ratio,
                        "<= 1 (both sides' float32 einsum/mean bounds)", "pass" if ok else "fail"))
        failing += [] if ok else [(leaf, port[leaf.path], ref[leaf.path], bound)]
    return with_gradient_causes(cfg, rows, failing)


def forward_row(cfg: LMConfig, ri: dict, pi: dict, label: str, gap: dict | None = None) -> Row:
    """One forward comparison: every intermediate within FORWARD_ULPS ulps of its per-member scale (beyond `gap`,
    the reference's own TF32 rounding per element, where it has one); the first beyond it, in the forward's order,
    names the block and leaf where the sides part."""
    first = None
    gap = gap or {}
    for name in intermediate_names(cfg.layers):     # the forward's order (jit hands the dict back sorted)
        if name not in ri or name not in pi:
            continue
        r, p = ri[name].astype(np.float64), pi[name].astype(np.float64)
        scale = np.max(np.abs(r).reshape(r.shape[0], -1), axis=1).reshape((-1,) + (1,) * (r.ndim - 1))
        ulps = float(np.max((np.abs(p - r) - gap.get(name, 0.0)) / (np.maximum(scale, 1e-30) * 2 * U32)))
        if ulps > FORWARD_ULPS and first is None:
            first = (name, ulps)
    worst = max(float(np.max((np.abs(pi[n].astype(np.float64) - ri[n]) - gap.get(n, 0.0)) /
                             (np.maximum(np.max(np.abs(ri[n])), 1e-30) * 2 * U32))) for n in ri if n in pi)
    why = ""
    if first is not None:
        leaf, block = intermediate_leaf(first[0])
        where = f"block {block}, leaf {leaf}" if block is not None else f"leaf {leaf}"
        why = f"the forward first departs at {first[0]} ({where}): {first[1]:.3g} ulps of its scale"
    allowed = f"<= {FORWARD_ULPS}" + (" beyond the reference's own TF32 rounding" if gap else "")
    return Row("forward", f"{label}: max ulps of an intermediate's scale", worst, allowed,
               "pass" if first is None else "fail", why)


def gap_of(ri: dict, r32: dict) -> dict:
    """|reference - the reference at float32| per intermediate, float64: its own TF32 rounding, measured."""
    return {k: np.abs(ri[k].astype(np.float64) - r32[k]) for k in ri if k in r32}


def tf32_row(cfg: LMConfig, ri: dict, gap: dict, label: str, platform) -> Row:
    """The reference's own TF32 departure from its float32 evaluation, in TF32 ulps (2^-10) of each intermediate's
    per-member scale, within FORWARD_ULPS (the float32 allowance's count, at TF32's unit)."""
    worst = 0.0
    for name in ri:
        r = ri[name].astype(np.float64)
        scale = np.max(np.abs(r).reshape(r.shape[0], -1), axis=1).reshape((-1,) + (1,) * (r.ndim - 1))
        worst = max(worst, float(np.max(gap[name] / (np.maximum(scale, 1e-30) * 2 * U_TF32))))
    ok = worst <= FORWARD_ULPS
    return Row("forward", f"{label}: the reference's own TF32 rounding, max TF32 ulps of an intermediate's scale",
               worst, f"<= {FORWARD_ULPS} ({platform.precision_words()})", "pass" if ok else "fail",
               "" if ok else f"the reference's platform, not the port: its forward departs from its own float32 "
                             f"evaluation by {worst:.3g} TF32 ulps ({platform.where()})")


def check_forward(R, side, cfg, seed, rng, with_noise: bool = True, noisy_reference=None,
                  noisy_reference32=None) -> list[Row]:
    """The members' scores and intermediates on fresh params, noise off and (with_noise) on: each side its own
    noise (rng=jax: the same draws), or, given noisy_reference(params, tokens), the reference on the side's noise.
    A TF32 reference is also evaluated at float32 (R.float32(), noisy_reference32) and its gap allowed for."""
    from rollout.corpus import load_corpus, member_tokens, train_windows
    corpus = load_corpus(seq_len=cfg.seq_len)
    tokens = member_tokens(train_windows(corpus, seed, 0, cfg.n_streams, cfg.seq_len), cfg.pop, cfg.group_size)
    params = fresh_params(R, cfg, seed, rng)                           # fresh values, not the init's constants
    R32 = float32_of(R) if ref_u(R) else None
    rows = []
    for noise in (False, True) if with_noise else (False,):
        _, pi = side.scores(seed, params, 0, tokens, noise)
        if noise and noisy_reference is not None:
            _, ri = noisy_reference(params, tokens)
            r32 = None if R32 is None else noisy_reference32(params, tokens)[1]
            label = "noise on (the port's own; the reference's forward on it)"
        else:
            _, ri = R.scores(cfg, seed, params, 0, tokens, noise)
            r32 = None if R32 is None else R32.scores(cfg, seed, params, 0, tokens, noise)[1]
            label = f"noise {'on (each side its own)' if noise else 'off'}"
        gap = None if r32 is None else gap_of(ri, r32)
        rows.append(forward_row(cfg, ri, pi, label, gap))
        if gap is not None:
            rows.append(tf32_row(cfg, ri, gap, label, R.platform))
    return rows


class ProductCase(NamedTuple):
    """One product the products check feeds both sides: a label, the form (mm, tmm), the stored slice (a, b) and the
    input's row axes between the members and the features."""

    label: str
    form: str
    shape: tuple[int, int]
    rows: tuple[int, ...]


def slices_shown(leaf) -> list[tuple[int, ...]]:
    """The slices of a stacked leaf the products check feeds: all of them up to PRODUCT_SLICES, else that many
    spread over the stack from the first to the last ([()] for an unstacked leaf)."""
    every = slice_index(leaf)
    if len(every) <= PRODUCT_SLICES:
        return every
    return [every[round(i * (len(every) - 1) / (PRODUCT_SLICES - 1))] for i in range(PRODUCT_SLICES)]


def matrix_words(leaf) -> str:
    """', the matrix of the stored (8, 3, 3, 3)' for an N-D mm leaf (its product is the mm of its matrix), else ''."""
    return f", the matrix of the stored {leaf.slice_shape}" if leaf.matrix is not None else ""


def product_cases(cfg) -> list[ProductCase]:
    """The LM (--task lm): its slice shapes and three more (wide, tall, square), rows (batch,). A declared tree
    (--task tree): every mm and tmm leaf at its class and slice shape (an N-D mm leaf at its declared matrix: a conv
    is the mm of its matrix on im2col's patches), stacked slices included, rows (batch, seq) as a transformer layer
    sees them."""
    if not isinstance(cfg, LMConfig):
        return [ProductCase(f"{leaf.path}{list(idx) if idx else ''} ({leaf.cls} {leaf.factor_dims[0]}x"
                            f"{leaf.factor_dims[1]}{matrix_words(leaf)})", leaf.cls, leaf.factor_dims,
                            TREE_PRODUCT_ROWS)
                for leaf in cfg.tree.of_class("mm", "tmm") for idx in slices_shown(leaf)]
    cases = list(dict.fromkeys((leaf.cls, leaf.slice_shape) for leaf in lm_tree(cfg).of_class("mm", "tmm")))
    cases += [(form, s) for form in ("mm", "tmm") for s in EXTRA_PRODUCT_SHAPES if (form, s) not in cases]
    return [ProductCase(f"{form} {a}x{b}", form, (a, b), (PRODUCT_BATCH,)) for form, (a, b) in cases]


def check_products(R, side, cfg, rng, witness=no_witness) -> list[Row]:
    """mm and tmm on fresh W, factors and inputs, against the float64 value of the reference's expression, within
    one side's float32 bound (linear_bound: gamma_{in + r + 1} of the expression in absolute values); the
    reference's own jitted product is held to the same bound, so the bound is shown to be met by the reference."""
    rows = []
    m, r = PRODUCT_MEMBERS, cfg.rank
    for case in product_cases(cfg):
        (a, b), form = case.shape, case.form
        W = (rng.standard_normal((a, b)) / math.sqrt(b)).astype(np.float32)
        A = (rng.standard_normal((m, a, r)) * 0.3).astype(np.float32)
        B = rng.standard_normal((m, b, r)).astype(np.float32)
        x = rng.standard_normal((m, *case.rows, b if form == "mm" else a)).astype(np.float32)
        rows.append(_product_row(R, side, case, (W, A, B, x), witness))
    return rows


def _product_row(R, side, case: ProductCase, inputs, witness) -> Row:
    """One product compared: the input's rows flattened to (m, n, in) for the bound and the reference, the port fed
    them as the case has them."""
    (W, A, B, x), form, (a, b) = inputs, case.form, case.shape
    m, n = x.shape[0], math.prod(case.rows)
    x3 = x.reshape(m, n, x.shape[-1])
    # tmm x @ W + (x @ A) @ B^T is linear_exact's x @ V^T + (x @ B') @ A'^T with V = W^T, A' = B, B' = A
    args = (W, A, B, x3) if form == "mm" else (W.T, B, A, x3)
    exact, bound = linear_exact(*args), np.maximum(linear_bound(*args), 1e-30)
    given = side.products(W, A, B, x, form)
    shaped = given.reshape(exact.shape)
    witness(case.label, given, given, exact.reshape(given.shape), bound.reshape(given.shape),
            "one side's float32 bound of the expression, against its float64 value (linear_bound)")
    port = shaped.astype(np.float64)
    ref_bound = np.maximum(linear_bound(*args, u_operand=ref_u(R)), 1e-30)      # TF32 operands, where it has them
    ref_ratio = float(np.max(np.abs(R.product(W, A, B, x3, form) - exact) / ref_bound))
    ratio = float(np.max(np.abs(port - exact) / bound))
    ok = ratio <= 1 and ref_ratio <= 1
    why = ""
    if not ok:
        plain = x3.astype(np.float64) @ (W.T if form == "mm" else W).astype(np.float64)
        swapped = (linear_exact(W.T, A, B, x3) if form == "tmm" and a == b else None)
        if ref_ratio > 1 and ratio <= 1:
            platform = getattr(R, "platform", ReferencePlatform())
            why = (f"the reference's platform, not the port: the reference's own {form} product is "
                   f"{ref_ratio:.3g}x its {'TF32' if platform.tf32 else 'float32'} bound ({platform.where()}, "
                   f"{platform.precision_words()}); the port is within its float32 bound")
        elif ref_ratio > 1:
            why = f"the reference's own product exceeds the bound ({ref_ratio:.3g}): the bound is wrong"
        elif np.allclose(port, plain, rtol=1e-4, atol=1e-5):
            why = f"the {form} product leaves out the low-rank term A B^T"
        elif swapped is not None and np.allclose(port, swapped, rtol=1e-4, atol=1e-5):
            why = cause("tmm_layout", "the (in, out) weight's product uses its factors as an mm's: "
                                      "x @ W + (x @ B) @ A^T")
        else:
            why = f"the perturbed {form} product differs from " + \
                  ("x @ (W + A B^T)^T" if form == "mm" else "x @ (W + A B^T)")
    return Row("products", f"{case.label}, {m} members x {' x '.join(map(str, case.rows))} rows: "
                           f"max |port - exact| / bound", ratio,
               "<= 1 (gamma_{in + r + 1} |x| (|W| + |A||B|^T))", "pass" if ok else "fail", why)


def check_updates(R, side, cfg, seed, rng, witness=no_witness) -> list[Row]:
    """One step from the same params: the side's new params against the reference's optax-sgd step on the side's
    own gradient (so only the step is judged), within base.leaf_step_bound (parity.core.tolerances.step_bound: the
    step added once or in up to N per-member adds into the weights, on the side's own noise magnitude) plus lr
    sqrt(N) x the gradient's einsum bound (the side's g against the exact step); leaves the reference never updates
    must come back bit for bit. A second call on zero fitness must give the params back bit for bit
    (base.zero_step_row: rounding-sized moves name an in-place perturb-and-restore, and then every failing leaf's
    cause says so). A step that differs otherwise is matched against optax's sgd, adam and adamw up to a gradient
    scale (parity.tree.base.step_texts: one scale for the tree, else one per leaf, a leaf clipped at a norm named).
    Each leaf's comparison is witnessed (the port's one update call shows a failure alone)."""
    params = fresh_params(R, cfg, seed, rng)
    shaped = R.shape(cfg, rng.standard_normal(cfg.pop).astype(np.float32))
    new, g = side.update(seed, 0, params, shaped)
    ref = reference_update(R, cfg, params, g)
    step, f_abs = math.sqrt(cfg.pop) * cfg.lr, np.abs(shaped).astype(np.float64)
    mags = {leaf.path: (None if side.leaf_noise(seed, 0, leaf) is None else B.magnitude_of(
        side.leaf_noise(seed, 0, leaf))) for leaf in cfg.tree.leaves if ref_perturbs(cfg, leaf)}
    zero = _zero_update_row(side, cfg, seed, params, mags)
    rows = [zero]
    for leaf in cfg.tree.leaves:
        p = leaf.path
        if not ref_perturbs(cfg, leaf):
            moved = B.flat_max(lambda n, o: np.abs(n.astype(np.float64) - o), new[p], params[p])
            ok = moved == 0
            if not ok:              # the port's one update call shows it: its repro (a leaf-sized comparison)
                witness(f"{p} ({leaf.cls})", new, new[p], params[p], 0.0,
                        "exact: the reference never updates this leaf", (p,))
            rows.append(Row("updates", f"{p} ({leaf.cls}): max |new - old|", moved, "== 0 (not updated)",
                            "pass" if ok else "fail", "" if ok else unchanged_cause(cfg, leaf, "updated")))
            continue
        mag = mags[p]
        bound = leaf_step_bound(cfg, leaf, params[p], ref[p], g[p], mag, f_abs)
        if mag is not None:         # the side's g against the exact step: its einsum bound, times lr sqrt(N)
            bound += step * gamma(gradient_roundings(cfg, leaf)) * noise_mean(leaf, mag, f_abs)
        ratio = B.flat_max(lambda n, x, b: np.abs(n.astype(np.float64) - x) / np.maximum(b, 1e-30),
                           new[p], ref[p], bound)
        if ratio > 1:
            witness(f"{p} ({leaf.cls})", new, new[p], ref[p], bound,
                    "step_bound of optax.sgd(lr) on -(g sqrt(N)) from the same params, g the port's own gradient, "
                    "added once or member by member", (p,))
        ok = ratio <= 1
        rows.append(Row("updates", f"{p} ({leaf.cls}): max |port - ref| / bound", ratio,
                        "<= 1 (step_bound: the step added once or in N adds, both sides, + lr sqrt(N) x the "
                        "gradient's bound)", "pass" if ok else "fail",
                        "" if ok else f"{p}: the step differs from optax.sgd(lr) on -(g sqrt(N)) "
                                      f"(params + lr sqrt(N) g)"))
    failed = [r for r in rows if r.verdict == "fail" and "the step differs" in r.cause]
    if failed:
        updated = [leaf.path for leaf in cfg.tree.leaves if ref_perturbs(cfg, leaf)]
        why = dict.fromkeys(updated, zero.cause) if IN_PLACE in zero.cause else step_texts(
            cfg, *({p: t[p] for p in updated} for t in (params, g, new)), f"{failed[0].value:.3g} x bound")
        rows = [r._replace(cause=f"{r.cause}; {why[r.quantity.split(' (')[0]]}") if r in failed else r for r in rows]
    return rows


def _zero_update_row(side, cfg, seed, params: dict, mags: dict) -> Row:
    """base.zero_step_row of the side's update on zero shaped fitness; skipped where that step is not finite (a step
    divided by the gradient's norm is 0 / 0 there: no zero step to compare)."""
    from parity.core.port import NonFinite
    try:
        after = side.update(seed, 0, params, np.zeros(cfg.pop, np.float32))[0]
    except NonFinite as e:
        return Row("updates", "update: a step on zero fitness (g = 0), entries moved", float("nan"), "== 0", "skip",
                   f"the port's update on zero fitness is not finite ({e}), so it has no zero step to compare")
    return zero_step_row(cfg, "updates", "update", params, after, mags)


def trajectory_gap(ref: dict, ref32: dict | None) -> dict | None:
    """|reference epoch - the same epoch at float32| per stage (scores, shaped, grads, params): a TF32 reference's
    own rounding, measured; None for a float32 reference."""
    if ref32 is None:
        return None
    d = lambda a, b: np.abs(np.asarray(a, np.float64) - np.asarray(b, np.float64))     # noqa: E731
    return {"scores": d(ref["scores"], ref32["scores"]), "shaped": d(ref["shaped"], ref32["shaped"]),
            "grads": {k: d(v, ref32["grads"][k]) for k, v in ref["grads"].items()},
            "params": {k: d(v, ref32["params"][k]) for k, v in ref["params"].items()}}


def _trajectory_fitness(cfg: LMConfig, ref: dict, port: dict, at: str,
                        gap: dict | None = None, shape=None) -> tuple[list[Row], np.ndarray | None]:
    """Rows for the scores and the shaped fitness of one epoch, and the shaped fitness' bound (None: a stage failed);
    gap: the reference's own TF32 rounding per stage (trajectory_gap), added to each allowance; shape: the port's
    shaping, which the cause of a shaped fitness that differs also probes (base.fitness_text)."""
    s_ref = ref["scores"].astype(np.float64)
    s_bound = FORWARD_ULPS * 2 * U32 * np.maximum(np.abs(s_ref), 1e-30) + (0.0 if gap is None else gap["scores"])
    ratio = float(np.max(np.abs(port["scores"] - s_ref) / s_bound))
    plus = "" if gap is None else " + the reference's own TF32 rounding"
    rows = [Row("trajectory", f"{at}: scores, max |port - ref| / bound", ratio,
                f"<= 1 ({FORWARD_ULPS} ulps of |score|{plus})",
                "pass" if ratio <= 1 else "fail",
                "" if ratio <= 1 else "the members' scores differ (see the forward check)")]
    if ratio > 1:
        return rows, None
    D, std = float(np.max(s_bound)), math.sqrt(s_ref.var() + 1e-5)
    f_err = shaping_pair_bound(ref["scores"], cfg.group_size) + \
        ((2 * D + np.abs(ref["shaped"].astype(np.float64)) * D) / (std - D) if std > D else np.inf) + \
        (0.0 if gap is None else gap["shaped"])
    ratio = float(np.max(np.abs(port["shaped"] - ref["shaped"].astype(np.float64)) / f_err))
    why = fitness_text(port["scores"], port["shaped"], cfg.group_size, shape) if ratio > 1 else ""
    rows.append(Row("trajectory", f"{at}: shaped fitness, max |port - ref| / bound", ratio,
                    f"<= 1 (shaping bounds + the scores' bound propagated{plus})", "pass" if ratio <= 1 else "fail",
                    why))
    return rows, (f_err if ratio <= 1 else None)


def _reference_magnitudes(R, cfg, seed, epoch) -> dict:
    """{path: (|noise| per member at the leaf's shape, float32 roundings of its gradient)} of the reference's draws."""
    return {leaf.path: ((np.abs(R.dense_noise(cfg, seed, epoch, leaf)), cfg.pop + 2) if leaf.cls == "param" else
                        (R.factors_abs_product(cfg, seed, epoch, leaf), cfg.pop * cfg.rank + 3))
            for leaf in lm_tree(cfg).leaves if ref_perturbs(cfg, leaf)}


def _trajectory_leaf(cfg, leaf, params, ref, port, f_err, at, mag, n_round, gap=None) -> list[Row]:
    """Rows for one leaf's gradient and new params after a lockstep epoch (unchanged where the reference never
    updates it); mag is |noise| per member (|A||B|^T or |eps|) and n_round its gradient's float32 roundings."""
    p = leaf.path
    if not ref_perturbs(cfg, leaf):
        moved = float(np.max(np.abs(port["params"][p].astype(np.float64) - params[p])))
        ok = moved == 0 and not np.any(port["grads"][p])
        return [Row("trajectory", f"{at}: {p} ({leaf.cls}): max |new - old|", moved, "== 0 (not updated)",
                    "pass" if ok else "fail", "" if ok else unchanged_cause(cfg, leaf, "updated"))]
    if mag is None:
        return [Row("trajectory", f"{at}: {p} ({leaf.cls})", float("nan"), "perturbed as the reference", "fail",
                    f"{p}: the port's training loop (es_ask) does not perturb it; the reference perturbs {leaf.cls} "
                    f"leaves")]
    f_abs = np.abs(ref["shaped"]).astype(np.float64)
    step = math.sqrt(cfg.pop) * cfg.lr
    g_bound = np.mean((2 * gamma(n_round) * f_abs + f_err).reshape((-1,) + (1,) * len(leaf.shape)) * mag, 0) + \
        (0.0 if gap is None else gap["grads"][p])
    g_ratio = float(np.max(np.abs(port["grads"][p] - ref["grads"][p].astype(np.float64)) / np.maximum(g_bound, 1e-30)))
    p_bound = step * g_bound + leaf_step_bound(cfg, leaf, params[p], ref["params"][p], ref["grads"][p], mag,
                                               f_abs + f_err) + (0.0 if gap is None else gap["params"][p])
    p_ratio = float(np.max(np.abs(port["params"][p] - ref["params"][p].astype(np.float64)) /
                           np.maximum(p_bound, 1e-30)))
    plus = "" if gap is None else " + the reference's own TF32 rounding"
    return [Row("trajectory", f"{at}: {p} ({leaf.cls}) {what}, max |port - ref| / bound", r, f"<= 1 ({allowed}{plus})",
                "pass" if r <= 1 else "fail", "" if r <= 1 else f"{p}: the {what} after a training epoch differs")
            for what, r, allowed in (("gradient", g_ratio, "both sides' einsum bounds + shaped error x |noise|"),
                                     ("params", p_ratio, "lr sqrt(N) x the gradient's bound + step_bound"))]


def check_trajectory(R, side, cfg, seed, parted: set[str], step=None) -> list[Row]:
    """TRAJECTORY_EPOCHS training epochs on the corpus in lockstep (each from the reference's params): scores,
    shaped fitness, per-leaf gradients and new params. Bounds, derived stage by stage: scores FORWARD_ULPS ulps of
    |score| (the forward check's); shaped the float32 shaping bound plus what a score error D propagates,
    (2 D + |shaped| D) / (std - D) (the centred value moves by <= 2 D, the std by <= D); gradients both sides'
    einsum bounds plus mean(|shaped error| |A||B|^T); params lr sqrt(N) times the gradient's bound plus
    base.leaf_step_bound (the step added once or in up to N per-member adds into the weights). A stage beyond its bound ends the check (what follows from it is not judged).

    A TF32 reference's own rounding (each stage against the same epoch at float32, trajectory_gap) is added to every
    allowance.

    step(params, epoch, tokens) -> (reference, port, magnitudes, the reference at float32 or None) replaces the
    default (both sides on their own draws, rng=jax) for the in-distribution mode (parity.tree.dist.trajectory_step:
    the reference on the side's es_ask noise)."""
    from rollout.corpus import load_corpus, member_tokens, train_windows
    corpus = load_corpus(seq_len=cfg.seq_len)
    params = R.init(cfg, seed)
    rows = []
    for epoch in range(TRAJECTORY_EPOCHS):
        tokens = member_tokens(train_windows(corpus, seed, epoch, cfg.n_streams, cfg.seq_len), cfg.pop, cfg.group_size)
        if step is None:
            ref, port = R.epoch_step(cfg, seed, params, epoch, tokens), side.epoch_step(seed, params, epoch, tokens)
            mags = _reference_magnitudes(R, cfg, seed, epoch)
            ref32 = float32_of(R).epoch_step(cfg, seed, params, epoch, tokens) if ref_u(R) else None
        else:
            ref, port, mags, ref32 = step(params, epoch, tokens)
        gap = trajectory_gap(ref, ref32)
        at = f"epoch {epoch}"
        got, f_err = _trajectory_fitness(cfg, ref, port, at, gap, side.shape)
        rows += got
        if f_err is None:
            break
        for leaf in lm_tree(cfg).leaves:
            rows += ([Row("trajectory", f"{at}: {leaf.path}", float("nan"), "-", "skip",
                          f"{leaf.path}'s noise already differs")] if leaf.path in parted else
                     _trajectory_leaf(cfg, leaf, params, ref, port, f_err, at, *mags.get(leaf.path, (None, 0)), gap))
        if any(r.verdict == "fail" for r in rows):
            break
        params = ref["params"]
    return rows


# ----------------------------------------------------------------------------- the run
def forward_after_noise(rows: list[Row], noise_causes) -> list[Row]:
    """The forward's rows, a failing noise-on row given the noise check's causes when the noise-off row passes: each
    side ran on its own draws, so noise that already differs moves the forward too (as the CartPole trajectory
    restates an earlier check's cause); unchanged when the noise passed or the forward departs without noise."""
    if not noise_causes or any(r.verdict == "fail" for r in rows if r.quantity.startswith("noise off")):
        return rows
    follows = "follows from the noise check: " + "; ".join(noise_causes)
    return [r._replace(cause=f"{r.cause}; {follows}" if r.cause else follows) if r.verdict == "fail" else r
            for r in rows]


FOREIGN_FORWARD = ("the model's forward is the port's own, so it is checked against the port's own plain forward: "
                   "each member's population forward against the plain model at theta + E_i (parity/tree/forward.py; "
                   "skipped, saying so, without population_forward, plain_forward and batch)")


@dataclass
class TreeState:
    """What the tree suite's checks share: both sides, the run, the suite's input stream, and what earlier checks
    found (the leaves whose noise parted and the noise check's causes, whether the LM's forward departs), which the
    forward's causes and the lockstep's needs read."""

    R: Any                          # the reference: parity.tree.reference on a platform, or a bundle's replay
    side: Any                       # TorchTree, or a parity.tree.adapter.PortSide
    cfg: Any                        # an LMConfig, or a port's declared spec.tree.TreeRun
    seed: int
    rng: np.random.Generator        # [seed, 20]: products, fitness, gradients and updates draw from it in that order
    exact: bool                     # draws compared element by element (the side draws JAX's numbers), else in law
    repro: Any = None               # a parity.core.repro.Collector, or None
    parted: set[str] = field(default_factory=set)
    noise_causes: list[str] = field(default_factory=list)
    forward_failed: bool = False

    @property
    def witness(self) -> Callable:
        """Told of each element-wise comparison of a port output (parity.core.repro.Collector.witness)."""
        return self.repro.witness if self.repro is not None else no_witness

    @property
    def keep(self) -> Callable | None:
        """Where the forward check's repro evidence goes (parity.core.repro.Collector.keep), or None."""
        return self.repro.keep if self.repro is not None else None


def init_on_declared_laws(s: TreeState) -> list[Row]:
    """--task tree's init: the port's init on the leaves whose law it declares (init_laws), "zeros" and "ones" exactly,
    ("normal", std) in law (KS and chi-square over two seeds; parity.tree.dist.check_init_laws); skipped without."""
    return D.check_init_laws(s.side, s.cfg, s.seed)


def lm_init(s: TreeState) -> list[Row]:
    """The LM's init against the reference's: leaf by leaf exactly (check_init), or in law (parity.tree.dist)."""
    return check_init(s.R, s.side, s.cfg, s.seed, s.witness) if s.exact else D.check_init(s.R, s.side, s.cfg, s.seed)


def noise(s: TreeState) -> list[Row]:
    """The noise check (element by element, or in distribution), keeping which leaves parted and its causes."""
    rows, s.parted = (check_noise if s.exact else D.check_noise)(s.R, s.side, s.cfg, s.seed)
    s.noise_causes = list(dict.fromkeys(r.cause for r in rows if r.verdict == "fail" and r.cause))
    return rows


def lm_products(s: TreeState) -> list[Row]:
    """The LM's products at every mm/tmm leaf and slice (check_products)."""
    return check_products(s.R, s.side, s.cfg, s.rng, s.witness)


def tree_products(s: TreeState) -> list[Row]:
    """A declared tree's products at every leaf, then each layer as the port's model calls it (parity.tree.layers)."""
    from parity.tree import layers
    return check_products(s.R, s.side, s.cfg, s.rng, s.witness) + layers.check_layers(s.side, s.cfg, s.seed)


def lm_fitness(s: TreeState) -> list[Row]:
    """The LM's fitness shaping on the suite's vectors (check_fitness)."""
    return check_fitness(s.R, s.side, s.cfg, s.rng, s.witness)


def tree_fitness(s: TreeState) -> list[Row]:
    """A declared tree's fitness shaping, plus one trial of tiny spread from its own stream ([seed, 21])."""
    return check_fitness(s.R, s.side, s.cfg, s.rng, s.witness, np.random.default_rng([s.seed, 21]))


def gradients(s: TreeState) -> list[Row]:
    """The gradients leaf by leaf, exactly or on the side's own noise (parity.tree.dist); parted leaves skipped."""
    if s.exact:
        return check_gradients(s.R, s.side, s.cfg, s.seed, s.rng, s.parted, s.witness)
    return D.check_gradients(s.R, s.side, s.cfg, s.seed, s.rng, s.parted)


def updates(s: TreeState) -> list[Row]:
    """One update step from known gradients (check_updates)."""
    return check_updates(s.R, s.side, s.cfg, s.seed, s.rng, s.witness)


def lm_forward(s: TreeState) -> list[Row]:
    """The LM's forward against the reference's, noise off and on (in law: the reference on the side's noise, and at
    float32 too on a TF32 reference); a failing noise-on row restates the noise check's causes (forward_after_noise)."""
    noisy = noisy32 = None
    if not s.exact:
        noisy = D.forward_reference(s.R, s.side, s.cfg, s.seed)
        noisy32 = D.forward_reference(float32_of(s.R), s.side, s.cfg, s.seed) if ref_u(s.R) else None
    rows = check_forward(s.R, s.side, s.cfg, s.seed, s.rng, noisy_reference=noisy, noisy_reference32=noisy32)
    rows = forward_after_noise(rows, s.noise_causes if s.exact else ())
    s.forward_failed = any(r.verdict == "fail" for r in rows)
    return rows


def tree_forward(s: TreeState) -> list[Row]:
    """A declared tree's population forward against the port's own plain forward (parity.tree.forward)."""
    from parity.tree import forward
    return forward.check_forward(s.side, s.cfg, s.seed, s.keep)


def lm_trajectory(s: TreeState) -> list[Row]:
    """TRAJECTORY_EPOCHS corpus epochs in lockstep (check_trajectory). In law, the reference steps on the side's
    es_ask noise (parity.tree.dist.trajectory_step), and that noise's own rows follow (its pairs and law: the lockstep
    alone computes everything on it, so a loop drawing at another scale than the port's noise() would otherwise
    pass)."""
    if s.exact:
        return check_trajectory(s.R, s.side, s.cfg, s.seed, s.parted)
    asked: list = []
    rows = check_trajectory(s.R, s.side, s.cfg, s.seed, s.parted, step=D.trajectory_step(s.R, s.side, s.cfg, s.seed,
                                                                                          asked))
    return rows + D.asked_rows(s.cfg, asked)


def tree_trajectory(s: TreeState) -> list[Row]:
    """The port's es_* loop in lockstep on synthetic fitness (parity.tree.lockstep)."""
    return lockstep.check(s.R, s.side, s.cfg, s.seed, s.exact)


def family_plan(init: Check, products, fitness, forward: Check, trajectory: Check) -> tuple[Check, ...]:
    """A tree plan in the suite's order: init, then the noise, products, fitness, gradients and updates (noise,
    gradients and updates the same functions for the LM and a declared tree), then the forward and the trajectory."""
    return (init, Check("noise", (), noise), Check("products", (), products), Check("fitness", (), fitness),
            Check("gradients", (), gradients), Check("updates", ("update",), updates), forward, trajectory)


# The LM's plan (an LMConfig): its own init, forward and corpus trajectory. Products, fitness and updates are
# draw-free in both modes; the others compare draws element by element (exact) or in distribution (parity.tree.dist).
# A need is a method of the side, or an earlier check the lockstep needs the sides to agree on (unmet).
LM_PLAN = family_plan(Check("init", ("init",), lm_init), lm_products, lm_fitness,
                      Check("forward", ("scores",), lm_forward),
                      Check("trajectory", ("epoch_step", "noise", "forward"), lm_trajectory))
# A declared tree's plan (--task tree): init on the laws the port states, noise, products at every leaf and layer,
# fitness (one more trial of tiny spread), gradients, updates, the model's forward against its plain forward, and the
# trajectory as the es_* lockstep on synthetic fitness.
TREE_PLAN = family_plan(Check("init", ("init",), init_on_declared_laws), tree_products, tree_fitness,
                        Check("forward", (), tree_forward),
                        Check("trajectory", ("es", "noise", "forward"), tree_trajectory))


def _plan(state: TreeState) -> tuple[Check, ...]:
    """The checks run() runs on this state, in order: LM_PLAN for the LM (an LMConfig), else TREE_PLAN."""
    return LM_PLAN if isinstance(state.cfg, LMConfig) else TREE_PLAN


NOT_SELECTED = "--checks"       # the need of a check that --checks left out


def unmet(need: str, s: TreeState) -> str:
    """Why a check needing `need` cannot run, or '': the lockstep after the noise or the forward parted, or a method
    the side lacks, or --checks that left it out."""
    if need == NOT_SELECTED:
        return "not selected (--checks)"
    if need == "noise":
        return ("lockstep needs the same noise and forward: the noise of " + ", ".join(sorted(s.parted))
                + " already differs") if s.parted else ""
    if need == "forward":
        return "lockstep needs the same noise and forward: the forward already departs" if s.forward_failed else ""
    if s.side.has(need):
        return ""
    shown = {"scores": "forward", "es": "es_init/es_ask/es_tell/es_params",
             "epoch_step": "epoch_step (forward and es_* or update)"}.get(need, need)
    return f"the port has no {shown}"


def skip_rows(name: str, why: str) -> list[Row]:
    """A skipped check's one row, saying why."""
    return [Row(name, "-", float("nan"), "-", "skip", why)]


def attempt(check: Check, s: TreeState) -> list[Row]:
    """check.run(s); a call the bundle cannot answer skips the check, saying which; the port's NaN or inf where the
    reference's is finite fails it (parity.core.nonfinite's rows), raised on (a protocol break) where it is not the
    port's, or the reference's answer to the same call is non-finite too."""
    from parity.core import nonfinite
    from parity.core.port import NonFinite
    from parity.core.tape import NotRecorded
    try:
        return check.run(s)
    except NotRecorded as err:
        return skip_rows(check.name, f"the bundle cannot answer the reference's `{err.method}` here: {err.why}")
    except NonFinite as err:              # the port's NaN or inf: a failure where the reference's is finite
        ours = err.source is getattr(s.side, "port", None)
        rows = nonfinite.tree_rows(check.name, err, s.R, s.cfg, s.repro, Row) if ours else None
        if rows is None:
            raise err
        return rows


def run(cfg: LMConfig, knobs: TreeKnobs, seed: int, log=print, side=None, repro=None, reference=None,
        platform: ReferencePlatform | None = None, device: str = "cpu", seconds: dict | None = None,
        checks: Sequence[str] | None = None) -> list[Row]:
    """Every check of the LM suite against `side` (default: torch_impl under knobs; else a parity.tree.adapter.PortSide).
    Draws are compared element by element when the side draws JAX's numbers (rng=jax / jax_compatible_rng), else in
    distribution (parity.tree.dist); a check needing a method the side lacks is skipped with the reason. `repro`, a
    parity.core.repro.Collector (its tape on a port's side, see tree_cli), collects each check's failing port call.
    `reference`: the reference's functions (default parity.tree.reference, live JAX; a bundle's replay:
    parity.tree.vectors.replay_reference, or bundle_reference for a bundle folder at this configuration and seed); a
    check needing a call the bundle cannot answer is skipped with the reason. `platform`: where the live reference
    runs (spec.platform; default where JAX runs); `device`: the torch side's device; `seconds`, when given, gets each
    check's time ({check: s}); `checks` (--checks), when given, the checks to run: each other one is a skip row
    saying it was not selected (the lockstep then runs without the noise's or the forward's verdict to stop on)."""
    if reference is None:
        from parity.tree import reference as tree_reference
        reference = tree_reference.on_platform(platform)
    if side is None:
        from parity.tree.torch_side import TorchTree
        side = TorchTree(cfg, knobs, device)
        if repro is not None:
            side = repro.recorded(side)
        exact = knobs.rng != "torch"                 # jax, jax-cpu, jax-gpu: JAX's keys and draws
    else:
        exact = side.port.jax_compatible_rng
    state = TreeState(reference, side, cfg, seed, np.random.default_rng([seed, 20]), exact, repro)
    rows = []
    plan = _plan(state)
    if checks is not None:          # a check left out needs what it cannot have: unmet says so in its skip row
        plan = tuple(c if c.name in checks else c._replace(needs=(NOT_SELECTED,)) for c in plan)
    for ran in run_plan(plan, state, unmet, skip_rows, attempt, repro.start if repro is not None else None):
        got = ran.result
        rows += got
        fails = [r for r in got if r.verdict == "fail"]
        if seconds is not None:
            seconds[ran.name] = ran.seconds
        shown = merged_causes((r.cause for r in fails if r.cause), cfg.tree.paths)[:1]
        log(f"{ran.name:10s} {'FAIL' if fails else 'skip' if all(r.verdict == 'skip' for r in got) else 'pass'}  "
            f"({len(got)} rows, {ran.seconds:.1f} s)" + "".join(f"  {c}" for c in shown))
    return rows


def verdicts(rows: list[Row]) -> list[tuple[str, str, Row]]:
    """(check, verdict, the row its headline shows) per check in run order: fail (its first failing row), skip (every
    row skipped) or pass (its largest value)."""
    out = []
    for c in dict.fromkeys(r.check for r in rows):
        rs = [r for r in rows if r.check == c]
        fails = [r for r in rs if r.verdict == "fail"]
        verdict = "fail" if fails else ("skip" if all(r.verdict == "skip" for r in rs) else "pass")
        out.append((c, verdict, fails[0] if fails else max((r for r in rs if r.value == r.value),
                                                           key=lambda r: r.value, default=rs[0])))
    return out


def sizes() -> dict[str, LMConfig]:
    return {"quick": LM_PRESETS["quick"], "selftest": LM_PRESETS["selftest"]}


# --task tree: the settings a port leaves undeclared, per size (spec.tree.TreeRun's defaults for the rest).
TREE_SIZES: dict[str, dict] = {"quick": {"pop": 16}, "selftest": {"pop": 8}}
