"""Init: the port's initial parameters against the reference's normal(0, 1) / sqrt(in) weights and zero biases.

Exact parts: biases must be zero; a port claiming JAX-compatible draws must reproduce
MLP.rand_init bit for bit. Statistical parts, pooled over every weight and several run seeds:
w * sqrt(in) must be standard normal (exact chi-square and Kolmogorov-Smirnov tests at the init
check's share of the suite's false-alarm budget); the kurtosis (normal 3, uniform 1.8) names the init.
torch's nn.Linear default (uniform in +-1/sqrt(in), non-zero biases) fails and is named.
"""
from __future__ import annotations

from typing import NamedTuple

import numpy as np
from scipy import stats

from parity.core import diagnose
from parity.mlp.checks.noise import other_backend
from parity.core.tolerances import check_alpha, chi2_interval, ks_critical, ulp_distance
from parity.core.verdict import Recorder, fmt, summarize
from spec.platform import ReferencePlatform

NAME = "init"


class Measured(NamedTuple):
    seeds: tuple[int, ...]
    n_weights: int                   # weight leaves per init
    n_biases: int
    scaled: np.ndarray               # every weight times sqrt(in), pooled over seeds
    bias_values: np.ndarray
    bias_in_bound: bool              # every bias within +-1/sqrt(in) (torch's uniform default)
    layers: tuple[tuple[int, float, int], ...]   # per weight: (values, raw mean square, fan-in), over seeds
    max_ulps: tuple[int, ...] | None  # per seed, against MLP.rand_init (a port claiming JAX's draws)
    same_weights: tuple[str, ...] = ()  # weights bit for bit alike at the first two seeds (the seed ignored)
    backend: str | None = None       # the port's init is the reference's on this other backend's normals
    platform: ReferencePlatform = ReferencePlatform()

    @property
    def var_in(self) -> float:
        return float(np.mean(self.scaled ** 2))

    @property
    def kurtosis(self) -> float:
        return float(np.mean(self.scaled ** 4) / self.var_in ** 2) if self.var_in > 0 else float("nan")

    @property
    def bias_zero(self) -> bool:
        return bool(np.all(self.bias_values == 0))


def measure(ctx) -> Measured:
    shapes = ctx.shapes
    seeds = tuple(ctx.seed + k for k in range(ctx.sizes.init_seeds))
    inits = [ctx.port.init_params(shapes, s) for s in seeds]
    weights = [n for n in shapes if n.endswith(".weight")]
    biases = [n for n in shapes if n.endswith(".bias")]
    for s, params in zip(seeds, inits):
        for b in biases:
            ctx.witness(f"seed {s} {b}", params, params[b], np.zeros(shapes[b]), 0.0,
                        "exact: the reference's biases are zeros", (b,))
    scaled = np.concatenate([(p[w].astype(np.float64) * np.sqrt(shapes[w][1])).ravel() for p in inits for w in weights])
    bias_values = np.concatenate([p[b].astype(np.float64).ravel() for p in inits for b in biases])
    bias_bounds = np.concatenate([np.full(shapes[b][0], 1 / np.sqrt(shapes[b.replace(".bias", ".weight")][1]))
                                  for _ in inits for b in biases])
    ulps, backend = None, None
    if ctx.port.jax_compatible_rng:
        refs = [ctx.reference.init_params(shapes, s) for s in seeds]
        for s, params, ref in zip(seeds, inits, refs):
            for k in shapes:
                ctx.witness(f"seed {s} {k}", params, params[k], ref[k], 0.0,
                            "exact: the port claims JAX-compatible draws (MLP.rand_init)", (k,))
        ulps = tuple(max(int(ulp_distance(port[k], ref[k]).max()) for k in shapes) for port, ref in zip(inits, refs))
        backend = None if not any(ulps) else other_backend(ctx, inits[0], lambda o: o.init_params(shapes, seeds[0]))
    layers = tuple((len(inits) * int(np.prod(shapes[w])),
                    float(np.mean(np.concatenate([p[w].astype(np.float64).ravel() for p in inits]) ** 2)),
                    int(shapes[w][1])) for w in weights)
    return Measured(seeds, len(weights), len(biases), scaled, bias_values,
                    bool(np.all(np.abs(bias_values) <= bias_bounds)), layers, ulps, same_at_two_seeds(inits, weights),
                    backend, ctx.platform)


def same_at_two_seeds(inits: list[dict], weights: list[str]) -> tuple[str, ...]:
    """Weights whose init is bit for bit the same at the first two seeds (reusing the check's draws; biases are
    zeros by design, so only weights say whether the seed is used). Exact: no false alarm."""
    if len(inits) < 2:
        return ()
    return tuple(w for w in weights if np.array_equal(inits[0][w], inits[1][w]))


def judge(m: Measured) -> Recorder:
    rec = Recorder(NAME)
    found = diagnose.init_cause(m.var_in, m.kurtosis, m.bias_zero, m.bias_in_bound, m.layers)
    size = f"{len(m.seeds)} seeds, {m.scaled.size} weights"
    seed_cause = diagnose.seed_cause("init", m.same_weights, m.seeds[:2]) if m.same_weights else None
    if len(m.seeds) > 1:
        rec.equal("weights the same at two run seeds", "port", f"seeds {m.seeds[0]} and {m.seeds[1]}",
                  len(m.same_weights), 0, "exact: the reference's init starts from key(seed)", cause=seed_cause)
    rec.equal("non-zero bias entries", "port", f"{len(m.seeds)} seeds, {m.bias_values.size} biases",
              int(np.sum(m.bias_values != 0)), 0, "the reference's biases are zeros", cause=found)
    alpha = check_alpha(NAME) / 2
    lo, hi = chi2_interval(m.scaled.size, alpha)
    rec.stat("w * sqrt(in): mean square", "port", size, m.var_in, lo, hi, alpha,
             f"chi-square({m.scaled.size})/{m.scaled.size}, alpha={alpha:.2g}", cause=found)
    rec.alpha += alpha
    rec.bound("w * sqrt(in): Kolmogorov-Smirnov distance to N(0,1)", "port", size,
              float(stats.kstest(m.scaled, "norm").statistic), ks_critical(m.scaled.size, alpha),
              f"exact KS critical value, alpha={alpha:.2g}", cause=found)
    rec.info("w * sqrt(in): kurtosis", "port", size, m.kurtosis, "normal 3, uniform 1.8")
    for s, ulps in zip(m.seeds, m.max_ulps or ()):
        rec.equal("max ULP vs MLP.rand_init", "port", f"seed {s}", ulps, 0, "bit for bit (JAX-compatible draws)",
                  cause=seed_cause or (found if (not m.bias_zero or abs(m.var_in - 1) > 0.2) else
                                       _rng_cause(m, f"its init differs from MLP.rand_init by up to {ulps} ULP at "
                                                     f"seed {s}")))
    return rec


def _rng_cause(m: Measured, detail: str):
    """knob rng: the other backend's normals where the port's init equals the reference's on them, else its draws."""
    if m.backend is not None:
        return diagnose.backend_cause(m.backend, m.platform, detail)
    return diagnose.cause("rng", f"the port claims JAX-compatible draws but {detail}")


def section(m: Measured) -> str:
    alpha = check_alpha(NAME) / 2
    return "\n".join([
        f"The port's init_params for seeds {list(m.seeds)} ({m.n_weights} weights, {m.n_biases} biases each).",
        "",
        f"Weights must differ between run seeds {list(m.seeds[:2])} (exact: a port that ignores the seed draws "
        "them bit for bit alike). Biases must be exactly zero. Weights scaled by sqrt(in), pooled ({m.scaled.size} values), are iid standard "
        f"normal under the reference: their mean square against chi-square(n)/n and their Kolmogorov-Smirnov "
        f"distance to N(0,1) against its exact critical value, at alpha={alpha:.2g} each (the init check's share of "
        "the suite's false-alarm budget); the kurtosis is reported (normal 3, uniform 1.8) to name the init. "
        + ("The port claims JAX-compatible draws, so its parameters must also equal MLP.rand_init bit for bit. "
           if m.max_ulps is not None else "The port uses its own generator: compared in distribution only. ")
        + f"Observed: var*in {fmt(m.var_in)}, kurtosis {fmt(m.kurtosis)}, biases "
          f"{'zero' if m.bias_zero else 'non-zero'}.",
    ])


def run(ctx):
    m = measure(ctx)
    return summarize(NAME, judge(m), section(m))
