"""Train the byte-level LM (spec/lm.py) with the functional torch EGGROLL: epochs of ask -> score -> tell.

The same loop as jax_reference.lm.train: epoch e scores every member on its group's window of
rollout.corpus.train_windows(corpus, seed, e, ...), then updates; validation bits/byte of the updated,
unperturbed model every cfg.eval_every epochs and after the last. What a run returns and prints: spec/lm_run.py.
"""
from __future__ import annotations

import math
import sys
import time
from typing import TextIO

import numpy as np
import torch

from rollout.corpus import check_corpus_fits, load_corpus, member_tokens, train_windows, val_windows
from spec.lm import LMConfig
from spec.lm_run import LMProgress, LMTrainResult, lm_epoch_row
from spec.tree_knobs import TreeKnobs
from torch_impl import cuda_graphs
from torch_impl.tree import es as lm_es, lm
from torch_impl.train import intra_op_threads


def epoch_tokens(corpus, cfg: LMConfig, seed: int, epoch: int, device) -> torch.Tensor:
    """Each member's window (pop, T + 1) int64: member i reads stream i // group_size of the epoch's streams."""
    windows = train_windows(corpus, seed, epoch, cfg.n_streams, cfg.seq_len)
    return torch.from_numpy(member_tokens(windows, cfg.pop, cfg.group_size).astype(np.int64)).to(device)


def train_lm(cfg: LMConfig, seed: int, knobs: TreeKnobs = TreeKnobs(), corpus=None, progress: bool = True,
             stream: TextIO | None = None, device: str | torch.device = "cpu", threads: int | None = 1,
             graph_backend=None) -> LMTrainResult:
    """Train cfg.epochs epochs from seed; `threads`: torch intra-op threads (default 1; None leaves torch's).
    On CUDA the population and validation forwards are captured as CUDA graphs (torch_impl.cuda_graphs; env
    TORCH_IMPL_CUDA_GRAPHS=never: eager), the same numbers; `graph_backend` (tests) captures on any device."""
    corpus = load_corpus() if corpus is None else corpus
    check_corpus_fits(corpus, cfg.seq_len)
    with intra_op_threads(threads), torch.inference_mode():
        return _train(cfg, seed, knobs, corpus, LMProgress(stream or sys.stdout, cfg.epochs, progress), device,
                      cuda_graphs.graphed(lm.forward, device, graph_backend))


def _train(cfg: LMConfig, seed: int, knobs: TreeKnobs, corpus, show: LMProgress, device,
           forward=lm.forward) -> LMTrainResult:
    es = lm_es.make(cfg, knobs)
    state = lm_es.init(es, seed, device)
    val = torch.from_numpy(val_windows(corpus, cfg.val_windows, cfg.seq_len).astype(np.int64)).to(device)
    history, val_bpb, start = [], math.nan, time.perf_counter()
    for epoch in range(cfg.epochs):
        noise, state = lm_es.ask(es, state)
        scores = forward(state.params, epoch_tokens(corpus, cfg, seed, epoch, device), noise)
        state, _ = lm_es.tell(es, state, noise, scores)
        measured = (epoch + 1) % cfg.eval_every == 0 or epoch == cfg.epochs - 1
        val_bpb_e = lm.bits_per_byte(state.params, val, forward) if measured else math.nan
        val_bpb = val_bpb_e if measured else val_bpb
        row = lm_epoch_row(epoch, -float(scores.mean()), val_bpb_e, (epoch + 1) * cfg.pop * cfg.seq_len,
                           time.perf_counter() - start)
        history.append(row)
        show.epoch(row)
    result = LMTrainResult(cfg.epochs, val_bpb, cfg.epochs * cfg.pop * cfg.seq_len, time.perf_counter() - start,
                           tuple(history), state.params)
    show.done(result)
    return result
