"""Perturbed products and forwards: the same W, factors and inputs through both sides.

perturbed_linear against the reference's do_mm expression x @ W^T + (x @ B) @ A^T, at the MLP's
shapes and a few more; then the full MLP forward without and with noise (shared: the reference's
draws), where an activation drift shows. Tolerance: the float32 bounds of parity.core.tolerances
(linear_bound; ForwardBound for the MLP), both sides summed; deterministic.

A reference whose platform resolves to TF32 (JAX's default precision on NVIDIA GPUs of compute capability >= 8.0,
or gpu-sim) rounds every matmul operand to 10 mantissa bits (u = 2^-11) before its float32 sums: its own bound is
the float32 one widened by four such roundings along the longest chain (x and B, then x @ B and A):
with_operands(gamma_(in+r+1), 4, 2^-11) for a product, the same per layer in ForwardBound. The port keeps its
float32 bound. When the reference exceeds its own bound while the port is within its own, the cause names the
reference's platform, never the port (reference_cause).
"""
from __future__ import annotations

from typing import NamedTuple

import numpy as np

from parity.core import diagnose
from parity.mlp.noiseform import bias_names, dense_of, update_of
from parity.core.tolerances import (ForwardBound, dense_linear_bound, dense_linear_exact, gamma, linear_bound,
                                    linear_bound_tf32, linear_exact, U_TF32, with_operands)
from parity.core.verdict import Recorder, fmt, summarize
from spec.layout import n_layers_of
from spec.platform import ReferencePlatform

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
    rng = ctx.rng("forward inputs")
    m = ctx.sizes.product_members
    params = ctx.reference.init_params(ctx.shapes, ctx.seed)
    params = {k: (v if k.endswith(".weight") else (0.1 * rng.standard_normal(v.shape)).astype(np.float32))
              for k, v in params.items()}
    noise = ctx.reference.noise(ctx.shapes, ctx.seed, 0, np.arange(m), ctx.cfg.pop, ctx.cfg.sigma, ctx.cfg.rank)
    x = (rng.standard_normal((m, ctx.shapes["0.weight"][1])) * np.array([1.0, 0.5, 0.1, 0.5])[: ctx.shapes["0.weight"][1]]
         ).astype(np.float32)                                   # CartPole-like observation scales
    return params, noise, x


def _matching_forward(port_out, params, noise, x, reference_act: str) -> tuple[str, bool] | None:
    """(activation, whether the bias noise is applied) of the float64 MLP the port's logits equal within its
    float32 bound: the reference's activation first, then the others; with the bias noise, then without it."""
    variants = [(noise, True)]
    if noise is not None and any(not isinstance(v, tuple) for v in noise.values()):
        variants.append(({k: v for k, v in noise.items() if isinstance(v, tuple)}, False))
    activations = [reference_act] + [a for a in CANDIDATE_ACTIVATIONS if a != reference_act]
    for nz, applied in variants:
        for act in activations:
            exact, bound = ForwardBound(params, nz, act)(x)
            if np.all(np.abs(port_out - exact) <= bound + 1e-7):
                return act, applied
    return None


class Linear(NamedTuple):
    """perturbed_linear at one shape: each side's and their difference's ratio to the float32 bound."""

    size: str
    both: float          # max |port - ref| / (both bounds + the gap between their exact values)
    port: float          # max |port - exact| / bound (a dense port: of x (W + E)^T, E = fl32(A B^T))
    ref: float           # max |ref - exact| / the reference's bound (TF32 operands where its platform has them)
    why: str
    port_why: str
    port_tf32: float = 0.0   # max |port - its exact| / (the bound with TF32 operands): <= 1 where TF32 explains it
    ref_why: str = ""        # the reference's bound in words (why, unless its platform rounds operands to TF32)


class Forward(NamedTuple):
    """The full MLP forward, plain or perturbed, against the first-order float32 bound."""

    size: str
    both: float
    port: float
    ref: float
    exceeds: bool                # |port - ref| > both bounds (+ the gap of a dense port's exact value) somewhere
    port_match: tuple[str, bool] | None   # when it exceeds: (activation, bias noise applied) of the MLP it equals
    worst: float                 # max |port - ref|


class Measured(NamedTuple):
    linear: tuple[Linear, ...]
    forward: tuple[Forward, ...]     # empty when the port has no forward
    activation: str                  # the reference's
    members: int
    own_bias_noise: bool | None      # when the forward leaves bias noise out: whether the port's own noise has any
    platform: ReferencePlatform = ReferencePlatform()   # where the reference ran (its bounds: TF32 or float32)


def _measure_linear(ctx, rng, out_dim: int, in_dim: int) -> Linear:
    m, batch, r, sigma = ctx.sizes.product_members, ctx.sizes.product_batch, ctx.cfg.rank, ctx.cfg.sigma
    W = (rng.standard_normal((out_dim, in_dim)) / np.sqrt(in_dim)).astype(np.float32)
    A = (rng.standard_normal((m, out_dim, r)) * sigma / np.sqrt(r)).astype(np.float32)
    B = rng.standard_normal((m, in_dim, r)).astype(np.float32)
    x = rng.standard_normal((m, batch, in_dim)).astype(np.float32)
    port = ctx.port.perturbed_linear(W, A, B, x)
    ref = ctx.ref.perturbed_linear(W, A, B, x)
    bound, exact = linear_bound(W, A, B, x), linear_exact(W, A, B, x)
    why = f"gamma_(in+r+1) = {fmt(gamma(in_dim + r + 1))} times |x||W|^T + |x||B||A|^T"
    port_bound, port_exact, port_why = bound, exact, why
    ref_bound, ref_why = bound, why
    if ctx.ref_u:                             # the reference's matmuls round their operands to TF32 first
        ref_bound = linear_bound(W, A, B, x, ctx.ref_u)
        widened = with_operands(gamma(in_dim + r + 1), 4, ctx.ref_u)
        ref_why = f"with_operands(gamma_(in+r+1), 4, 2^-11) = {fmt(widened)} times |x||W|^T + |x||B||A|^T (TF32 operands)"
    tf32_bound = linear_bound_tf32(W, A, B, x)
    if ctx.port.dense:                        # the port computed x (W + E)^T from the E it was given
        E = dense_of(A, B)
        port_bound, port_exact = dense_linear_bound(W, E, x), dense_linear_exact(W, E, x)
        port_why = f"gamma_(in+2) = {fmt(gamma(in_dim + 2))} times |x|(|W| + |E|)^T, E = fl32(A B^T)"
        tf32_bound = port_bound * (1 + gamma(3, U_TF32) / gamma(in_dim + 2))
    allowed = ref_bound + port_bound + np.abs(port_exact - exact)
    ctx.witness(f"out={out_dim} in={in_dim}", port, port, ref, allowed,
                "both sides' float32 bounds of the product (parity.core.tolerances.linear_bound)")
    return Linear(f"out={out_dim} in={in_dim} r={r} m={m} batch={batch}", float(np.max(np.abs(port - ref) / allowed)),
                  float(np.max(np.abs(port - port_exact) / port_bound)), float(np.max(np.abs(ref - exact) / ref_bound)),
                  why, port_why, float(np.max(np.abs(port - port_exact) / tf32_bound)), ref_why)


def _measure_forward(ctx, label: str, params, noise, x, act: str) -> Forward:
    """Both forwards on the same noise; a dense port's own exact value and bound are those of the E it was given."""
    n_out = ctx.shapes[f"{n_layers_of(ctx.shapes) - 1}.weight"][0]
    port = ctx.port.forward(params, noise, x, n_out)
    ref = ctx.ref.forward(params, noise, x, n_out)
    exact, bound = ForwardBound(params, noise, act)(x)
    given = ctx.port.received(noise, "forward")
    port_exact, port_bound = (exact, bound) if given is noise else ForwardBound(params, given, act)(x)
    if ctx.ref_u:                             # the reference's TF32 products, carried through its MLP
        bound = ForwardBound(params, noise, act, u_operand=ctx.ref_u)(x)[1]
    allowed = bound + port_bound + np.abs(port_exact - exact)
    ctx.witness(label, port, port, ref, allowed,
                "both sides' float32 bounds of the MLP (parity.core.tolerances.ForwardBound)")
    exceeds = bool(np.any(np.abs(port - ref) > allowed))
    return Forward(f"{label} m={x.shape[0]} sizes={ctx.cfg.sizes}", float(np.max(np.abs(port - ref) / allowed)),
                   float(np.max(np.abs(port - port_exact) / port_bound)), float(np.max(np.abs(ref - exact) / bound)),
                   exceeds, _matching_forward(port, params, given, x, act) if exceeds else None,
                   float(np.max(np.abs(port - ref))))


def _own_bias_noise(ctx) -> bool:
    """Whether the port's own noise (its update part) perturbs any bias: tells bias_noise=off from update_only."""
    noise = ctx.port.noise(ctx.shapes, ctx.seed, 0, np.arange(2), ctx.cfg.pop, ctx.cfg.sigma, ctx.cfg.rank)
    return bool(bias_names(update_of(noise)))


def measure(ctx) -> Measured:
    rng = ctx.rng("linear products")
    linear = tuple(_measure_linear(ctx, rng, out_dim, in_dim) for out_dim, in_dim in _linear_cases(ctx))
    act = ctx.reference.run.activation
    forward: tuple[Forward, ...] = ()
    if ctx.port.has("forward"):
        params, noise, x = _forward_inputs(ctx)
        forward = tuple(_measure_forward(ctx, label, params, nz, x, act)
                        for label, nz in (("plain", None), ("perturbed", noise)))
    leaves_bias_out = any(f.port_match is not None and not f.port_match[1] for f in forward)
    return Measured(linear, forward, act, ctx.sizes.product_members,
                    _own_bias_noise(ctx) if leaves_bias_out else None, ctx.platform)


def judge(m: Measured) -> Recorder:
    rec = Recorder(NAME)
    for c in m.linear:
        ref_cause = diagnose.reference_cause(f"do_mm at {c.size}", c.ref, m.platform)
        product_cause = ref_cause if c.port <= 1 < c.ref else _product_cause(c)   # never the port for the reference
        rec.bound("max |port - ref| / bound", "both", c.size, c.both, 1.0,
                  (c.why + ", both sides") if not m.platform.tf32 else
                  f"the port's float32 bound + the reference's TF32 bound ({c.ref_why})", cause=product_cause)
        rec.bound("max |port - exact| / bound", "port", c.size, c.port, 1.0, c.port_why, cause=_product_cause(c))
        rec.bound("max |ref - exact| / bound", "reference", c.size, c.ref, 1.0, c.ref_why or c.why, cause=ref_cause)
    tf32 = any(c.port > 1 and c.port_tf32 <= 1 for c in m.linear)
    for f in m.forward:
        found = None
        if f.exceeds and f.port <= 1 < f.ref:                # the reference's own rounding, not the port's
            found = diagnose.reference_cause(f"{f.size.split()[0]} MLP forward", f.ref, m.platform)
        elif f.exceeds and f.port_match is None and tf32:     # the TF32 products above, carried through the MLP
            found = diagnose.cause("matmul_precision", f"the {f.size.split()[0]} forward's logits differ from the "
                                                       f"reference's by up to {fmt(f.worst)}, beyond float32 "
                                                       "rounding, as the TF32 products above")
        elif f.exceeds:                        # each differing forward diagnosed on its own (plain, perturbed)
            found, *more = _forward_causes(f, m.activation, m.own_bias_noise)
            rec.causes.extend(more)
        why = "first-order float32 bound of the MLP"
        ref_why = why if not m.platform.tf32 else "first-order bound of the MLP with TF32 operands"
        rec.bound("max |port - ref| / bound", "both", f.size, f.both, 1.0,
                  f"{why} (ForwardBound), both sides" if not m.platform.tf32 else
                  "ForwardBound: the port's float32, the reference's with TF32 operands", cause=found)
        rec.bound("max |port - exact| / bound", "port", f.size, f.port, 1.0, why,
                  cause=None if f.port <= 1 < f.ref else found)
        rec.bound("max |ref - exact| / bound", "reference", f.size, f.ref, 1.0, ref_why,
                  cause=diagnose.reference_cause(f"{f.size.split()[0]} MLP forward", f.ref, m.platform))
    return rec


def _product_cause(c: Linear):
    """TF32 matmuls when the port is within TF32's rounding of the exact product, else an unknown product drift."""
    if c.port > 1 and c.port_tf32 <= 1:
        return diagnose.cause("matmul_precision", f"the port's x @ (W + A B^T)^T at {c.size} is within TF32 rounding "
                                                  "(operands rounded to 10 mantissa bits) of the exact product but not "
                                                  f"within float32's: {fmt(c.port)}x the float32 bound, "
                                                  f"{fmt(c.port_tf32)}x the TF32 bound (as matmul_precision=high)")
    return diagnose.other("perturbed product", f"x @ (W + A B^T)^T at {c.size}: the port's result is not within "
                                               "float32 rounding of the exact product")


def _forward_causes(f: Forward, reference_act: str, own_bias_noise: bool | None = True) -> list:
    """The causes a differing forward shows: the bias noise left out of it (update_only when the port's own noise
    has bias noise, off when it has none), another activation, or neither known."""
    if f.port_match is None:
        return [diagnose.activation_cause(None, reference_act, fmt(f.worst))]
    act, applied = f.port_match
    causes = []
    if not applied and own_bias_noise is False:
        causes.append(diagnose.cause("bias_noise", "the port's forward does not add the bias noise it is given and "
                                                   "its own noise has none: it perturbs no bias (as bias_noise=off); "
                                                   "its logits equal the reference MLP's without bias noise; "
                                                   f"worst logit difference {fmt(f.worst)}"))
    elif not applied:
        causes.append(diagnose.cause("bias_noise", "the port's forward does not add the bias noise it is given: its "
                                                   "logits equal the reference MLP's without bias noise (as "
                                                   "bias_noise=update_only, noise that enters the update only); "
                                                   f"worst logit difference {fmt(f.worst)}"))
    if act != reference_act:
        causes.append(diagnose.activation_cause(act, reference_act, fmt(f.worst)))
    return causes or [diagnose.activation_cause(None, reference_act, fmt(f.worst))]


def section(m: Measured) -> str:
    tf32_note = ("" if not m.platform.tf32 else "\n\nThe reference's platform resolves to TF32 (" + m.platform.where() +
                 "): its products and forwards are held to the float32 bounds widened by four TF32 operand roundings "
                 "(u = 2^-11, parity.core.tolerances.with_operands), the port to its float32 bounds, and the sides may "
                 "differ by the sum.")
    forward_note = "skipped: the port has no `forward` method"
    if m.forward:
        forward_note = (f"Full MLP forwards on {m.members} members with the reference's {m.activation} activation, "
                        "plain and with the reference's noise (weights and biases) fed to both sides (a dense port "
                        "gets E = fl32(A B^T), and its bound is that of x (W + E)^T plus the gap between the two "
                        "exact values).")
    return "\n".join([
        "perturbed_linear: x @ W^T + (x @ B) @ A^T on the same float32 inputs. Allowed: each side within "
        "gamma_(in+r+1) (|x||W|^T + |x||B||A|^T) of the exact product (Higham's bound for any summation order; "
        "u = 2^-24), so the sides differ by at most twice that; deterministic. A dense port (dense_noise) gets "
        "E = fl32(A B^T) and is held to gamma_(in+2) |x|(|W| + |E|)^T around x (W + E)^T; the sides then differ by "
        "at most both bounds plus |x (E - A B^T)^T|, computed exactly.",
        "",
        forward_note + " Allowed: the first-order float32 bound of parity.core.tolerances.ForwardBound (rounding "
        "of each perturbed product, bias additions, the layer norm's mean/variance/sqrt/division, propagated "
        "through |W| + |A||B|^T and the layer norm's 1/s Jacobian), both sides. A port whose logits match a "
        "different activation's float64 MLP is diagnosed as an activation drift." + tf32_note,
    ])


def run(ctx):
    m = measure(ctx)
    return summarize(NAME, judge(m), section(m))
