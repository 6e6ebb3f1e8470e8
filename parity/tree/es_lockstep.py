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
  within lr sqrt(N) times the gradient's bound (both sides' einsum bounds, 2 gamma_n |f| |noise| averaged, plus the
  shaping error shaping_pair_bound times |noise|) plus both sides' update_bound. Named at the first epoch by
  parity.tree.check.step_text (optax sgd, adam or adamw up to a gradient scale: knob `optimizer`, or the scale);
  later, a step along the reference's at a steady factor per epoch names `lr_decay`.
- untouched leaves (those the reference never perturbs: embedding, excluded, frozen params): given back bit for bit.
The first epoch with a failing row ends the check: what follows from it is not judged.
"""
from __future__ import annotations

import math

import numpy as np

from parity.core import diagnose
from parity.core.tolerances import gamma, update_bound
from parity.tree import blocks as B
from parity.tree.base import (Row, fitness_text, fresh_params, noise_excess, pairing_text, ref_perturbs,
                              reference_magnitude, reference_update, shaping_pair_bound, step_text,
                              unchanged_cause)
from parity.tree.dist import asked_rows, estimate, unperturbed_row
from parity.tree.numpy_reference import true_epoch

MAX_EPOCHS = 7
STREAM_SCORES, STREAM_PARAMS = 22, 23        # the run seed's numpy streams for the scores and the initial params


def epochs(cfg) -> int:
    """Enough epochs for the noise to change generation twice: 2 noise_reuse + 1 (3 with reuse 0 or 1), at most
    MAX_EPOCHS."""
    return min(2 * max(cfg.noise_reuse, 1) + 1, MAX_EPOCHS)


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
def _shaping_row(R, side, cfg, step: dict) -> Row:
    """The port's shape_fitness of the epoch's scores against the reference's (the fitness check's bound): a loop
    whose step differs because its shaping does is named by the shaping (tree_check.fitness_text)."""
    f = step["scores"]
    port, ref = side.shape(f), R.shape(cfg, f)
    ratio = float(np.max(np.abs(port.astype(np.float64) - ref) / shaping_pair_bound(f, cfg.group_size)))
    return Row("trajectory", f"epoch {step['epoch']}: shaped fitness of the scores, max |port - ref| / bound", ratio,
               "<= 1 (both sides' float32 shaping bounds)", "pass" if ratio <= 1 else "fail",
               "" if ratio <= 1 else fitness_text(f, port, cfg.group_size))


def _reference_step(R, cfg, seed: int, step: dict, exact: bool) -> tuple[dict, dict, dict]:
    """(the reference's gradient per leaf, its new params, {path: (|noise| per member as a blocks.Magnitude, float32
    roundings)}) for one epoch: its own draws (exact) or the port's es_ask noise, on the port's params before the
    step."""
    shaped = R.shape(cfg, step["scores"])
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
    return grads, reference_update(R, cfg, step["before"], grads), mags


def _step_rows(R, cfg, seed: int, step: dict, exact: bool) -> list[Row]:
    """es_params after es_tell, every leaf, against one reference step from the params before it (see the module
    docstring for the bound); the first failing leaf's cause names the optimizer, a scale or lr_decay."""
    grads, expected, mags = _reference_step(R, cfg, seed, step, exact)
    f = step["scores"]
    f_abs, f_err = np.abs(R.shape(cfg, f)).astype(np.float64), shaping_pair_bound(f, cfg.group_size)
    lr_step, e, rows = math.sqrt(cfg.pop) * cfg.lr, step["epoch"], []
    for leaf in cfg.tree.leaves:
        p, before, after = leaf.path, step["before"][leaf.path], step["after"][leaf.path]
        if p not in mags:
            moved = B.flat_max(lambda a, b: np.abs(a.astype(np.float64) - b), after, before)
            rows.append(Row("trajectory", f"epoch {e}: {p} ({leaf.cls}): max |new - old|", moved, "== 0 (not updated)",
                            "pass" if moved == 0 else "fail",
                            "" if moved == 0 else unchanged_cause(cfg, leaf, "updated")))
            continue
        mag, n_round = mags[p]
        g_bound = B.mean_abs(leaf, mag, 2 * gamma(n_round) * f_abs + f_err)
        ratio = B.flat_max(lambda a, x, g, gb: np.abs(a.astype(np.float64) - x) / np.maximum(
            lr_step * gb + 2 * update_bound(x, lr_step * g.astype(np.float64)), 1e-30), after, expected[p], grads[p],
            g_bound)
        rows.append(Row("trajectory", f"epoch {e}: {p} ({leaf.cls}) params after es_tell, max |port - ref| / bound",
                        ratio, "<= 1 (lr sqrt(N) x the gradient's bound + update_bound, both sides)",
                        "pass" if ratio <= 1 else "fail",
                        "" if ratio <= 1 else f"{p}: the step of es_tell at epoch {e} differs from optax.sgd(lr)"))
    failed = [r for r in rows if r.verdict == "fail" and "the step of es_tell" in r.cause]
    if failed:
        why = _step_cause(cfg, step, grads, expected, list(mags), f"{failed[0].value:.3g} x bound")
        rows = [r._replace(cause=f"{r.cause}; {why}") if r in failed else r for r in rows]
    return rows


def _step_cause(cfg, step: dict, grads: dict, expected: dict, paths: list[str], worst: str) -> str:
    """At the first epoch: which optimizer and gradient scale reproduce the step (tree_check.step_text); later: a
    step along the reference's at another size names `lr_decay` (its factor per epoch), else the step differs."""
    pick = lambda t: {p: np.asarray(t[p]) for p in paths}         # noqa: E731
    if step["epoch"] == 0:
        return step_text(cfg, pick(step["before"]), pick(grads), pick(step["after"]), worst)
    port = np.concatenate([(step["after"][p].astype(np.float64) - step["before"][p]).ravel() for p in paths])
    ref = np.concatenate([(expected[p].astype(np.float64) - step["before"][p]).ravel() for p in paths])
    c = float(port @ ref) / max(float(ref @ ref), 1e-300)
    cosine = float(port @ ref) / max(float(np.linalg.norm(port) * np.linalg.norm(ref)), 1e-300)
    if c <= 0 or cosine < 1 - 1e-6:       # the steps' float32 roundings leave a parallel step within 1e-8 of 1
        return (f"the step at epoch {step['epoch']} is not along the reference's sgd step (cosine {cosine:.6g}; "
                f"{worst})")
    return diagnose.lr_schedule_cause({step["epoch"]: c}, 1.0).text


# ----------------------------------------------------------------------------- the check
def check(R, side, cfg, seed: int, exact: bool) -> list[Row]:
    """Every epoch of the port's own loop on synthetic fitness, judged in turn (the module docstring)."""
    params0 = fresh_params(R, cfg, seed, np.random.default_rng([seed, STREAM_PARAMS]))
    run = drive(side, cfg, seed, params0)
    start = next(run)
    moved = max(float(np.max(np.abs(start[p].astype(np.float64) - params0[p]))) for p in params0)
    rows = [Row("trajectory", "es_init: max |es_params - the params given|", moved, "== 0 (es_init keeps them)",
                "pass" if moved == 0 else "fail", "" if moved == 0 else "es_init changes the params it is given")]
    del start, params0
    previous, asked, failed = None, [], False
    for step in run:             # every epoch is driven (the port's calls as without a failure); judged until one fails
        asked.append(step["noise"])
        if not failed:
            got = _exact_noise_rows(R, cfg, seed, step) if exact else _dist_noise_rows(cfg, step, previous)
            if not any(r.verdict == "fail" for r in got):
                got.append(_shaping_row(R, side, cfg, step))
            if not any(r.verdict == "fail" for r in got):
                got += _step_rows(R, cfg, seed, step, exact)
            rows += got
            failed = any(r.verdict == "fail" for r in rows)
        previous = step["noise"]
        del step
    if not exact:
        rows += asked_rows(cfg, asked)
    return rows


def reference_draws(cfg) -> list[tuple[object, int]]:
    """(configuration, epoch) of every draw this check may ask the reference for: its epochs, and every generation
    up to one past them (naming noise_reuse). What a recorded bundle must hold (parity.tree.vectors)."""
    return [(cfg, e) for e in range(epochs(cfg))] + [(generations(cfg), g) for g in range(epochs(cfg) + 1)]
