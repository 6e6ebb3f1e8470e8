"""egg.c's departures as knobs on the torch int8 port: each equal to the C side's switch at every piece, each caught
and named by `python -m parity int8 --torch KNOB=VALUE` at two sizes, and the faithful side never flagged.

Pieces (parity/int8/pieces.py) are computed on fresh random inputs from fixed seeds: random params, tokens with a
byte 0 in every row, random states, scores with ties and an int32-wrapping difference, random fitness signs.
"""
from __future__ import annotations

import numpy as np
import pytest

import c_int8
from parity.int8.pieces import first_parting, make_case, name_knobs
from spec.int8 import INT8_PRESETS
from spec.int8_knobs import ALL_INT8_KNOBS, INT8_KNOBS, NANO_EGG, int8_profile

REASON = c_int8.unavailable_reason()
needs_c = pytest.mark.skipif(REASON is not None, reason=REASON or "")
SIZES = {"selftest": (INT8_PRESETS["selftest"], 11), "quick": (INT8_PRESETS["quick"], 2 ** 32 - 5)}
SETTINGS = {**{f"{k}={v.egg_c}": NANO_EGG.replace(**{k: v.egg_c}) for k, v in ALL_INT8_KNOBS.items()},
            "egg.c": int8_profile("egg.c"), "egg.c-cpumulti": int8_profile("egg.c-cpumulti")}


class Bench:
    """One size: the case, the C side's signatures (cached per knob setting) and the torch side's pieces."""

    def __init__(self, size: str):
        from parity.int8.reference import lookups
        self.cfg, self.seed = SIZES[size]
        self.case = make_case(self.cfg, self.seed, 3)
        self.lut, self.init_lut = lookups()
        self._c: dict = {}
        self._torch: dict = {}

    def c(self, knobs):
        from parity.int8.c_side import CSide
        if knobs not in self._c:
            self._c[knobs] = CSide(self.cfg, self.seed, self.lut, self.init_lut, knobs).pieces(self.case)
        return self._c[knobs]

    def torch(self, knobs):
        """The torch side's pieces under knobs, computed once per setting (several tests read the same ones)."""
        from parity.int8.torch_side import TorchSide
        if knobs not in self._torch:
            self._torch[knobs] = TorchSide(self.cfg, self.seed, knobs).pieces(self.case)
        return self._torch[knobs]


@pytest.fixture(scope="module", params=list(SIZES))
def bench(request):
    if REASON is not None:
        pytest.skip(REASON)
    return Bench(request.param)


@needs_c
@pytest.mark.parametrize("setting", list(SETTINGS))
def test_torch_knob_equals_the_c_sides_switch_at_every_piece(bench, setting):
    knobs = SETTINGS[setting]
    ours, theirs = bench.torch(knobs), bench.c(knobs)
    assert first_parting(theirs, ours, bench.case.threads) is None
    assert first_parting(bench.c(NANO_EGG), ours, bench.case.threads) is not None     # the departure shows here


@needs_c
@pytest.mark.parametrize("knob", list(INT8_KNOBS))
def test_each_departure_is_named_exactly_by_the_c_sides_signatures(bench, knob):
    knobs = NANO_EGG.replace(**{knob: INT8_KNOBS[knob].egg_c})
    naming = name_knobs(bench.torch(knobs), bench.c, bench.case.threads)
    assert naming.exact and naming.knobs == knobs


@needs_c
def test_the_egg_c_profile_is_named_as_all_seven(bench):
    naming = name_knobs(bench.torch(int8_profile("egg.c")), bench.c, bench.case.threads)
    assert naming.exact and naming.knobs == int8_profile("egg.c")


@needs_c
def test_the_faithful_torch_side_equals_the_c_side_and_names_nothing(bench):
    ours = bench.torch(NANO_EGG)
    assert first_parting(bench.c(NANO_EGG), ours, bench.case.threads) is None
    assert name_knobs(ours, bench.c, bench.case.threads).knobs == NANO_EGG


def test_xorshift_values_are_egg_cs_generator_over_many_seeds():
    import torch
    from tests.c_int8.test_egg_int8 import _xorshift_values as reference     # egg.c's generator, one value at a time
    from torch_impl.int8 import xorshift as int8_xorshift
    seeds = np.random.default_rng(3).integers(0, 2 ** 32, 40, dtype=np.uint64).tolist() + [1, 2 ** 32 - 1]
    got = int8_xorshift.values(torch.tensor(seeds, dtype=torch.int64), 70)
    assert [row.tolist() for row in got] == [reference(s, 70) for s in seeds]


def test_torch_cli_takes_int8_knobs_and_refuses_bad_ones(capsys):
    from torch_impl.__main__ import main
    assert main(["--task", "int8", "--preset", "selftest", "--profile", "egg.c", "--torch", "log2=table"]) == 0
    out = capsys.readouterr().out
    assert "knobs int8_noise=xorshift, vote_threshold=fixed160" in out and "log2=" not in out.split("corpus")[0]
    for argv in (["--torch", "log2=exact"], ["--torch", "noise=xorshift"], ["--profile", "oop-port"]):
        with pytest.raises(SystemExit) as exc:
            main(["--task", "int8", "--preset", "selftest", *argv])
        assert exc.value.code == 2
        assert "error:" in capsys.readouterr().err


# ----------------------------------------------------------------------------- the command, knob by knob
@pytest.fixture(scope="module")
def reference_once():
    """The JAX reference's pieces computed once per configuration, seed, case and platform in this module: every
    command below asks for the same two (one per size), and only the torch side changes between them."""
    from parity.int8.reference import ReferenceSide
    pieces, memo = ReferenceSide.pieces, {}

    def once(self, case, log=lambda s: None):
        key = (self.cfg, self.seed, self.platform, case.epoch, case.trajectory_epochs, case.corpus.sha256)
        if key not in memo:
            memo[key] = pieces(self, case, log)
        return dict(memo[key])
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(ReferenceSide, "pieces", once)
        yield memo


@needs_c
@pytest.mark.parametrize("size", list(SIZES))
@pytest.mark.parametrize("setting", [f"{k}={v.egg_c}" for k, v in INT8_KNOBS.items()] + ["egg.c"])
def test_parity_int8_exits_1_and_names_the_knob(size, setting, tmp_path, capsys, reference_once):
    from parity.int8 import cli as int8_cli
    argv = ["--size", size, "--epochs", "2", "--out", str(tmp_path), "--quiet"]
    argv += ["--profile", "egg.c"] if setting == "egg.c" else ["--torch", setting]
    assert int8_cli.main(argv) == 1
    capsys.readouterr()
    torch_row = next(line for line in (tmp_path / "summary.md").read_text().splitlines()
                     if line.startswith("| torch"))
    named = SETTINGS[setting].departures()
    for knob, value in named.items():
        assert f"{knob}={value}: {ALL_INT8_KNOBS[knob].means}" in torch_row
    assert "the C side with exactly these knobs reproduces every piece" in torch_row
    assert torch_row.count("=") - torch_row.split("|")[2].count("=") >= len(named)
