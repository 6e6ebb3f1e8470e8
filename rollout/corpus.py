"""The byte-level LM's data: the shipped corpus, its train/validation split and the windows each epoch reads.

Both sides take their tokens from here, so the data part of spec/lm.py's docstring is implemented once:
train = the first int(0.9 * n) bytes, validation = the rest; at epoch e stream j starts at
`default_rng([seed, e]).integers(0, len(train) - T, n_streams)[j]` and member i reads stream i // group_size.
"""
from __future__ import annotations

import hashlib
from pathlib import Path
from typing import NamedTuple

import numpy as np

CORPUS_PATH = Path(__file__).resolve().parent / "data" / "corpus.txt"
TRAIN_FRACTION = 0.9          # train = bytes[:int(0.9 * n)], validation = bytes[int(0.9 * n):]


class Corpus(NamedTuple):
    """The corpus as bytes: train (n_train,) and val (n_val,) uint8, where it was read from, sha256 of the file."""

    train: np.ndarray
    val: np.ndarray
    path: Path
    sha256: str


def split_at(n: int) -> int:
    """Index of the first validation byte of an n-byte corpus: int(0.9 * n)."""
    return int(TRAIN_FRACTION * n)


def min_corpus_bytes(seq_len: int) -> int:
    """Fewest bytes whose train and validation parts each hold one window of seq_len + 1 bytes."""
    n = 10 * (seq_len + 1) - 10
    while split_at(n) < seq_len + 1 or n - split_at(n) < seq_len + 1:
        n += 1
    return n


def _check_seq_len(seq_len: int) -> None:
    if int(seq_len) != seq_len or seq_len < 1:
        raise ValueError(f"seq_len must be an integer >= 1 (tokens scored per window), got {seq_len!r}")


def load_corpus(path: str | Path | None = None, seq_len: int = 1) -> Corpus:
    """Read and split the corpus (default: the shipped one); refuse a path that is missing, empty or too short."""
    _check_seq_len(seq_len)
    path = Path(CORPUS_PATH if path is None else path)
    if not path.is_file():
        raise ValueError(f"corpus {path} does not exist or is not a file; give the path of a text file "
                         f"(the shipped corpus is {CORPUS_PATH})")
    data = path.read_bytes()
    if not data:
        raise ValueError(f"corpus {path} is empty; give a text file of at least {min_corpus_bytes(seq_len)} bytes")
    if len(data) < min_corpus_bytes(seq_len):
        raise ValueError(f"corpus {path} has {len(data)} bytes, too short for windows of seq_len + 1 = "
                         f"{seq_len + 1} bytes in both train and validation; it needs at least "
                         f"{min_corpus_bytes(seq_len)} bytes")
    arr = np.frombuffer(data, dtype=np.uint8)
    cut = split_at(len(arr))
    return Corpus(arr[:cut].copy(), arr[cut:].copy(), path, hashlib.sha256(data).hexdigest())


def _check_fits(part: np.ndarray, name: str, seq_len: int) -> None:
    _check_seq_len(seq_len)
    if len(part) < seq_len + 1:
        raise ValueError(f"the corpus's {name} part has {len(part)} bytes, fewer than one window of seq_len + 1 = "
                         f"{seq_len + 1}; use seq_len <= {len(part) - 1} or a corpus of at least "
                         f"{min_corpus_bytes(seq_len)} bytes")


def check_corpus_fits(corpus: Corpus, seq_len: int) -> None:
    """ValueError unless train and validation each hold one window of seq_len + 1 bytes (a corpus passed in, not
    loaded: load_corpus checks its own); the rule train_windows and val_windows apply to their part."""
    _check_fits(corpus.train, "train", seq_len)
    _check_fits(corpus.val, "validation", seq_len)


def _gather(part: np.ndarray, starts: np.ndarray, seq_len: int) -> np.ndarray:
    """Rows part[s : s + seq_len + 1] for each start s: (len(starts), seq_len + 1) uint8."""
    return part[starts[:, None] + np.arange(seq_len + 1)]


def train_windows(corpus: Corpus, seed: int, epoch: int, n_streams: int, seq_len: int) -> np.ndarray:
    """The epoch's streams (n_streams, seq_len + 1) uint8: stream j starts at
    default_rng([seed, epoch]).integers(0, len(train) - seq_len, n_streams)[j]."""
    _check_fits(corpus.train, "train", seq_len)
    if seed < 0 or epoch < 0:
        raise ValueError(f"seed and epoch must be >= 0 (numpy seeds), got seed={seed}, epoch={epoch}")
    if n_streams < 1:
        raise ValueError(f"n_streams must be >= 1, got {n_streams}")
    starts = np.random.default_rng([seed, epoch]).integers(0, len(corpus.train) - seq_len, n_streams)
    return _gather(corpus.train, starts, seq_len)


def member_tokens(windows: np.ndarray, pop: int, group_size: int) -> np.ndarray:
    """Each member's window (pop, seq_len + 1): member i reads stream i // group_size (group_size 0: stream 0)."""
    if group_size < 0 or (group_size and pop % group_size):
        raise ValueError(f"group_size {group_size} does not divide the population {pop}; use 0 (one stream for "
                         f"all) or a divisor of {pop}")
    n_streams = pop // group_size if group_size else 1
    if windows.ndim != 2 or windows.shape[0] != n_streams:
        raise ValueError(f"windows has shape {windows.shape} but pop {pop} with group_size {group_size} reads "
                         f"{n_streams} streams; pass train_windows(..., n_streams={n_streams}, ...)")
    stream = np.arange(pop) // group_size if group_size else np.zeros(pop, dtype=np.int64)
    return windows[stream]


def val_windows(corpus: Corpus, n: int, seq_len: int) -> np.ndarray:
    """n validation windows (n, seq_len + 1) uint8 at starts linspace(0, len(val) - seq_len - 1, n) as int64."""
    _check_fits(corpus.val, "validation", seq_len)
    if n < 1:
        raise ValueError(f"the number of validation windows must be >= 1, got {n}")
    starts = np.linspace(0, len(corpus.val) - seq_len - 1, n).astype(np.int64)
    return _gather(corpus.val, starts, seq_len)
