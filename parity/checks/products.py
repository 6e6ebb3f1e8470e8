"""Perturbed products and forwards: the same W, factors and inputs through both sides.

perturbed_linear against the reference's do_mm expression x @ W^T + (x @ B) @ A^T, at the MLP's
shapes and a few more; then the full MLP forward without and with noise (shared: the reference's
draws), where an activation drift shows. Tolerance: the float32 bounds of parity.tolerances
(linear_bound; ForwardBound for the MLP), both sides summed; deterministic.
"""
from __future__ import annotations

import numpy as np

from parity import diagnose
from parity.tolerances import ForwardBound, gamma, linear_bound, linear_exact
from parity.verdict import Recorder, fmt, summarize

NAME = "products"
CANDIDATE_ACTIVATIONS = ("pqn", "tanh", "relu", "silu")


def _linear_cases(ctx):
    shapes = [s for n, s in ctx.shapes.items() if n.endswith(".weight")]
    for extra in ctx.sizes.extra_linear:
        if tuple(extra) not in shapes:
            shapes.append(tuple(extra))
    return shapes


def _forward_inputs(ctx):
    """Params (the reference's init with non-zero biases), the shared noise and observations."""
    rng = ctx.rng(21)
    m = ctx.sizes.product_members
    params = ctx.reference.init_params(ctx.shapes, ctx.seed)
    params = {k: (v if k.endswith(".weight") else (0.1 * rng.standard_normal(v.shape)).astype(np.float32))
              for k, v in params.items()}
    noise = ctx.reference.noise(ctx.shapes, ctx.seed, 0, np.arange(m), ctx.cfg.pop, ctx.cfg.sigma, ctx.cfg.rank)
    x = (rng.standard_normal((m, ctx.shapes["0.weight"][1])) * np.array([1.0, 0.5, 0.1, 0.5])[: ctx.shapes["0.weight"][1]]
         ).astype(np.float32)                                   # CartPole-like observation scales
    return params, noise, x


def _matching_activation(port_out, params, noise, x):
    """Which activation's float64 MLP the port's logits equal within that MLP's float32 bound."""
    for act in CANDIDATE_ACTIVATIONS:
        exact, bound = ForwardBound(params, noise, act)(x)
        if np.all(np.abs(port_out - exact) <= bound + 1e-7):
            return act
    return None


def run(ctx):
    rec = Recorder(NAME)
    rng = ctx.rng(20)
    m, batch, r = ctx.sizes.product_members, ctx.sizes.product_batch, ctx.cfg.rank
    sigma = ctx.cfg.sigma
    for out_dim, in_dim in _linear_cases(ctx):
        W = (rng.standard_normal((out_dim, in_dim)) / np.sqrt(in_dim)).astype(np.float32)
        A = (rng.standard_normal((m, out_dim, r)) * sigma / np.sqrt(r)).astype(np.float32)
        B = rng.standard_normal((m, in_dim, r)).astype(np.float32)
        x = rng.standard_normal((m, batch, in_dim)).astype(np.float32)
        size = f"out={out_dim} in={in_dim} r={r} m={m} batch={batch}"
        port = ctx.port.perturbed_linear(W, A, B, x)
        ref = ctx.ref.perturbed_linear(W, A, B, x)
        bound = linear_bound(W, A, B, x)
        exact = linear_exact(W, A, B, x)
        why = f"gamma_(in+r+1) = {fmt(gamma(in_dim + r + 1))} times |x||W|^T + |x||B||A|^T"
        product_cause = diagnose.other("perturbed product", f"x @ (W + A B^T)^T at {size}: the port's result is not "
                                                            "within float32 rounding of the exact product")
        rec.bound("max |port - ref| / bound", "both", size, float(np.max(np.abs(port - ref) / (2 * bound))), 1.0,
                  why + ", both sides", cause=product_cause)
        rec.bound("max |port - exact| / bound", "port", size, float(np.max(np.abs(port - exact) / bound)), 1.0, why,
                  cause=product_cause)
        rec.bound("max |ref - exact| / bound", "reference", size, float(np.max(np.abs(ref - exact) / bound)), 1.0, why,
                  cause=diagnose.other("reference product", "the reference's do_mm exceeds the float32 bound"))

    forward_note = "skipped: the port has no `forward` method"
    if ctx.port.has("forward"):
        params, noise, x = _forward_inputs(ctx)
        act = ctx.reference.run.activation
        n_out = ctx.shapes[f"{len([k for k in ctx.shapes if k.endswith('.weight')]) - 1}.weight"][0]
        found = None
        for label, nz in (("plain", None), ("perturbed", noise)):
            port = ctx.port.forward(params, nz, x, n_out)
            ref = ctx.ref.forward(params, nz, x, n_out)
            exact, bound = ForwardBound(params, nz, act)(x)
            size = f"{label} m={x.shape[0]} sizes={ctx.cfg.sizes}"
            diff = float(np.max(np.abs(port - ref)))
            if found is None and np.any(np.abs(port - ref) > 2 * bound):
                found = diagnose.activation_cause(_matching_activation(port, params, nz, x), act, fmt(diff))
            forward_cause = found

            rec.bound("max |port - ref| / bound", "both", size, float(np.max(np.abs(port - ref) / (2 * bound))), 1.0,
                      "first-order float32 bound of the MLP (ForwardBound), both sides", cause=forward_cause)
            rec.bound("max |port - exact| / bound", "port", size, float(np.max(np.abs(port - exact) / bound)), 1.0,
                      "first-order float32 bound of the MLP", cause=forward_cause)
            rec.bound("max |ref - exact| / bound", "reference", size, float(np.max(np.abs(ref - exact) / bound)), 1.0,
                      "first-order float32 bound of the MLP",
                      cause=diagnose.other("reference forward", "the reference MLP exceeds its float32 bound"))
        forward_note = (f"Full MLP forwards on {x.shape[0]} members with the reference's {act} activation, plain and "
                        "with the reference's noise (weights and biases) fed to both sides.")
    section = "\n".join([
        "perturbed_linear: x @ W^T + (x @ B) @ A^T on the same float32 inputs. Allowed: each side within "
        "gamma_(in+r+1) (|x||W|^T + |x||B||A|^T) of the exact product (Higham's bound for any summation order; "
        "u = 2^-24), so the sides differ by at most twice that; deterministic.",
        "",
        forward_note + " Allowed: the first-order float32 bound of parity.tolerances.ForwardBound (rounding "
        "of each perturbed product, bias additions, the layer norm's mean/variance/sqrt/division, propagated "
        "through |W| + |A||B|^T and the layer norm's 1/s Jacobian), both sides. A port whose logits match a "
        "different activation's float64 MLP is diagnosed as an activation drift.",
    ])
    return summarize(NAME, rec, section)
