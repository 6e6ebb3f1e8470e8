"""Gradients: the ES estimate on shared noise and fitness, and on synthetic objectives with a known gradient.

Shared part (deterministic): both sides get the reference's noise and the same shaped fitness, so
the generator cannot matter (rng=torch passes); per leaf the difference must stay within the
float32 bound of the einsum (gamma_{N r + 3} sum|f A B| / N) or mean (gamma_{N+2} mean|f eps|),
both sides summed. Relative error, cosine and norm ratio are reported beside it. A reference on TF32
(its platform's default precision on NVIDIA GPUs, or gpu-sim) rounds the einsum's two operands (f A and
B) to 10 mantissa bits first: its bound is with_operands(gamma_{N r + 3}, 2, 2^-11); the mean is no matmul.
When a leaf differs beyond that, each side is held to its own bound of the exact (float64) estimate, and a
reference beyond its own while the port is within names the reference's platform, not the port.

Synthetic part (statistical): each side draws its OWN noise, shapes the fitness of a linear and a
quadratic objective of the perturbation and estimates the gradient; its cosine to the true
gradient is averaged over repeats at several population sizes. A scaling or sign drift moves a
side's curve; the two curves are compared with Welch intervals at the check's Bonferroni share.
"""
from __future__ import annotations

from typing import NamedTuple

import numpy as np

from parity.core import diagnose
from parity.mlp.noiseform import forward_of, members
from parity.core.tolerances import (bias_grad_bound, check_alpha, dense_grad_bound, representation_bound,
                                    two_sample_interval, weight_grad_bound)
from parity.core.verdict import Recorder, fmt, summarize
from spec.platform import ReferencePlatform

NAME = "gradients"


def _flat(tree: dict, names) -> np.ndarray:
    return np.concatenate([np.asarray(tree[n], np.float64).ravel() for n in names])


def _cosine(a: np.ndarray, b: np.ndarray) -> float:
    na, nb = np.linalg.norm(a), np.linalg.norm(b)
    return float(a @ b / (na * nb)) if na > 0 and nb > 0 else 0.0


def _leaf_bound(name: str, noise: dict, shaped: np.ndarray, u_operand: float = 0.0) -> np.ndarray:
    """One side's float32 bound of a leaf's estimate on this noise: factors, a dense E, or a bias's eps
    (u_operand: the reference's TF32 operands, for the factors' einsum)."""
    if name.endswith(".weight"):
        value = noise[name]
        return (weight_grad_bound(shaped, *value, u_operand=u_operand) if isinstance(value, tuple)
                else dense_grad_bound(shaped, value))
    if name in noise:
        return bias_grad_bound(shaped, noise[name])
    return np.zeros(1)


def _exact(name: str, noise: dict, shaped: np.ndarray) -> np.ndarray | None:
    """The estimate on factor or bias noise in float64 (None for a dense E or a leaf without noise)."""
    f = np.asarray(shaped, np.float64)
    value = noise.get(name)
    if isinstance(value, tuple):
        A, B = (np.asarray(v, np.float64) for v in value)
        return np.tensordot(f[:, None, None] * A, B, axes=([0, 2], [0, 2])) / f.size
    return None if value is None or name.endswith(".weight") else (f[:, None] * np.asarray(value, np.float64)).mean(0)


def _sides(name: str, noise: dict, shaped: np.ndarray, p: np.ndarray, q: np.ndarray, u_ref: float):
    """(port, reference) each against its own bound of the exact estimate, or None where there is none to take."""
    exact = _exact(name, noise, shaped)
    if exact is None:
        return None
    own = lambda g, u: float(np.max(np.abs(g - exact) / np.maximum(_leaf_bound(name, noise, shaped, u), 1e-300)))
    return own(p, 0.0), own(q, u_ref)


def _allowed(name: str, noise: dict, given: dict, shaped: np.ndarray, u_ref: float = 0.0) -> np.ndarray:
    """|port - ref| allowed on a leaf: both sides' bounds, plus (a dense port, given E = fl32(A B^T)) how far the
    rounding of E moves the exact estimate."""
    allowed = _leaf_bound(name, noise, shaped, u_ref) + _leaf_bound(name, given, shaped)
    if given is not noise and name.endswith(".weight"):
        allowed = allowed + representation_bound(shaped, *noise[name])
    return allowed


def _weight_terms(kind: str, value, t: np.ndarray) -> tuple[np.ndarray, np.ndarray | float]:
    """(<t, delta_m>, ||delta_m||^2 for the quadratic) of a weight's perturbations, from factors or a dense E."""
    if not isinstance(value, tuple):
        E = np.asarray(value, np.float64)                                             # (m, out, in)
        return (E * t).sum((1, 2)), ((E ** 2).sum((1, 2)) if kind == "quadratic" else 0.0)
    A, B = (np.asarray(x, np.float64) for x in value)                                 # (m, out, r), (m, in, r)
    inner = ((t @ B) * A).sum((1, 2))                                                 # <t, A_m B_m^T>
    square = 0.0
    if kind == "quadratic":
        square = ((np.swapaxes(A, 1, 2) @ A) * (np.swapaxes(B, 1, 2) @ B)).sum((1, 2))   # ||A B^T||_F^2
    return inner, square


def _objective_values(kind: str, noise: dict, target: dict, names) -> np.ndarray:
    """Fitness (m,) float32 of each member's perturbation delta_i for a linear or quadratic objective.

    linear: <t, delta>; quadratic: -||t + delta||^2 (t = theta - theta*). For a weight delta = A B^T,
    so <t, A B^T> = sum((t B) * A) and ||A B^T||^2 = sum((A^T A) * (B^T B)): nothing out x in per member
    (a dense port's E is used as given). The perturbation is what the port's forward applies (its forward
    noise, when it gives forward and update noise apart).
    """
    noise = forward_of(noise)
    m = members(noise)
    total = np.zeros(m)
    for name in names:
        t = target[name]
        if name.endswith(".weight"):
            inner, square = _weight_terms(kind, noise[name], t)
        elif name in noise:
            eps = np.asarray(noise[name], np.float64)                                 # (m, out)
            inner, square = eps @ t, (eps ** 2).sum(1)
        else:
            inner, square = np.zeros(m), 0.0
        total += inner if kind == "linear" else -((t ** 2).sum() + 2 * inner + square)
    return total.astype(np.float32)


class Leaf(NamedTuple):
    """One leaf's estimate on shared noise: the difference against the float32 bound, and what it looks like."""

    name: str
    size: str
    ratio: float            # max |port - ref| / (both sides' bound); 0 when identical
    relative: float         # ||port - ref|| / ||ref||
    cosine: float
    norm_ratio: float       # ||port|| / ||ref||
    half_sigma_ratio: float | None   # the norm ratio re-measured at sigma / 2 (tells 1/sigma from a constant)
    sides: tuple[float, float] | None = None   # a leaf beyond the bound: (port, reference) vs their own bounds


class Curve(NamedTuple):
    """The synthetic objective's mean cosines to the true gradient, each side with its own noise."""

    kind: str
    n: int
    port: tuple[float, ...]
    reference: tuple[float, ...]


class Measured(NamedTuple):
    leaves: tuple[Leaf, ...]
    curves: tuple[Curve, ...]
    sigma: float
    repeats: int
    pops: tuple[int, ...]
    platform: ReferencePlatform = ReferencePlatform()


def _norm_ratio(p: np.ndarray, q: np.ndarray) -> float:
    return float(np.linalg.norm(p) / np.linalg.norm(q)) if np.linalg.norm(q) > 0 else float("nan")


def _shared_noise(ctx, n: int, rng) -> list[Leaf]:
    """Both sides' estimates on the reference's noise and one shaped fitness vector, leaf by leaf."""
    shapes, sigma, r = ctx.shapes, ctx.cfg.sigma, ctx.cfg.rank
    noise = ctx.reference.noise(shapes, ctx.seed, 0, np.arange(n), n, sigma, r)
    shaped = ctx.ref.shape_fitness(rng.standard_normal(n).astype(np.float32), 0)
    g_port, g_ref = ctx.port.gradient(noise, shaped, sigma, shapes), ctx.ref.gradient(noise, shaped, sigma, shapes)
    given = ctx.port.received(noise)
    # the same at sigma / 2: a leaf whose ratio scales with 1/sigma is divided by sigma once more
    noise2 = ctx.reference.noise(shapes, ctx.seed, 0, np.arange(n), n, sigma / 2, r)
    g2_port, g2_ref = (ctx.port.gradient(noise2, shaped, sigma / 2, shapes),
                       ctx.ref.gradient(noise2, shaped, sigma / 2, shapes))
    leaves = []
    for name in shapes:
        p, q = np.asarray(g_port[name], np.float64), np.asarray(g_ref[name], np.float64)
        bound = _allowed(name, noise, given, shaped, ctx.ref_u)
        ctx.witness(f"N={n} {name}", g_port, p, q, bound, "both sides' float32 bounds of the estimate", (name,))
        ratio = float(np.max(np.abs(p - q) / np.maximum(bound, 1e-300))) if np.any(p != q) else 0.0
        half = (float(np.linalg.norm(g2_port[name]) / np.linalg.norm(g2_ref[name]))
                if np.linalg.norm(g2_ref[name]) > 0 else None)
        sides = _sides(name, noise, shaped, p, q, ctx.ref_u) if ratio > 1 and given is noise else None
        leaves.append(Leaf(name, f"N={n} r={r} sigma={fmt(sigma)} {shapes[name]}", ratio,
                           float(np.linalg.norm(p - q) / np.linalg.norm(q)) if np.linalg.norm(q) > 0 else 0.0,
                           _cosine(p.ravel(), q.ravel()), _norm_ratio(p, q), half, sides))
    return leaves


def _synthetic(ctx) -> list[Curve]:
    """Each side's mean cosine to the true gradient of a linear and a quadratic objective, with its own noise."""
    shapes, sigma, r, names = ctx.shapes, ctx.cfg.sigma, ctx.cfg.rank, list(ctx.shapes)
    target_rng = ctx.rng("synthetic targets")
    targets = {kind: {name: target_rng.standard_normal(shape) for name, shape in shapes.items()}
               for kind in ("linear", "quadratic")}
    curves = []
    for kind, target in targets.items():
        true = _flat({k: (v if kind == "linear" else -2 * v) for k, v in target.items()}, names)
        for n in ctx.sizes.synthetic_pops:
            cos = {"port": [], "reference": []}
            for k in range(ctx.sizes.synthetic_repeats):
                seed_k = ctx.seed * 1000 + 100 + k
                for side, port in (("port", ctx.port), ("reference", ctx.ref)):
                    noise = port.noise(shapes, seed_k, 0, np.arange(n), n, sigma, r)
                    shaped = port.shape_fitness(_objective_values(kind, noise, target, names), 0)
                    cos[side].append(_cosine(_flat(port.gradient(noise, shaped, sigma, shapes), names), true))
            curves.append(Curve(kind, n, tuple(cos["port"]), tuple(cos["reference"])))
    return curves


def measure(ctx) -> Measured:
    rng = ctx.rng("shared-noise fitness")
    leaves = [leaf for n in ctx.sizes.grad_pops for leaf in _shared_noise(ctx, n, rng)]
    ctx.log(f"[{NAME}] synthetic objectives: {len(ctx.sizes.synthetic_pops)} population sizes x "
            f"{ctx.sizes.synthetic_repeats} repeats x 2 sides")
    return Measured(tuple(leaves), tuple(_synthetic(ctx)), ctx.cfg.sigma, ctx.sizes.synthetic_repeats,
                    tuple(ctx.sizes.synthetic_pops), ctx.platform)


def judge(m: Measured, upstream: tuple = ()) -> Recorder:
    """upstream: causes of the noise and fitness checks (a failing synthetic curve follows from them)."""
    rec = Recorder(NAME)
    found: dict[str, object] = {}
    for leaf in m.leaves:
        if not leaf.ratio <= 1.0 and leaf.name not in found:    # diagnosed where the leaf first fails
            reference_only = leaf.sides is not None and leaf.sides[0] <= 1 < leaf.sides[1]
            found[leaf.name] = (diagnose.reference_cause(f"estimate of '{leaf.name}'", leaf.sides[1], m.platform)
                                if reference_only else
                                diagnose.gradient_cause(leaf.name, leaf.norm_ratio, leaf.cosine,
                                                        leaf.half_sigma_ratio, m.sigma, m.sigma / 2))
        rec.bound(f"{leaf.name}: max |port - ref| / bound", "both", leaf.size, leaf.ratio, 1.0,
                  "float32 bound of the einsum/mean, both sides" if not m.platform.tf32 else
                  "the port's float32 bound + the reference's with TF32 einsum operands", cause=found.get(leaf.name))
        rec.info(f"{leaf.name}: relative error", "both", leaf.size, leaf.relative)
        rec.info(f"{leaf.name}: cosine", "both", leaf.size, leaf.cosine)
        rec.info(f"{leaf.name}: norm ratio port/ref", "both", leaf.size, leaf.norm_ratio)
    alpha = check_alpha(NAME) / (2 * len(m.pops))
    for c in m.curves:
        diff, half = two_sample_interval(np.array(c.port), np.array(c.reference), alpha)
        half = max(half, 1e-6)         # identical draws (a JAX-compatible port) give a zero-width interval
        size = f"{c.kind} N={c.n} {m.repeats} repeats"
        rec.stat("mean cosine to the true gradient: port - ref", "both", size, diff, -half, half, alpha,
                 f"Welch interval, alpha={alpha:.2g}",
                 cause=upstream[0] if upstream else diagnose.other(
                     "gradient estimate", f"the port's estimate is {'less' if diff < 0 else 'more'} aligned "
                                          f"with the true gradient of a {c.kind} objective at N={c.n} "
                                          f"(cosine {fmt(np.mean(c.port))} vs {fmt(np.mean(c.reference))})"))
        rec.info("mean cosine to the true gradient", "port", size, float(np.mean(c.port)))
        rec.info("mean cosine to the true gradient", "reference", size, float(np.mean(c.reference)))
    return rec


def section(m: Measured) -> str:
    alpha = check_alpha(NAME) / (2 * len(m.pops))
    table = "\n".join(f"| {c.kind} | {c.n} | {fmt(np.mean(c.port))} | {fmt(np.mean(c.reference))} |"
                      for c in m.curves)
    return "\n".join([
        "Shared noise and fitness: the reference's noise for each population size and one shaped fitness vector "
        "go to both sides. Allowed per leaf: |port - ref| <= the two sides' float32 bounds of the estimate "
        "(weights: gamma_(N r + 3) sum_n |f_n| |A_n| |B_n|^T / N; biases: gamma_(N+2) mean |f_n eps_n|; a dense port, "
        "given E = fl32(A B^T): gamma_(N+2) sum_n |f_n| |E_n| / N plus u sum_n |f_n| |A_n| |B_n|^T / N for E's rounding); "
        "deterministic. A leaf that differs is diagnosed by its norm ratio and cosine (re-measured at sigma/2 to "
        "tell a 1/sigma factor from a constant).",
        "",
        f"Synthetic objectives, each side with its own noise, {m.repeats} repeats per size: linear <c, delta> (true "
        "gradient c) and quadratic -||theta + delta - theta*||^2 (true gradient -2(theta - theta*)). The mean "
        f"cosines of the sides must agree within a Welch interval at alpha={alpha:.2g} per size (Bonferroni share of "
        "the suite's budget).",
        "",
        "| objective | N | port mean cosine | reference mean cosine |",
        "| --- | --- | --- | --- |",
        table,
    ])


def run(ctx):
    m = measure(ctx)
    upstream = tuple(c for check in ("noise", "fitness") for c in diagnose.follows(check, ctx.causes_of(check)))
    return summarize(NAME, judge(m, upstream), section(m))
