"""Train nano-egg's integer LM (spec/int8.py) with the JAX reference, nanoGPT style: init, then epochs of
score -> vote -> (validate) -> log.

Epoch e: the threshold thr_e goes into noiser_params (nano-egg sets update_threshold per epoch), the population
scores its T + 1 bytes from the states the last epoch left (`rollout.int8_data`), the pairs' signs vote every
leaf, and the validation rows are scored with noise off when (e + 1) % validate_every == 0 or e is the last
epoch. History rows are spec.lm_run.lm_epoch_row's, plus the integer run's own readings:
    score_sum     the population's summed scores (1/16 bit)
    fitness_pos   pairs with f = +1; fitness_zero: pairs with f = 0
    changed       fraction of all parameter entries the vote moved (nano-egg logs it per class: see below)
    changed_lowrank, changed_fullrank   mean over mm leaves / over param leaves of the fraction moved (as
                  nano-egg's lora_differences / nonlora_differences; the embedding is in neither)
    threshold     thr_e
"""
from __future__ import annotations

import math
import sys
import time
from typing import Callable, TextIO

import jax
import jax.numpy as jnp
import numpy as np

from jax_reference.int8.model import (EGG, MM_PARAM, PARAM, QEggRoll, init_int8, population_scores, update,
                                validation_scores)
from rollout.corpus import load_corpus
from rollout.int8_data import (epoch_tokens, int8_streams, segment_offset, stream_layout, train_rows,
                               validation_rows)
from spec.int8 import Int8Config, bits_per_byte, thresholds
from spec.lm_run import LMProgress, LMTrainResult, lm_epoch_row


def changed_fractions(old, new, es_map) -> dict:
    """Fraction of entries moved: overall, and nano-egg's per-class means (mm leaves; param leaves)."""
    olds, news, classes = jax.tree.leaves(old), jax.tree.leaves(new), jax.tree.leaves(es_map)
    fracs = [float(np.mean(np.asarray(a) != np.asarray(b))) for a, b in zip(olds, news)]
    moved = sum(int(np.sum(np.asarray(a) != np.asarray(b))) for a, b in zip(olds, news))
    total = sum(int(np.asarray(a).size) for a in olds)
    mean = lambda cls: float(np.mean([f for f, c in zip(fracs, classes) if c == cls]))
    return {"changed": moved / total, "changed_lowrank": mean(MM_PARAM), "changed_fullrank": mean(PARAM)}


def train_int8(cfg: Int8Config, seed: int, corpus=None, progress: bool = True, stream: TextIO | None = None,
               observe: Callable | None = None, validate: bool = True) -> LMTrainResult:
    """Train cfg.epochs epochs from seed on the corpus (default: the shipped one); LMTrainResult with int8 params.

    observe(epoch, scores (pop,) int32, params after the update), if given, sees every epoch (lockstep checks);
    validate=False scores no validation rows (val bits/byte NaN): a lockstep check that reads only scores and params."""
    corpus = load_corpus() if corpus is None else corpus
    train_stream, val_stream = int8_streams(corpus)
    layout = stream_layout(len(train_stream), cfg)             # ValueError: the corpus is too short
    rows = train_rows(train_stream, layout.n_sequences, layout.segments, cfg.tokens_per_update)
    val = validation_rows(val_stream, cfg.val_rows)
    val_tokens = val.shape[0] * (val.shape[1] - 1)
    show = LMProgress(stream or sys.stdout, cfg.epochs, progress)

    init = init_int8(cfg, seed)
    params, es_map, es_tree_key = init.params, init.es_map, init.es_tree_key
    thr = thresholds(cfg)
    frozen, noiser_params = QEggRoll.init_noiser(params, cfg.sigma_shift, thr[0], noise_seed=seed,
                                                 noise_reuse=cfg.noise_reuse, rank=cfg.rank, use_clt=cfg.use_clt,
                                                 fast_fitness=cfg.fast_fitness)
    states = jnp.zeros((cfg.pop,) + EGG.default_state(params).shape, jnp.int8)

    history, val_bpb, start = [], math.nan, time.perf_counter()
    step_tokens = cfg.pop * cfg.tokens_per_update
    for epoch in range(cfg.epochs):
        noiser_params = dict(noiser_params, update_threshold=jnp.int32(thr[epoch]))
        tokens = epoch_tokens(rows, segment_offset(epoch, layout, cfg.tokens_per_update), cfg.tokens_per_update,
                              cfg.pop, cfg.group_size)
        step_start = time.perf_counter()
        scores, states = population_scores(frozen, noiser_params, params, es_tree_key, es_map, epoch, tokens,
                                           states)
        new_params = update(frozen, noiser_params, params, es_tree_key, es_map, scores, epoch)
        jax.block_until_ready(new_params)
        step_s = time.perf_counter() - step_start
        scores = np.asarray(scores)
        moved = changed_fractions(params, new_params, es_map)
        params = new_params
        if observe is not None:
            observe(epoch, scores, params)
        measured = validate and ((epoch + 1) % cfg.validate_every == 0 or epoch == cfg.epochs - 1)
        val_e = bits_per_byte(int(validation_scores(params, val).astype(np.int64).sum()), val_tokens) \
            if measured else math.nan
        val_bpb = val_e if measured else val_bpb
        row = lm_epoch_row(epoch, bits_per_byte(int(scores.astype(np.int64).sum()), scores.size
                                                * cfg.tokens_per_update), val_e, (epoch + 1) * step_tokens,
                           time.perf_counter() - start, step_tokens=step_tokens, step_s=step_s)
        pairs = np.sign(scores[0::2].astype(np.int64) - scores[1::2])
        row.update(score_sum=int(scores.astype(np.int64).sum()), fitness_pos=int(np.sum(pairs > 0)),
                   fitness_zero=int(np.sum(pairs == 0)), threshold=int(thr[epoch]), **moved)
        history.append(row)
        show.epoch(row)

    result = LMTrainResult(cfg.epochs, val_bpb, cfg.epochs * step_tokens, time.perf_counter() - start,
                           tuple(history), params)
    show.done(result)
    return result
