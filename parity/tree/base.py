"""What every check of the tree suite shares, element by element (parity.tree.check), in distribution
(parity.tree.dist) or along a port's es_* loop (parity.tree.lockstep): the row a check writes, the epochs the
draws are compared at, the causes in the tree knobs' words, both sides' shaping bound, fresh parameters, the
optimizer step's diagnosis, and which rng the faithful side follows on a reference's platform.
"""
from __future__ import annotations

import math
import re
from typing import Iterable, NamedTuple, Sequence

import numpy as np

from parity.core import diagnose, optscale
from parity.core.tolerances import U32, U_TF32, drift_bound, gamma, shaping_bound, step_bound, update_bound
from parity.tree import blocks as B
from spec.lm import LMConfig
from spec.platform import ReferencePlatform
from spec.tree_knobs import TREE_CHOICES, TREE_DESCRIPTIONS

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


BARE, QUOTED = "\x00", "\x01"      # a leaf named in a cause: blocks.attn.q (mm), or quoted 'blocks.attn.q (mm)'


def _leaf_template(text: str, paths: Sequence[str]) -> tuple[str, list[str]]:
    """The cause with each leaf it names (its path, its class after it, quoted or not) replaced by a placeholder, and
    those leaves as named."""
    named: list[str] = []
    alternatives = "|".join(re.escape(p) for p in sorted(paths, key=len, reverse=True))
    pattern = re.compile(rf"(?<![\w.'])('?)({alternatives})( \((?:mm|tmm|param|embedding|excluded)\))?\1(?![\w]|\.\w)")

    def mark(match: re.Match) -> str:
        named.append(match.group(2) + (match.group(3) or ""))
        return QUOTED if match.group(1) else BARE
    return (pattern.sub(mark, text), named) if paths else (text, named)


def merged_causes(texts: Iterable[str], paths: Sequence[str]) -> list[str]:
    """The distinct causes, those that differ only in the one leaf they name given as one line listing the leaves:
    'blocks.attn.q: the step differs ...' for each leaf -> 'the step differs ... (leaves blocks.attn.q, lm_head)' (a
    check's cause per leaf is one fact on the terminal and in a test's message; the rows keep one per leaf)."""
    groups: dict[str, list[tuple[str, str | None]]] = {}
    for text in dict.fromkeys(texts):
        template, named = _leaf_template(text, paths)
        leaf = named[0] if named and len(set(named)) == 1 else None
        groups.setdefault(template if leaf else text, []).append((text, leaf))
    out = []
    for template, members in groups.items():
        if len(members) == 1:
            out.append(members[0][0])
            continue
        body = template[3:] if template.startswith(BARE + ": ") else template
        body = body.replace(BARE + "'s", "each leaf's").replace(QUOTED + " ", "each leaf's ")
        body = body.replace(BARE, "each leaf").replace(QUOTED, "each leaf")
        out.append(f"{body} (leaves {', '.join(leaf for _, leaf in members)})")
    return out


def ref_perturbs(cfg: LMConfig, leaf) -> bool:
    return leaf.cls in ("mm", "tmm") or (leaf.cls == "param" and not cfg.freeze_nonlora)


def pairing_text(leaf, dense: np.ndarray) -> str:
    """The pairing cause (the MLP's knob `antithetic`) when the members' mirrors are not (2k, 2k+1), else ''."""
    mirror = diagnose.mirror_map(np.asarray(dense, np.float64).reshape(dense.shape[0], -1))
    found = diagnose.pairing_cause(mirror, np.arange(dense.shape[0]) ^ 1)
    return f"{leaf.path}: {found.text}" if found is not None else ""


def shaping_pair_bound(f: np.ndarray, g: int) -> np.ndarray:
    """Both sides' float32 bound for group shaping (group means, the global variance), per member."""
    g = g or f.size
    centred = f.astype(np.float64).reshape(-1, g) - f.astype(np.float64).reshape(-1, g).mean(1, keepdims=True)
    return 2 * (shaping_bound(f) + (gamma(g) * np.abs(f).mean() + U32 * np.abs(centred.ravel())) /
                math.sqrt(f.astype(np.float64).var() + 1e-5))


def fitness_text(f: np.ndarray, port: np.ndarray, g: int, shape=None) -> str:
    """The cause of a shaping that differs, by what differs (parity.tree.shaping.describe: the epsilon's place and
    value, ddof, centring, groups, ranks, `group_fitness`), on f and, where `shape` (the port's shaping) is given, on
    that module's probe vectors too. Every place that names fitness (the fitness check, the es_* lockstep's shaping
    row, the LM trajectory) calls it."""
    from parity.tree import shaping
    return shaping.describe(f, port, g, shape)


def reference_magnitude(R, cfg, seed: int, epoch: int, leaf):
    """|noise| of the reference's draws of one leaf as a parity.tree.blocks.Magnitude: low-rank as the factors it
    forms |A| |B|^T from (R.abs_factors, float64), param leaves |eps| (pop, *shape)."""
    if leaf.cls == "param":
        return B.Magnitude(np.abs(R.dense_noise(cfg, seed, epoch, leaf)).astype(np.float64))
    return B.Magnitude(*R.abs_factors(cfg, seed, epoch, leaf))


def noise_excess(R, cfg, seed: int, epoch: int, leaf, port_value, port_dense) -> tuple[float, int, int]:
    """(max (|port - ref| - bound) over one perturbed leaf's blocks, blocks formed, blocks) against the reference's
    draws at epoch: bound 2 gamma_r |A||B|^T (param leaves 0: exact). port_dense(block) is the side's perturbation
    there. A block after the first where the side's factors (or eps) are the reference's bit for bit is within the
    bound by construction (each side's float32 product of the same factors is within gamma_r |A||B|^T of their
    exact one) and is not formed (parity.tree.blocks)."""
    ref_value = R.leaf_noise(cfg, seed, epoch, leaf)

    def excess(blk) -> float:
        d = port_dense(blk).astype(np.float64)
        d -= R.dense_noise(cfg, seed, epoch, leaf, block=blk)
        np.abs(d, out=d)
        if leaf.cls != "param":
            d -= 2 * gamma(cfg.rank) * R.factors_abs_product(cfg, seed, epoch, leaf, block=blk)
        return float(np.max(d))
    return B.worst_over(leaf, cfg.pop, lambda blk: B.same(port_value, ref_value, blk, leaf), excess)


def reference_update(R, cfg, params: dict, grads: dict) -> dict:
    """R.update (one optax-sgd step of the reference's noiser) leaf by leaf: the step is elementwise within each leaf,
    so the numbers are the whole tree's, while the reference holds one leaf's copies at a time, not the tree's."""
    return {p: R.update(cfg, {p: params[p]}, {p: grads[p]})[p] for p in params}


def ref_u(R) -> float:
    """The unit the reference rounds matmul operands to (U_TF32 on a TF32 platform, else 0)."""
    return U_TF32 if getattr(R, "platform", ReferencePlatform()).tf32 else 0.0


def float32_of(R):
    """The reference pinned to float32 (R.float32()); a replayed bundle has none: NotRecorded (the check is skipped
    with the reason)."""
    from parity.core.tape import NotRecorded
    if getattr(type(R), "float32", None) is None:
        raise NotRecorded("float32", "this reference cannot be evaluated at float32, which bounds its own TF32 "
                                     "rounding here; check against the live reference")
    return R.float32()


def unchanged_cause(cfg: LMConfig, leaf, what: str) -> str:
    if leaf.cls == "embedding":
        return cause("embedding", f"{leaf.path} is {what}; the reference never updates embedding leaves")
    if leaf.cls == "param":
        return cause("frozen_leaves", f"{leaf.path} is {what}; the reference leaves param leaves as they are "
                                      f"under freeze_nonlora")
    return f"{leaf.path} ({leaf.cls}) is {what}; the reference never updates {leaf.cls} leaves"


def fresh_params(R, cfg, seed: int, rng) -> dict[str, np.ndarray]:
    """The LM: the reference's init plus fresh normal values * 0.05 (no leaf left at the init's ones and zeros). A
    declared tree (no reference init): fresh normal values * 0.1 at every leaf's shape."""
    if not isinstance(cfg, LMConfig):
        return {leaf.path: (rng.standard_normal(leaf.shape) * 0.1).astype(np.float32) for leaf in cfg.tree.leaves}
    return {k: (v + rng.standard_normal(v.shape).astype(np.float32) * 0.05).astype(np.float32)
            for k, v in R.init(cfg, seed).items()}


class NumpyOptimizers:
    """optax's sgd, adam and adamw in numpy (parity.mlp.numpy_reference) behind the two calls parity.core.optscale.verified
    makes of a reference: the candidate optimizers a step that is not the reference's sgd is matched against."""

    def __init__(self, lr: float, optimizer: str = "sgd"):
        self.lr, self.optimizer = lr, optimizer

    def with_run_knobs(self, optimizer: str) -> "NumpyOptimizers":
        return NumpyOptimizers(self.lr, optimizer)

    def optimizer_init(self, params: dict):
        from parity.core.optimizers import optimizer_init
        return optimizer_init(self.optimizer, params)

    def optimizer_apply(self, params: dict, state, grads: dict, n: int, epoch: int):
        from parity.core.optimizers import optimizer_apply
        return optimizer_apply(params, state, grads, n, self.lr)


def leaf_gradient_text(leaf, port: np.ndarray, ref: np.ndarray, bound, sigma: float, pop: int | None = None,
                       rank: int | None = None, fit=None) -> str:
    """Why one leaf's gradient differs, in the MLP suite's words (parity.core.diagnose.gradient_cause): zero, a pure
    scale when port - c ref is within the rounding bound (parity.core.optscale.fit_leaf; c named when one of sigma, N
    and r fits: 1/sigma, N/sigma, 1/(sigma^2 sqrt(N)), sqrt(r), 2, ...), the opposite sign, or another direction
    (its cosine, norm ratio and the least-squares scale); an N-D mm leaf's gradient laid out in another order of its
    matrix says that order (blocks.other_order)."""
    order = B.other_order(leaf, port, ref)
    if order:
        return f"{leaf.path} ({leaf.cls}): the gradient {order}"
    p, r = np.asarray(port, np.float64).ravel(), np.asarray(ref, np.float64).ravel()
    norm_p, norm_r = float(np.linalg.norm(p)), float(np.linalg.norm(r))
    if norm_r == 0:
        return f"{leaf.path}: the gradient is nonzero (norm {norm_p:.6g}) where the reference's is zero"
    fit = fit or optscale.fit_leaf(p, r, bound)
    # the leaf's class after its path, so a path ending in ".bias" is not read as the MLP's bias knobs
    text = diagnose.gradient_cause(f"{leaf.path} ({leaf.cls})", fit.c if fit.aligned else norm_p / norm_r,
                                   fit.cosine, None, sigma, None, pop, rank, fit.aligned).text
    if fit.aligned or norm_p == 0:
        return text
    return f"{text} (least-squares scale {fit.c:.6g}; port - scale x ref is {fit.excess:.3g} x its rounding bound)"


def cap_words(v: float) -> str:
    """A cap as the report writes it: 1.0, 0.5, 2.5, 0.123457."""
    text = f"{v:.6g}"
    return text if any(ch in text for ch in ".e") else f"{text}.0"


def clipped_text(what: str, leaf, cap: float, c: float) -> str:
    return (f"the {what} of {leaf.path} ({leaf.cls}) is clipped at norm {cap_words(cap)} ({c:.3g} x the reference's, "
            f"same direction)")


def gradient_texts(cfg, failing: Sequence[tuple]) -> dict[str, str]:
    """{path: why its gradient differs} for the failing leaves [(leaf, port, ref, bound)], the same words in both
    modes (parity.tree.check.check_gradients, parity.tree.dist.check_gradients): leaf_gradient_text, except that
    leaves scaled down along the reference's direction, by no named scale, whose norms sit at one cap (a round value,
    or one norm two or more of them share: parity.core.optscale.caps) are said to be clipped at it."""
    fits = {leaf.path: optscale.fit_leaf(port, ref, bound) for leaf, port, ref, bound in failing}
    down = {leaf.path: (float(np.linalg.norm(np.asarray(port, np.float64))), optscale.cap_tolerance(np.size(port)))
            for leaf, port, ref, bound in failing if fits[leaf.path].aligned and 0 < fits[leaf.path].c < 1
            and not diagnose.named_factor(fits[leaf.path].c, cfg.sigma, cfg.pop, cfg.rank)}
    capped = optscale.caps(down)
    return {leaf.path: clipped_text("gradient", leaf, capped[leaf.path], fits[leaf.path].c) if leaf.path in capped
            else leaf_gradient_text(leaf, port, ref, bound, cfg.sigma, cfg.pop, cfg.rank, fits[leaf.path])
            for leaf, port, ref, bound in failing}


def with_gradient_causes(cfg, rows: list[Row], failing: list[tuple]) -> list[Row]:
    """A gradient check's rows with each failing leaf's cause, in both modes (parity.tree.check.check_gradients on
    the reference's noise, parity.tree.dist.check_gradients on the port's own): gradient_texts over the failing
    leaves [(leaf, port, ref, bound)] together, so a cap that several leaves' norms share is seen across them. A
    failing row without a cause is a failing leaf's; its quantity begins '<path> ('."""
    why = gradient_texts(cfg, failing)
    return [r._replace(cause=why[r.quantity.split(" (")[0]]) if r.verdict == "fail" and not r.cause else r
            for r in rows]


def _tree_fit(cfg, old: dict, grads: dict, new: dict):
    """The optax optimizer and gradient scale reproducing the port's step on these leaves (parity.core.optscale over
    sgd, adam and adamw, verified within parity.core.optscale.MATCH), or None."""
    fits = optscale.candidates(NumpyOptimizers(cfg.lr), ("sgd", "adam", "adamw"), old, grads, new, cfg.pop, cfg.lr,
                               cfg.sigma)
    return optscale.best_match(fits, optscale.MATCH)


def _fit_words(cfg, fit, worst: str) -> str:
    if fit.name == "1" and fit.optimizer != "sgd":
        return diagnose.optimizer_cause(fit.optimizer, "sgd", worst).text
    if fit.optimizer == "sgd" and (fit.name == "1" or abs(fit.c - 1) < optscale.MATCH):   # no scale a port writes: rounding
        return diagnose.other("optimizer step", f"the port's step is optax sgd on its gradient at the reference's "
                                                f"scale (fitted c = {fit.c:.6g}), yet beyond the bound: its rounding "
                                                f"exceeds even the per-member summation bound (N adds into the "
                                                f"weights, parity.core.tolerances.step_bound): the step is formed or "
                                                f"applied coarser than float32 in any order of summation allows (a "
                                                f"reduced-precision format, or weights disturbed in place: see the "
                                                f"zero-fitness row) ({worst})").text
    return diagnose.scaled_optimizer_cause(fit, "sgd", optscale.words(fit, cfg.sigma, cfg.pop), worst).text


IN_PLACE = "the perturbation is added and removed in place, and the weights drift by rounding"


def gradient_roundings(cfg, leaf) -> int:
    """float32 roundings of one entry of a leaf's gradient: N r + 3 (einsum of f A and B over members and rank,
    / N) for a low-rank leaf, N + 2 (mean of f eps) for a param leaf."""
    return cfg.pop * cfg.rank + 3 if leaf.cls in ("mm", "tmm") else cfg.pop + 2


def noise_mean(leaf, mag, w) -> np.ndarray:
    """mean_n w_n |E_n| at the leaf's shape, float64: mag a blocks.Magnitude (blocks.mean_abs) or a dense |noise|
    (pop, *shape); w (pop,) >= 0."""
    if isinstance(mag, B.Magnitude):
        return B.mean_abs(leaf, mag, w)
    return np.mean(np.asarray(w, np.float64).reshape((-1,) + (1,) * (np.ndim(mag) - 1)) * mag, 0)


def leaf_step_bound(cfg, leaf, before, ref_new, ref_grad, mag, f_abs) -> np.ndarray:
    """parity.core.tolerances.step_bound of one leaf's step, the one allowance every check of a step uses (updates,
    the lockstep, the LM trajectory): s = lr sqrt(N), step_abs = s mean_n |f_n| |E_n| from the side's own noise
    magnitude per member (mag: blocks.Magnitude or dense |noise|; f_abs >= |the fitness either side weighs|), up to
    N adds into the weights. The caller adds its gap between the two exact steps (s x the gradient's bound)."""
    s = math.sqrt(cfg.pop) * cfg.lr
    step_abs = s * noise_mean(leaf, mag, f_abs) if mag is not None else s * np.abs(np.asarray(ref_grad, np.float64))
    return step_bound(before, ref_new, s * np.asarray(ref_grad, np.float64), step_abs, gradient_roundings(cfg, leaf),
                      cfg.pop)


def zero_step_row(cfg, check: str, at: str, before: dict, after: dict, mags: dict) -> Row:
    """A step on zero fitness must give the params back bit for bit: g = 0 exactly, so p + lr sqrt(N) 0 = p in any
    order of summation and for sgd and adam alike. Entries that move anyway are named: within drift_bound of the
    members' perturb-and-restore rounding (|p| and the side's own |E_n|, mags: path -> blocks.Magnitude or None)
    as IN_PLACE (a fail), with the leaf and how many entries moved; beyond it a skip saying so: a step not made of
    the gradient alone (weight decay), which the step rows judge and name."""
    moved = {p: int(np.count_nonzero(np.asarray(after[p]) != np.asarray(before[p]))) for p in before}
    total = sum(moved.values())
    quantity = f"{at}: a step on zero fitness (g = 0), entries moved"
    allowed = "== 0 (p + lr sqrt(N) 0 = p bit for bit, in any order of summation)"
    if total == 0:
        return Row(check, quantity, 0.0, allowed, "pass")
    worst = {}
    for p in (p for p in before if moved[p]):
        leaf = cfg.tree.leaf(p)
        mag = mags.get(p)
        noise_sum = 0.0 if mag is None else cfg.pop * noise_mean(leaf, mag, np.ones(cfg.pop))
        d = np.abs(np.asarray(after[p], np.float64) - before[p])
        worst[p] = (float(np.max(d / np.maximum(drift_bound(before[p], noise_sum, cfg.pop, cfg.rank), 1e-300))),
                    float(np.max(d)))
    named = sorted(worst, key=lambda p: -moved[p])
    where = "; ".join(f"{p} ({cfg.tree.leaf(p).cls}): {moved[p]} of {np.size(before[p])} entries moved, by up to "
                      f"{worst[p][1]:.3g} ({worst[p][0]:.3g} x that rounding)" for p in named[:3]) + \
        "".join(f"; {p} ({cfg.tree.leaf(p).cls}): {moved[p]} of {np.size(before[p])}" for p in named[3:])
    if max(r for r, _ in worst.values()) <= 1:
        why = (f"{IN_PLACE}: a step on zero fitness (exactly zero in any order of summation) still moves the params, "
               f"by no more than N in-place perturb-and-restores of |p| + |E| round to; {where}")
        return Row(check, quantity, float(total), allowed, "fail", why)
    # beyond rounding: a step not made of the gradient alone (weight decay?), which the step rows judge and name
    return Row(check, quantity, float(total), allowed, "skip",
               f"not rounding: a step on zero fitness moves the params by more than an in-place perturb-and-restore "
               f"rounds to, so the step is not the gradient's alone (weight decay?); the step rows judge and name "
               f"it; {where}")


def _step_caps(cfg, old: dict, grads: dict, new: dict, fits: dict) -> dict[str, tuple[str, float]]:
    """{leaf: (what, cap)} for leaves whose step is sgd scaled down (c < 1, no named scale): the update new - old, or
    the gradient it steps on (c g = update / (lr sqrt(N))), at one cap (parity.core.optscale.caps; the update's norm
    allowed its float32 rounding, update_bound, besides)."""
    down = [p for p, f in fits.items() if f is not None and f.optimizer == "sgd" and 0 < f.c < 1 and f.name is None]
    steps = {p: np.asarray(new[p], np.float64) - old[p] for p in down}
    norms = {p: float(np.linalg.norm(u)) for p, u in steps.items()}
    rtol = {p: optscale.cap_tolerance(u.size, float(np.linalg.norm(update_bound(np.asarray(new[p], np.float64), u)))
                                      / max(norms[p], 1e-300)) for p, u in steps.items()}
    out = {p: ("update", v) for p, v in optscale.caps({p: (norms[p], rtol[p]) for p in down}).items()}
    per = cfg.lr * math.sqrt(cfg.pop)
    grad = optscale.caps({p: (norms[p] / per, rtol[p]) for p in down if p not in out})
    return {**out, **{p: ("gradient", v) for p, v in grad.items()}}


def step_texts(cfg, old: dict, grads: dict, new: dict, worst: str) -> dict[str, str]:
    """{leaf: which optax optimizer, on the port's gradient times which scale, reproduces its step}: one fit for the
    whole tree when one fits (the same words for every leaf), else one per leaf (a leaf's step clipped at a norm is
    said so: _step_caps; a leaf no optimizer explains at any scale is said so), or that none explains any leaf."""
    fit = _tree_fit(cfg, old, grads, new)
    if fit is not None:
        return dict.fromkeys(old, _fit_words(cfg, fit, worst))
    fits = {p: _tree_fit(cfg, {p: old[p]}, {p: grads[p]}, {p: new[p]}) for p in old}
    if all(f is None for f in fits.values()):             # no optimizer explains any leaf: no knob is named
        return dict.fromkeys(old, diagnose.other(
            "optimizer step", f"the port's step matches none of optax sgd, adam, adamw at the reference's learning "
                              f"rate, at any gradient scale ({worst})").text)
    capped = _step_caps(cfg, old, grads, new, fits)
    out = {}
    for p, f in fits.items():
        leaf = cfg.tree.leaf(p)
        if p in capped:
            out[p] = (clipped_text(capped[p][0], leaf, capped[p][1], f.c)
                      + ("" if capped[p][0] == "update" else " before the step"))
        elif f is not None and f.optimizer == "sgd" and f.name == "1":
            out[p] = f"the step of {p} ({leaf.cls}) is the reference's {SCALE_ONE}"
        elif f is None:
            out[p] = diagnose.other("optimizer step", f"the step of {p} ({leaf.cls}) matches none of optax sgd, adam, "
                                                      f"adamw at the reference's learning rate, at any gradient scale "
                                                      f"({worst})").text
        else:
            out[p] = f"the step of {p} ({leaf.cls}): {_fit_words(cfg, f, worst)}"
    return {p: t if t.endswith(SCALE_ONE) else f"{t}; {ONE_SCALE}" for p, t in out.items()}


SCALE_ONE = "(optax sgd at gradient scale 1)"
ONE_SCALE = "one scale does not fit every leaf"


def step_text(cfg, old: dict, grads: dict, new: dict, worst: str) -> str:
    """Which optax optimizer, on the port's gradient times which scale, reproduces the port's step (parity.core.optscale
    over sgd, adam and adamw, verified within parity.core.optscale.MATCH), in the MLP suite's words: the knob `optimizer`
    when it is not sgd, else the scale; or that none does. When no one fit explains every leaf, each leaf's
    (step_texts) that is not sgd at scale 1, joined."""
    texts = step_texts(cfg, old, grads, new, worst)
    if len(set(texts.values())) == 1:
        return next(iter(texts.values()))
    return f"{ONE_SCALE}, leaf by leaf: " + "; ".join(t.removesuffix(f"; {ONE_SCALE}") for t in texts.values()
                                                     if not t.endswith(SCALE_ONE))


def follow_reference_rng(knobs, platform) -> tuple:
    """(knobs, words): the tree side's rng=jax follows the reference's normals: plain jax is JAX's CPU normals, so on
    a GPU-normals reference it becomes rng=jax-gpu where spec.tree_knobs has that value; a side pinned to one
    backend (jax-cpu, jax-gpu) stays as pinned."""
    value = f"jax-{platform.normals}"
    if knobs.rng != "jax" or platform.normals == "cpu" or value not in TREE_CHOICES["rng"]:
        return knobs, ""
    import dataclasses
    return dataclasses.replace(knobs, rng=value), f"rng=jax follows the reference's backend: rng={value}"
