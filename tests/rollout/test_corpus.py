"""rollout.corpus: the LM's split, its windows (shapes, determinism, group sharing) and its refusals."""
from __future__ import annotations

import hashlib

import numpy as np
import pytest

from rollout.corpus import (CORPUS_PATH, Corpus, load_corpus, member_tokens, min_corpus_bytes, split_at,
                            train_windows, val_windows)
from spec.lm import LM_PRESETS


@pytest.fixture(scope="module")
def corpus() -> Corpus:
    return load_corpus()


def test_the_shipped_corpus_is_small_mostly_printable_text_with_its_licence(corpus):
    data = CORPUS_PATH.read_bytes()
    assert 60_000 <= len(data) <= 1_000_000            # issue 20: <= 1 MB; enough text for a byte model
    data.decode("utf-8")                               # raises if not UTF-8
    printable = sum(32 <= b < 127 or b in (9, 10, 13) for b in data)
    assert printable / len(data) > 0.99
    assert (CORPUS_PATH.parent / "LICENSE").read_text().count("CC0") >= 1
    assert corpus.sha256 == hashlib.sha256(data).hexdigest() and corpus.path == CORPUS_PATH


def test_the_split_is_the_first_90_percent_and_the_rest(corpus):
    data = np.frombuffer(CORPUS_PATH.read_bytes(), dtype=np.uint8)
    cut = int(0.9 * len(data))
    assert split_at(len(data)) == cut
    assert corpus.train.dtype == np.uint8 and corpus.val.dtype == np.uint8
    assert np.array_equal(corpus.train, data[:cut]) and np.array_equal(corpus.val, data[cut:])


@pytest.mark.parametrize("n_streams,seq_len", [(3, 8), (16, 32)])
def test_train_windows_are_the_stated_slices_and_deterministic(corpus, n_streams, seq_len):
    w = train_windows(corpus, 7, 3, n_streams, seq_len)
    assert w.shape == (n_streams, seq_len + 1) and w.dtype == np.uint8
    starts = np.random.default_rng([7, 3]).integers(0, len(corpus.train) - seq_len, n_streams)
    for j, s in enumerate(starts):
        assert np.array_equal(w[j], corpus.train[s:s + seq_len + 1])
    assert np.array_equal(w, train_windows(corpus, 7, 3, n_streams, seq_len))
    assert not np.array_equal(w, train_windows(corpus, 7, 4, n_streams, seq_len))
    assert not np.array_equal(w, train_windows(corpus, 8, 3, n_streams, seq_len))


def test_a_window_may_end_on_the_last_train_byte(tmp_path):
    """The largest start is len(train) - seq_len - 1, so every window lies inside train."""
    path = tmp_path / "tiny.txt"
    path.write_bytes(bytes(range(40, 60)))              # 20 bytes: train 18, val 2
    small = load_corpus(path, seq_len=1)
    w = train_windows(small, 0, 0, 200, 16)
    assert w.shape == (200, 17)
    assert set(w[:, 0]) == {40, 41}                     # both possible starts drawn, none beyond
    assert np.array_equal(w[w[:, 0] == 41][0], small.train[1:18])


@pytest.mark.parametrize("pop,group_size", [(8, 4), (16, 2), (12, 0), (6, 6)])
def test_members_of_a_group_share_a_stream(corpus, pop, group_size):
    n_streams = pop // group_size if group_size else 1
    w = train_windows(corpus, 1, 0, n_streams, 12)
    tokens = member_tokens(w, pop, group_size)
    assert tokens.shape == (pop, 13)
    for i in range(pop):
        assert np.array_equal(tokens[i], w[i // group_size if group_size else 0])


def test_the_presets_stream_counts_fit(corpus):
    for cfg in LM_PRESETS.values():
        w = train_windows(corpus, 0, 0, cfg.n_streams, cfg.seq_len)
        assert member_tokens(w, cfg.pop, cfg.group_size).shape == (cfg.pop, cfg.seq_len + 1)
        assert val_windows(corpus, cfg.val_windows, cfg.seq_len).shape == (cfg.val_windows, cfg.seq_len + 1)


@pytest.mark.parametrize("n,seq_len", [(4, 8), (64, 32), (1, 5)])
def test_val_windows_are_evenly_spaced_from_the_first_to_the_last(corpus, n, seq_len):
    v = val_windows(corpus, n, seq_len)
    assert v.shape == (n, seq_len + 1) and v.dtype == np.uint8
    starts = np.linspace(0, len(corpus.val) - seq_len - 1, n).astype(np.int64)
    for k, s in enumerate(starts):
        assert np.array_equal(v[k], corpus.val[s:s + seq_len + 1])
    assert np.array_equal(v[0], corpus.val[:seq_len + 1])
    if n > 1:
        assert np.array_equal(v[-1], corpus.val[-(seq_len + 1):])


def test_min_corpus_bytes_is_the_least_length_that_fits_a_window_in_both_parts():
    for seq_len in (1, 8, 32, 99):
        n = min_corpus_bytes(seq_len)
        assert split_at(n) >= seq_len + 1 and n - split_at(n) >= seq_len + 1
        m = n - 1
        assert split_at(m) < seq_len + 1 or m - split_at(m) < seq_len + 1


# ----------------------------------------------------------------------------- bad input
def test_a_missing_path_is_refused(tmp_path):
    with pytest.raises(ValueError, match="does not exist or is not a file"):
        load_corpus(tmp_path / "nope.txt")
    with pytest.raises(ValueError, match="does not exist or is not a file"):
        load_corpus(tmp_path)


def test_an_empty_corpus_is_refused(tmp_path):
    (tmp_path / "empty.txt").write_bytes(b"")
    with pytest.raises(ValueError, match="is empty"):
        load_corpus(tmp_path / "empty.txt")


def test_a_corpus_too_short_for_the_window_is_refused_with_the_minimum(tmp_path):
    path = tmp_path / "short.txt"
    path.write_bytes(b"x" * 100)
    need = min_corpus_bytes(32)
    with pytest.raises(ValueError, match=f"has 100 bytes, too short .* at least {need} bytes"):
        load_corpus(path, seq_len=32)
    load_corpus(path, seq_len=8)                        # 100 bytes: train 90, val 10 >= 9


def test_windows_longer_than_a_part_are_refused(tmp_path):
    path = tmp_path / "short.txt"
    path.write_bytes(b"y" * 100)                        # train 90, val 10
    small = load_corpus(path)
    with pytest.raises(ValueError, match="validation part has 10 bytes.*use seq_len <= 9"):
        val_windows(small, 4, 10)
    with pytest.raises(ValueError, match="train part has 90 bytes.*use seq_len <= 89"):
        train_windows(small, 0, 0, 2, 90)


@pytest.mark.parametrize("call,message", [
    (lambda c: train_windows(c, 0, 0, 2, 0), "seq_len must be an integer >= 1"),
    (lambda c: train_windows(c, -1, 0, 2, 8), "seed and epoch must be >= 0"),
    (lambda c: train_windows(c, 0, 0, 0, 8), "n_streams must be >= 1"),
    (lambda c: val_windows(c, 0, 8), "validation windows must be >= 1"),
    (lambda c: member_tokens(train_windows(c, 0, 0, 2, 8), 8, 3), "group_size 3 does not divide"),
    (lambda c: member_tokens(train_windows(c, 0, 0, 3, 8), 8, 4), r"reads 2 streams"),
])
def test_bad_window_arguments_are_refused(corpus, call, message):
    with pytest.raises(ValueError, match=message):
        call(corpus)
