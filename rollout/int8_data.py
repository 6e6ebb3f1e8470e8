"""The integer LM's data (spec/int8.py, "Data"): nano-egg's stream layout over the project's corpus, numpy only.

Each part of the shipped corpus (rollout.corpus's 90/10 split) is one document, stored as nano-egg stores a
document: byte 0, then its bytes. Training cuts the train stream into pop // group_size rows that epochs read T
bytes at a time (member i: row i // group_size); validation cuts the validation stream into val_rows rows.
"""
from __future__ import annotations

import numpy as np

from rollout.corpus import Corpus


def document_stream(part: np.ndarray) -> np.ndarray:
    """[0] + part as uint8 (nano-egg's document layout: a 0 byte before every document)."""
    return np.concatenate([np.zeros(1, np.uint8), np.asarray(part, dtype=np.uint8)])


def train_rows(stream: np.ndarray, n_sequences: int, segments: int, tokens_per_update: int) -> np.ndarray:
    """stream[:n_sequences * (segments * T + 1)] as (n_sequences, segments * T + 1) uint8 (spec.int8.stream_layout
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



def egg_c_tokens(data: np.ndarray, step: int, pop: int, seq_len: int) -> np.ndarray:
    """egg.c's data layout (full_trained_egg-cpumulti.c): at step s pair p reads seq_len inputs and their next bytes
    from offset (s * seq_len + p * stride) % (len - seq_len), stride = len // (pop / 2); both members of the pair read
    the same bytes. (pop, seq_len + 1) uint8, member m reading pair m // 2's row."""
    data = np.asarray(data, dtype=np.uint8)
    pairs = pop // 2
    stride = len(data) // pairs
    starts = (step * seq_len + np.arange(pairs, dtype=np.int64) * stride) % (len(data) - seq_len)
    rows = data[starts[:, None] + np.arange(seq_len + 1)]
    return np.repeat(rows, 2, axis=0)
