"""Noise: distribution, pairing, scaling, bias noise, independence, the noise_reuse schedule, the generator.

The port's noise comes from its own generator (`noise()`), the reference's from the noiser's draws.
Deterministic parts (exact: no false alarms): which member mirrors which, bias noise presence,
which probed epochs share noise, draws shared across members/leaves/epochs, and, for a port that
claims JAX-compatible draws, bit-identity with jax.random. Statistical parts (moments against exact
expected values): t-intervals over independent members (one per mirrored pair) at a Bonferroni
share of the suite's false-alarm budget (see parity.core.tolerances).
"""
from __future__ import annotations

from typing import NamedTuple

import numpy as np
from scipy import stats

from parity.core import diagnose
from parity.mlp.checks import dense
from parity.core.port import SplitNoise
from parity.mlp.noiseform import dense_mismatch, draws, independent_entries, perturbation, update_of
from parity.core.tolerances import (ULP_TOLERANCE, check_alpha, chi2_interval, ks_critical, mean_interval,
                                    normal_mean_interval, ulp_distance)
from parity.core.verdict import Recorder, fmt, summarize
from rollout.cartpole import MAX_STEPS
from spec.platform import ReferencePlatform

NAME = "noise"
P_MEMBERS = 128   # members whose perturbation A B^T is formed for the independence tests
GENERATOR_MEMBERS = 256   # members a dense port claiming JAX's draws is compared on (E against A B^T)


def _weights(shapes):
    return [n for n in shapes if n.endswith(".weight")]


def _biases(shapes):
    return [n for n in shapes if n.endswith(".bias")]


def _signfree(x: np.ndarray) -> bytes:
    """Bytes of x with its sign fixed by the first non-zero entry (a draw and its negation hash alike)."""
    flat = np.asarray(x, np.float64).ravel()
    nz = np.flatnonzero(flat)
    return diagnose.canonical(flat * (np.sign(flat[nz[0]]) if nz.size else 1.0))


# ----------------------------------------------------------------------------- statistics
class Test(NamedTuple):
    """One statistical test: `kind` chi2 (mean of squares of iid N(0,1) values), mean (their mean), ks
    (normality of the values), t (per-member statistics with expected mean `expected`), and for a dense port
    eggroll (KS of independent entries of E / sigma against EGGROLL's entry distribution; `rank` is r)."""

    quantity: str
    size: str
    kind: str
    values: np.ndarray
    cause: object
    expected: float = 0.0
    rank: int = 0
    source: tuple = ()         # (leaf, factor) the values are taken from: rows reps of that array / divisor
    divisor: float = 1.0


SHAPE = diagnose.other("noise distribution", "the draws are not normal")
CENTRE = diagnose.other("noise distribution", "the draws do not have mean zero")


def _scale_tests(noise: dict, reps: np.ndarray, shapes, sigma: float, r: int) -> list[Test]:
    """Per weight: the mean square of A / (sigma/sqrt r) and of B (chi-square: both are iid N(0,1) entries)."""
    tests = []
    for w in _weights(shapes):
        a = noise[w][0][reps].astype(np.float64).ravel() / (sigma / np.sqrt(r))
        b = noise[w][1][reps].astype(np.float64).ravel()
        size = f"{reps.size} members, {w} {noise[w][0].shape[1]}x{noise[w][1].shape[1]} r={r}"
        tests.append(Test(f"{w} A / (sigma/sqrt r): mean square", size, "chi2", a, diagnose.other(
            "noise scaling (sigma/sqrt(r) on A)",
            f"A of {w} has variance {fmt(float(np.mean(a ** 2)))} x sigma^2/r (sigma={fmt(sigma)}, r={r})"),
            source=(w, 0), divisor=sigma / np.sqrt(r)))
        tests.append(Test(f"{w} B: mean square", size, "chi2", b, diagnose.other(
            "noise scaling", f"B of {w} has variance {fmt(float(np.mean(b ** 2)))}; the reference's B is standard normal"),
            source=(w, 1)))
    return tests


def _pooled_tests(noise: dict, reps: np.ndarray, shapes, sigma: float, r: int) -> list[Test]:
    """All weights pooled: the mean (normal) and the Kolmogorov-Smirnov distance to N(0,1) of A and B."""
    weights = _weights(shapes)
    a_all = np.concatenate([noise[w][0][reps].astype(np.float64).ravel() for w in weights]) / (sigma / np.sqrt(r))
    b_all = np.concatenate([noise[w][1][reps].astype(np.float64).ravel() for w in weights])
    size = f"{reps.size} members, all weights"
    return [Test("A / (sigma/sqrt r): mean", size, "mean", a_all, CENTRE),
            Test("B: mean", size, "mean", b_all, CENTRE),
            Test("A / (sigma/sqrt r): Kolmogorov-Smirnov distance to N(0,1)", size, "ks", a_all, SHAPE),
            Test("B: Kolmogorov-Smirnov distance to N(0,1)", size, "ks", b_all, SHAPE)]


def _independence_tests(noise: dict, reps: np.ndarray, shapes, sigma: float) -> list[Test]:
    """Symmetric per-member statistics that are 0 in expectation: products of adjacent rows and columns of each
    A B^T, of different pairs' perturbations, of different leaves' draws (t-intervals)."""
    weights = _weights(shapes)
    tests, p_all = [], []
    few = reps[:P_MEMBERS]                     # A B^T is formed (out x in per member): cap the memory
    for w in weights:
        p = perturbation(noise, w, few) / sigma                                   # (n, out, in)
        p_all.append(p.reshape(few.size, -1))
        leaf_size = f"{few.size} members, {w} {p.shape[1]}x{p.shape[2]}"
        dep = diagnose.other("noise independence", f"neighbouring entries of {w}'s perturbation are correlated")
        if p.shape[1] > 1:
            tests.append(Test(f"{w} A B^T / sigma^2: mean product of adjacent rows", leaf_size, "t",
                              (p[:, 1:, :] * p[:, :-1, :]).mean((1, 2)), dep))
        if p.shape[2] > 1:
            tests.append(Test(f"{w} A B^T / sigma^2: mean product of adjacent columns", leaf_size, "t",
                              (p[:, :, 1:] * p[:, :, :-1]).mean((1, 2)), dep))
    p_all = np.concatenate(p_all, 1)
    tests.append(Test("A B^T / sigma: mean", f"{few.size} members, all weights", "t", p_all.mean(1), CENTRE))
    half = (few.size // 2) * 2
    tests.append(Test("A B^T: mean product of different pairs", f"{half // 2} disjoint pairs of members", "t",
                      (p_all[0:half:2] * p_all[1:half:2]).mean(1),
                      diagnose.cause("rng", "the noise of different antithetic pairs is correlated (key scheme)")))
    if len(weights) > 1:
        cross = []
        for w1, w2 in zip(weights[:-1], weights[1:]):
            x1, x2 = draws(noise, w1)[reps].reshape(reps.size, -1), draws(noise, w2)[reps].reshape(reps.size, -1)
            k = min(x1.shape[1], x2.shape[1])
            cross.append(x1[:, :k] * x2[:, :k])
        tests.append(Test(f"{'E' if isinstance(noise[w1], np.ndarray) else 'B'}: mean product across leaves",
                          f"{reps.size} members, all weights", "t",
                          np.concatenate(cross, 1).mean(1),
                          diagnose.cause("rng", "the noise of different parameter leaves is correlated (key scheme)")))
    return tests


def _bias_tests(noise: dict, reps: np.ndarray, shapes, sigma: float) -> list[Test]:
    """Per bias the mean square of eps (chi-square), pooled its mean and Kolmogorov-Smirnov distance."""
    tests = []
    biases = [bn for bn in _biases(shapes) if bn in noise]
    for bn in biases:
        e = noise[bn][reps].astype(np.float64).ravel() / sigma
        tests.append(Test(f"{bn} noise / sigma: mean square", f"{reps.size} members, {bn}", "chi2", e, diagnose.cause(
            "bias_noise", f"bias noise of {bn} has variance {fmt(float(np.mean(e ** 2)))} x sigma^2; the reference's is "
                          "sigma * eps, eps standard normal")))
    if biases:
        e = np.concatenate([noise[bn][reps].astype(np.float64).ravel() for bn in biases]) / sigma
        size = f"{reps.size} members, all biases"
        tests += [Test("bias noise / sigma: mean", size, "mean", e, CENTRE),
                  Test("bias noise / sigma: Kolmogorov-Smirnov distance to N(0,1)", size, "ks", e, SHAPE)]
    return tests


def _dense_tests(noise: dict, reps: np.ndarray, shapes, sigma: float, r: int) -> list[Test]:
    """A dense port's E: per weight and pooled, the exact KS distance of independent entries of E / sigma to
    EGGROLL's entry distribution (parity.mlp.checks.dense); each failure's cause says scale or distribution."""
    samples = {w: independent_entries(noise, w, reps) / sigma for w in _weights(shapes)}
    per_leaf, pooled_cause = dense.causes(samples, r)
    tests = []
    for w, x in samples.items():
        o, i = noise[w].shape[1:]
        tests.append(Test(f"{w} E / sigma: Kolmogorov-Smirnov distance to EGGROLL's entries",
                          f"{reps.size} members x {min(o, i)} diagonal entries, {w} {o}x{i}", "eggroll", x,
                          per_leaf[w], rank=r))
    x = np.concatenate(list(samples.values()))
    tests.append(Test("E / sigma: Kolmogorov-Smirnov distance to EGGROLL's sqrt(chi2_r / r) N(0,1)",
                      f"{x.size} independent entries, all weights", "eggroll", x, pooled_cause, rank=r))
    return tests


def _moment_tests(noise: dict, reps: np.ndarray, shapes, sigma: float, r: int, is_dense: bool = False) -> list[Test]:
    """Every distribution and independence test of the port's noise, over independent members `reps`.

    Under the reference's behaviour the entries of A / (sigma/sqrt r), of B and of eps / sigma are iid
    standard normal across independent members, so their scale (chi-square), mean (normal) and
    shape (Kolmogorov-Smirnov) have exact null distributions. A dense port's E is tested on its independent
    entries instead (parity.mlp.checks.dense).
    """
    weights = (_dense_tests(noise, reps, shapes, sigma, r) if is_dense
               else _scale_tests(noise, reps, shapes, sigma, r) + _pooled_tests(noise, reps, shapes, sigma, r))
    return weights + _independence_tests(noise, reps, shapes, sigma) + _bias_tests(noise, reps, shapes, sigma)


def _judge(rec: Recorder, test: Test, alpha: float) -> None:
    """Record one statistical test at level alpha (exact for chi2, mean, ks and eggroll; a t-interval for t)."""
    n, cause = test.values.size, test.cause
    if test.kind == "chi2":
        lo, hi = chi2_interval(n, alpha)
        return rec.stat(test.quantity, "port", test.size, float(np.mean(test.values ** 2)), lo, hi, alpha,
                        f"chi-square({n})/{n}, alpha={alpha:.2g}", cause=cause)
    if test.kind == "mean":
        lo, hi = normal_mean_interval(n, alpha)
        return rec.stat(test.quantity, "port", test.size, float(np.mean(test.values)), lo, hi, alpha,
                        f"N(0, 1/{n}), alpha={alpha:.2g}", cause=cause)
    if test.kind == "ks":
        rec.alpha += alpha
        d = float(stats.kstest(test.values, "norm").statistic)
        return rec.bound(test.quantity, "port", test.size, d, ks_critical(n, alpha),
                         f"exact KS critical value, alpha={alpha:.2g}", cause=cause)
    if test.kind == "eggroll":
        return dense.judge_distribution(rec, test.quantity, test.size, test.values, test.rank, alpha, cause)
    mean, lo, hi = mean_interval(test.values, test.expected, alpha)
    return rec.stat(test.quantity, "port", test.size, mean, lo, hi, alpha, f"t-interval, alpha={alpha:.2g}",
                    cause=cause)


# ----------------------------------------------------------------------------- structure
def _mirror_consistency(noise: dict, mirror: np.ndarray, shapes) -> tuple[int, str]:
    """How many (member, leaf) pairs break the mirror map found on the first weight (exact negation)."""
    bad, first = 0, ""
    for i, j in enumerate(mirror):
        if j < 0:
            continue
        for name in shapes:
            if name not in noise:
                continue
            if name.endswith(".weight"):
                same = np.array_equal(perturbation(noise, name, slice(i, i + 1)),
                                      -perturbation(noise, name, slice(j, j + 1)))
            else:
                same = np.array_equal(np.asarray(noise[name][i], np.float64), -np.asarray(noise[name][j], np.float64))
            if not same:
                bad += 1
                first = first or f"member {i} mirrors member {j} in the first weight but not in '{name}'"
    return bad, first


def _duplicates(noise: dict, reps: np.ndarray, shapes) -> tuple[int, str]:
    """Members (one per pair) whose draw of some weight equals another's up to sign: a reused key."""
    count, first = 0, ""
    for w in _weights(shapes):
        seen: dict[bytes, int] = {}
        for i in reps:
            fp = _signfree(draws(noise, w)[i])
            if fp in seen:
                count += 1
                first = first or f"members {seen[fp]} and {i} draw the same noise for '{w}'"
            seen.setdefault(fp, int(i))
    return count, first


def _shared_prefix(noise: dict, reps: np.ndarray, shapes) -> tuple[int, str]:
    """Members whose draws for two leaves share a prefix: one key used for several leaves draws the same numbers.

    Weights are compared through B (the raw draw; a dense port's E), biases through |eps| (same sigma on every bias).
    """
    groups = [[(w, draws(noise, w)) for w in _weights(shapes)],
              [(bn, np.abs(noise[bn])) for bn in _biases(shapes) if bn in noise]]
    count, first = 0, ""
    for leaves in groups:
        for x, (n1, v1) in enumerate(leaves):
            for n2, v2 in leaves[x + 1:]:
                f1, f2 = v1[reps].reshape(reps.size, -1), v2[reps].reshape(reps.size, -1)
                k = min(f1.shape[1], f2.shape[1])
                same = np.all(f1[:, :k] == f2[:, :k], axis=1)
                if same.any():
                    count += int(same.sum())
                    first = first or f"'{n1}' and '{n2}' draw the same first {k} numbers (one key for both leaves?)"
    return count, first


def _fingerprints(noise: dict, names: list[str]) -> bytes | None:
    parts = []
    for name in names:
        if name not in noise:
            return None
        value = noise[name]
        parts += list(value) if isinstance(value, tuple) else [value]
    return b"".join(diagnose.canonical(np.asarray(p, np.float64)) for p in parts)


def _reuse_across_epochs(by_epoch: dict[int, dict], epochs, groups: list[int], names: list[str]) -> tuple[int, str]:
    """Draws of one epoch group found again (any member, up to sign) in another group of `names`' noise."""
    firsts: dict[int, int] = {}
    for e, g in zip(epochs, groups):
        firsts.setdefault(g, e)
    chosen = sorted(firsts.values())[:4]
    count, first = 0, ""
    for name in names:
        seen: dict[bytes, tuple[int, int]] = {}
        for e in chosen:
            values = draws(by_epoch[e], name)
            for i in range(values.shape[0]):
                fp = _signfree(values[i])
                if fp in seen and seen[fp][0] != e:
                    count += 1
                    if not first:
                        e0, i0 = seen[fp]
                        first = f"'{name}' of member {i} at epoch {e} equals member {i0}'s at epoch {e0}"
                seen.setdefault(fp, (e, i))
    return count, first


# ----------------------------------------------------------------------------- measure
class Structure(NamedTuple):
    """Exact facts about the port's noise at epoch 0: bias leaves, who mirrors whom, shared draws."""

    ref_biases: tuple[str, ...]        # biases the reference perturbs
    port_biases: tuple[str, ...]       # ... that the port perturbs too
    port_mirror: np.ndarray            # (pop,) the member whose A B^T is this member's exact negation, or -1
    ref_mirror: np.ndarray
    unnegated: tuple[int, str]         # (mirror pairs not negated in some leaf, the first seen)
    reps: np.ndarray                   # one member per mirrored pair: the independent members
    duplicates: tuple[int, str]        # (unmirrored members drawing the same B, the first seen)
    shared_prefix: tuple[int, str]     # (members whose leaves share their first draws, the first seen)
    zero_columns: tuple[tuple[str, int], ...] = ()   # (weight, factor columns zero in every independent member)


class Schedule(NamedTuple):
    """Which probed epochs share noise, per side and kind; draws that come back in another epoch."""

    probes: tuple[int, ...]
    members: int
    groups: dict                       # (side, "weight" | "bias") -> partition ids, None where a leaf is missing
    reuse: dict                        # kind -> (draws back in an epoch with other noise, the first seen)


class Split(NamedTuple):
    """How a port that gives forward and update noise apart differs between the two (exact)."""

    weights: tuple[str, ...]           # weights whose forward noise is not their update noise
    update_only: tuple[str, ...]       # biases with update noise and none in the forward
    different: tuple[str, ...]         # biases whose forward noise is not their update noise
    forward_only: tuple[str, ...]      # biases with forward noise and none in the update


class Generator(NamedTuple):
    """The generator itself: bit-identity per leaf (a port claiming JAX's draws) or in distribution."""

    leaf_ulps: tuple[tuple[str, float, float], ...]   # (leaf, max ULP vs jax.random, identical fraction)
    dense_ratios: tuple[tuple[str, float], ...]       # a dense port claiming JAX's draws: (weight, max |E - A B^T| / bound)
    action_differ: tuple[tuple[int, int], ...]        # (epoch, action uniforms differing from jax.random)
    b_identical: tuple[str, float] | None             # own generator: (first weight, B bit-identical fraction)
    uniform_ks: float | None                          # own generator: KS distance of its action uniforms
    uniform_draws: int
    action_pop: int                                   # the population the action uniforms are drawn for
    other_backend: str | None = None                  # the port equals the reference on this backend's normals


class SeedDependence(NamedTuple):
    """The port's noise at two run seeds (epoch 0, the probe members): the leaves drawn bit for bit alike."""

    seeds: tuple[int, int]
    members: int
    leaves: int                        # leaves compared (every weight and every bias with noise)
    same: tuple[str, ...]              # leaves whose noise is identical at both seeds


def _seed_dependence(ctx) -> SeedDependence:
    """Draw the probe members at epoch 0 for the run seed and another one (cheap: probe_pop members) and list the
    leaves whose noise did not change. Exact: distinct seeds give continuous draws that coincide with probability
    0, so this row has no false-alarm rate."""
    shapes, cfg = ctx.shapes, ctx.cfg
    seeds = (ctx.seed, diagnose.other_seed(ctx.seed))
    probe = np.arange(ctx.sizes.probe_pop)
    first, second = (update_of(ctx.port.noise(shapes, s, 0, probe, probe.size, cfg.sigma, cfg.rank)) for s in seeds)
    names = [n for n in shapes if n in first and n in second]
    return SeedDependence(seeds, probe.size, len(names),
                          tuple(n for n in names if _fingerprints(first, [n]) == _fingerprints(second, [n])))


class Measured(NamedTuple):
    seed: int
    pop: int
    rank: int
    sigma: float
    weights: tuple[str, ...]
    structure: Structure
    tests: tuple[Test, ...]
    shape_stats: tuple[tuple[str, float, float, float], ...]   # (weight, var, kurtosis of A B^T/sigma, std(A) ratio)
    schedule: Schedule
    jax_compatible: bool
    uses_uniform_test: bool
    generator: Generator
    split: Split | None = None                 # a port that gives forward and update noise apart
    dense: bool = False                        # a port with dense_noise (E in place of A, B)
    ranks: tuple = ()                          # dense: parity.mlp.checks.dense.Rank per weight that can exceed rank r
    seed_dependence: SeedDependence | None = None
    platform: ReferencePlatform = ReferencePlatform()   # where the reference drew (its backend's normals)


def _split(noise: dict, shapes) -> Split | None:
    """Which leaves' forward noise differs from their update noise (None: the port gave one dict)."""
    if not isinstance(noise, SplitNoise):
        return None
    fwd, upd = noise.forward, noise.update

    def same(name):
        a, b = fwd[name], upd[name]
        return all(np.array_equal(x, y) for x, y in zip(a, b)) if isinstance(a, tuple) else np.array_equal(a, b)

    biases = _biases(shapes)
    return Split(tuple(w for w in _weights(shapes) if not same(w)),
                 tuple(b for b in biases if b in upd and b not in fwd),
                 tuple(b for b in biases if b in upd and b in fwd and not same(b)),
                 tuple(b for b in biases if b in fwd and b not in upd))


def _zero_columns(noise: dict, reps: np.ndarray, shapes) -> tuple[tuple[str, int], ...]:
    """Weights whose factors have columns that are zero in A and B for every independent member: noise of a lower
    rank padded with zero columns (a fixed rank, or one clipped to min(r, out, in)). Exact: a column of normal draws
    is zero with probability 0. Dense noise has no columns (its rank is checked in parity.mlp.checks.dense)."""
    out = []
    for w in _weights(shapes):
        if isinstance(noise[w], tuple):
            a, b = (np.asarray(f[reps]) for f in noise[w])
            zero = int(np.sum(np.all(a == 0, axis=(0, 1)) & np.all(b == 0, axis=(0, 1))))
            if zero:
                out.append((w, zero))
    return tuple(out)


def _structure(port: dict, ref: dict, shapes, pop: int) -> Structure:
    ref_biases = tuple(bn for bn in _biases(shapes) if bn in ref)
    w0 = _weights(shapes)[0]
    port_mirror = diagnose.mirror_map(perturbation(port, w0).reshape(pop, -1))
    ref_mirror = diagnose.mirror_map(perturbation(ref, w0).reshape(pop, -1))
    reps = np.array([i for i in range(pop) if port_mirror[i] < 0 or i < port_mirror[i]])
    return Structure(ref_biases, tuple(bn for bn in ref_biases if bn in port), port_mirror, ref_mirror,
                     _mirror_consistency(port, port_mirror, shapes), reps, _duplicates(port, reps, shapes),
                     _shared_prefix(port, reps, shapes), _zero_columns(port, reps, shapes))


def _shape_stats(port: dict, reps: np.ndarray, weights, sigma: float, r: int):
    """Per weight: variance and kurtosis of A B^T / sigma (1 and 3 + 6/r for EGGROLL), std(A) / (sigma/sqrt r)
    (None for a dense port, which has no A)."""
    out = []
    for w in weights:
        p = perturbation(port, w, reps[:P_MEMBERS]) / sigma
        std_a = (float(np.sqrt((port[w][0][reps].astype(np.float64) ** 2).mean()) * np.sqrt(r) / sigma)
                 if isinstance(port[w], tuple) else None)
        out.append((w, float(np.mean(p ** 2)), float(np.mean(p ** 4) / np.mean(p ** 2) ** 2), std_a))
    return tuple(out)


def _schedule(ctx, port_biases) -> Schedule:
    """Draw a few members at every probed epoch on both sides; partition the epochs by equal noise."""
    shapes, cfg = ctx.shapes, ctx.cfg
    probes = tuple(ctx.sizes.probe_epochs)
    ctx.log(f"[{NAME}] probing {len(probes)} epochs for the noise_reuse schedule")
    probe = np.arange(ctx.sizes.probe_pop)
    drawn = {side: {e: update_of(port.noise(shapes, ctx.seed, e, probe, probe.size, cfg.sigma, cfg.rank))
                    for e in probes}
             for side, port in (("port", ctx.port), ("reference", ctx.ref))}
    groups = {}
    for side in drawn:
        for kind, names in (("weight", _weights(shapes)), ("bias", _biases(shapes))):
            fps = [_fingerprints(drawn[side][e], names) for e in probes]
            groups[side, kind] = None if any(fp is None for fp in fps) else diagnose.partition(fps)
    reuse = {kind: _reuse_across_epochs(drawn["port"], probes, groups["port", kind], list(names))
             for kind, names in (("weight", _weights(shapes)), ("bias", port_biases))
             if names and groups["port", kind] is not None}
    return Schedule(probes, probe.size, groups, reuse)


def _jax_identity(port: dict, ref: dict, names) -> tuple[tuple, tuple]:
    """(leaf ULPs, dense ratios): each leaf of a port claiming JAX's draws against the reference's; a dense E
    against the float32 bound of the product of the reference's factors (its first GENERATOR_MEMBERS members)."""
    leaf_ulps, ratios = [], []
    for name in names:
        if name.endswith(".weight") and not isinstance(port[name], tuple):
            few = slice(0, GENERATOR_MEMBERS)
            ratios.append((name, dense_mismatch(port[name][few], ref[name][0][few], ref[name][1][few])))
            continue
        parts = port[name] if name.endswith(".weight") else (port[name],)
        refs = ref[name] if name.endswith(".weight") else (ref[name],)
        ulps = ulp_distance(np.concatenate([p.ravel() for p in parts]), np.concatenate([q.ravel() for q in refs]))
        leaf_ulps.append((name, float(ulps.max()), float(np.mean(ulps == 0))))
    return tuple(leaf_ulps), tuple(ratios)


def _same(a, b) -> bool:
    if isinstance(a, tuple) or isinstance(b, tuple):
        return isinstance(a, tuple) and isinstance(b, tuple) and len(a) == len(b) and all(map(_same, a, b))
    return np.array_equal(np.asarray(a), np.asarray(b))


def other_backend(ctx, port, draw) -> str | None:
    """The backend whose normals the port's draws are, bit for bit, when that is not the reference's: `draw` asks
    the reference on the other backend's normals (ReferencePort.on_other_normals) for the same call. None when
    they differ too, or the reference offers no other backend (a bundle, a table this checkout lacks)."""
    flip = getattr(ctx.reference, "on_other_normals", None)
    other = flip() if callable(flip) else None
    if other is None:
        return None
    alt = draw(other)
    return other.platform.normals if all(_same(port[k], alt[k]) for k in alt) and set(port) >= set(alt) else None


def _generator(ctx, port: dict, ref: dict, names, uniform_test: bool, pop: int = 0) -> Generator:
    """Bit-identity with jax.random for a port that claims it (and, where it differs, whether it is the other
    backend's normals of the same bits); else B's identical share and the uniforms' KS."""
    cfg, seed = ctx.cfg, ctx.seed
    if ctx.port.jax_compatible_rng:
        leaf_ulps, ratios = _jax_identity(port, ref, names)
        backend = None if all(u == 0 for _, u, _ in leaf_ulps) else other_backend(
            ctx, port, lambda other: {k: v for k, v in other.noise(ctx.shapes, seed, 0, np.arange(pop), pop, cfg.sigma,
                                                                   cfg.rank).items() if k in names})
        differ = []
        if ctx.port.has("action_uniforms"):
            for e in (0, 3):
                pu = ctx.port.action_uniforms(seed, e, cfg.pop, MAX_STEPS)[:MAX_STEPS]
                ru = ctx.ref.action_uniforms(seed, e, cfg.pop, MAX_STEPS)[:MAX_STEPS]
                differ.append((e, int(np.sum(ulp_distance(pu, ru) > 0))))
        return Generator(leaf_ulps, ratios, tuple(differ), None, None, 0, cfg.pop, backend)
    w0 = _weights(ctx.shapes)[0]
    ks, n = None, 0
    if uniform_test:
        u = ctx.port.action_uniforms(seed, 0, cfg.pop, MAX_STEPS)[:MAX_STEPS].ravel().astype(np.float64)
        ks, n = float(stats.kstest(u, "uniform").statistic), u.size
    identical = (w0, float(np.mean(port[w0][1] == ref[w0][1]))) if isinstance(port[w0], tuple) else None
    return Generator((), (), (), identical, ks, n, cfg.pop)


def _witness_draws(ctx, given: dict, port: dict, ref: dict, pop: int) -> None:
    """A port claiming JAX's draws: each of its factors and bias noises against the reference's, for a repro (exact,
    as the ULP rows; a pairing that differs shows as members that do not line up)."""
    prefix = ("update",) if isinstance(given, SplitNoise) else ()
    for name, value in port.items():
        if name not in ref:
            continue
        parts = enumerate(zip(value, ref[name])) if isinstance(value, tuple) else [(None, (value, ref[name]))]
        for i, (p, q) in parts:
            path = prefix + ((name,) if i is None else (name, i))
            what = name if i is None else f"{name} {'AB'[i]}"
            ctx.witness(f"{what}, members 0..{pop - 1}", given, p, q, 0.0,
                        "exact: the port claims JAX-compatible draws (jax_compatible_rng)", path)


def _witness_scale(ctx, given: dict, tests, reps: np.ndarray, alpha: float) -> None:
    """Hand the repro collector the first per-weight scale test (chi-square) outside its interval, with the rows of
    the port's array it read: its repro calls noise() afresh and recomputes the mean square."""
    prefix = ("update",) if isinstance(given, SplitNoise) else ()
    port = update_of(given)
    for test in tests:
        if test.kind != "chi2" or not test.source:
            continue
        (lo, hi), value = chi2_interval(test.values.size, alpha), float(np.mean(test.values ** 2))
        if not lo <= value <= hi:
            leaf, factor = test.source
            ctx.statistic(f"{test.quantity}, {test.size}", given, prefix + test.source, reps,
                          test.divisor, "mean square", value, (lo, hi), alpha,
                          f"chi-square({test.values.size})/{test.values.size}, alpha={alpha:.2g}",
                          port[leaf][factor])
            return


def measure(ctx) -> Measured:
    cfg, shapes = ctx.cfg, ctx.shapes
    sigma, r = cfg.sigma, cfg.rank
    pop = dense.population(shapes) if ctx.port.dense else ctx.sizes.noise_pop
    ctx.log(f"[{NAME}] drawing {pop} members on both sides")
    given = ctx.port.noise(shapes, ctx.seed, 0, np.arange(pop), pop, sigma, r)
    port = update_of(given)                    # the noise its update uses (the forward's is compared with it)
    ref = ctx.ref.noise(shapes, ctx.seed, 0, np.arange(pop), pop, sigma, r)
    if ctx.port.jax_compatible_rng and not ctx.port.dense:
        _witness_draws(ctx, given, port, ref, pop)
    structure = _structure(port, ref, shapes, pop)
    weights = tuple(_weights(shapes))
    uniform_test = ctx.port.has("action_uniforms") and not ctx.port.jax_compatible_rng
    tests = tuple(_moment_tests(port, structure.reps, shapes, sigma, r, ctx.port.dense))
    _witness_scale(ctx, given, tests, structure.reps, _level(len(tests), uniform_test))   # while its call is taped
    return Measured(ctx.seed, pop, r, sigma, weights, structure, tests,
                    _shape_stats(port, structure.reps, weights, sigma, r), _schedule(ctx, structure.port_biases),
                    ctx.port.jax_compatible_rng, uniform_test,
                    _generator(ctx, port, ref, list(weights) + list(structure.port_biases), uniform_test, pop),
                    _split(given, shapes), ctx.port.dense,
                    dense.measure_rank(port, structure.reps, weights, sigma, r) if ctx.port.dense else (),
                    _seed_dependence(ctx), ctx.platform)


# ----------------------------------------------------------------------------- judge
def _judge_structure(rec: Recorder, m: Measured, size: str) -> None:
    st = m.structure
    rec.equal("bias leaves with noise", "port", size, len(st.port_biases), len(st.ref_biases),
              "the reference perturbs every bias",
              cause=diagnose.cause("bias_noise", "the port does not perturb the biases (no bias noise, as "
                                                 "bias_noise=off); the reference adds +-sigma*eps to every bias"))
    rec.equal("members whose mirror differs from the reference's", "port", size,
              int(np.sum(st.port_mirror != st.ref_mirror)), 0, "exact negation of A B^T",
              cause=diagnose.pairing_cause(st.port_mirror, st.ref_mirror))
    bad, first = st.unnegated
    rec.equal("mirror pairs not negated in every leaf", "port", size, bad, 0, "exact",
              cause=diagnose.cause("antithetic", first or "mirrored members differ"))
    rec.equal("weights whose factors have zero columns in every member", "port", f"{st.reps.size} members",
              len(st.zero_columns), 0, "exact: r columns of normal draws",
              cause=diagnose.zero_columns_cause(st.zero_columns, m.rank, len(m.weights)) if st.zero_columns else None)
    for quantity, (count, first) in (("unmirrored members with identical draws", st.duplicates),
                                     ("members whose leaves share draws", st.shared_prefix)):
        rec.equal(quantity, "port", f"{st.reps.size} members", count, 0, "exact",
                  cause=diagnose.cause("rng", f"key scheme: {first}"))


def _judge_seed(rec: Recorder, sd: SeedDependence | None) -> None:
    """Every leaf's noise must change with the run seed (exact: no false alarm)."""
    if sd is None:
        return
    rec.equal("leaves whose noise is the same at two run seeds", "port",
              f"seeds {sd.seeds[0]} and {sd.seeds[1]}, epoch 0, {sd.members} members, {sd.leaves} leaves",
              len(sd.same), 0, "exact: the reference's noise starts from key(seed)",
              cause=diagnose.seed_cause("noise", sd.same, sd.seeds) if sd.same else None)


def _split_bias_cause(sp: Split):
    """The bias difference between a port's forward and update noise, in the knob table's words."""
    if sp.update_only or sp.different:
        what = (f"no bias noise for {', '.join(sp.update_only)}" if sp.update_only
                else f"other bias noise than its update for {', '.join(sp.different)}")
        return diagnose.cause("bias_noise", f"the port's forward applies {what} while its update uses bias noise: "
                                            f"noise that enters the update only (as {diagnose.UPDATE_ONLY})")
    return diagnose.other("forward and update noise", f"the port's forward applies bias noise to "
                                                      f"{', '.join(sp.forward_only)} that its update never uses")


def _judge_split(rec: Recorder, sp: Split, size: str) -> None:
    """A port that gives forward and update noise apart: the same weight noise in both; bias noise in both alike."""
    rec.equal("weights whose forward noise differs from the update noise", "port", size, len(sp.weights), 0,
              "the same draws in the forward and the update",
              cause=diagnose.other("forward and update noise", "the weight noise the port's forward applies is not "
                                                               f"the noise its update uses ({', '.join(sp.weights)})"))
    differ = len(sp.update_only) + len(sp.different) + len(sp.forward_only)
    rec.equal("biases whose forward noise differs from the update noise", "port", size, differ, 0,
              "the reference's forward applies the bias noise its update uses",
              cause=_split_bias_cause(sp) if differ else None)


def _disagreements(a, b) -> int:
    """Pairs of probed epochs that share noise on one side and not on the other."""
    same_a, same_b = np.equal.outer(a, a), np.equal.outer(b, b)
    return int(np.triu(same_a != same_b, 1).sum())


def _judge_schedule(rec: Recorder, sch: Schedule, update_only: bool = False) -> None:
    """update_only: the port's forward was seen leaving its bias noise out (products check, or its forward noise)."""
    g = sch.groups
    causes = diagnose.schedule_cause(sch.probes, g["port", "weight"], g["reference", "weight"], g["port", "bias"],
                                     g["reference", "bias"], update_only)
    size = f"{len(sch.probes)} epochs 0..{sch.probes[-1]}, {sch.members} members"
    rec.equal("pairs of probed epochs sharing weight noise differently", "port", size,
              _disagreements(g["port", "weight"], g["reference", "weight"]), 0, "exact",
              cause=next((c for c in causes if c.knob == "noise_reuse"), None))
    if g["port", "bias"] is not None and g["reference", "bias"] is not None:
        rec.equal("pairs of probed epochs sharing bias noise differently", "port", size,
                  _disagreements(g["port", "bias"], g["reference", "bias"]), 0, "exact",
                  cause=next((c for c in causes if c.knob == "bias_noise"), causes[0] if causes else None))
    for kind, knob in (("weight", "noise_reuse"), ("bias", "bias_noise")):
        if kind in sch.reuse:
            count, first = sch.reuse[kind]
            rec.equal(f"{kind} draws reused across epochs with different noise", "port", size, count, 0, "exact",
                      cause=diagnose.cause(knob, f"draws come back in another epoch: {first}"))


def _judge_generator(rec: Recorder, m: Measured, size: str, alpha: float) -> None:
    gen = m.generator
    aligned = diagnose.pairing_cause(m.structure.port_mirror, m.structure.ref_mirror) is None
    for name, max_ulp, identical in gen.leaf_ulps:
        if aligned:
            detail = (f"{100 * (1 - identical):.3g}% of '{name}' differ from jax.random (max {int(max_ulp)} ULP)")
            rec.bound(f"{name}: max ULP vs jax.random", "port", size, max_ulp, ULP_TOLERANCE,
                      "bit-identical draws on the same backend",
                      cause=diagnose.backend_cause(gen.other_backend, m.platform, detail) if gen.other_backend else
                      diagnose.cause("rng", f"the port claims JAX-compatible draws, but {detail}"))
        else:
            rec.info(f"{name}: max ULP vs jax.random", "port", size, max_ulp,
                     "not judged: the pairing differs, so members do not line up")
        rec.info(f"{name}: bit-identical fraction", "port", size, identical)
    for name, ratio in gen.dense_ratios:
        rec.bound(f"{name}: max |E - A B^T| / float32 bound, A B^T from jax.random", "port",
                  f"{GENERATOR_MEMBERS} members", ratio, 1.0, "gamma_(r+3) |A||B|^T: E is a float32 product of "
                                                              "JAX's factors",
                  cause=diagnose.cause("rng", f"the port claims JAX-compatible draws, but its E of '{name}' is not a "
                                              "float32 product of jax.random's factors (up to "
                                              f"{fmt(ratio)}x the rounding bound)") if aligned else None)
    for e, differ in gen.action_differ:
        rec.equal(f"action uniforms differing from jax.random, epoch {e}", "port", f"({MAX_STEPS}, {gen.action_pop})",
                  differ, 0, "bit-identical",
                  cause=diagnose.cause("rng", f"the port claims JAX-compatible draws, but {differ} action "
                                              f"uniforms of epoch {e} differ from uniform(fold_in(action_key, e))"))
    if gen.b_identical is not None:
        rec.info(f"{gen.b_identical[0]}: B bit-identical fraction", "port", size, gen.b_identical[1],
                 "not judged: own generator, compared in distribution")
    if gen.uniform_ks is not None:
        rec.alpha += alpha
        rec.bound("action uniforms: Kolmogorov-Smirnov distance to U[0,1)", "port", f"{gen.uniform_draws} draws",
                  gen.uniform_ks, ks_critical(gen.uniform_draws, alpha), f"exact KS critical value, alpha={alpha:.2g}",
                  cause=diagnose.other("action sampling", "the port's action uniforms are not uniform on [0, 1)"))


def _level(n_tests: int, uniform_test: bool) -> float:
    """Each statistical test's level: the noise check's share of the suite's budget, split evenly (Bonferroni)."""
    return check_alpha(NAME) / (n_tests + int(uniform_test))


def _alpha(m: Measured) -> float:
    return _level(len(m.tests), m.uses_uniform_test)


def _judge_tests(rec: Recorder, m: Measured) -> None:
    """Every statistical test; a dense port's pooled entries' variance and kurtosis are reported beside them."""
    for test in m.tests:
        _judge(rec, test, _alpha(m))
    for test in m.tests:
        if test.kind == "eggroll" and test.quantity.startswith("E / sigma"):
            dense.info_moments(rec, test.size, test.values, test.rank)


def judge(m: Measured, update_only_elsewhere: bool = False) -> Recorder:
    """update_only_elsewhere: the products check found the port's forward leaving out the bias noise it is given."""
    rec = Recorder(NAME)
    size = f"pop={m.pop} r={m.rank} sigma={fmt(m.sigma)}"
    if m.split is not None:
        _judge_split(rec, m.split, size)
    _judge_structure(rec, m, size)
    _judge_seed(rec, m.seed_dependence)
    dense.judge_rank(rec, m.ranks, m.rank)
    _judge_tests(rec, m)
    for w, var, kurt, _ in m.shape_stats:
        rec.info(f"{w} A B^T / sigma: variance", "port", size, var, "expected 1")
        rec.info(f"{w} A B^T / sigma: kurtosis", "port", size, kurt, f"expected 3 + 6/r = {fmt(3 + 6 / m.rank)}")
    for w, _, _, std_a in m.shape_stats:
        if std_a is not None:
            rec.info(f"{w}: std(A) / (sigma/sqrt r)", "port", size, std_a)
    split_update_only = m.split is not None and bool(m.split.update_only or m.split.different)
    _judge_schedule(rec, m.schedule, update_only_elsewhere or split_update_only)
    _judge_generator(rec, m, size, _alpha(m))
    return rec


# ----------------------------------------------------------------------------- section
def _notes(m: Measured) -> list[str]:
    st, g = m.structure, m.schedule.groups
    notes = [f"Pairing layout: port {diagnose.layout_name(st.port_mirror)}, reference "
             f"{diagnose.layout_name(st.ref_mirror)}.",
             "Schedule: port weights: " + diagnose.describe_schedule(m.schedule.probes, g["port", "weight"])
             + "; reference weights: " + diagnose.describe_schedule(m.schedule.probes, g["reference", "weight"])
             + (("; port biases: " + diagnose.describe_schedule(m.schedule.probes, g["port", "bias"]))
                if g["port", "bias"] else "") + "."]
    if m.split is not None:
        notes.append("Forward and update noise: the port gives them apart; the statistics are of its update noise, "
                     "and its forward noise must hold the same weight noise and the same bias noise.")
    if m.jax_compatible:
        notes.append("Generator: the port claims JAX-compatible draws, so its noise is compared with jax.random "
                     "element by element (after the pairing check; a pairing drift makes members not line up"
                     + ("; a dense E must be within gamma_(r+3) |A||B|^T of the product of JAX's factors)." if m.dense
                        else ")."))
    else:
        notes.append("Generator: the port uses its own generator (e.g. rng=torch), which is not a drift: its noise "
                     "is compared in distribution, pairing, key scheme and schedule only, never element by element.")
    return notes


def section(m: Measured) -> str:
    return "\n".join([
        f"The port's and the reference's noise for {m.pop} members at epoch 0 (seed {m.seed}), and "
        f"{m.schedule.members} members "
        f"at each of {len(m.schedule.probes)} probed epochs.",
        "",
        "Exact parts (no false alarms): which member is the exact negation of which (A_i B_i^T = -A_j B_j^T, and the "
        "same pairs negated in every leaf and bias); bias noise present; no two unmirrored members and no two leaves "
        "sharing draws; which probed epochs share noise (weights and biases apart), against the reference's schedule "
        "for its noise_reuse; no draw coming back in an epoch with different noise; every leaf's noise changing with the "
        "run seed (the probe members at epoch 0 drawn again at a second run seed: a port that ignores the seed "
        "draws them bit for bit alike).",
        "",
        f"Statistical parts, over {m.structure.reps.size} independent members (one per mirrored pair), "
        f"{len(m.tests)} tests at alpha={_alpha(m):.2g} each (the noise check's share of the suite's false-alarm "
        "budget, Bonferroni). Under the reference the entries of A/(sigma/sqrt r), of B and of eps/sigma are iid "
        "standard normal, so the tests are exact: per leaf the mean square against chi-square(n)/n (the "
        "sigma/sqrt(r) scaling), pooled the mean against N(0, 1/n) and the Kolmogorov-Smirnov distance to N(0,1) "
        "against its exact critical value. Independence: the per-member mean product of adjacent rows and columns "
        "of A B^T, of different pairs and of different leaves must be 0 within a t-interval (symmetric "
        "statistics). The variance (1) and kurtosis (3 + 6/r) of A B^T / sigma are reported.",
        "",
        *([DENSE_NOTE, ""] if m.dense else []),
        *_notes(m),
    ])


DENSE_NOTE = (
    "Dense noise (the port declares dense_noise and gives E = A B^T per member, no factors; it is drawn for more "
    "members, as many as 64 MB of E allow, up to 8192): the A and B tests are replaced. Rank (exact): each "
    "independent member's E may have at most r singular values above parity.core.tolerances.rank_threshold, the most "
    "float32 rounding can give a rank-r product (gamma_(r+3) ||A||_F ||B||_F with the norms' 1 - 1e-12 chi-square "
    "quantiles); a port whose \"low-rank\" noise is not low rank fails here. Scale and distribution, on independent "
    "entries (the diagonal of each E): per weight and pooled the exact Kolmogorov-Smirnov distance of E / sigma "
    "(sigma known) to EGGROLL's entry distribution sqrt(chi2_r / r) N(0,1) (variance 1, kurtosis 3 + 6/r); their "
    "variance and kurtosis are reported and name the cause: a wrong scale when the entries are EGGROLL-shaped at "
    "another variance, else another distribution. See parity/mlp/checks/dense.py.")


def run(ctx):
    m = measure(ctx)
    return summarize(NAME, judge(m, diagnose.names_update_only(ctx.causes_of("products"))), section(m))
