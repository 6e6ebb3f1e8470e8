"""The tree suite's trajectory on a declared tree (`--task tree`): the port's own training loop (es_init, es_ask,
es_tell, es_params) driven for `epochs(cfg)` epochs on synthetic fitness, since the model's forward is the port's
own; each epoch is judged on its own against one reference step from the port's params before it:

- noise: what es_ask hands out at epoch e. A port drawing JAX's numbers: against the reference's draws at
  true_epoch(e, noise_reuse), within the noise check's bound (2 gamma_r |A||B|^T; param leaves exact). A port on its
  own generator: epochs e - 1 and e draw alike exactly when the reference's generations are alike, and (after the
  loop) its pairs and law (parity.tree.dist.asked_rows: antithetic pairs exactly; over the epochs' distinct draws
  one KS of every low-rank leaf's diagonal entries, one mean square of all their entries and one per low-rank leaf,
  at check_alpha("trajectory") / asked_tests(cfg)). Named: `noise_reuse` (another
  generation's draws, or fresh draws where the reference reuses them and the reverse), `sigma_decay` (the same
  draws at a scale that moves with the epoch, parity.core.diagnose.sigma_schedule_cause).
- shaping: the port's shape_fitness of the epoch's scores within the fitness check's bound (its step would follow it).
- step: es_params after es_tell against the reference's optax-sgd step (R.update) from the params before it, on the
  reference's estimate from the same scores (shaped by the reference; its own draws, or the port's es_ask noise),
  within lr sqrt(N) times the gradient's bound (both sides' einsum bounds, gamma_n |f| |noise| averaged per side,
  the reference's with_operands(gamma_n, 2, u) on a TF32 platform where it draws the noise itself, as in the
  gradients check; plus the shaping error shaping_pair_bound times |noise|) plus base.leaf_step_bound (parity.core.tolerances.step_bound: the
  step added once or in up to N per-member adds into the weights, on the noise's own magnitude), per entry.
- untouched leaves (those the reference never perturbs: embedding, excluded, frozen params): given back bit for bit.
- zero fitness: one more es_tell on zero scores from es_init must give the params back bit for bit (its step is
  exactly zero in any order of summation); rounding-sized moves name an in-place perturb and restore
  (base.zero_step_row), and then every failing step row says so.

Every epoch is judged, a failure at one not ending the check: each epoch's step is judged from the port's own params
before it, so the epochs are independent. Where es_ask's noise departs from the reference's draws (exact mode), that
epoch's step is judged on the port's own noise (the reference's estimate on it, as in distribution); where the
shaping departs, on the port's own shaped fitness, or on the reference's where that fits better (es_tell may shape
on its own, not through shape_fitness): a noise or shaping departure is named by its own rows and the step by its
own. A step that is not judged (es_ask hands no noise of a perturbed leaf) is a skip row saying so.

The failing steps are named over the epochs (_named_steps), by the simplest model that reproduces the port's steps
at every epoch within the step bound, on PICKS entries of each perturbed leaf (the run seed's stream; elementwise
optimizers, so a sample is enough, and no epoch keeps a tree): a constant gradient scale (the first step's words,
parity.tree.base.step_text: optax sgd, adam or adamw up to a gradient scale, knob `optimizer` or the scale); a scale
c d^e (`lr_decay` d, with the scale c named where it is not 1); sgd with momentum mu (nesterov or not) and weight
decay wd on c g (parity.core.momentum: torch.optim.SGD's convention, optax.sgd(momentum) after add_decayed_weights
the same; its bound is the step bound carried through the buffer's weights plus the buffer's float32 arithmetic;
3 epochs identify it, and epochs(cfg) >= momentum.MIN_EPOCHS); optax adam or adamw at the first step's scale with
its moments carried (within parity.core.optscale.MATCH, as the first step's match). Where none does, each epoch is
named alone: its first step's words, or a later step along the reference's at a factor (`lr_decay`), or not along
it (its cosine). One cause of several epochs is one line naming them ("epochs 1, 2"), the leaves merged as
parity.tree.base.merged_causes merges them.
"""
from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np

from parity.core import diagnose, momentum, optscale
from parity.core.tolerances import gamma, with_operands
from parity.tree import blocks as B
from parity.tree.base import (IN_PLACE, NumpyOptimizers, Row, fitness_text, fresh_params, leaf_step_bound,
                              noise_excess, pairing_text, ref_perturbs, ref_u, reference_magnitude, reference_update,
                              shaping_pair_bound, step_text, unchanged_cause, zero_step_row)
from parity.tree.dist import asked_rows, estimate, unperturbed_row
from parity.tree.numpy_reference import true_epoch

MAX_EPOCHS = 7
STREAM_SCORES, STREAM_PARAMS = 22, 23        # the run seed's numpy streams for the scores and the initial params
STREAM_PICKS = 24                            # ... and for the entries the optimizer fit over the epochs reads
PICKS = 512                                  # entries of each perturbed leaf that fit reads (all of a smaller leaf)
FIT_RTOL = 1e-4                              # a fitted scale or decay within this of 1 is 1
STEP_MARK = "the step of es_tell"            # a failing step row's cause, named over the epochs by _named_steps


def epochs(cfg) -> int:
    """Enough epochs for the noise to change generation twice: 2 noise_reuse + 1 (3 with reuse 0 or 1), at least
    the momentum fit's momentum.MIN_EPOCHS (3), at most MAX_EPOCHS."""
    return min(max(2 * max(cfg.noise_reuse, 1) + 1, momentum.MIN_EPOCHS), MAX_EPOCHS)


def generations(cfg):
    """The configuration whose epoch g draws generation g (noise_reuse 1): the reference's draws of any generation,
    which a port's es_ask noise is compared with to name `noise_reuse`."""
    return cfg.replace(noise_reuse=1)


def synthetic_scores(cfg, seed: int) -> list[np.ndarray]:
    """One fitness vector (pop,) float32 per epoch: normal * 2 plus a normal offset per group * 3."""
    rng = np.random.default_rng([seed, STREAM_SCORES])
    g = cfg.group_size or cfg.pop
    return [(rng.standard_normal(cfg.pop) * 2 + rng.standard_normal(cfg.pop // g).repeat(g) * 3).astype(np.float32)
            for _ in range(epochs(cfg))]


def drive(side, cfg, seed: int, params0: dict):
    """The port's own loop from params0, one epoch at a time: yields es_params right after es_init, then
    {epoch, noise, scores, before, after} per epoch. Lazy, so that only the epoch being judged holds its params
    (two copies of the tree, not one per epoch)."""
    port = side.port
    state = port.es_init(params0, seed)
    before = port.es_params(state)
    yield before
    for epoch, f in enumerate(synthetic_scores(cfg, seed)):
        noise = port.es_ask(state, epoch)
        state = port.es_tell(state, noise, f, epoch)
        after = port.es_params(state)
        yield {"epoch": epoch, "noise": noise, "scores": f, "before": before, "after": after}
        before = after


# ----------------------------------------------------------------------------- noise
def _fit_scale(port: np.ndarray, ref: np.ndarray) -> float | None:
    """c when port is ref times one factor c (least squares, then held to 1e-4 of it), else None."""
    p, r = port.ravel(), np.asarray(ref, np.float64).ravel()
    c = float(p @ r / max(float(r @ r), 1e-300))
    return c if np.allclose(p, c * r, rtol=1e-4, atol=1e-7 * float(np.abs(p).max() + 1e-300)) else None


def _asked_cause(R, cfg, seed: int, epoch: int, leaf, port: np.ndarray, block) -> str:
    """Why es_ask's noise of a leaf at epoch differs from the reference's draws there: another generation
    (`noise_reuse`), the same draws at another scale (`sigma_decay`), the pairing, or none of these; port is the
    perturbation in one block (parity.tree.blocks.head: every member; the whole leaf when it fits)."""
    gen = true_epoch(epoch, cfg.noise_reuse)
    for other in range(epochs(cfg) + 1):
        alt = R.dense_noise(generations(cfg), seed, other, leaf, block=block)
        if other != gen and np.allclose(port, alt, rtol=0, atol=1e-6 * max(1.0, float(np.abs(alt).max()))):
            return diagnose.cause("noise_reuse", f"es_ask's noise of {leaf.path} at epoch {epoch} is the reference's "
                                                 f"generation {other}; with noise_reuse {cfg.noise_reuse} the "
                                                 f"reference draws generation {gen}").text
    c = _fit_scale(port, R.dense_noise(cfg, seed, epoch, leaf, block=block))
    if c is not None and epoch > 0 and abs(c - 1) > 1e-3:
        return diagnose.sigma_schedule_cause(epoch, c, 1.0).text
    return pairing_text(leaf, port) or f"{leaf.path}: es_ask's noise at epoch {epoch} is not the reference's draws"


def _exact_noise_rows(R, cfg, seed: int, step: dict) -> list[Row]:
    """es_ask's noise of every leaf at one epoch against the reference's draws (jax_compatible_rng ports)."""
    e, noise, rows = step["epoch"], step["noise"], []
    for leaf in cfg.tree.leaves:
        value, q = noise.get(leaf.path), f"epoch {e}: es_ask noise, {leaf.path} ({leaf.cls})"
        if not ref_perturbs(cfg, leaf):
            rows.append(unperturbed_row(leaf, value, q)._replace(check="trajectory"))
            continue
        if value is None:
            rows.append(Row("trajectory", f"{q}: perturbed", 0.0, "perturbed as the reference", "fail",
                            f"{leaf.path}: the port's training loop (es_ask) does not perturb it; the reference "
                            f"perturbs {leaf.cls} leaves"))
            continue
        worst, done, every = noise_excess(R, cfg, seed, e, leaf, value,
                                          lambda blk: B.dense_block(leaf, value, blk, np.float64))
        why = ""
        if worst > 0:
            head = B.head(leaf, cfg.pop)
            why = _asked_cause(R, cfg, seed, e, leaf, B.dense_block(leaf, value, head, np.float64), head)
        rows.append(Row("trajectory", f"{q}: max (|port - ref| - bound)", worst,
                        "<= 0 (the reference's draws at true_epoch(e, noise_reuse); 2 gamma_r |A||B|^T)" +
                        B.skipped_words(done, every), "pass" if worst <= 0 else "fail", why))
    return rows


def _dist_noise_rows(cfg, step: dict, before: dict | None) -> list[Row]:
    """A port on its own generator: leaves the reference never perturbs unperturbed, and epochs e - 1 and e drawing
    alike exactly when the reference's generations are alike (same draws at another scale: `sigma_decay`)."""
    e, noise, rows = step["epoch"], step["noise"], []
    same_gen = e > 0 and true_epoch(e, cfg.noise_reuse) == true_epoch(e - 1, cfg.noise_reuse)
    for leaf in cfg.tree.leaves:
        value, q = noise.get(leaf.path), f"epoch {e}: es_ask noise, {leaf.path} ({leaf.cls})"
        if not ref_perturbs(cfg, leaf):
            rows.append(unperturbed_row(leaf, value, q)._replace(check="trajectory"))
        elif value is None:
            rows.append(Row("trajectory", f"{q}: perturbed", 0.0, "perturbed as the reference", "fail",
                            f"{leaf.path}: the port's training loop (es_ask) does not perturb it"))
        elif before is not None and before.get(leaf.path) is not None:
            rows.append(_reuse_row(cfg, leaf, e, before[leaf.path], value, same_gen))
    return rows


def _reuse_row(cfg, leaf, e: int, prev, cur, same_gen: bool) -> Row:
    """Epochs e - 1 and e's es_ask noise of a leaf (protocol values) drawn alike exactly when the reference's
    generations are alike (blocks.equal_dense: the perturbations bit for bit); a same-generation pair that differs by
    one factor, fitted on every member's first rows and slices (blocks.head), names `sigma_decay`."""
    same = B.equal_dense(leaf, cfg.pop, prev, cur)
    why = ""
    if same != same_gen:
        head = B.head(leaf, cfg.pop)
        c = _fit_scale(B.dense_block(leaf, cur, head, np.float64), B.dense_block(leaf, prev, head, np.float64)) \
            if same_gen else None
        why = diagnose.sigma_schedule_cause(e, c, 1.0, since=e - 1).text if c is not None else diagnose.cause(
            "noise_reuse", f"es_ask's noise of {leaf.path} at epochs {e - 1} and {e} is "
                           f"{'the same' if same else 'different'}; with noise_reuse {cfg.noise_reuse} the reference "
                           f"draws {'one generation' if same_gen else 'a fresh generation each'}").text
    return Row("trajectory", f"epoch {e}: es_ask noise, {leaf.path}: the same draws as epoch {e - 1}", float(same),
               f"== {int(same_gen)} (noise_reuse {cfg.noise_reuse})", "pass" if not why else "fail", why)


# ----------------------------------------------------------------------------- the step
class Sample(NamedTuple):
    """One epoch's step on the sampled entries (flat float64, the perturbed leaves' picks concatenated in tree
    order): what the optimizer fit over epochs reads (parity.core.momentum), two trees' worth never kept."""

    epoch: int
    before: np.ndarray
    after: np.ndarray
    grad: np.ndarray        # the reference's gradient g there (ascent, before sqrt(N))
    bound: np.ndarray       # the step's bound per entry (_step_rows: the gradient's and leaf_step_bound)
    first: str = ""         # the epoch's optimizer words on every entry (step_text) when its step fails


def picks(cfg, seed: int) -> dict[str, np.ndarray]:
    """Up to PICKS entries of each perturbed leaf (flat indices, sorted), from the run seed's own stream."""
    rng = np.random.default_rng([seed, STREAM_PICKS])
    out = {}
    for leaf in cfg.tree.leaves:
        if ref_perturbs(cfg, leaf):
            n = math.prod(leaf.shape)
            out[leaf.path] = np.sort(rng.choice(n, min(n, PICKS), replace=False))
    return out


def _shaping_row(R, side, cfg, step: dict) -> tuple[Row, np.ndarray]:
    """(row, the port's shaped fitness): the port's shape_fitness of the epoch's scores against the reference's (the
    fitness check's bound); a loop whose step differs because its shaping does is named by the shaping
    (base.fitness_text, which also probes the port's shape_fitness)."""
    f = step["scores"]
    port, ref = side.shape(f), R.shape(cfg, f)
    ratio = float(np.max(np.abs(port.astype(np.float64) - ref) / shaping_pair_bound(f, cfg.group_size)))
    return Row("trajectory", f"epoch {step['epoch']}: shaped fitness of the scores, max |port - ref| / bound", ratio,
               "<= 1 (both sides' float32 shaping bounds)", "pass" if ratio <= 1 else "fail",
               "" if ratio <= 1 else fitness_text(f, port, cfg.group_size, side.shape)), port


def _reference_step(R, cfg, seed: int, step: dict, exact: bool, shaped=None) -> tuple[dict, dict, dict, np.ndarray]:
    """(the reference's gradient per leaf, its new params, {path: (|noise| per member as a blocks.Magnitude, float32
    roundings)}, the shaped fitness it stepped on) for one epoch: its own draws (exact) or the port's es_ask noise,
    on the port's params before the step; on the reference's shaping of the scores, or `shaped` (the port's, where
    its shaping departs)."""
    shaped = R.shape(cfg, step["scores"]) if shaped is None else shaped
    perturbed = [leaf for leaf in cfg.tree.leaves if ref_perturbs(cfg, leaf)]
    rounds = {leaf.path: cfg.pop * cfg.rank + 3 if leaf.cls in ("mm", "tmm") else cfg.pop + 2 for leaf in perturbed}
    if exact:
        grads = R.grads(cfg, seed, step["epoch"], shaped)
        mags = {leaf.path: (reference_magnitude(R, cfg, seed, step["epoch"], leaf), rounds[leaf.path])
                for leaf in perturbed}
    else:
        value = step["noise"]
        grads = {leaf.path: (estimate(leaf, value[leaf.path], shaped).astype(np.float32) if leaf in perturbed
                             else np.zeros(leaf.shape, np.float32)) for leaf in cfg.tree.leaves}
        mags = {leaf.path: (B.magnitude_of(value[leaf.path]), rounds[leaf.path]) for leaf in perturbed}
    return grads, reference_update(R, cfg, step["before"], grads), mags, shaped


def _step_rows(R, cfg, seed: int, step: dict, exact: bool, shaped=None, pick=None) -> tuple[list[Row], Sample]:
    """es_params after es_tell, every leaf, against one reference step from the params before it (see the module
    docstring for the bound; on the port's noise where exact is False, on `shaped` where given), and the epoch's
    Sample at `pick`. A failing leaf's cause says STEP_MARK; _named_steps names it over the epochs."""
    grads, expected, mags, on_shaped = _reference_step(R, cfg, seed, step, exact, shaped)
    f = step["scores"]
    f_abs = np.abs(on_shaped).astype(np.float64)
    f_err = shaping_pair_bound(f, cfg.group_size)
    lr_step, e, rows, bounds = math.sqrt(cfg.pop) * cfg.lr, step["epoch"], [], {}
    on = ("" if exact else "; on the port's es_ask noise") + ("" if shaped is None else "; on the port's shaping")
    for leaf in cfg.tree.leaves:
        p, before, after = leaf.path, step["before"][leaf.path], step["after"][leaf.path]
        if p not in mags:
            moved = B.flat_max(lambda a, b: np.abs(a.astype(np.float64) - b), after, before)
            rows.append(Row("trajectory", f"epoch {e}: {p} ({leaf.cls}): max |new - old|", moved, "== 0 (not updated)",
                            "pass" if moved == 0 else "fail",
                            "" if moved == 0 else unchanged_cause(cfg, leaf, "updated")))
            continue
        mag, n_round = mags[p]
        # both sides' einsum bounds, the reference's with TF32 operands where it has them and drew the noise itself
        # (the gradients check's rule); on the port's noise the reference's estimate is numpy float64
        g, u = gamma(n_round), ref_u(R) if exact and leaf.cls in ("mm", "tmm") else 0.0
        g_bound = B.mean_abs(leaf, mag, (g + with_operands(g, 2, u)) * f_abs + f_err)
        bound = lr_step * g_bound + leaf_step_bound(cfg, leaf, before, expected[p], grads[p], mag, (f_abs + f_err) *
                                                    (1 + 2 * gamma(cfg.rank)))
        ratio = B.flat_max(lambda a, x, b: np.abs(a.astype(np.float64) - x) / np.maximum(b, 1e-30), after,
                           expected[p], bound)
        if pick is not None:
            bounds[p] = np.ravel(bound)[pick[p]]
        rows.append(Row("trajectory", f"epoch {e}: {p} ({leaf.cls}) params after es_tell, max |port - ref| / bound",
                        ratio, f"<= 1 (lr sqrt(N) x the gradient's bound + step_bound: added once or in N adds{on})",
                        "pass" if ratio <= 1 else "fail",
                        "" if ratio <= 1 else f"{p}: {STEP_MARK} differs from optax.sgd(lr)"))
    sample = None
    if pick is not None:
        flat = lambda t: np.concatenate([np.ravel(t[p])[pick[p]].astype(np.float64) for p in pick])   # noqa: E731
        failed = [r for r in rows if STEP_MARK in r.cause]
        first = ""
        if failed:
            paths = list(mags)
            sub = lambda t: {p: np.asarray(t[p]) for p in paths}         # noqa: E731
            first = step_text(cfg, sub(step["before"]), sub(grads), sub(step["after"]),
                              f"{max(r.value for r in failed):.3g} x bound")
        sample = Sample(e, flat(step["before"]), flat(step["after"]), flat(grads),
                        np.concatenate([bounds[p] for p in pick]), first)
    return rows, sample


# ----------------------------------------------------------------------------- the step over the epochs
def _epochs_words(es) -> str:
    es = sorted(es)
    return f"epoch {es[0]}" if len(es) == 1 else f"epochs {', '.join(map(str, es))}"


def _scale_words(cfg, c: float) -> str:
    """'' at c = 1 (within FIT_RTOL), else ' on a gradient <name or value> times the reference's'."""
    if abs(c - 1) <= FIT_RTOL:
        return ""
    names = optscale.scale_names(c, c * (1 - FIT_RTOL), c * (1 + FIT_RTOL), cfg.sigma, cfg.pop, cfg.rank)
    return f" on a gradient {names[0] if names else f'{c:.6g}'} times the reference's" + \
        (f" (fitted c = {c:.6g})" if names else "")


class Chain(NamedTuple):
    """Every epoch's Sample from epoch 0 on, stacked (E, K) float64: the port's steps, the reference's sgd steps
    lr sqrt(N) g, the params before each step and the step bounds."""

    steps: np.ndarray
    unit: np.ndarray
    params: np.ndarray
    bounds: np.ndarray


def _chain(cfg, samples: list) -> Chain | None:
    if not samples or any(s is None or s.epoch != e for e, s in enumerate(samples)):
        return None
    lr_step = math.sqrt(cfg.pop) * cfg.lr
    return Chain(np.stack([s.after - s.before for s in samples]), np.stack([lr_step * s.grad for s in samples]),
                 np.stack([s.before for s in samples]), np.maximum(np.stack([s.bound for s in samples]), 1e-300))


def _per_epoch_scales(ch: Chain) -> np.ndarray:
    """c_e: each epoch's step against the reference's sgd step, weighted least squares (weight 1/b)."""
    w = ch.unit / ch.bounds
    return np.sum(ch.steps / ch.bounds * w, 1) / np.maximum(np.sum(w * w, 1), 1e-300)


def _scaled_ratio(ch: Chain, c: np.ndarray) -> float:
    """max |port step - c_e s_e| / (max(|c_e|, 1) b_e): the sgd step at scale c_e per epoch against the port's (the
    bound's gradient part scales with c_e, its rounding of the params does not)."""
    c = np.asarray(c, np.float64).reshape(-1, 1)
    return float(np.max(np.abs(ch.steps - c * ch.unit) / (np.maximum(np.abs(c), 1) * ch.bounds)))


def _adam_along(cfg, samples: list, ch: Chain) -> bool:
    """Whether optax adam or adamw at epoch 0's fitted gradient scale (parity.core.optscale), its moments carried
    from epoch to epoch, reproduces the port's step at every epoch within optscale.MATCH of its largest entry."""
    from parity.core.optimizers import optimizer_apply, optimizer_init
    s0 = samples[0]
    one = lambda x: {"x": x.astype(np.float32)}                # noqa: E731
    fits = optscale.candidates(NumpyOptimizers(cfg.lr), ("adam", "adamw"), one(s0.before), one(s0.grad),
                               one(s0.after), cfg.pop, cfg.lr, cfg.sigma)
    best = optscale.best_match(fits, optscale.MATCH)
    if best is None:
        return False
    state = optimizer_init(best.optimizer, one(s0.before))
    for s in samples:
        new, state = optimizer_apply(one(s.before), state, optscale.scaled(one(s.grad), best.c), cfg.pop, cfg.lr)
        step = new["x"].astype(np.float64) - s.before
        if np.max(np.abs(s.after - s.before - step)) > optscale.MATCH * max(float(np.max(np.abs(step))), 1e-30):
            return False
    return True


def _trajectory_cause(cfg, samples: list) -> str | None:
    """One cause for the port's steps over every epoch, the simplest that reproduces them within their bound: a
    constant gradient scale (the first step's optimizer words, parity.core.optscale), a scale decaying by one factor
    per epoch (`lr_decay`), sgd with momentum (nesterov or not) and weight decay (parity.core.momentum), or optax adam
    or adamw with its moments carried; None when none does (or the epochs are too few or not all sampled)."""
    ch = _chain(cfg, samples)
    if ch is None or len(samples) < momentum.MIN_EPOCHS:
        return None
    E, K = ch.steps.shape
    c_e = _per_epoch_scales(ch)
    w = ch.unit / ch.bounds
    c = float(np.sum(ch.steps / ch.bounds * w) / max(float(np.sum(w * w)), 1e-300))
    constant = _scaled_ratio(ch, np.full(E, c))
    if constant <= 1:
        return samples[0].first or None
    if np.all(c_e > 0):
        slope, log_c = np.polyfit(np.arange(E), np.log(c_e), 1)
        d, c0 = math.exp(slope), math.exp(log_c)
        if abs(d - 1) > FIT_RTOL and _scaled_ratio(ch, c0 * d ** np.arange(E)) <= 1:
            if abs(c0 - 1) <= FIT_RTOL:
                return diagnose.lr_schedule_cause({e: float(c_e[e]) for e in range(1, E)}, 1.0).text
            shown = ", ".join(f"epoch {e}: {c_e[e]:.6f}" for e in range(E))
            return diagnose.cause("lr_decay", f"the port's update size relative to the reference's is {shown}: "
                                              f"a per-epoch factor of {d:.6g} (lr_decay={d:.4g}), the reference "
                                              f"uses 1,{_scale_words(cfg, c0)}").text
    best, _ = momentum.simplest(ch.steps, ch.unit, ch.params, ch.bounds, cfg.lr)
    if best is not None:
        scale = _scale_words(cfg, best.c) or " on the reference's gradient"
        return diagnose.cause("optimizer", f"the port's steps over epochs 0 to {E - 1} are {momentum.words(best)}"
                                           f"{scale} (torch.optim.SGD's convention; optax.sgd(momentum, "
                                           f"nesterov) after add_decayed_weights is the same), where the "
                                           f"reference uses plain sgd: reproduced within {best.ratio:.3g} of the "
                                           f"step bound at {K} sampled entries, where the best constant gradient "
                                           f"scale ({c:.6g}) is {constant:.3g}x it").text
    if samples[0].first and _adam_along(cfg, samples, ch):
        return f"{samples[0].first}; at every epoch, its moments carried"
    return None


def _epoch_cause(cfg, s: Sample) -> str:
    """One epoch's step on its own: epoch 0's optimizer words (step_text); later, a leaf's step clipped at a norm
    (step_text's per-leaf words: clipping keeps no state, so any epoch shows it), or a step along the reference's at
    another size names `lr_decay` (its factor), else that it is not along the reference's step."""
    if s.first and (s.epoch == 0 or "clipped at norm" in s.first):
        return s.first
    port, ref = s.after - s.before, math.sqrt(cfg.pop) * cfg.lr * s.grad
    c = float(port @ ref) / max(float(ref @ ref), 1e-300)
    cosine = float(port @ ref) / max(float(np.linalg.norm(port) * np.linalg.norm(ref)), 1e-300)
    if c <= 0 or cosine < 1 - 1e-6:       # the steps' float32 roundings leave a parallel step within 1e-8 of 1
        return f"the step at epoch {s.epoch} is not along the reference's sgd step (cosine {cosine:.6g})"
    if abs(c - 1) <= FIT_RTOL:            # the reference's step at its own size, yet beyond the bound: no schedule
        return (f"the step at epoch {s.epoch} is the reference's sgd step at factor {c:.8f}, yet beyond the bound: "
                f"its rounding exceeds even the per-member summation bound (N adds into the weights)")
    return diagnose.lr_schedule_cause({s.epoch: c}, 1.0).text


def _named_steps(cfg, rows: list[Row], samples: list, drift: str = "") -> list[Row]:
    """Each failing step row's cause: `drift` (the zero-fitness row's in-place cause) where es_tell drifts the
    weights, else the one cause of every epoch's steps (_trajectory_cause) where one reproduces them, else each
    epoch's own (_epoch_cause); one cause of several epochs says them ('epochs 1, 2')."""
    failing = sorted({int(r.quantity.split(":")[0].split()[1]) for r in rows if STEP_MARK in r.cause})
    if not failing:
        return rows
    whole = drift or _trajectory_cause(cfg, samples)
    by_epoch = {s.epoch: s for s in samples if s is not None}
    why = {e: whole or (_epoch_cause(cfg, by_epoch[e]) if e in by_epoch else "") for e in failing}
    epochs_of = {w: [e for e in failing if why[e] == w] for w in why.values()}
    out = []
    for r in rows:
        if STEP_MARK in r.cause:
            e = int(r.quantity.split(":")[0].split()[1])
            r = r._replace(cause=f"{r.cause.split(':')[0]}: the step of es_tell at {_epochs_words(epochs_of[why[e]])} "
                                 f"differs from optax.sgd(lr)" + (f"; {why[e]}" if why[e] else ""))
        out.append(r)
    return out


# ----------------------------------------------------------------------------- the check
def zero_fitness_row(side, cfg, seed: int, params0: dict) -> Row:
    """es_tell at epoch 0 on zero scores from a fresh es_init(params0): the port's shaping of zeros is zero (else
    the row is skipped), so its step is exactly zero in any order of summation and es_params must be params0 bit for
    bit (base.zero_step_row names rounding-sized moves as an in-place perturb and restore)."""
    from parity.core.port import NonFinite
    zeros = np.zeros(cfg.pop, np.float32)
    try:
        shaped = side.shape(zeros)
    except NonFinite:                 # a shaping without an epsilon: 0 / 0 (the fitness check names it)
        shaped = None
    if shaped is None or np.any(shaped != 0):
        return Row("trajectory", "es_tell: a step on zero fitness (g = 0), entries moved", float("nan"), "== 0",
                   "skip", "the port's shape_fitness of zero scores is not zero, so its step there need not be")
    port, before = side.port, {p: np.array(v) for p, v in params0.items()}
    state = port.es_init(params0, seed)
    noise = port.es_ask(state, 0)
    after = port.es_params(port.es_tell(state, noise, zeros, 0))
    mags = {p: B.magnitude_of(v) for p, v in noise.items()}
    return zero_step_row(cfg, "trajectory", "es_tell", before, after, mags)


def _fails(rows: list[Row]) -> int:
    return sum(r.verdict == "fail" for r in rows)


def _missing(cfg, step: dict) -> list[str]:
    return [leaf.path for leaf in cfg.tree.leaves if ref_perturbs(cfg, leaf) and step["noise"].get(leaf.path) is None]


def check(R, side, cfg, seed: int, exact: bool) -> list[Row]:
    """Every epoch of the port's own loop on synthetic fitness, each judged on its own (the module docstring), and
    one more es_tell on zero fitness (zero_fitness_row), whose in-place cause names the epochs' failing steps."""
    params0 = fresh_params(R, cfg, seed, np.random.default_rng([seed, STREAM_PARAMS]))
    zero = zero_fitness_row(side, cfg, seed, params0)
    run = drive(side, cfg, seed, params0)
    start = next(run)
    moved = max(float(np.max(np.abs(start[p].astype(np.float64) - params0[p]))) for p in params0)
    rows = [Row("trajectory", "es_init: max |es_params - the params given|", moved, "== 0 (es_init keeps them)",
                "pass" if moved == 0 else "fail", "" if moved == 0 else "es_init changes the params it is given"),
            zero]
    del start, params0
    previous, asked, samples, pick = None, [], [], picks(cfg, seed)
    for step in run:             # every epoch judged from the port's own params before it
        asked.append(step["noise"])
        got = _exact_noise_rows(R, cfg, seed, step) if exact else _dist_noise_rows(cfg, step, previous)
        shaping, port_shaped = _shaping_row(R, side, cfg, step)
        got.append(shaping)
        missing = _missing(cfg, step)
        if missing:
            got.append(Row("trajectory", f"epoch {step['epoch']}: the step", float("nan"), "-", "skip",
                           f"not judged: es_ask hands no noise of {', '.join(missing)}"))
            samples.append(None)
        else:
            own_noise = not exact or any(r.verdict == "fail" for r in got if "es_ask noise" in r.quantity)
            step_rows, sample = _step_rows(R, cfg, seed, step, not own_noise,
                                           None if shaping.verdict == "pass" else port_shaped, pick)
            if shaping.verdict == "fail" and _fails(step_rows):
                # es_tell may shape on its own, not through shape_fitness: the step on the reference's shaping is
                # kept where it fits better (the shaping's departure is its own row either way)
                alt = _step_rows(R, cfg, seed, step, not own_noise, None, pick)
                step_rows, sample = alt if _fails(alt[0]) < _fails(step_rows) else (step_rows, sample)
            got += step_rows
            samples.append(sample)
        rows += got
        previous = step["noise"]
        del step
    rows = _named_steps(cfg, rows, samples, zero.cause if IN_PLACE in zero.cause else "")
    if not exact:
        rows += asked_rows(cfg, asked)
    return rows


def reference_draws(cfg) -> list[tuple[object, int]]:
    """(configuration, epoch) of every draw this check may ask the reference for: its epochs, and every generation
    up to one past them (naming noise_reuse). What a recorded bundle must hold (parity.tree.vectors)."""
    return [(cfg, e) for e in range(epochs(cfg))] + [(generations(cfg), g) for g in range(epochs(cfg) + 1)]
