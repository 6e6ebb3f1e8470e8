"""Diagnosis: from what a port was OBSERVED to do, the most likely knob of DESIGN.md's knob table, in its words.

Nothing here reads a port's knobs (a foreign port has none): each function takes measurements
(mirror maps, which epochs share noise, which candidate formula reproduces the port's output, norm
ratios) and returns a `Cause` whose text names the knob (`DESCRIPTIONS` of spec.knobs) and
what was seen.
"""
from __future__ import annotations

import math
from typing import Callable, Iterable, Sequence

import numpy as np

from parity.core.tolerances import entry_ks, entry_moment, ks_critical
from parity.core.verdict import Cause, fmt
from spec.knobs import DESCRIPTIONS
from spec.platform import backend_sentence


UPDATE_ONLY = "bias_noise=update_only"   # how every check names bias noise that enters the update only


def names_update_only(causes: Iterable[Cause]) -> bool:
    """Whether a check's causes say the port's bias noise enters the update only."""
    return any(c.knob == "bias_noise" and UPDATE_ONLY in c.text for c in causes)


def cause(knob: str, detail: str) -> Cause:
    """A cause naming a knob: '<description> differs (knob `k`): <detail>'."""
    return Cause(knob, f"{DESCRIPTIONS[knob]} differs (knob `{knob}`): {detail}")


def other(what: str, detail: str) -> Cause:
    """A cause no knob describes (a foreign port's own difference)."""
    return Cause(None, f"{what} differs: {detail}")


def reference_cause(what: str, ratio: float, platform) -> Cause:
    """The reference beyond its own bound (the port being within its own): its platform's rounding, never the port.

    platform: spec.platform.ReferencePlatform, as the report states it."""
    bound = "TF32" if platform.tf32 else "float32"
    hint = ("its platform rounds more than TF32 operands explain" if platform.tf32 else
            "it computes with coarser products than its platform is described to have (e.g. TF32 matmuls: JAX's "
            "default precision on NVIDIA GPUs); rerun with --reference-precision highest, or describe the platform "
            "(--reference-platform)")
    return Cause(None, f"the reference's platform, not the port: the reference's {what} is {fmt(ratio)}x its "
                       f"{bound} bound of the exact value ({platform.where()}, {platform.precision_words()}); {hint}")


def backend_cause(port_normals: str, platform, detail: str) -> Cause:
    """A port on the other backend's float32 normals (rng=jax-cpu against a GPU reference, or back): knob rng, with
    the sentence that the bits agree and only the backend's normal differs."""
    return cause("rng", f"{backend_sentence(port_normals, platform)}; {detail}. Draw the reference's "
                        f"(rng=jax-{platform.normals}, or rng=jax to follow it)")


def other_seed(seed: int) -> int:
    """A second run seed for the seed checks: seed + 1 (seed - 1 at the top of JAX's uint32 range)."""
    return seed + 1 if seed < 2 ** 32 - 1 else seed - 1


def seed_cause(what: str, leaves: Sequence[str], seeds: tuple[int, int]) -> Cause:
    """A port whose draws ignore the run seed: its `what` (noise, init) is bit for bit the same at two run seeds."""
    shown = ", ".join(f"'{n}'" for n in leaves[:4]) + (" ..." if len(leaves) > 4 else "")
    return Cause(None, f"run seed ignored: the port's {what} is bit for bit the same at run seeds {seeds[0]} and "
                       f"{seeds[1]} ({shown}); the reference's key chain starts from key(seed), so every run seed draws "
                       "other numbers (a hard-coded key or generator seed?)")


def zero_columns_cause(zero: Sequence[tuple[str, int]], rank: int, n_weights: int) -> Cause:
    """Factors padded with zero columns: noise of a lower rank than r in (weight, zero columns) of each leaf; when
    every weight keeps the same rank k, the advice to declare it (`rank = k`)."""
    shown = ", ".join(f"'{w}' {k}" for w, k in zero[:4]) + (" ..." if len(zero) > 4 else "")
    kept = sorted({rank - z for _, z in zero})
    declare = (f"; a port of fixed rank {kept[0]} declares it (`rank = {kept[0]}` on the adapter) and is compared at "
               "that rank" if len(kept) == 1 and len(zero) == n_weights else "")
    return Cause(None, f"noise rank differs: the port's factors have columns that are zero in every member ({shown} "
                       f"of r={rank}): noise of a lower rank padded with zero columns (a rank fixed below r, or "
                       f"clipped to min(r, out, in)), which the scale and distribution rows then misread{declare}")


def follows(check: str, causes: Iterable[Cause]) -> tuple[Cause, ...]:
    """Causes of an upstream check, restated for a downstream one that their difference explains."""
    return tuple(Cause(c.knob, f"follows from the {check} check: {c.text}") for c in causes)


# ----------------------------------------------------------------------------- antithetic pairing
def canonical(x: np.ndarray) -> bytes:
    """Bytes of a float array with -0.0 made +0.0 (so that exact equality is byte equality)."""
    return np.ascontiguousarray(np.asarray(x) + 0.0).tobytes()


def mirror_map(fingerprints: np.ndarray) -> np.ndarray:
    """For each member (row), the other member whose fingerprint is its exact negation, or -1.

    fingerprints: (m, k) float64, e.g. each member's perturbation A_i B_i^T flattened. Exact
    negation is what antithetic sampling produces (the mirror's A or eps is the negated draw).
    """
    table: dict[bytes, int] = {}
    for i, row in enumerate(fingerprints):
        table.setdefault(canonical(row), i)
    out = np.full(len(fingerprints), -1, dtype=np.int64)
    for i, row in enumerate(fingerprints):
        j = table.get(canonical(-row))
        if j is not None and j != i:
            out[i] = j
    return out


def layout_name(mirror: np.ndarray) -> str:
    """interleaved (2k <-> 2k+1), halves (i <-> i + N/2), off (no mirrors) or other."""
    n = len(mirror)
    idx = np.arange(n)
    if np.all(mirror == -1):
        return "off"
    if np.array_equal(mirror, idx ^ 1):
        return "interleaved"
    if n % 2 == 0 and np.array_equal(mirror, (idx + n // 2) % n):
        return "halves"
    return "other"


def pairing_cause(port_mirror: np.ndarray, ref_mirror: np.ndarray) -> Cause | None:
    """None when the pairing agrees; else which member mirrors which, on each side."""
    diff = np.nonzero(port_mirror != ref_mirror)[0]
    if diff.size == 0:
        return None
    i = int(diff[0])
    p, r = int(port_mirror[i]), int(ref_mirror[i])
    if p < 0:
        seen = f"member {i} is the mirror of no member"
    else:
        seen = f"member {i} is the mirror of member {p}"
    want = f"not of member {r}" if r >= 0 else "while the reference gives it no mirror"
    layout = layout_name(port_mirror)
    named = {"halves": "pairs are the two halves of the population (i, i + N/2)",
             "off": "no antithetic pairs", "interleaved": "interleaved pairs (2k, 2k+1)",
             "other": "an unrecognised pairing"}[layout]
    return cause("antithetic", f"{seen}, {want} ({named}; reference: {layout_name(ref_mirror)})")


# ----------------------------------------------------------------------------- noise schedule
def partition(fingerprints: Sequence[bytes]) -> list[int]:
    """Group ids: probes with equal fingerprints share an id (ids in order of first appearance)."""
    ids: dict[bytes, int] = {}
    return [ids.setdefault(fp, len(ids)) for fp in fingerprints]


def describe_schedule(epochs: Sequence[int], groups: Sequence[int], knob: bool = True) -> str:
    """In words: when the noise changes over the probed epochs (and, with knob, which noise_reuse matches)."""
    changes = [e for e, g, g0 in zip(epochs[1:], groups[1:], groups[:-1]) if g != g0]
    if not changes:
        return f"the same noise at every probed epoch (0 to {epochs[-1]})" + (", as noise_reuse=0" if knob else "")
    k = changes[0]
    predicted = partition([str(e // k).encode() for e in epochs])
    if list(predicted) == list(groups):
        if k == 1:
            return "new noise every epoch" + (", as noise_reuse=1" if knob else "")
        prev = max(e for e in epochs if e < k)
        exact = "" if prev == k - 1 else f" (first change between epochs {prev} and {k})"
        return f"new noise every {k} epochs" + (f", as noise_reuse={k}" if knob else "") + exact
    shown = ", ".join(map(str, changes[:6])) + (" ..." if len(changes) > 6 else "")
    return f"the noise changes at epochs {shown}" + (" (no noise_reuse value gives this pattern)" if knob else "")


def schedule_cause(epochs, port_weight, ref_weight, port_bias, ref_bias, update_only: bool = False) -> list[Cause]:
    """Causes from the partitions of probed epochs by equal weight noise and by equal bias noise.

    update_only: the port's forward was seen leaving its bias noise out, so fresh bias noise is named as
    bias_noise=update_only (as the products check or its forward noise says), not as fresh.
    """
    found: list[Cause] = []
    if list(port_weight) != list(ref_weight):
        found.append(cause("noise_reuse", f"the port's weight noise: {describe_schedule(epochs, port_weight)}; "
                                          f"the reference's: {describe_schedule(epochs, ref_weight)}"))
    if port_bias is not None and ref_bias is not None and list(port_bias) != list(ref_bias):
        kind = (f"fresh bias noise that its forward never applies: noise that enters the update only, as "
                f"{UPDATE_ONLY}" if update_only else "fresh bias noise")
        if list(port_bias) != list(port_weight) and list(port_weight) == list(ref_weight):
            found.append(cause("bias_noise", f"the port's bias noise: {describe_schedule(epochs, port_bias, False)} "
                                             f"({kind}), while its weight noise and the reference's bias "
                                             f"noise follow noise_reuse: {describe_schedule(epochs, ref_bias)}"))
        elif not found:
            found.append(cause("bias_noise", f"the port's bias noise: {describe_schedule(epochs, port_bias, False)}; "
                                             f"the reference's: {describe_schedule(epochs, ref_bias, False)}"))
    return found


# ----------------------------------------------------------------------------- fitness shaping
def _centred_ranks(f: np.ndarray) -> np.ndarray:
    from scipy.stats import rankdata
    n = f.size
    return np.zeros_like(f) if n == 1 else (rankdata(f) - 1) / (n - 1) - 0.5


def _grouped(f: np.ndarray, group_size: int) -> np.ndarray:
    if not group_size:
        return f - f.mean()
    g = f.reshape(-1, group_size)
    return (g - g.mean(1, keepdims=True)).ravel()


def _over_spread(centred: np.ndarray, spread: float) -> np.ndarray:
    """centred / spread with no epsilon: NaN (0/0, undefined) where the spread is zero (below 1e-8)."""
    return np.full_like(centred, np.nan) if spread < 1e-8 else centred / spread


# name -> (words, float64 formula (f, group_size) -> shaped, knob value it corresponds to or None); NaN where the
# formula is 0/0 (a zero spread): matches_candidate takes a port's NaN (no guard) or zeros (a guard) there
FITNESS_CANDIDATES: dict[str, tuple[str, Callable[[np.ndarray, int], np.ndarray], str | None]] = {
    "jax": ("(f - mean) / sqrt(var + 1e-5)", lambda f, g: _grouped(f, g) / math.sqrt(f.var() + 1e-5), "jax"),
    "std": ("(f - mean) / std (ddof 0, no epsilon)", lambda f, g: _over_spread(_grouped(f, g), f.std()), "std"),
    "std_unbiased": ("(f - mean) / (std(ddof 1) + 1e-8)",
                     lambda f, g: _grouped(f, g) / ((f.std(ddof=1) if f.size > 1 else 0.0) + 1e-8), "std_unbiased"),
    "rank": ("centred ranks in [-0.5, 0.5]", lambda f, g: _centred_ranks(f), "rank"),
    "std_eps": ("(f - mean) / (std + 1e-8)", lambda f, g: _grouped(f, g) / (f.std() + 1e-8), None),
    "raw": ("the raw fitness (no shaping)", lambda f, g: f.copy(), None),
    "centred": ("f - mean (not divided)", lambda f, g: _grouped(f, g), None),
}


def matches_candidate(port: np.ndarray, cand: np.ndarray, allowed: np.ndarray) -> bool:
    """Whether a port's shaped vector is a candidate's within `allowed`; where the candidate is 0/0 (NaN: a zero
    spread), a port that divides anyway gives NaN and one that guards the division zeros: either matches."""
    with np.errstate(invalid="ignore"):
        close = np.abs(port - cand) <= allowed + 1e-6 * np.abs(cand)
    return bool(np.all(close | (np.isnan(cand) & (np.isnan(port) | (port == 0)))))


UNGROUPED = "; it ignores group_size (grouped fitness centred by the population's mean; CartPole runs use no groups)"


def fitness_cause(matches: dict[str, int], n_shaped: int, n_cases: int, failing: int, worst: str,
                  ungrouped: frozenset = frozenset(), also: str = "") -> Cause:
    """matches: candidate -> in how many of the n_shaped vectors the port shaped (of n_cases) it equals the port;
    ungrouped: the candidates it equals on some grouped vector only with group_size ignored; also: a sentence added
    (zero_spread_sentence)."""
    also = f"; {also}" if also else ""
    full = [name for name, count in matches.items() if n_shaped and count == n_shaped and name != "jax"]
    if full:
        name = full[0]
        words, _, knob_value = FITNESS_CANDIDATES[name]
        extra = f" (as fitness={knob_value})" if knob_value else ""
        return cause("fitness", f"the port's shaped fitness is {words}{extra}, the reference's "
                                f"{FITNESS_CANDIDATES['jax'][0]}; {failing} of {n_cases} vectors differ, worst {worst}"
                                + (UNGROUPED if name in ungrouped else "") + also)
    if n_shaped and matches.get("jax") == n_shaped and "jax" in ungrouped:
        return other("fitness shaping", f"the port's shaped fitness is the reference's {FITNESS_CANDIDATES['jax'][0]} "
                                        f"but for groups{UNGROUPED}; {failing} of {n_cases} vectors differ{also}")
    best = max((n for n in matches if n != "jax"), key=lambda n: matches[n], default=None)
    hint = ""
    if best is not None and matches[best] > 0:
        hint = f"; closest known shaping: {FITNESS_CANDIDATES[best][0]} ({matches[best]} of {n_shaped} vectors)"
    return cause("fitness", f"the port's shaped fitness differs on {failing} of {n_cases} vectors (worst {worst}) "
                            f"and is none of the known shapings{hint}{also}")


def nonfinite_count(x: np.ndarray) -> str:
    """Where an array holds NaN or inf, in words: 'NaN at 64 of 64 values', 'NaN at 3 and +inf at 1 of 64 values'."""
    x = np.asarray(x)
    kinds = [(int(np.isnan(x).sum()), "NaN"), (int(np.isposinf(x).sum()), "+inf"), (int(np.isneginf(x).sum()), "-inf")]
    return " and ".join(f"{word} at {n}" for n, word in kinds if n) + f" of {x.size} values"


def zero_spread(f: np.ndarray, group_size: int = 0) -> str:
    """In words, where a fitness vector has no spread to divide by ('' where it has): the whole vector, or a group."""
    f = np.asarray(f, np.float64).ravel()
    if f.size and np.all(np.isfinite(f)) and f.std() == 0:
        return f"every value is {fmt(f[0])}: spread 0"
    if group_size and f.size % group_size == 0 and np.all(np.isfinite(f)):
        flat = np.nonzero(f.reshape(-1, group_size).std(1) == 0)[0]
        if flat.size:
            return (f"group {int(flat[0])} (of size {group_size}) holds {fmt(f[flat[0] * group_size])} only: "
                    f"spread 0" + (f", and {flat.size - 1} more groups" if flat.size > 1 else ""))
    return ""


def zero_spread_sentence(case: str, spread: str, returned: str) -> str:
    """The sentence for a shaping that divides by a zero spread: on which input, what it returned, what would fix it."""
    return (f"the port divides by a zero spread: on {case} ({spread}) it returns {returned} (0/0, no epsilon), where "
            "the reference's sqrt(var + 1e-5) gives zeros: add an epsilon to the spread, or return zeros where it is 0")


# ----------------------------------------------------------------------------- NaN or inf out of finite input
_DRAW = ("a draw at u = 0 or 1 (log(0) in a Box-Muller normal, an inverse CDF at 0 or 1), or a scale such as "
         "sigma / sqrt(rank) that divides by zero")
_PRODUCT = "an overflow, or a buffer read before it is written (torch.empty, np.empty)"
_STEP = ("a division by zero in the step, such as adam's m / (sqrt(v) + eps) with eps = 0 where a gradient entry is "
         "zero (0/0)")
NONFINITE_HINTS = {
    "shape_fitness": "a division by the fitness' spread without an epsilon",
    "noise": _DRAW, "es_ask": _DRAW,
    "perturbed_linear": _PRODUCT, "perturbed_mm": _PRODUCT, "perturbed_tmm": _PRODUCT,
    "forward": ("a normalisation dividing by a zero variance without an epsilon, a log or exp of extreme values, "
                "or " + _PRODUCT),
    "gradient": "a division by zero (by N, by sigma, by a spread), or a buffer read before it is written",
    "optimizer_step": _STEP, "update": _STEP,
    "es_params": ("the port's own step: its shaping of the returns (0/0 where they are equal), its gradient or "
                  "its optimizer (" + _STEP + ")"),
    "init_params": "a scale with a zero denominator (1/sqrt(fan_in)), or a buffer read before it is written",
    "action_uniforms": "a division by zero turning random bits into uniforms",
}
SPREAD_ARGS = ("f", "shaped", "fitness", "scores")


def _input_finding(named: Sequence[tuple[str, object]]) -> str:
    """What in the call's input explains a NaN: a fitness-like argument with no spread, or an all-zero one."""
    group = next((int(v) for k, v in named if k == "group_size" and isinstance(v, (int, np.integer))), 0)
    for name, value in named:
        if name not in SPREAD_ARGS or not isinstance(value, np.ndarray) or value.ndim != 1:
            continue
        if value.size and not np.any(value):
            return f"the `{name}` it was given is all zero: a division by its spread or norm without an epsilon is 0/0"
        spread = zero_spread(value, group if name == "f" else 0)
        if spread:
            return (f"the port divides by a zero spread: the `{name}` it was given has none ({spread}), and a "
                    "division by it without an epsilon is 0/0")
    return ""


def nonfinite_cause(method: str, named: Sequence[tuple[str, object]], where: Sequence, reference: str) -> Cause:
    """Why a port's `method` returned NaN or inf (where: [(path, array)]) on finite input (named: its arguments),
    the reference's answer being `reference` ('finite' or why it was not asked): the input's finding, else the
    method's usual suspects, with what the output shows (only inf: an overflow or x / 0)."""
    arrays = [a for _, a in where]
    only_inf = not any(np.isnan(a).any() for a in arrays)
    everywhere = all(not np.isfinite(a).any() for a in arrays)
    likely = _input_finding(named) or NONFINITE_HINTS.get(method, "a division by zero, an overflow, or a buffer "
                                                                  "read before it is written")
    if only_inf:
        likely += "; only inf, no NaN: an overflow or a division x / 0"
    seen = "; ".join(f"{nonfinite_count(a)} of {path_words(p)}" for p, a in list(where)[:3])
    if everywhere and not only_inf:
        seen += ": every value (one NaN early on spreads through every sum)"
    return Cause(None, f"numerical failure: the port's `{method}` returns NaN or inf on finite input ({seen}); the "
                       f"reference's answer to the same call: {reference}; likely {likely}")


def path_words(path: Sequence) -> str:
    """An array's place in a port's output in words: "'0.weight' A" (a pair's factors), "'0.bias'" (an optimizer
    step's params: the leading index dropped), 'the result'."""
    parts = list(path)
    if parts and isinstance(parts[0], (int, np.integer)):
        parts = parts[1:]
    words = []
    for part in parts:
        if isinstance(part, (int, np.integer)) and words:
            words.append("AB"[part] if part in (0, 1) else str(part))
        else:
            words.append(f"'{part}'")
    return " ".join(words) or "the result"


# ----------------------------------------------------------------------------- forward / activation
def activation_cause(port_act: str | None, ref_act: str, worst: str) -> Cause:
    if port_act is not None:
        return cause("activation", f"the port's forward matches the {port_act} activation, not {ref_act} "
                                   f"(worst logit difference {worst})")
    return other("forward pass", f"the port's forward matches the reference MLP with none of the known activations "
                                 f"(pqn, tanh, relu, silu); worst logit difference {worst}")


# ----------------------------------------------------------------------------- gradients
def gradient_cause(leaf: str, norm_ratio: float, cosine: float, ratio_other_sigma: float | None,
                   sigma: float, other_sigma: float | None, pop: int | None = None, rank: int | None = None,
                   aligned: bool | None = None) -> Cause:
    """A gradient leaf that differs: zero (a bias: no bias noise), a pure scale (1/sigma; given pop, and rank, any
    other factor parity.core.optscale names: N, 1/N, sqrt(N), sqrt(r), N/sigma, 2, ...), a sign flip, or a different
    direction. `aligned` (parity.core.optscale.fit_leaf: port - c ref within the rounding bound, norm_ratio then c)
    decides "same direction" where given; else the cosine within 1e-4 of +-1 does."""
    is_bias = leaf.endswith(".bias")
    if norm_ratio == 0:
        if is_bias:
            return cause("bias_noise", f"'{leaf}' gradient is zero on the reference's noise and fitness: the port's "
                                       "gradient ignores the bias noise it is given, so it perturbs no bias (as "
                                       "bias_noise=off); the reference's is mean(f * sigma * eps)")
        return other("gradient estimate", f"'{leaf}' gradient is zero on the reference's noise and fitness")
    same = cosine > 1 - 1e-4 if aligned is None else aligned and norm_ratio > 0
    if same and math.isfinite(norm_ratio):
        scales_with_sigma = (ratio_other_sigma is not None and other_sigma is not None
                             and abs(ratio_other_sigma * other_sigma / (norm_ratio * sigma) - 1) < 1e-3)
        if abs(norm_ratio * sigma - 1) < 1e-3 or scales_with_sigma:
            detail = (f"'{leaf}' gradient is {fmt(norm_ratio)}x the reference's = 1/sigma at sigma={fmt(sigma)}"
                      + (f" and {fmt(ratio_other_sigma)}x at sigma={fmt(other_sigma)}" if ratio_other_sigma else "")
                      + " (divided by sigma once more)")
            return cause("bias_grad", detail) if is_bias else other("weight gradient scale", detail)
        return other("gradient scale", f"'{leaf}' gradient is {fmt(norm_ratio)}x the reference's"
                                       f"{named_factor(norm_ratio, sigma, pop, rank)} (same direction)")
    if (cosine < -1 + 1e-4) if aligned is None else (aligned and norm_ratio < 0):
        return other("gradient sign", f"'{leaf}' gradient points the opposite way (cosine {fmt(cosine)}); "
                                      "the reference's convention is the ascent direction")
    return other("gradient estimate", f"'{leaf}' gradient has cosine {fmt(cosine)} and norm ratio "
                                      f"{fmt(norm_ratio)} to the reference's on the same noise and fitness")


def named_factor(ratio: float, sigma: float, pop: int | None, rank: int | None) -> str:
    """', a factor N at N=8' when `ratio` is within 1e-3 of scales parity.core.optscale names (each such name, tied ones
    joined by '='), with the values of sigma, N and r they use; '' without pop or when none fits."""
    from parity.core import optscale
    if pop is None:
        return ""
    names = [n for n in optscale.scale_names(ratio, ratio / (1 + 1e-3), ratio * (1 + 1e-3), sigma, pop, rank)
             if n != "1"]
    if not names:
        return ""
    used = [f"{k}={v}" for k, v, symbol in (("sigma", fmt(sigma), "sigma"), ("N", pop, "N"), ("r", rank, "(r)"))
            if any(symbol in n for n in names)]
    return f", a factor {' = '.join(names)}" + (f" at {', '.join(used)}" if used else "")


# ----------------------------------------------------------------------------- optimizer and schedules
def decay_estimate(ratios: dict[int, float], ref_decay: float) -> float | None:
    """The port's per-epoch factor d from ratios r_e = (d / d_ref)^e observed at epochs e >= 1."""
    pairs = [(e, r) for e, r in ratios.items() if e >= 1 and r > 0 and math.isfinite(r)]
    if not pairs:
        return None
    # least squares of log r_e = e log(d / d_ref) through the origin
    num = sum(e * math.log(r) for e, r in pairs)
    den = sum(e * e for e, _ in pairs)
    return ref_decay * math.exp(num / den)


def optimizer_cause(matched: str | None, ref_opt: str, worst: str, scale: str = "") -> Cause:
    """The optimizer the port's updates match (scale: the words of parity.core.optscale.words when its gradient scale
    was fitted and is not 1), or none of them."""
    if matched is not None and matched != ref_opt:
        on = f" {scale}" if scale else ""
        return cause("optimizer", f"the port's parameter updates match optax {matched} (its defaults){on}, not "
                                  f"{ref_opt} (worst difference {worst})")
    return cause("optimizer", f"the port's parameter updates match none of optax sgd, adam, adamw at the "
                              f"reference's learning rate (worst difference {worst})")


def scaled_optimizer_cause(fit, ref_opt: str, words: str, worst: str) -> Cause:
    """A port whose first step is an optax optimizer on its gradient times a fitted scale (parity.core.optscale): the
    optimizer knob when it is not the reference's, else the scale alone (for sgd the same as an lr factor)."""
    if fit.optimizer != ref_opt:
        return optimizer_cause(fit.optimizer, ref_opt, worst, words)
    return other("optimizer step", f"the port's parameter updates match optax {fit.optimizer} {words}"
                 + ("; for sgd a gradient scale and a learning-rate factor are the same" if fit.optimizer == "sgd"
                    else "") + f" (without the scale: {worst})")


def lr_schedule_cause(ratios: dict[int, float], ref_decay: float) -> Cause:
    d = decay_estimate(ratios, ref_decay)
    shown = ", ".join(f"epoch {e}: {r:.6f}" for e, r in sorted(ratios.items()))
    guess = f"; a per-epoch factor of {d:.6g} (lr_decay={d:.4g}) fits, the reference uses {ref_decay:g}" if d else ""
    return cause("lr_decay", f"the port's update size relative to the reference's is {shown}{guess}")


def sigma_schedule_cause(epoch: int, ratio: float, ref_decay: float, since: int = 0) -> Cause:
    """The port's noise at `epoch` is `ratio` x the reference's, relative to epoch `since` (the same draws)."""
    lag = epoch - since
    d = ref_decay * ratio ** (1.0 / lag) if lag > 0 and ratio > 0 else None
    guess = f"; a per-epoch factor of {d:.6g} (sigma_decay={d:.4g}) fits, the reference uses {ref_decay:g}" if d else ""
    where = f"at epoch {epoch}" if since == 0 else f"from epoch {since} to {epoch}"
    return cause("sigma_decay", f"{where} the port's noise is {ratio:.6f}x the reference's "
                                f"(same draws, different sigma){guess}")


def sigma_trend_cause(epochs: int, slope: float, stderr: float, ref_decay: float) -> Cause:
    """Fresh draws: the log mean square of the port's noise over the reference's sigma_e^2 has `slope` per epoch
    (standard error `stderr`) over `epochs` epochs; the port's decay is the reference's times exp(slope / 2)."""
    ratio = math.exp(slope / 2)
    d, d_err = ref_decay * ratio, ref_decay * ratio * stderr / 2
    return cause("sigma_decay", f"over {epochs} epochs of fresh draws (es_ask/es_tell on synthetic fitness) the "
                                f"port's noise scale changes by {ratio:.6f}x per epoch relative to the reference's; "
                                f"a per-epoch factor of {d:.6g} +- {d_err:.2g} (sigma_decay={d:.4g}) fits, the "
                                f"reference uses {ref_decay:g}")


# ----------------------------------------------------------------------------- init
def fixed_std_fits_better(layers: Sequence[tuple[int, float, int]]) -> tuple[bool, float]:
    """(whether one std for every layer explains the weights better than a std of k/sqrt(in), that std).

    layers: (weights, their mean square, fan-in) per layer; Gaussian log-likelihoods at each model's MLE.
    """
    n, m2, fan_in = (np.array([layer[i] for layer in layers], dtype=np.float64) for i in range(3))
    if n.size < 2 or np.all(fan_in == fan_in[0]):
        return False, float("nan")
    s2 = float((n * m2).sum() / n.sum())                       # common variance
    k2 = float((n * m2 * fan_in).sum() / n.sum())              # variance k^2 / in
    ll_fixed = -0.5 * float((n * (math.log(s2) + m2 / s2)).sum())
    ll_scaled = -0.5 * float((n * (np.log(k2 / fan_in) + m2 * fan_in / k2)).sum())
    return ll_fixed > ll_scaled, math.sqrt(s2)


def init_cause(var_in: float, kurtosis: float, bias_zero: bool, bias_bound_ok: bool,
               layers: Sequence[tuple[int, float, int]] = ()) -> Cause:
    """Which init the port's weights look like: normal/sqrt(in) (var*in 1, kurtosis 3), torch's uniform (1/3, 1.8),
    or normal with one std for every layer whatever its fan-in (the functional port's 0.1)."""
    looks_uniform = abs(var_in - 1 / 3) < 0.1 and abs(kurtosis - 1.8) < 0.4
    fixed, std = fixed_std_fits_better(layers)
    if fixed and bias_zero and abs(var_in - 1) > 0.2:
        return cause("init", f"weights are normal with one std for every layer ({fmt(std)}, not 1/sqrt(in)) and "
                             "biases zero, as init=normal; the reference draws normal/sqrt(in)")
    bias = "biases are zero" if bias_zero else ("biases are non-zero, uniform in +-1/sqrt(in)" if bias_bound_ok
                                                else "biases are non-zero")
    if looks_uniform:
        return cause("init", f"weights look uniform(+-1/sqrt(in)) (var*in {fmt(var_in)}, kurtosis {fmt(kurtosis)}) "
                             f"and {bias}, as torch nn.Linear's default; the reference draws normal/sqrt(in) "
                             "with zero biases")
    return cause("init", f"weights have var*in {fmt(var_in)} and kurtosis {fmt(kurtosis)} and {bias}; the reference "
                         "draws normal/sqrt(in) (var*in 1, kurtosis 3) with zero biases")


# ----------------------------------------------------------------------------- EGGROLL's dense entries: scale or shape
DIAGNOSTIC_ALPHA = 1e-6     # level of the scale-free KS test that tells a wrong scale from a wrong shape (a cause's
                            # wording only, never a verdict)


def kurtosis(x: np.ndarray) -> float:
    """E x^4 / (E x^2)^2 of a sample (3 for a normal, 3 + 6/r for EGGROLL's entries)."""
    return float(np.mean(x ** 4) / np.mean(x ** 2) ** 2)


def distribution_cause(x: np.ndarray, r: int):
    return other("noise distribution", f"the port's noise is not distributed as EGGROLL's: its independent "
                                       f"entries of E have kurtosis {fmt(kurtosis(x))} and variance "
                                       f"{fmt(float(np.mean(x ** 2)))} x sigma^2; an entry of EGGROLL's "
                                       f"A B^T is sqrt(chi2_r / r) N(0, sigma^2), kurtosis 3 + 6/r = "
                                       f"{fmt(entry_moment(2, r))}")


def scale_cause(name: str, x: np.ndarray):
    return other("noise scaling", f"entries of E of '{name}' have variance {fmt(float(np.mean(x ** 2)))} "
                                  "x sigma^2; EGGROLL's A B^T (A times sigma/sqrt(r)) has sigma^2")


def is_rescaled(x: np.ndarray, r: int) -> bool:
    """Whether x looks like EGGROLL's entries at another scale: shaped like them once divided by their own RMS
    (scale-free KS at DIAGNOSTIC_ALPHA) while the variance is clearly off (5 standard errors)."""
    v = float(np.mean(x ** 2))
    shaped, _ = entry_ks(x / np.sqrt(v), r)
    off = abs(v - 1) > 5 * np.sqrt((entry_moment(2, r) - 1) / x.size)
    return shaped <= ks_critical(x.size, DIAGNOSTIC_ALPHA) and off
