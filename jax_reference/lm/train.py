"""Train the byte-level LM (spec/lm.py) with the reference EggRoll, nanoGPT style: init, then epochs of score -> update.

Keys: model_key, es_key, _ = split(key(seed), 3) (jax_reference.lm.model.init_lm, es_keys). Data: rollout.corpus's
windows at (seed, epoch). What a run returns and prints: spec/lm_run.py.
"""
from __future__ import annotations

import math
import sys
import time
from functools import lru_cache
from typing import TextIO

import jax
import jax.numpy as jnp
import numpy as np
import optax

from jax_reference.lm.model import es_keys, init_lm, population_scores, val_bits_per_byte
from jax_reference.noiser import EggRoll
from jax_reference.population import population_iterinfos
from rollout.corpus import check_corpus_fits, load_corpus, member_tokens, train_windows, val_windows
from spec.lm import LMConfig
from spec.lm_run import LMProgress, LMTrainResult, lm_epoch_row

SOLVERS = {"sgd": optax.sgd, "adam": optax.adam, "adamw": optax.adamw}


def make_update(noiser, frozen_noiser_params, es_map, pop: int):
    """Jitted (noiser_params, params, es_tree_key, scores (pop,), epoch) -> (noiser_params, params): one ES step.

    The scores are the members' log2-likelihoods per byte (higher is better), shaped by convert_fitnesses
    (group means, global variance) and handed to do_updates, which scans the stacked leaves slice by slice.
    """
    @jax.jit
    def update(noiser_params, params, es_tree_key, scores, epoch):
        fitnesses = noiser.convert_fitnesses(frozen_noiser_params, noiser_params, scores)
        return noiser.do_updates(frozen_noiser_params, noiser_params, params, es_tree_key, fitnesses,
                                 population_iterinfos(epoch, pop), es_map)
    return update


@lru_cache(maxsize=8)
def compiled_update(noiser, cfg: LMConfig):
    """make_update for cfg's model and noiser settings, built once: runs with other seeds (or epochs) reuse the
    compiled step. Call with cfg.replace(epochs=1, eval_every=1) so that the run length does not split the cache."""
    template = init_lm(cfg, 0)
    frozen_noiser_params, _ = noiser.init_noiser(
        template.params, cfg.sigma, cfg.lr, solver=SOLVERS[cfg.optimizer], group_size=cfg.group_size,
        freeze_nonlora=cfg.freeze_nonlora, noise_reuse=cfg.noise_reuse, rank=cfg.rank)
    return make_update(noiser, frozen_noiser_params, template.es_map, cfg.pop)


def train_lm(cfg: LMConfig, seed: int, corpus=None, progress: bool = True, stream: TextIO | None = None,
             noiser=EggRoll) -> LMTrainResult:
    """Train cfg.epochs epochs from seed; validation bits/byte every cfg.eval_every epochs and after the last."""
    corpus = load_corpus() if corpus is None else corpus
    check_corpus_fits(corpus, cfg.seq_len)
    show = LMProgress(stream or sys.stdout, cfg.epochs, progress)

    # the model, its ES keys and the noiser (upstream's LLM settings: freeze_nonlora, group_size, fresh noise)
    init = init_lm(cfg, seed)
    params = init.params
    es_tree_key = es_keys(params, init.scan_map, seed)
    frozen_noiser_params, noiser_params = noiser.init_noiser(
        params, cfg.sigma, cfg.lr, solver=SOLVERS[cfg.optimizer], group_size=cfg.group_size,
        freeze_nonlora=cfg.freeze_nonlora, noise_reuse=cfg.noise_reuse, rank=cfg.rank)
    update = compiled_update(noiser, cfg.replace(epochs=1, eval_every=1))   # the same step, jitted once per settings
    val = jnp.asarray(val_windows(corpus, cfg.val_windows, cfg.seq_len))

    history, val_bpb, start = [], math.nan, time.perf_counter()
    for epoch in range(cfg.epochs):
        windows = train_windows(corpus, seed, epoch, cfg.n_streams, cfg.seq_len)       # (n_streams, T + 1)
        tokens = member_tokens(windows, cfg.pop, cfg.group_size)                         # (pop, T + 1)
        step_start = time.perf_counter()
        scores = population_scores(noiser, frozen_noiser_params, noiser_params, params, es_tree_key, epoch, tokens)
        noiser_params, params = update(noiser_params, params, es_tree_key, scores, jnp.int32(epoch))
        jax.block_until_ready(params)
        step_s = time.perf_counter() - step_start
        train_bpb = -float(np.mean(np.asarray(scores)))
        measured = (epoch + 1) % cfg.eval_every == 0 or epoch == cfg.epochs - 1
        val_bpb_e = val_bits_per_byte(params, val) if measured else math.nan
        val_bpb = val_bpb_e if measured else val_bpb
        row = lm_epoch_row(epoch, train_bpb, val_bpb_e, (epoch + 1) * cfg.pop * cfg.seq_len,
                           time.perf_counter() - start, step_tokens=cfg.pop * cfg.seq_len, step_s=step_s)
        history.append(row)
        show.epoch(row)

    result = LMTrainResult(cfg.epochs, val_bpb, cfg.epochs * cfg.pop * cfg.seq_len, time.perf_counter() - start,
                           tuple(history), params)
    show.done(result)
    return result
