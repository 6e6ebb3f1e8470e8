"""Train nano-egg's integer LM (spec/int8.py) with the torch int8 port: epochs of ask -> score -> tell -> (validate).

The same loop, data and history rows as jax_reference.int8.train (which documents the integer run's own fields:
score_sum, fitness_pos, fitness_zero, changed, changed_lowrank, changed_fullrank, threshold); the numbers are
equal to the JAX reference's, epoch by epoch (tests/torch_impl/test_int8.py).
"""
from __future__ import annotations

import math
import sys
import time
from typing import Callable, TextIO

import numpy as np
import torch

from rollout.corpus import load_corpus
from rollout.int8_data import (epoch_tokens, int8_streams, segment_offset, stream_layout, train_rows,
                               validation_rows)
from spec.int8 import Int8Config, bits_per_byte
from spec.int8_knobs import NANO_EGG, Int8Knobs
from spec.lm_run import LMProgress, LMTrainResult, lm_epoch_row
from spec.tree import Tree
from torch_impl import cuda_graphs
from torch_impl.int8 import es as int8_es
from torch_impl.int8.model import default_state, scores as model_scores
from torch_impl.int8.noise import member_view
from torch_impl.train import intra_op_threads


def changed_fractions(tree: Tree, old: dict, new: dict) -> dict:
    """Fraction of entries moved: overall, and nano-egg's per-class means (mm leaves; param leaves)."""
    fracs = {p: float((old[p] != new[p]).double().mean()) for p in tree.paths}
    moved = sum(int((old[p] != new[p]).sum()) for p in tree.paths)
    total = sum(old[p].numel() for p in tree.paths)
    mean = lambda cls: float(np.mean([fracs[leaf.path] for leaf in tree.leaves if leaf.cls == cls]))
    return {"changed": moved / total, "changed_lowrank": mean("mm"), "changed_fullrank": mean("param")}


def validation_scores(params: dict, rows: torch.Tensor, cfg: Int8Config, knobs: Int8Knobs = NANO_EGG,
                      score=model_scores) -> torch.Tensor:
    """(val_rows,) int32: every row scored from a zero state with noise off, all rows at once (`score`: the model's
    scores or their captured form, torch_impl.cuda_graphs.graphed)."""
    return score(params, None, rows, default_state(cfg, rows.shape[0], rows.device), cfg.sigma_shift,
                 knobs=knobs)[0]


def train_int8(cfg: Int8Config, seed: int, corpus=None, progress: bool = True, stream: TextIO | None = None,
               observe: Callable | None = None, device: str | torch.device = "cpu",
               threads: int | None = 1, knobs: Int8Knobs = NANO_EGG, graph_backend=None,
               validate: bool = True) -> LMTrainResult:
    """Train cfg.epochs epochs from seed (default corpus: the shipped one); LMTrainResult with int8 params.

    observe(epoch, scores (pop,) int32, params after the update, info) sees every epoch (lockstep checks);
    threads: torch intra-op threads (default 1; None leaves torch's); knobs: egg.c's departures (spec/int8_knobs.py);
    validate=False scores no validation rows (val bits/byte NaN): a lockstep check that reads only scores and params.
    On CUDA the population's and the validation's scores are captured as CUDA graphs (torch_impl.cuda_graphs; env
    TORCH_IMPL_CUDA_GRAPHS=never: eager), the same integers; `graph_backend` (tests) captures on any device."""
    corpus = load_corpus() if corpus is None else corpus
    with intra_op_threads(threads), torch.inference_mode():
        return _train(cfg, seed, corpus, LMProgress(stream or sys.stdout, cfg.epochs, progress), observe, device,
                      knobs, cuda_graphs.graphed(model_scores, device, graph_backend), validate)


def _train(cfg: Int8Config, seed: int, corpus, show: LMProgress, observe, device, knobs: Int8Knobs,
           score=model_scores, validate: bool = True) -> LMTrainResult:
    train_stream, val_stream = int8_streams(corpus)
    layout = stream_layout(len(train_stream), cfg)              # ValueError: the corpus is too short
    rows = train_rows(train_stream, layout.n_sequences, layout.segments, cfg.tokens_per_update)
    val = torch.from_numpy(validation_rows(val_stream, cfg.val_rows).astype(np.int64)).to(device)
    val_tokens = val.shape[0] * (val.shape[1] - 1)
    es = int8_es.make(cfg, knobs)
    state = int8_es.init(es, seed, device)
    states = default_state(cfg, cfg.pop, device)
    history, val_bpb, start = [], math.nan, time.perf_counter()
    step_tokens = cfg.pop * cfg.tokens_per_update
    for epoch in range(cfg.epochs):
        tokens = torch.from_numpy(epoch_tokens(rows, segment_offset(epoch, layout, cfg.tokens_per_update),
                                               cfg.tokens_per_update, cfg.pop, cfg.group_size).astype(np.int64))
        step_start = time.perf_counter()
        noise, state = int8_es.ask(es, state)
        scores, states = score(state.params, member_view(noise, cfg.pop), tokens.to(device), states,
                               cfg.sigma_shift, knobs=knobs)
        old = state.params
        state, info = int8_es.tell(es, state, noise, scores)
        step_s = time.perf_counter() - step_start
        if observe is not None:
            observe(epoch, scores, state.params, info)
        measured = validate and ((epoch + 1) % cfg.validate_every == 0 or epoch == cfg.epochs - 1)
        val_e = bits_per_byte(int(validation_scores(state.params, val, cfg, knobs, score).to(torch.int64).sum()),
                              val_tokens) \
            if measured else math.nan
        val_bpb = val_e if measured else val_bpb
        total = int(scores.to(torch.int64).sum())
        row = lm_epoch_row(epoch, bits_per_byte(total, step_tokens), val_e, (epoch + 1) * step_tokens,
                           time.perf_counter() - start, step_tokens=step_tokens, step_s=step_s)
        f = info["fitness"]
        row.update(score_sum=total, fitness_pos=int((f > 0).sum()), fitness_zero=int((f == 0).sum()),
                   threshold=int(info["threshold"]), **changed_fractions(es.tree, old, state.params))
        history.append(row)
        show.epoch(row)
    result = LMTrainResult(cfg.epochs, val_bpb, cfg.epochs * step_tokens, time.perf_counter() - start,
                           tuple(history), state.params)
    show.done(result)
    return result
