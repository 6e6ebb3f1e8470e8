"""The integer LM's data (spec/int8.py, "Data"): nano-egg's stream layout over the project's corpus, numpy only.

Each part of the shipped corpus (rollout.corpus's 90/10 split) is one document, stored as nano-egg stores a
document: byte 0, then its bytes. Training cuts the train stream into pop // group_size rows that epochs read T
bytes at a time (member i: row i // group_size); validation cuts the validation stream into val_rows rows.

egg.c's layout (ljubomirj/egg.c full_trained_egg-cpumulti.c's main, for c_int8.train_egg_c) is a different one: the
data file's bytes as they are (no byte 0), read by `egg_c_*` below.
"""
from __future__ import annotations

from typing import NamedTuple

import numpy as np

from rollout.corpus import Corpus


class StreamLayout(NamedTuple):
    """How a training stream is cut: n_sequences rows of segments * T + 1 bytes (rows = stream[:used])."""

    n_sequences: int
    segments: int
    tokens_per_sequence: int

    @property
    def used(self) -> int:
        return self.n_sequences * self.tokens_per_sequence


def stream_layout(stream_len: int, cfg) -> StreamLayout:
    """nano-egg's layout for cfg (spec.int8.Int8Config: n_sequences, tokens_per_update); ValueError if the stream is too short for one segment per sequence."""
    ns, T = cfg.n_sequences, cfg.tokens_per_update
    segments = (stream_len - ns) // (T * ns)
    if segments < 1:
        raise ValueError(f"the training stream has {stream_len} bytes, too few for {ns} sequences of "
                         f"T + 1 = {T + 1} bytes; it needs at least {ns * (T + 1)} (fewer sequences: a larger "
                         f"group_size, or a smaller tokens_per_update, or a longer corpus)")
    return StreamLayout(ns, segments, segments * T + 1)


def segment_offset(epoch: int, layout: StreamLayout, tokens_per_update: int) -> int:
    """The first byte every row reads at epoch e: (e % segments) * T."""
    return (epoch % layout.segments) * tokens_per_update


def document_stream(part: np.ndarray) -> np.ndarray:
    """[0] + part as uint8 (nano-egg's document layout: a 0 byte before every document)."""
    return np.concatenate([np.zeros(1, np.uint8), np.asarray(part, dtype=np.uint8)])


def train_rows(stream: np.ndarray, n_sequences: int, segments: int, tokens_per_update: int) -> np.ndarray:
    """stream[:n_sequences * (segments * T + 1)] as (n_sequences, segments * T + 1) uint8 (stream_layout
    gives the numbers)."""
    length = segments * tokens_per_update + 1
    if n_sequences * length > len(stream):
        raise ValueError(f"{n_sequences} rows of {length} bytes need {n_sequences * length} bytes; the stream has "
                         f"{len(stream)}")
    return np.asarray(stream[:n_sequences * length], dtype=np.uint8).reshape(n_sequences, length)


def epoch_tokens(rows: np.ndarray, offset: int, tokens_per_update: int, pop: int, group_size: int) -> np.ndarray:
    """Each member's T + 1 bytes at this epoch (pop, T + 1): rows[i // group_size, offset : offset + T + 1]."""
    if rows.shape[0] * group_size != pop:
        raise ValueError(f"{rows.shape[0]} rows with group_size {group_size} serve {rows.shape[0] * group_size} "
                         f"members, not pop {pop}")
    window = rows[:, offset:offset + tokens_per_update + 1]
    if window.shape[1] != tokens_per_update + 1:
        raise ValueError(f"offset {offset} leaves {window.shape[1]} bytes in rows of {rows.shape[1]}; need "
                         f"T + 1 = {tokens_per_update + 1}")
    return np.repeat(window, group_size, axis=0)


def validation_rows(stream: np.ndarray, val_rows: int) -> np.ndarray:
    """The validation stream as (val_rows, len // val_rows) uint8, the tail dropped; ValueError if rows < 2 bytes."""
    length = len(stream) // val_rows
    if length < 2:
        raise ValueError(f"the validation stream has {len(stream)} bytes, too few for {val_rows} rows of at least "
                         f"2 bytes; use val_rows <= {max(len(stream) // 2, 1)}")
    return np.asarray(stream[:val_rows * length], dtype=np.uint8).reshape(val_rows, length)


def int8_streams(corpus: Corpus) -> tuple[np.ndarray, np.ndarray]:
    """(train stream, validation stream): each part of the corpus as one document."""
    return document_stream(corpus.train), document_stream(corpus.val)


# ----------------------------------------------------------------------------- egg.c's layout
def egg_c_max_steps(length: int, tokens_per_update: int) -> int:
    """The steps egg.c runs over a data file of `length` bytes: (length - 1) // T."""
    return (length - 1) // tokens_per_update


def egg_c_pair_offsets(length: int, step: int, pairs: int, tokens_per_update: int) -> np.ndarray:
    """Where pair p reads at step s (egg.c): (s T + p stride) % (length - T), stride = length // pairs; (pairs,) int64.

    Both members of the pair (2p with the + noise, 2p + 1 with the -) read the same T + 1 bytes from there."""
    T = tokens_per_update
    if length <= T or pairs < 1:
        raise ValueError(f"egg.c's layout needs more than T = {T} bytes and at least one pair; got {length} bytes "
                         f"and {pairs} pairs")
    stride = length // pairs
    return (step * T + np.arange(pairs, dtype=np.int64) * stride) % (length - T)


def egg_c_step_tokens(data: np.ndarray, step: int, pop: int, tokens_per_update: int) -> np.ndarray:
    """Each member's T + 1 bytes at step s in egg.c's layout (pop, T + 1): members 2p and 2p + 1 read
    data[o_p : o_p + T + 1], o_p = egg_c_pair_offsets(...)[p]."""
    if pop % 2:
        raise ValueError(f"pop {pop} is odd: egg.c evaluates antithetic pairs")
    data = np.asarray(data, dtype=np.uint8)
    offsets = egg_c_pair_offsets(len(data), step, pop // 2, tokens_per_update)
    rows = data[offsets[:, None] + np.arange(tokens_per_update + 1)]
    return np.repeat(rows, 2, axis=0)


def egg_c_main_tokens(data: np.ndarray, step: int, tokens_per_update: int) -> np.ndarray:
    """The T + 1 bytes egg.c's noise-off progress loss reads at step s (every 10th): data[s T : s T + T + 1]."""
    T = tokens_per_update
    if step * T + T + 1 > len(data):
        raise ValueError(f"step {step} reads bytes up to {step * T + T + 1}; the data has {len(data)} "
                         f"(egg.c runs (length - 1) // T = {egg_c_max_steps(len(data), T)} steps)")
    return np.asarray(data[step * T:step * T + T + 1], dtype=np.uint8)


def load_int8_corpus(path, cfg) -> Corpus:
    """The corpus at path (None: the shipped one) checked against nano-egg's layout for cfg (spec.int8.Int8Config):
    ValueError if it is missing, empty, or too short for the training sequences or the validation rows. Every int8
    command line calls it before any work."""
    from rollout.corpus import load_corpus
    corpus = load_corpus(path, cfg.tokens_per_update)
    train_stream, val_stream = int8_streams(corpus)
    stream_layout(len(train_stream), cfg)            # refuses a train part too short for the sequences
    validation_rows(val_stream, cfg.val_rows)        # and a validation part too short for the rows
    return corpus
