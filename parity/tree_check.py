"""`python -m parity check --task lm`: the torch tree ES against the JAX reference on the byte-level LM, leaf by
leaf and class by class, with each tree drift named in the knob table's words (spec.tree_knobs).

Checks (rng=jax: the sides share keys, so draws are compared element by element):
- init: every leaf equal (exact; both draw JAX's normals and scale in float32 alike).
- noise: every leaf and stacked slice, at two epochs (noise_reuse 1: a fresh generation each). Low-rank leaves are
  compared as each member's A B^T at the stored shape: both sides form it from the same factors, so they may differ
  by at most 2 gamma_r |A||B|^T (one float32 product of r terms per side, Higham's bound); param leaves exactly. A
  leaf one side perturbs and the other does not names `embedding` or `frozen_leaves`; a difference that matches the
  reference's draw with shared slice keys, declaration-order keys or a transposed tmm split names `stack_keys`,
  `leaf_order` or `tmm_layout`.
- fitness: fresh random fitness vectors with groups, against the sum of both sides' float32 shaping bounds; a side
  that matches each group divided by its own spread names `group_fitness`.
- gradients: per leaf on the same shaped fitness, each side with its own noise (skipped for leaves whose noise
  already differs), within both sides' einsum bounds (gamma_{N r + 3} sum |f||A||B|^T / N per side); frozen, embedding and
  excluded leaves must be exactly zero.
- forward: the members' scores and every intermediate on the reference's params and each side's own noise. Bound:
  64 float32 ulps of each intermediate's scale (max |entry| per member). Why 64: each block applies about ten
  correctly rounded or few-ulp operations per entry (XLA rewrites the norm's x / sqrt(m) as x * rsqrt(m), and exp,
  log and the sigmoid differ by a few ulps between XLA and torch), and the score sums T terms; measured agreement is
  within 11 ulps at every size here, and any drift of the noise or the math moves entries by sigma-sized amounts,
  orders above the bound. The first intermediate beyond it names the block and leaf where the sides part.
"""
from __future__ import annotations

import math
import os
import time
from typing import NamedTuple

import numpy as np

from parity.tolerances import U32, gamma, shaping_bound
from reporting import atomic_write, markdown_table
from spec.lm import LM_PRESETS, LMConfig, intermediate_leaf, lm_tree
from spec.tree_knobs import TREE_DESCRIPTIONS, TreeKnobs

FORWARD_ULPS = 64
EPOCHS = (0, 1)


class Row(NamedTuple):
    check: str
    quantity: str
    value: float
    allowed: str
    verdict: str          # pass | fail | skip
    cause: str = ""


def cause(knob: str, detail: str) -> str:
    return f"{TREE_DESCRIPTIONS[knob]} differs (knob `{knob}`): {detail}"


def _ref_perturbs(cfg: LMConfig, leaf) -> bool:
    return leaf.cls in ("mm", "tmm") or (leaf.cls == "param" and not cfg.freeze_nonlora)


# ----------------------------------------------------------------------------- checks
def check_init(R, side, cfg, seed) -> list[Row]:
    ref, port = R.init(cfg, seed), side.init(seed)
    rows = []
    for path in lm_tree(cfg).paths:
        diff = float(np.max(np.abs(ref[path] - port[path])))
        rows.append(Row("init", f"{path}: max |port - ref|", diff, "== 0 (same keys, same float32 scaling)",
                        "pass" if diff == 0 else "fail", "" if diff == 0 else "init differs"))
    return rows


def _noise_cause(R, cfg, seed, epoch, leaf, port) -> str:
    for variant, knob, detail in (
            ("shared", "stack_keys", "every slice of the stack drawn from the leaf's own key (the layers share noise)"),
            ("insertion", "leaf_order", "the leaf's key index is its place in declaration order, not JAX's "
                                        "flatten order"),
            ("tmm_transposed", "tmm_layout", "the (in, out) weight was transposed and factored as an mm")):
        if variant == "shared" and not leaf.scan_axes or variant == "tmm_transposed" and leaf.cls != "tmm":
            continue
        alt = R.dense_noise(cfg, seed, epoch, leaf, variant)
        if np.allclose(alt, port, rtol=0, atol=1e-6 * max(1.0, float(np.abs(alt).max()))):
            return cause(knob, f"{leaf.path}'s noise equals the reference's draw when {detail}")
    return f"{leaf.path}: noise differs and matches no known tree drift (rng or key scheme)"


def check_noise(R, side, cfg, seed) -> tuple[list[Row], set[str]]:
    rows, parted = [], set()
    for epoch in EPOCHS:
        for leaf in lm_tree(cfg).leaves:
            port = side.dense_noise(seed, epoch, leaf)
            q = f"{leaf.path} ({leaf.cls}) epoch {epoch}"
            if not _ref_perturbs(cfg, leaf):
                ok = port is None or not np.any(port)
                why = ""
                if not ok:
                    knob = "embedding" if leaf.cls == "embedding" else "frozen_leaves"
                    why = cause(knob, f"{leaf.path} is perturbed (max |noise| {np.abs(port).max():.3g}); the reference "
                                      f"leaves {leaf.cls} leaves" + (" under freeze_nonlora" if leaf.cls == "param" else "")
                                      + " unperturbed")
                    parted.add(leaf.path)
                rows.append(Row("noise", f"{q}: max |noise|", 0.0 if port is None else float(np.abs(port).max()),
                                "== 0 (not perturbed)", "pass" if ok else "fail", why))
                continue
            ref = R.dense_noise(cfg, seed, epoch, leaf)
            if port is None:
                parted.add(leaf.path)
                rows.append(Row("noise", f"{q}: perturbed", 0.0, "perturbed as the reference", "fail",
                                f"{leaf.path} is not perturbed; the reference perturbs {leaf.cls} leaves"))
                continue
            bound = 0.0 if leaf.cls == "param" else 2 * gamma(cfg.rank) * R.factors_abs_product(cfg, seed, epoch, leaf)
            excess = np.abs(port.astype(np.float64) - ref) - bound
            worst = float(np.max(excess))
            ok = worst <= 0
            if not ok:
                parted.add(leaf.path)
            rows.append(Row("noise", f"{q}: max (|port - ref| - bound)", worst,
                            "<= 0 (2 gamma_r |A||B|^T; param leaves exact)", "pass" if ok else "fail",
                            "" if ok else _noise_cause(R, cfg, seed, epoch, leaf, port)))
    return rows, parted


def _group_var(f: np.ndarray, g: int) -> np.ndarray:
    x = f.astype(np.float64).reshape(-1, g)
    return ((x - x.mean(1, keepdims=True)) / np.sqrt(x.var(1, keepdims=True) + 1e-5)).ravel()


def check_fitness(R, side, cfg, rng) -> list[Row]:
    rows = []
    g = cfg.group_size
    for trial in range(3):
        f = (rng.standard_normal(cfg.pop) * 2.0 + rng.standard_normal(cfg.pop // g).repeat(g) * 3.0).astype(np.float32)
        ref, port = R.shape(cfg, f), side.shape(f)
        centred = f.astype(np.float64).reshape(-1, g) - f.astype(np.float64).reshape(-1, g).mean(1, keepdims=True)
        bound = 2 * (shaping_bound(f) + (gamma(g) * np.abs(f).mean() + U32 * np.abs(centred.ravel())) /
                     math.sqrt(f.astype(np.float64).var() + 1e-5))
        ratio = float(np.max(np.abs(port.astype(np.float64) - ref) / bound))
        ok = ratio <= 1
        why = ""
        if not ok and np.allclose(port, _group_var(f, g), rtol=1e-4, atol=1e-5):
            why = cause("group_fitness", "each group is divided by its own spread, not by the global variance")
        elif not ok:
            why = "fitness shaping differs"
        rows.append(Row("fitness", f"trial {trial}, groups of {g}: max |port - ref| / bound", ratio,
                        "<= 1 (both sides' float32 shaping bounds)", "pass" if ok else "fail", why))
    return rows


def check_gradients(R, side, cfg, seed, rng, parted: set[str]) -> list[Row]:
    shaped = R.shape(cfg, rng.standard_normal(cfg.pop).astype(np.float32))
    ref, port = R.grads(cfg, seed, 0, shaped), side.grads(seed, 0, shaped)
    rows = []
    for leaf in lm_tree(cfg).leaves:
        q = f"{leaf.path} ({leaf.cls}): max |port - ref|"
        if leaf.path in parted:
            rows.append(Row("gradients", q, float("nan"), "-", "skip", f"{leaf.path}'s noise already differs"))
            continue
        diff = np.abs(port[leaf.path].astype(np.float64) - ref[leaf.path])
        if not _ref_perturbs(cfg, leaf):
            ok = not np.any(port[leaf.path])
            rows.append(Row("gradients", q, float(diff.max()), "== 0 (no update)", "pass" if ok else "fail",
                            "" if ok else f"{leaf.path} gets an update the reference never gives it"))
            continue
        w = np.abs(shaped).astype(np.float64).reshape((-1,) + (1,) * len(leaf.shape))     # |f_n|, broadcast
        if leaf.cls == "param":     # mean_n f_n eps_n: N products and sums, one rounding each, both sides
            bound = 2 * gamma(cfg.pop + 2) * np.mean(w * np.abs(R.dense_noise(cfg, seed, 0, leaf)), 0)
        else:                       # einsum over N members and r columns, then / N: gamma_{N r + 3} per side
            bound = 2 * gamma(cfg.pop * cfg.rank + 3) * np.mean(w * R.factors_abs_product(cfg, seed, 0, leaf), 0)
        ratio = float(np.max(diff / np.maximum(bound, 1e-30)))
        ok = ratio <= 1
        rows.append(Row("gradients", f"{leaf.path} ({leaf.cls}): max |port - ref| / bound", ratio,
                        "<= 1 (both sides' float32 einsum/mean bounds)", "pass" if ok else "fail",
                        "" if ok else f"{leaf.path}: the gradient differs"))
    return rows


def check_forward(R, side, cfg, seed, rng) -> list[Row]:
    from rollout.corpus import load_corpus, member_tokens, train_windows
    corpus = load_corpus(seq_len=cfg.seq_len)
    tokens = member_tokens(train_windows(corpus, seed, 0, cfg.n_streams, cfg.seq_len), cfg.pop, cfg.group_size)
    params = R.init(cfg, seed)
    params = {k: (v + rng.standard_normal(v.shape).astype(np.float32) * 0.05).astype(np.float32)
              for k, v in params.items()}                              # fresh values, not the init's constants
    rows = []
    for noise in (False, True):
        (rs, ri), (ps, pi) = R.scores(cfg, seed, params, 0, tokens, noise), side.scores(seed, params, 0, tokens, noise)
        first = None
        for name in ri:
            if name not in pi:
                continue
            r, p = ri[name].astype(np.float64), pi[name].astype(np.float64)
            scale = np.max(np.abs(r).reshape(r.shape[0], -1), axis=1).reshape((-1,) + (1,) * (r.ndim - 1))
            ulps = float(np.max(np.abs(p - r) / (np.maximum(scale, 1e-30) * 2 * U32)))
            if ulps > FORWARD_ULPS and first is None:
                first = (name, ulps)
        worst = max(float(np.max(np.abs(pi[n].astype(np.float64) - ri[n]) /
                                 (np.maximum(np.max(np.abs(ri[n])), 1e-30) * 2 * U32))) for n in ri if n in pi)
        ok = first is None
        why = ""
        if not ok:
            leaf, block = intermediate_leaf(first[0])
            where = f"block {block}, leaf {leaf}" if block is not None else f"leaf {leaf}"
            why = f"the forward first departs at {first[0]} ({where}): {first[1]:.3g} ulps of its scale"
        rows.append(Row("forward", f"noise {'on (each side its own)' if noise else 'off'}: max ulps of an "
                                   f"intermediate's scale", worst, f"<= {FORWARD_ULPS}", "pass" if ok else "fail", why))
    return rows


# ----------------------------------------------------------------------------- the run
def run(cfg: LMConfig, knobs: TreeKnobs, seed: int, log=print) -> list[Row]:
    from parity import tree_reference as R
    from parity.tree_torch import TorchTree
    side = TorchTree(cfg, knobs)
    rng = np.random.default_rng([seed, 20])
    rows = []
    if knobs.rng != "jax":
        return [Row(c, "-", float("nan"), "-", "skip", "rng=torch: the LM suite compares draws element by element "
                                                        "and has no in-distribution mode yet") for c in
                ("init", "noise", "gradients", "forward")] + check_fitness(R, side, cfg, rng)
    for name, fn in (("init", lambda: check_init(R, side, cfg, seed)),
                     ("noise", None), ("fitness", lambda: check_fitness(R, side, cfg, rng)),
                     ("gradients", None), ("forward", lambda: check_forward(R, side, cfg, seed, rng))):
        t0 = time.perf_counter()
        if name == "noise":
            got, parted = check_noise(R, side, cfg, seed)
        elif name == "gradients":
            got = check_gradients(R, side, cfg, seed, rng, parted)
        else:
            got = fn()
        rows += got
        fails = [r for r in got if r.verdict == "fail"]
        log(f"{name:10s} {'FAIL' if fails else 'pass'}  ({len(got)} rows, {time.perf_counter() - t0:.1f} s)"
            + (f"  {fails[0].cause}" if fails else ""))
    return rows


def write(out: str, rows: list[Row], header: list[str]) -> None:
    os.makedirs(out, exist_ok=True)
    checks = list(dict.fromkeys(r.check for r in rows))
    table = []
    for c in checks:
        rs = [r for r in rows if r.check == c]
        fails = [r for r in rs if r.verdict == "fail"]
        verdict = "fail" if fails else ("skip" if all(r.verdict == "skip" for r in rs) else "pass")
        shown = fails[0] if fails else max((r for r in rs if r.value == r.value), key=lambda r: r.value, default=rs[0])
        table.append([c, verdict, f"{shown.quantity} = {shown.value:.4g}", shown.allowed, shown.cause or "-"])
    text = "\n".join(header + ["", markdown_table(["check", "verdict", "observed (worst)", "allowed", "likely cause"],
                                                  table), ""])
    atomic_write(os.path.join(out, "summary.md"), text)
    lines = ["check,quantity,value,allowed,verdict,cause"] + [
        ",".join('"' + str(x).replace('"', "'") + '"' for x in r) for r in rows]
    atomic_write(os.path.join(out, "parity.csv"), "\n".join(lines) + "\n")


def sizes() -> dict[str, LMConfig]:
    return {"quick": LM_PRESETS["quick"], "selftest": LM_PRESETS["selftest"]}
