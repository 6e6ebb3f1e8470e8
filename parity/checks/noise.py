"""Noise: distribution, pairing, scaling, bias noise, independence, the noise_reuse schedule, the generator.

The port's noise comes from its own generator (`noise()`), the reference's from the noiser's draws.
Deterministic parts (exact: no false alarms): which member mirrors which, bias noise presence,
which probed epochs share noise, draws shared across members/leaves/epochs, and, for a port that
claims JAX-compatible draws, bit-identity with jax.random. Statistical parts (moments against exact
expected values): t-intervals over independent members (one per mirrored pair) at a Bonferroni
share of the suite's false-alarm budget (see parity.tolerances).
"""
from __future__ import annotations

from typing import NamedTuple

import numpy as np
from scipy import stats

from parity import diagnose
from parity.tolerances import (ULP_TOLERANCE, check_alpha, chi2_interval, ks_critical, mean_interval,
                               normal_mean_interval, ulp_distance)
from parity.verdict import Recorder, fmt, summarize
from rollout.cartpole import MAX_STEPS

NAME = "noise"
P_MEMBERS = 128   # members whose perturbation A B^T is formed for the independence tests


def _weights(shapes):
    return [n for n in shapes if n.endswith(".weight")]


def _biases(shapes):
    return [n for n in shapes if n.endswith(".bias")]


def _perturbation(A: np.ndarray, B: np.ndarray) -> np.ndarray:
    """Each member's A_i @ B_i^T in float64: (m, out, in)."""
    return np.asarray(A, np.float64) @ np.swapaxes(np.asarray(B, np.float64), 1, 2)


def _signfree(x: np.ndarray) -> bytes:
    """Bytes of x with its sign fixed by the first non-zero entry (a draw and its negation hash alike)."""
    flat = np.asarray(x, np.float64).ravel()
    nz = np.flatnonzero(flat)
    return diagnose.canonical(flat * (np.sign(flat[nz[0]]) if nz.size else 1.0))


# ----------------------------------------------------------------------------- statistics
class Test(NamedTuple):
    """One statistical test: `kind` chi2 (mean of squares of iid N(0,1) values), mean (their mean), ks
    (normality of the values) or t (per-member statistics with expected mean `expected`)."""

    quantity: str
    size: str
    kind: str
    values: np.ndarray
    cause: object
    expected: float = 0.0


def _moment_tests(noise: dict, reps: np.ndarray, shapes, sigma: float, r: int) -> list[Test]:
    """Every distribution and independence test of the port's noise, over independent members `reps`.

    Under the reference's behaviour the entries of A / (sigma/sqrt r), of B and of eps / sigma are iid
    standard normal across independent members, so their scale (chi-square), mean (normal) and
    shape (Kolmogorov-Smirnov) have exact null distributions. Independence statistics (products of
    neighbouring entries, of different pairs, of different leaves) are symmetric per-member means,
    judged by t-intervals.
    """
    tests: list[Test] = []
    weights = _weights(shapes)
    a_scale, n_reps = sigma / np.sqrt(r), reps.size
    shape_cause = diagnose.other("noise distribution", "the draws are not normal")
    for w in weights:
        a = noise[w][0][reps].astype(np.float64).ravel() / a_scale
        b = noise[w][1][reps].astype(np.float64).ravel()
        size = f"{n_reps} members, {w} {noise[w][0].shape[1]}x{noise[w][1].shape[1]} r={r}"
        tests.append(Test(f"{w} A / (sigma/sqrt r): mean square", size, "chi2", a, diagnose.other(
            "noise scaling (sigma/sqrt(r) on A)",
            f"A of {w} has variance {fmt(float(np.mean(a ** 2)))} x sigma^2/r (sigma={fmt(sigma)}, r={r})")))
        tests.append(Test(f"{w} B: mean square", size, "chi2", b, diagnose.other(
            "noise scaling", f"B of {w} has variance {fmt(float(np.mean(b ** 2)))}; the reference's B is standard normal")))
    a_all = np.concatenate([noise[w][0][reps].astype(np.float64).ravel() for w in weights]) / a_scale
    b_all = np.concatenate([noise[w][1][reps].astype(np.float64).ravel() for w in weights])
    size = f"{n_reps} members, all weights"
    centre = diagnose.other("noise distribution", "the draws do not have mean zero")
    tests += [Test("A / (sigma/sqrt r): mean", size, "mean", a_all, centre),
              Test("B: mean", size, "mean", b_all, centre),
              Test("A / (sigma/sqrt r): Kolmogorov-Smirnov distance to N(0,1)", size, "ks", a_all, shape_cause),
              Test("B: Kolmogorov-Smirnov distance to N(0,1)", size, "ks", b_all, shape_cause)]
    p_all = []
    few = reps[:P_MEMBERS]                     # A B^T is formed (out x in per member): cap the memory
    size = f"{few.size} members, all weights"
    for w in weights:
        p = _perturbation(noise[w][0][few], noise[w][1][few]) / sigma               # (n, out, in)
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
    tests.append(Test("A B^T / sigma: mean", size, "t", p_all.mean(1), centre))
    half = (few.size // 2) * 2
    tests.append(Test("A B^T: mean product of different pairs", f"{half // 2} disjoint pairs of members", "t",
                      (p_all[0:half:2] * p_all[1:half:2]).mean(1),
                      diagnose.cause("rng", "the noise of different antithetic pairs is correlated (key scheme)")))
    if len(weights) > 1:
        cross = []
        for w1, w2 in zip(weights[:-1], weights[1:]):
            x1, x2 = noise[w1][1][reps].reshape(n_reps, -1), noise[w2][1][reps].reshape(n_reps, -1)
            k = min(x1.shape[1], x2.shape[1])
            cross.append(x1[:, :k] * x2[:, :k])
        tests.append(Test("B: mean product across leaves", f"{n_reps} members, all weights", "t", np.concatenate(cross, 1).mean(1),
                          diagnose.cause("rng", "the noise of different parameter leaves is correlated (key scheme)")))
    biases = [bn for bn in _biases(shapes) if bn in noise]
    for bn in biases:
        e = noise[bn][reps].astype(np.float64).ravel() / sigma
        tests.append(Test(f"{bn} noise / sigma: mean square", f"{n_reps} members, {bn}", "chi2", e, diagnose.cause(
            "bias_noise", f"bias noise of {bn} has variance {fmt(float(np.mean(e ** 2)))} x sigma^2; the reference's is "
                          "sigma * eps, eps standard normal")))
    if biases:
        e = np.concatenate([noise[bn][reps].astype(np.float64).ravel() for bn in biases]) / sigma
        bsize = f"{n_reps} members, all biases"
        tests += [Test("bias noise / sigma: mean", bsize, "mean", e, centre),
                  Test("bias noise / sigma: Kolmogorov-Smirnov distance to N(0,1)", bsize, "ks", e, shape_cause)]
    return tests


def _judge(rec: Recorder, test: Test, alpha: float) -> None:
    """Record one statistical test at level alpha (exact for chi2, mean and ks; a t-interval for t)."""
    n = test.values.size
    if test.kind == "chi2":
        lo, hi = chi2_interval(n, alpha)
        rec.stat(test.quantity, "port", test.size, float(np.mean(test.values ** 2)), lo, hi, alpha,
                 f"chi-square({n})/{n}, alpha={alpha:.2g}", cause=test.cause)
    elif test.kind == "mean":
        lo, hi = normal_mean_interval(n, alpha)
        rec.stat(test.quantity, "port", test.size, float(np.mean(test.values)), lo, hi, alpha,
                 f"N(0, 1/{n}), alpha={alpha:.2g}", cause=test.cause)
    elif test.kind == "ks":
        rec.alpha += alpha
        d = float(stats.kstest(test.values, "norm").statistic)
        rec.bound(test.quantity, "port", test.size, d, ks_critical(n, alpha), f"exact KS critical value, alpha={alpha:.2g}",
                  cause=test.cause)
    else:
        mean, lo, hi = mean_interval(test.values, test.expected, alpha)
        rec.stat(test.quantity, "port", test.size, mean, lo, hi, alpha, f"t-interval, alpha={alpha:.2g}",
                 cause=test.cause)


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
                pi = _perturbation(noise[name][0][i:i + 1], noise[name][1][i:i + 1])
                pj = _perturbation(noise[name][0][j:j + 1], noise[name][1][j:j + 1])
                same = np.array_equal(pi, -pj)
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
            fp = _signfree(noise[w][1][i])
            if fp in seen:
                count += 1
                first = first or f"members {seen[fp]} and {i} draw the same B for '{w}'"
            seen.setdefault(fp, int(i))
    return count, first


def _shared_prefix(noise: dict, reps: np.ndarray, shapes) -> tuple[int, str]:
    """Members whose draws for two leaves share a prefix: one key used for several leaves draws the same numbers.

    Weights are compared through B (the raw draw), biases through |eps| (same sigma on every bias).
    """
    groups = [[(w, noise[w][1]) for w in _weights(shapes)],
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


def _reuse_across_epochs(draws: dict[int, dict], epochs, groups: list[int], names: list[str]) -> tuple[int, str]:
    """Draws of one epoch group found again (any member, up to sign) in another group of `names`' noise."""
    firsts: dict[int, int] = {}
    for e, g in zip(epochs, groups):
        firsts.setdefault(g, e)
    chosen = sorted(firsts.values())[:4]
    count, first = 0, ""
    for name in names:
        seen: dict[bytes, tuple[int, int]] = {}
        for e in chosen:
            noise = draws[e]
            values = noise[name][1] if name.endswith(".weight") else noise[name]
            for i in range(values.shape[0]):
                fp = _signfree(values[i])
                if fp in seen and seen[fp][0] != e:
                    count += 1
                    if not first:
                        e0, i0 = seen[fp]
                        first = f"'{name}' of member {i} at epoch {e} equals member {i0}'s at epoch {e0}"
                seen.setdefault(fp, (e, i))
    return count, first


# ----------------------------------------------------------------------------- the check
def run(ctx):
    rec = Recorder(NAME)
    cfg, shapes, seed = ctx.cfg, ctx.shapes, ctx.seed
    sigma, r, pop = cfg.sigma, cfg.rank, ctx.sizes.noise_pop
    members = np.arange(pop)
    ctx.log(f"[{NAME}] drawing {pop} members on both sides")
    port = ctx.port.noise(shapes, seed, 0, members, pop, sigma, r)
    ref = ctx.ref.noise(shapes, seed, 0, members, pop, sigma, r)
    weights, biases = _weights(shapes), _biases(shapes)
    size = f"pop={pop} r={r} sigma={fmt(sigma)}"
    notes: list[str] = []

    # Bias noise presence.
    ref_biases = [bn for bn in biases if bn in ref]
    port_biases = [bn for bn in ref_biases if bn in port]
    rec.equal("bias leaves with noise", "port", size, len(port_biases), len(ref_biases),
              "the reference perturbs every bias",
              cause=diagnose.cause("bias_noise", "the port does not perturb the biases (no bias noise, as "
                                                 "bias_noise=off); the reference adds +-sigma*eps to every bias"))

    # Antithetic pairing: who mirrors whom, exactly.
    w0 = weights[0]
    fp_port = _perturbation(*port[w0]).reshape(pop, -1)
    fp_ref = _perturbation(*ref[w0]).reshape(pop, -1)
    port_mirror, ref_mirror = diagnose.mirror_map(fp_port), diagnose.mirror_map(fp_ref)
    pairing = diagnose.pairing_cause(port_mirror, ref_mirror)
    rec.equal("members whose mirror differs from the reference's", "port", size,
              int(np.sum(port_mirror != ref_mirror)), 0, "exact negation of A B^T", cause=pairing)
    notes.append(f"Pairing layout: port {diagnose.layout_name(port_mirror)}, reference {diagnose.layout_name(ref_mirror)}.")
    bad, first = _mirror_consistency(port, port_mirror, shapes)
    rec.equal("mirror pairs not negated in every leaf", "port", size, bad, 0, "exact",
              cause=diagnose.cause("antithetic", first or "mirrored members differ"))

    # Draws shared where they must not be (exact).
    reps = np.array([i for i in range(pop) if port_mirror[i] < 0 or i < port_mirror[i]])
    count, first = _duplicates(port, reps, shapes)
    rec.equal("unmirrored members with identical draws", "port", f"{reps.size} members", count, 0, "exact",
              cause=diagnose.cause("rng", f"key scheme: {first}"))
    count, first = _shared_prefix(port, reps, shapes)
    rec.equal("members whose leaves share draws", "port", f"{reps.size} members", count, 0, "exact",
              cause=diagnose.cause("rng", f"key scheme: {first}"))

    # Moments and independence against exact expected values (statistical).
    tests = _moment_tests(port, reps, shapes, sigma, r)
    use_uniform_test = ctx.port.has("action_uniforms") and not ctx.port.jax_compatible_rng
    alpha = check_alpha(NAME) / (len(tests) + int(use_uniform_test))
    for test in tests:
        _judge(rec, test, alpha)
    for w in weights:
        p = _perturbation(port[w][0][reps[:P_MEMBERS]], port[w][1][reps[:P_MEMBERS]]) / sigma
        rec.info(f"{w} A B^T / sigma: variance", "port", size, float(np.mean(p ** 2)), "expected 1")
        rec.info(f"{w} A B^T / sigma: kurtosis", "port", size, float(np.mean(p ** 4) / np.mean(p ** 2) ** 2),
                 f"expected 3 + 6/r = {fmt(3 + 6 / r)}")
    for w in weights:
        rec.info(f"{w}: std(A) / (sigma/sqrt r)", "port", size,
                 float(np.sqrt((port[w][0][reps].astype(np.float64) ** 2).mean()) * np.sqrt(r) / sigma))

    # The noise_reuse schedule: which probed epochs share noise (exact), weights and biases apart.
    probes = tuple(ctx.sizes.probe_epochs)
    ctx.log(f"[{NAME}] probing {len(probes)} epochs for the noise_reuse schedule")
    probe = np.arange(ctx.sizes.probe_pop)
    draws_port = {e: ctx.port.noise(shapes, seed, e, probe, probe.size, sigma, r) for e in probes}
    draws_ref = {e: ctx.ref.noise(shapes, seed, e, probe, probe.size, sigma, r) for e in probes}
    groups = {}
    for side, draws in (("port", draws_port), ("reference", draws_ref)):
        for kind, names in (("weight", weights), ("bias", biases)):
            fps = [_fingerprints(draws[e], names) for e in probes]
            groups[side, kind] = None if any(fp is None for fp in fps) else diagnose.partition(fps)
    schedule_causes = diagnose.schedule_cause(probes, groups["port", "weight"], groups["reference", "weight"],
                                              groups["port", "bias"], groups["reference", "bias"])
    probe_size = f"{len(probes)} epochs 0..{probes[-1]}, {probe.size} members"

    def disagreements(a, b) -> int:
        """Pairs of probed epochs that share noise on one side and not on the other."""
        same_a, same_b = np.equal.outer(a, a), np.equal.outer(b, b)
        return int(np.triu(same_a != same_b, 1).sum())

    rec.equal("pairs of probed epochs sharing weight noise differently", "port", probe_size,
              disagreements(groups["port", "weight"], groups["reference", "weight"]), 0, "exact",
              cause=next((c for c in schedule_causes if c.knob == "noise_reuse"), None))
    if groups["port", "bias"] is not None and groups["reference", "bias"] is not None:
        rec.equal("pairs of probed epochs sharing bias noise differently", "port", probe_size,
                  disagreements(groups["port", "bias"], groups["reference", "bias"]), 0, "exact",
                  cause=next((c for c in schedule_causes if c.knob == "bias_noise"),
                             schedule_causes[0] if schedule_causes else None))
    notes.append("Schedule: port weights: " + diagnose.describe_schedule(probes, groups["port", "weight"])
                 + "; reference weights: " + diagnose.describe_schedule(probes, groups["reference", "weight"])
                 + (("; port biases: " + diagnose.describe_schedule(probes, groups["port", "bias"]))
                    if groups["port", "bias"] else "") + ".")
    for kind, names, knob in (("weight", weights, "noise_reuse"), ("bias", port_biases, "bias_noise")):
        if not names or groups["port", kind] is None:
            continue
        count, first = _reuse_across_epochs(draws_port, probes, groups["port", kind], names)
        rec.equal(f"{kind} draws reused across epochs with different noise", "port", probe_size, count, 0, "exact",
                  cause=diagnose.cause(knob, f"draws come back in another epoch: {first}"))

    # The generator itself.
    if ctx.port.jax_compatible_rng:
        aligned = pairing is None
        for name in weights + port_biases:
            if name.endswith(".weight"):
                p_arr = np.concatenate([port[name][0].ravel(), port[name][1].ravel()])
                r_arr = np.concatenate([ref[name][0].ravel(), ref[name][1].ravel()])
            else:
                p_arr, r_arr = port[name].ravel(), ref[name].ravel()
            ulps = ulp_distance(p_arr, r_arr)
            identical = float(np.mean(ulps == 0))
            gen_cause = diagnose.cause("rng", f"the port claims JAX-compatible draws, but {100 * (1 - identical):.3g}% "
                                              f"of '{name}' differ from jax.random (max {int(ulps.max())} ULP)")
            if aligned:
                rec.bound(f"{name}: max ULP vs jax.random", "port", size, float(ulps.max()), ULP_TOLERANCE,
                          "bit-identical draws on the same backend", cause=gen_cause)
            else:
                rec.info(f"{name}: max ULP vs jax.random", "port", size, float(ulps.max()),
                         "not judged: the pairing differs, so members do not line up")
            rec.info(f"{name}: bit-identical fraction", "port", size, identical)
        if ctx.port.has("action_uniforms"):
            for e in (0, 3):
                pu = ctx.port.action_uniforms(seed, e, cfg.pop, MAX_STEPS)[:MAX_STEPS]
                ru = ctx.ref.action_uniforms(seed, e, cfg.pop, MAX_STEPS)[:MAX_STEPS]
                differ = int(np.sum(ulp_distance(pu, ru) > 0))
                rec.equal(f"action uniforms differing from jax.random, epoch {e}", "port", f"({MAX_STEPS}, {cfg.pop})",
                          differ, 0, "bit-identical",
                          cause=diagnose.cause("rng", f"the port claims JAX-compatible draws, but {differ} action "
                                                      f"uniforms of epoch {e} differ from uniform(fold_in(action_key, e))"))
        notes.append("Generator: the port claims JAX-compatible draws, so its noise is compared with jax.random "
                     "element by element (after the pairing check; a pairing drift makes members not line up).")
    else:
        for name in weights[:1]:
            identical = float(np.mean(port[name][1] == ref[name][1]))
            rec.info(f"{name}: B bit-identical fraction", "port", size, identical,
                     "not judged: own generator, compared in distribution")
        if use_uniform_test:
            u = ctx.port.action_uniforms(seed, 0, cfg.pop, MAX_STEPS)[:MAX_STEPS].ravel().astype(np.float64)
            rec.alpha += alpha
            rec.bound("action uniforms: Kolmogorov-Smirnov distance to U[0,1)", "port", f"{u.size} draws",
                      float(stats.kstest(u, "uniform").statistic), ks_critical(u.size, alpha),
                      f"exact KS critical value, alpha={alpha:.2g}",
                      cause=diagnose.other("action sampling", "the port's action uniforms are not uniform on [0, 1)"))
        notes.append("Generator: the port uses its own generator (e.g. rng=torch), which is not a drift: its noise "
                     "is compared in distribution, pairing, key scheme and schedule only, never element by element.")

    section = "\n".join([
        f"The port's and the reference's noise for {pop} members at epoch 0 (seed {seed}), and {probe.size} members "
        f"at each of {len(probes)} probed epochs.",
        "",
        "Exact parts (no false alarms): which member is the exact negation of which (A_i B_i^T = -A_j B_j^T, and the "
        "same pairs negated in every leaf and bias); bias noise present; no two unmirrored members and no two leaves "
        "sharing draws; which probed epochs share noise (weights and biases apart), against the reference's schedule "
        "for its noise_reuse; no draw coming back in an epoch with different noise.",
        "",
        f"Statistical parts, over {reps.size} independent members (one per mirrored pair), {len(tests)} tests at "
        f"alpha={alpha:.2g} each (the noise check's share of the suite's false-alarm budget, Bonferroni). Under the "
        "reference the entries of A/(sigma/sqrt r), of B and of eps/sigma are iid standard normal, so the tests are "
        "exact: per leaf the mean square against chi-square(n)/n (the sigma/sqrt(r) scaling), pooled the mean against "
        "N(0, 1/n) and the Kolmogorov-Smirnov distance to N(0,1) against its exact critical value. Independence: "
        "the per-member mean product of adjacent rows and columns of A B^T, of different pairs and of different "
        "leaves must be 0 within a t-interval (symmetric statistics). The variance (1) and kurtosis (3 + 6/r) of "
        "A B^T / sigma are reported.",
        "",
        *notes,
    ])
    return summarize(NAME, rec, section)
