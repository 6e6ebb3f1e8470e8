"""Init: the port's initial parameters against the reference's normal(0, 1) / sqrt(in) weights and zero biases.

Exact parts: biases must be zero; a port claiming JAX-compatible draws must reproduce
MLP.rand_init bit for bit. Statistical parts, pooled over every weight and several run seeds:
w * sqrt(in) must be standard normal (exact chi-square and Kolmogorov-Smirnov tests at the init
check's share of the suite's false-alarm budget); the kurtosis (normal 3, uniform 1.8) names the init.
torch's nn.Linear default (uniform in +-1/sqrt(in), non-zero biases) fails and is named.
"""
from __future__ import annotations

import numpy as np

from parity import diagnose
from scipy import stats

from parity.tolerances import check_alpha, chi2_interval, ks_critical, ulp_distance
from parity.verdict import Recorder, fmt, summarize

NAME = "init"


def run(ctx):
    rec = Recorder(NAME)
    if not ctx.port.has("init_params"):
        return summarize(NAME, rec, "Skipped: the port has no `init_params`.")
    shapes = ctx.shapes
    seeds = [ctx.seed + k for k in range(ctx.sizes.init_seeds)]
    inits = [ctx.port.init_params(shapes, s) for s in seeds]
    weights = [n for n in shapes if n.endswith(".weight")]
    biases = [n for n in shapes if n.endswith(".bias")]
    scaled = np.concatenate([(p[w].astype(np.float64) * np.sqrt(shapes[w][1])).ravel() for p in inits for w in weights])
    bias_values = np.concatenate([p[b].astype(np.float64).ravel() for p in inits for b in biases])
    bias_bounds = np.concatenate([np.full(shapes[b][0], 1 / np.sqrt(shapes[b.replace(".bias", ".weight")][1]))
                                  for _ in inits for b in biases])
    var_in = float(np.mean(scaled ** 2))
    kurt = float(np.mean(scaled ** 4) / var_in ** 2) if var_in > 0 else float("nan")
    bias_zero = bool(np.all(bias_values == 0))
    found = diagnose.init_cause(var_in, kurt, bias_zero, bool(np.all(np.abs(bias_values) <= bias_bounds)))
    size = f"{len(seeds)} seeds, {scaled.size} weights"

    rec.equal("non-zero bias entries", "port", f"{len(seeds)} seeds, {bias_values.size} biases",
              int(np.sum(bias_values != 0)), 0, "the reference's biases are zeros", cause=found)
    alpha = check_alpha(NAME) / 2
    lo, hi = chi2_interval(scaled.size, alpha)
    rec.stat("w * sqrt(in): mean square", "port", size, var_in, lo, hi, alpha,
             f"chi-square({scaled.size})/{scaled.size}, alpha={alpha:.2g}", cause=found)
    rec.alpha += alpha
    rec.bound("w * sqrt(in): Kolmogorov-Smirnov distance to N(0,1)", "port", size,
              float(stats.kstest(scaled, "norm").statistic), ks_critical(scaled.size, alpha),
              f"exact KS critical value, alpha={alpha:.2g}", cause=found)
    rec.info("w * sqrt(in): kurtosis", "port", size, kurt, "normal 3, uniform 1.8")

    if ctx.port.jax_compatible_rng:
        for s, port in zip(seeds, inits):
            ref = ctx.reference.init_params(shapes, s)
            ulps = max(int(ulp_distance(port[k], ref[k]).max()) for k in shapes)
            rec.equal("max ULP vs MLP.rand_init", "port", f"seed {s}", ulps, 0, "bit for bit (JAX-compatible draws)",
                      cause=found if (not bias_zero or abs(var_in - 1) > 0.2) else diagnose.cause(
                          "rng", f"the port claims JAX-compatible draws but its init differs from MLP.rand_init "
                                 f"by up to {ulps} ULP at seed {s}"))
    section = "\n".join([
        f"The port's init_params for seeds {seeds} ({len(weights)} weights, {len(biases)} biases each).",
        "",
        f"Biases must be exactly zero. Weights scaled by sqrt(in), pooled ({scaled.size} values), are iid standard "
        f"normal under the reference: their mean square against chi-square(n)/n and their Kolmogorov-Smirnov distance "
        f"to N(0,1) against its exact critical value, at alpha={alpha:.2g} each (the init check's share of the suite's "
        "false-alarm budget); the kurtosis is reported (normal 3, uniform 1.8) to name the init. "
        + ("The port claims JAX-compatible draws, so its parameters must also equal MLP.rand_init bit for bit. "
           if ctx.port.jax_compatible_rng else "The port uses its own generator: compared in distribution only. ")
        + f"Observed: var*in {fmt(var_in)}, kurtosis {fmt(kurt)}, biases {'zero' if bias_zero else 'non-zero'}.",
    ])
    return summarize(NAME, rec, section)
