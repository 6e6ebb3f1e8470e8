"""Gradients: the ES estimate on shared noise and fitness, and on synthetic objectives with a known gradient.

Shared part (deterministic): both sides get the reference's noise and the same shaped fitness, so
the generator cannot matter (rng=torch passes); per leaf the difference must stay within the
float32 bound of the einsum (gamma_{N r + 3} sum|f A B| / N) or mean (gamma_{N+2} mean|f eps|),
both sides summed. Relative error, cosine and norm ratio are reported beside it.

Synthetic part (statistical): each side draws its OWN noise, shapes the fitness of a linear and a
quadratic objective of the perturbation and estimates the gradient; its cosine to the true
gradient is averaged over repeats at several population sizes. A scaling or sign drift moves a
side's curve; the two curves are compared with Welch intervals at the check's Bonferroni share.
"""
from __future__ import annotations

import numpy as np

from parity import diagnose
from parity.tolerances import bias_grad_bound, check_alpha, two_sample_interval, weight_grad_bound
from parity.verdict import Recorder, fmt, summarize

NAME = "gradients"


def _flat(tree: dict, names) -> np.ndarray:
    return np.concatenate([np.asarray(tree[n], np.float64).ravel() for n in names])


def _cosine(a: np.ndarray, b: np.ndarray) -> float:
    na, nb = np.linalg.norm(a), np.linalg.norm(b)
    return float(a @ b / (na * nb)) if na > 0 and nb > 0 else 0.0


def _leaf_bound(name: str, noise: dict, shaped: np.ndarray) -> np.ndarray:
    if name.endswith(".weight"):
        return weight_grad_bound(shaped, *noise[name])
    if name in noise:
        return bias_grad_bound(shaped, noise[name])
    return np.zeros(1)


def _objective_values(kind: str, noise: dict, target: dict, names) -> np.ndarray:
    """Fitness (m,) float32 of each member's perturbation delta_i for a linear or quadratic objective.

    linear: <t, delta>; quadratic: -||t + delta||^2 (t = theta - theta*). For a weight delta = A B^T,
    so <t, A B^T> = sum((t B) * A) and ||A B^T||^2 = sum((A^T A) * (B^T B)): nothing out x in per member.
    """
    m = next(v[0].shape[0] for v in noise.values() if isinstance(v, tuple))
    total = np.zeros(m)
    for name in names:
        t = target[name]
        if name.endswith(".weight"):
            A, B = (np.asarray(x, np.float64) for x in noise[name])                 # (m, out, r), (m, in, r)
            inner = ((t @ B) * A).sum((1, 2))                                         # <t, A_m B_m^T>
            square = 0.0
            if kind == "quadratic":
                square = ((np.swapaxes(A, 1, 2) @ A) * (np.swapaxes(B, 1, 2) @ B)).sum((1, 2))   # ||A B^T||_F^2
        elif name in noise:
            eps = np.asarray(noise[name], np.float64)                                 # (m, out)
            inner, square = eps @ t, (eps ** 2).sum(1)
        else:
            inner, square = np.zeros(m), 0.0
        total += inner if kind == "linear" else -((t ** 2).sum() + 2 * inner + square)
    return total.astype(np.float32)


def run(ctx):
    rec = Recorder(NAME)
    cfg, shapes, sigma, r = ctx.cfg, ctx.shapes, ctx.cfg.sigma, ctx.cfg.rank
    names = list(shapes)
    rng = ctx.rng(41)
    found: dict[str, object] = {}
    for n in ctx.sizes.grad_pops:
        noise = ctx.reference.noise(shapes, ctx.seed, 0, np.arange(n), n, sigma, r)
        shaped = ctx.ref.shape_fitness(rng.standard_normal(n).astype(np.float32), 0)
        g_port = ctx.port.gradient(noise, shaped, sigma, shapes)
        g_ref = ctx.ref.gradient(noise, shaped, sigma, shapes)
        other_sigma = sigma / 2
        for name in names:
            size = f"N={n} r={r} sigma={fmt(sigma)} {shapes[name]}"
            p, q = np.asarray(g_port[name], np.float64), np.asarray(g_ref[name], np.float64)
            bound = 2 * _leaf_bound(name, noise, shaped)
            ratio = float(np.max(np.abs(p - q) / np.maximum(bound, 1e-300))) if np.any(p != q) else 0.0
            norm_ratio = float(np.linalg.norm(p) / np.linalg.norm(q)) if np.linalg.norm(q) > 0 else float("nan")
            cosine = _cosine(p.ravel(), q.ravel())

            def leaf_cause(name=name, norm_ratio=norm_ratio, cosine=cosine, n=n, shaped=shaped):
                if name not in found:
                    noise2 = ctx.reference.noise(shapes, ctx.seed, 0, np.arange(n), n, other_sigma, r)
                    g2p = ctx.port.gradient(noise2, shaped, other_sigma, shapes)[name]
                    g2r = ctx.ref.gradient(noise2, shaped, other_sigma, shapes)[name]
                    ratio2 = float(np.linalg.norm(g2p) / np.linalg.norm(g2r)) if np.linalg.norm(g2r) > 0 else None
                    found[name] = diagnose.gradient_cause(name, norm_ratio, cosine, ratio2, sigma, other_sigma)
                return found[name]

            rec.bound(f"{name}: max |port - ref| / bound", "both", size, ratio, 1.0,
                      "float32 bound of the einsum/mean, both sides", cause=leaf_cause)
            rec.info(f"{name}: relative error", "both", size,
                     float(np.linalg.norm(p - q) / np.linalg.norm(q)) if np.linalg.norm(q) > 0 else 0.0)
            rec.info(f"{name}: cosine", "both", size, cosine)
            rec.info(f"{name}: norm ratio port/ref", "both", size, norm_ratio)

    # Synthetic objectives: each side with its own noise.
    target_rng = ctx.rng(42)
    targets = {kind: {name: target_rng.standard_normal(shape) for name, shape in shapes.items()}
               for kind in ("linear", "quadratic")}
    pops, reps = ctx.sizes.synthetic_pops, ctx.sizes.synthetic_repeats
    alpha = check_alpha(NAME) / (2 * len(pops))
    curves = []
    ctx.log(f"[{NAME}] synthetic objectives: {len(pops)} population sizes x {reps} repeats x 2 sides")
    for kind, target in targets.items():
        true = _flat({k: (v if kind == "linear" else -2 * v) for k, v in target.items()}, names)
        for n in pops:
            cos = {"port": [], "reference": []}
            for k in range(reps):
                seed_k = ctx.seed * 1000 + 100 + k
                for side, port in (("port", ctx.port), ("reference", ctx.ref)):
                    noise = port.noise(shapes, seed_k, 0, np.arange(n), n, sigma, r)
                    shaped = port.shape_fitness(_objective_values(kind, noise, target, names), 0)
                    g = port.gradient(noise, shaped, sigma, shapes)
                    cos[side].append(_cosine(_flat(g, names), true))
            diff, half = two_sample_interval(np.array(cos["port"]), np.array(cos["reference"]), alpha)
            half = max(half, 1e-6)         # identical draws (a JAX-compatible port) give a zero-width interval
            size = f"{kind} N={n} {reps} repeats"
            upstream = [c for check in ("noise", "fitness") for c in diagnose.follows(check, ctx.causes_of(check))]
            rec.stat("mean cosine to the true gradient: port - ref", "both", size, diff, -half, half, alpha,
                     f"Welch interval, alpha={alpha:.2g}",
                     cause=upstream[0] if upstream else diagnose.other(
                         "gradient estimate", f"the port's estimate is {'less' if diff < 0 else 'more'} aligned "
                                              f"with the true gradient of a {kind} objective at N={n} "
                                              f"(cosine {fmt(np.mean(cos['port']))} vs {fmt(np.mean(cos['reference']))})"))
            for side in cos:
                rec.info("mean cosine to the true gradient", side, size, float(np.mean(cos[side])))
            curves.append((kind, n, np.mean(cos["port"]), np.mean(cos["reference"])))
    table = "\n".join(f"| {kind} | {n} | {fmt(cp)} | {fmt(cr)} |" for kind, n, cp, cr in curves)
    section = "\n".join([
        "Shared noise and fitness: the reference's noise for each population size and one shaped fitness vector "
        "go to both sides. Allowed per leaf: |port - ref| <= the two sides' float32 bounds of the estimate "
        "(weights: gamma_(N r + 3) sum_n |f_n| |A_n| |B_n|^T / N; biases: gamma_(N+2) mean |f_n eps_n|); "
        "deterministic. A leaf that differs is diagnosed by its norm ratio and cosine (re-measured at sigma/2 to "
        "tell a 1/sigma factor from a constant).",
        "",
        f"Synthetic objectives, each side with its own noise, {reps} repeats per size: linear <c, delta> (true "
        "gradient c) and quadratic -||theta + delta - theta*||^2 (true gradient -2(theta - theta*)). The mean "
        f"cosines of the sides must agree within a Welch interval at alpha={alpha:.2g} per size (Bonferroni share of "
        "the suite's budget).",
        "",
        "| objective | N | port mean cosine | reference mean cosine |",
        "| --- | --- | --- | --- |",
        table,
    ])
    return summarize(NAME, rec, section)
