"""`python -m parity int8`: three sides equal at every piece, a parting named at its first piece and element, a
departing torch side named by the C side's knob signatures, bad input refused with exit 2 and nothing written."""
from __future__ import annotations

import json

import numpy as np
import pytest

from parity.int8 import cli as int8_cli
from parity.int8.pieces import element_text, equal_counts, first_parting, make_case, name_knobs
from spec.int8 import INT8_PRESETS
from spec.int8_knobs import ALL_INT8_KNOBS, INT8_KNOBS, NANO_EGG, Int8Knobs


def _c_reason():
    import c_int8
    return c_int8.unavailable_reason()


needs_c = pytest.mark.skipif(_c_reason() is not None, reason=_c_reason() or "")


# ----------------------------------------------------------------------------- the pure parts
def test_first_parting_names_the_first_piece_and_element_in_pipeline_order():
    rng = np.random.default_rng(11)
    ref = {"init.emb": rng.integers(-127, 128, (256, 4)).astype(np.int8),
           "trace.blocks.0.ln1": rng.integers(-127, 128, (3, 8, 4)).astype(np.int8),
           "votes.blocks.att.Wf": rng.integers(-999, 999, (2, 4, 4)).astype(np.int32)}
    side = {k: v.copy() for k, v in ref.items()}
    assert first_parting(ref, side) is None
    side["votes.blocks.att.Wf"][1, 2, 3] += 1                       # later piece
    side["trace.blocks.0.ln1"][2, 5, 1] ^= 1                        # earlier piece: reported first
    p = first_parting(ref, side, members=(0, 1, 31))
    assert p.piece == "trace.blocks.0.ln1" and p.element == "member 31, token 5, unit 1" and p.differing == 1
    assert p.reference == str(ref["trace.blocks.0.ln1"][2, 5, 1]) and p.total == 3 * 8 * 4
    side["trace.blocks.0.ln1"] = ref["trace.blocks.0.ln1"]
    p = first_parting(ref, side)
    assert p.piece == "votes.blocks.att.Wf" and p.element == "layer 1, row 2, col 3"
    assert first_parting(ref, {**side, "init.emb": ref["init.emb"][:, :2]}).text().startswith(
        "init.emb: shape (256, 2)")
    missing = dict(side)
    del missing["init.emb"]
    assert first_parting(ref, missing).side == "missing"


@pytest.mark.parametrize("piece, index, text", [
    ("starts.blocks.att.Uf", (3, 1), "member 3, layer 1"),
    ("starts.head", (6,), "member 6"),
    ("noise.head.A", (0, 17), "member 0, entry 17"),
    ("noise.blocks.mlp.0.weight.B", (1, 0, 2), "member 1, layer 0, entry 2"),
    ("trace.state", (2, 1, 3), "member 2, layer 1, unit 3"),
    ("trace.score", (1,), "member 1"),
    ("scores", (5,), "member 5"), ("states", (5, 0, 2), "member 5, layer 0, unit 2"), ("fitness", (3,), "pair 3"),
    ("update.ln_out.weight", (2,), "unit 2"), ("init.blocks.att.bf", (1, 2), "layer 1, unit 2"),
    ("trajectory.3.scores", (4,), "member 4"), ("trajectory.2.blocks.att.Wh", (0, 1, 2), "layer 0, row 1, col 2"),
])
def test_elements_are_named_by_their_axes(piece, index, text):
    assert element_text(piece, index, members=(0, 1, 2, 7)) == text
    assert element_text("trace.logits", (3, 0, 9), members=(0, 1, 2, 7)) == "member 7, token 0, unit 9"


def _planted(rng, knobs: Int8Knobs) -> dict:
    """A synthetic side whose every egg.c knob changes its own pieces (and two knobs share one piece)."""
    base = {f"p{i}": np.arange(20, dtype=np.int32) * (i + 1) for i in range(8)}
    out = {k: v.copy() for k, v in base.items()}
    for i, knob in enumerate(ALL_INT8_KNOBS):
        if knobs.is_egg_c(knob):
            out[f"p{i % 8}"][i] += 1 + i
    return out


def test_name_knobs_finds_exactly_the_planted_set_and_no_more():
    rng = np.random.default_rng(5)
    for planted in ({"log2": "mitchell"}, {"evolving": "matrices", "out_shift": "fixed", "mlp": "off"},
                    dict(NANO_EGG.replace(**{k: v.egg_c for k, v in INT8_KNOBS.items()}).departures())):
        target = _planted(rng, NANO_EGG.replace(**planted))
        naming = name_knobs(target, lambda k: _planted(rng, k))
        assert naming.exact and naming.knobs.departures() == planted and naming.left is None


def test_name_knobs_says_so_when_no_knob_set_reproduces_the_side():
    target = _planted(None, NANO_EGG.replace(log2="mitchell"))
    target["p7"][19] = -5                                            # a departure no knob makes
    naming = name_knobs(target, lambda k: _planted(None, k))
    assert not naming.exact and naming.left.piece == "p7" and naming.left.element == "unit 19"
    assert naming.knobs.departures() == {"log2": "mitchell"}         # the closest set still explains the rest
    assert equal_counts(target, target) == (8, 160)


def test_case_is_fresh_random_inputs_fixed_by_the_seed():
    cfg = INT8_PRESETS["selftest"]
    a, b, c = make_case(cfg, 0, 2), make_case(cfg, 0, 2), make_case(cfg, 1, 2)
    assert all(np.array_equal(a.params[p], b.params[p]) for p in a.params)
    assert not np.array_equal(a.tokens, c.tokens)
    assert (a.tokens == 0).any(axis=1).all() and len(np.unique(a.states)) > a.states.size // 2 and (a.fitness == 0).any()
    assert a.scores[2] == a.scores[3] and 0 < a.threshold
    with pytest.raises(ValueError, match="trajectory runs 1..4"):
        make_case(cfg, 0, 5)


# ----------------------------------------------------------------------------- the command
@needs_c
@pytest.mark.parametrize("size, seed", [("selftest", 3), ("quick", 1)])
def test_three_sides_are_equal_at_every_piece(size, seed, tmp_path, capsys):
    """In this process (the command's `python -m parity` entry runs as a process in tests/cli/test_exit_codes.py): the tables
    and compiled functions the other tests built serve it too."""
    out = tmp_path / "out"
    code = int8_cli.main(["--out", str(out), "--size", size, "--seed", str(seed), "--epochs", "3"])
    said = capsys.readouterr()
    assert code == 0, said.out + said.err
    summary = (out / "summary.md").read_text()
    assert "Integer parity, three ways: PASS" in summary
    rows = [line for line in summary.splitlines() if line.startswith("| JAX") or line.startswith("| torch")
            or line.startswith("| C")]
    assert len(rows) == 5 and all(line.count(" | none | ") == 1 for line in rows[:3])   # 3 sides + 2 group rows
    result = json.loads((out / "result.json").read_text())["details"]     # what only int8 reports
    assert [s["parting"] for s in result["sides"]] == [None, None, None] and result["c_side"] == "ran"
    n = int(rows[0].split(" of ")[1].split(" ")[0])
    assert n > 100 and f"{n} of {n}" in rows[1] and f"{n} of {n}" in rows[2]


def test_a_failed_c_build_exits_2_with_the_compilers_error(tmp_path, capsys, monkeypatch):
    import parity.int8.c_side
    monkeypatch.setattr(parity.int8.c_side, "unavailable_reason",
                        lambda: "C side not built: the C compiler failed:\negg_int8.c:3: error: 'x' undeclared")
    code = int8_cli.main(["--out", str(tmp_path / "out"), "--size", "selftest"])
    err = capsys.readouterr().err
    assert code == 2 and "error: 'x' undeclared" in err and "--no-c" in err
    assert not (tmp_path / "out").exists()


def test_no_compiler_leaves_the_c_side_out_and_says_why(tmp_path, capsys, monkeypatch):
    import parity.int8.c_side
    monkeypatch.setattr(parity.int8.c_side, "unavailable_reason",
                        lambda: "C side skipped: no C compiler: none of cc, gcc, clang is on PATH")
    code = int8_cli.main(["--out", str(tmp_path / "out"), "--size", "selftest", "--epochs", "2", "--quiet"])
    assert code == 0, capsys.readouterr()
    summary = (tmp_path / "out" / "summary.md").read_text()
    assert "| C (c_int8) | - | - | skipped: C side skipped: no C compiler" in summary
    assert json.loads((tmp_path / "out" / "result.json").read_text())["details"]["c_side"].startswith("C side skipped")
