"""parity.core.tape: call keys, recording and replay, and the bundle on disk (with every way it can be refused)."""
import json
import zipfile
from pathlib import Path

import numpy as np
import pytest

from parity.core.port import UsageError
from parity.core.tape import (ARRAYS, FORMAT_VERSION, MANIFEST, NotRecorded, Recording, Replay, Store, Token, call_key,
                              read_bundle, write_bundle)


class Opaque:
    """A state no bundle can store (like a JAX optimizer state)."""

    def __init__(self, total):
        self.total = total


class Toy:
    """A small 'reference': data in, data out, an opaque state threaded through, and a call that raises."""

    def __init__(self, scale):
        self.scale = np.float32(scale)
        self.name = "toy"

    def product(self, x, w):
        return (x @ w) * self.scale

    def split(self, params):
        return {k: (v.sum(), v.shape) for k, v in params.items()}

    def start(self, x):
        return Opaque(np.float32(x.sum()))

    def step(self, state, x):
        new = Opaque(state.total + np.float32(x.sum()))
        return new.total, new

    def refuse(self, x):
        raise ValueError(f"refused {x.size} values")


METHODS = ("product", "split", "start", "step", "refuse")


def _session(ref, rng, n):
    """The calls a 'check' makes; returns what it saw."""
    x, w = rng.standard_normal((n, 3)).astype(np.float32), rng.standard_normal((3, 2)).astype(np.float32)
    seen = [ref.product(x, w), ref.split({"b": w[0], "a": x})]
    state = ref.start(x)
    total, state = ref.step(state, w)
    seen.append(total)
    total, state = ref.step(state, x)
    seen.append(total)
    with pytest.raises(ValueError, match="refused"):
        ref.refuse(x)
    return seen


def _same(a, b):
    if isinstance(a, dict):
        assert a.keys() == b.keys()
        for k in a:
            _same(a[k], b[k])
    elif isinstance(a, tuple):
        assert len(a) == len(b)
        for u, v in zip(a, b):
            _same(u, v)
    else:
        np.testing.assert_array_equal(a, b)
        assert np.asarray(a).dtype == np.asarray(b).dtype


@pytest.mark.parametrize("n", [2, 17])
def test_call_key_follows_the_bytes(n):
    rng = np.random.default_rng(n)
    x = rng.standard_normal((n, 4)).astype(np.float32)
    key = call_key("m", (x, {"b": 1, "a": 2.5}), {"k": None})
    assert key == call_key("m", (x.copy(), {"a": 2.5, "b": 1}), {"k": None})      # dict order is not content
    flipped = x.copy()
    flipped.view(np.uint32)[0, 0] ^= 1                                            # one bit of one float
    different = [call_key("m", (flipped, {"b": 1, "a": 2.5}), {"k": None}),
                 call_key("m", (x.astype(np.float64), {"b": 1, "a": 2.5}), {"k": None}),
                 call_key("m", (x.reshape(4, n), {"b": 1, "a": 2.5}), {"k": None}),
                 call_key("m", ([x], {"b": 1, "a": 2.5}), {"k": None}),
                 call_key("m", ((x,), {"b": 1, "a": 2.5}), {"k": None}),
                 call_key("m", (x, {"b": 1, "a": 2.5}), {"k": None}, scope="other knobs"),
                 call_key("n", (x, {"b": 1, "a": 2.5}), {"k": None}),
                 call_key("m", (x, {"b": True, "a": 2.5}), {"k": None})]
    assert len({key, *different}) == len(different) + 1
    with pytest.raises(TypeError, match="cannot key"):
        call_key("m", (object(),))


@pytest.mark.parametrize("n", [3, 40])
def test_a_replay_from_disk_answers_what_the_recording_saw(tmp_path, n):
    recording = Recording(Toy(1.5), METHODS)
    live = _session(recording, np.random.default_rng(n), n)
    folder = write_bundle(tmp_path / "b", recording.store, {"task": "toy", "size": n})
    bundle = read_bundle(folder)
    assert bundle.manifest["format_version"] == FORMAT_VERSION and bundle.manifest["size"] == n
    replay = Replay(bundle.store, METHODS, attributes={"name": "toy"})
    replayed = _session(replay, np.random.default_rng(n), n)
    for a, b in zip(live, replayed):
        _same(a, b)
    assert replay.name == "toy" and replay.misses == []


def test_tokens_stand_for_opaque_state_and_are_threaded_back():
    recording = Recording(Toy(2.0), METHODS)
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    state = recording.start(x)
    assert isinstance(state, Token)
    total, state2 = recording.step(state, x)
    assert isinstance(state2, Token) and state2 != state and total == np.float32(30)


def test_a_miss_goes_to_the_fallback_or_is_not_recorded():
    rng = np.random.default_rng(5)
    recording = Recording(Toy(1.0), METHODS)
    x, w = rng.standard_normal((4, 3)).astype(np.float32), rng.standard_normal((3, 2)).astype(np.float32)
    recording.product(x, w)
    plain = Replay(recording.store, METHODS)
    np.testing.assert_array_equal(plain.product(x, w), x @ w)
    other = x + np.float32(1)
    with pytest.raises(NotRecorded, match="product"):
        plain.product(other, w)
    backed = Replay(recording.store, METHODS, fallback=Toy(1.0))
    np.testing.assert_array_equal(backed.product(other, w), other @ w)
    assert backed.misses == ["product"]


def test_what_a_caller_writes_into_an_answer_does_not_change_the_store():
    recording = Recording(Toy(1.0), METHODS)
    x, w = np.ones((2, 3), np.float32), np.full((3, 2), 2, np.float32)
    first = recording.product(x, w)
    first[:] = -1
    replay = Replay(recording.store, METHODS)
    out = replay.product(x, w)
    out[:] = 7
    np.testing.assert_array_equal(replay.product(x, w), np.full((2, 2), 6, np.float32))


def test_children_share_the_store_under_their_own_scope():
    parent = Recording(Toy(1.0), METHODS)
    child = parent.child(Toy(3.0), scope="scale=3")
    x, w = np.ones((2, 3), np.float32), np.ones((3, 2), np.float32)
    parent.product(x, w)
    child.product(x, w)
    np.testing.assert_array_equal(Replay(parent.store, METHODS).product(x, w), np.full((2, 2), 3, np.float32))
    np.testing.assert_array_equal(Replay(parent.store, METHODS, scope="scale=3").product(x, w),
                                  np.full((2, 2), 9, np.float32))


@pytest.fixture
def bundle(tmp_path):
    recording = Recording(Toy(1.5), METHODS)
    _session(recording, np.random.default_rng(0), 8)
    return write_bundle(tmp_path / "bundle", recording.store, {"task": "toy", "command": "make toy"})


def test_a_missing_bundle_or_file_is_refused(tmp_path, bundle):
    with pytest.raises(UsageError, match="no such folder"):
        read_bundle(tmp_path / "nowhere")
    (bundle / ARRAYS).unlink()
    with pytest.raises(UsageError, match=f"{ARRAYS} is missing"):
        read_bundle(bundle)


def test_a_truncated_bundle_is_refused(bundle):
    data = (bundle / ARRAYS).read_bytes()
    (bundle / ARRAYS).write_bytes(data[: len(data) // 2])
    with pytest.raises(UsageError, match="content hash"):
        read_bundle(bundle)
    manifest = (bundle / MANIFEST).read_text()
    (bundle / MANIFEST).write_text(manifest[: len(manifest) // 2])
    with pytest.raises(UsageError, match="not valid JSON"):
        read_bundle(bundle)


def test_an_unreadable_arrays_file_with_a_matching_hash_is_refused(bundle):
    """A bundle rewritten consistently (hash recomputed) around a damaged npz still fails to load, with exit 2."""
    from parity.core.tape import content_hash

    manifest = json.loads((bundle / MANIFEST).read_text())
    damaged = b"PK\x03\x04 not a zip"
    (bundle / ARRAYS).write_bytes(damaged)
    manifest["content_hash"] = content_hash(damaged, manifest)
    (bundle / MANIFEST).write_text(json.dumps(manifest))
    with pytest.raises(UsageError, match="cannot be read"):
        read_bundle(bundle)
    assert not zipfile.is_zipfile(bundle / ARRAYS)


def test_another_format_version_or_a_changed_manifest_is_refused(bundle):
    manifest = json.loads((bundle / MANIFEST).read_text())
    (bundle / MANIFEST).write_text(json.dumps({**manifest, "format_version": FORMAT_VERSION + 1}))
    with pytest.raises(UsageError, match=f"format version {FORMAT_VERSION + 1}.*reads version {FORMAT_VERSION}.*make toy"):
        read_bundle(bundle)
    calls = manifest["calls"]
    calls[0]["method"] = "tampered"
    (bundle / MANIFEST).write_text(json.dumps({**manifest, "calls": calls}))
    with pytest.raises(UsageError, match="content hash does not match"):
        read_bundle(bundle)
    (bundle / MANIFEST).write_text(json.dumps({**manifest, "task": "another task"}))   # a field beside the calls
    with pytest.raises(UsageError, match="content hash does not match"):
        read_bundle(bundle)


def test_writing_over_a_bundle_replaces_it_whole(tmp_path, bundle):
    store = Store()
    store.put("product", "k", np.arange(3, dtype=np.float32))
    write_bundle(bundle, store, {"task": "again"})
    assert read_bundle(bundle).manifest["task"] == "again"
    assert sorted(p.name for p in bundle.iterdir()) == sorted([ARRAYS, MANIFEST])
    assert [p.name for p in Path(bundle.parent).iterdir() if p.name.startswith(".")] == []


@pytest.mark.parametrize("n", [1, 9])
def test_the_repro_scripts_own_decoder_reads_what_tape_encodes(n):
    """parity/repro_script.py's decoder, alone as a repro folder runs it (numpy and the port only), reads what
    tape encodes: the same values as tape.decode, which adds the recording's own kinds to it."""
    from parity.core import repro_script
    from parity.core.tape import decode, encode

    rng = np.random.default_rng(n)
    value = ({"w": rng.standard_normal((n, 3)).astype(np.float32), "b": (rng.integers(0, 9, n), None)},
             [2.5, 7, True, "x", np.float32(1.5)])
    arrays: dict = {}
    node = encode(value, arrays)
    ours, theirs = decode(node, arrays), repro_script.decode(node, arrays)
    _same(ours[0], theirs[0])
    assert list(ours[1][:4]) == list(theirs[1][:4]) and ours[1][4] == theirs[1][4]


@pytest.mark.parametrize("manifest, says", [({"xla_flags": "--xla_cpu_enable_fast_math=true"},
                                              "XLA_FLAGS `--xla_cpu_enable_fast_math=true`"),
                                             ({"xla_flags": ""}, "XLA_FLAGS unset (XLA's defaults)"),
                                             ({}, "XLA_FLAGS not recorded")])
def test_a_reports_bundle_line_says_the_xla_flags_it_was_recorded_under(manifest, says):
    from parity.core.tape import Bundle, recording_of
    line = recording_of(Bundle(Path("b"), {"task": "mlp", "versions": {"jax": "x"}, **manifest}, Store()))
    assert line.endswith(f"; {says})") and "jax x" in line
