"""spec.int8_knobs: the knob table, profiles and KNOB=VALUE parsing say what is wrong and what would be right."""
from __future__ import annotations

import pytest

from spec.int8_knobs import (ALL_INT8_KNOBS, INT8_KNOBS, INT8_PROFILES, NANO_EGG, Int8KnobError, Int8Knobs,
                             as_int8_knobs, int8_profile, parse_int8_knobs)


def test_defaults_are_nano_egg_and_the_egg_c_profile_departs_in_all_seven():
    assert NANO_EGG.departures() == {}
    assert int8_profile("egg.c").departures() == {k: v.egg_c for k, v in INT8_KNOBS.items()}
    assert set(int8_profile("egg.c-cpumulti").departures()) == set(ALL_INT8_KNOBS)
    assert set(INT8_PROFILES) == {"nano-egg", "egg.c", "egg.c-cpumulti"}


def test_parse_applies_overrides_on_a_profile():
    k = parse_int8_knobs(["log2=mitchell", "state_reset=never"])
    assert k.departures() == {"log2": "mitchell", "state_reset": "never"}
    assert parse_int8_knobs(["log2=table"], profile="egg.c").departures() == {
        n: v.egg_c for n, v in INT8_KNOBS.items() if n != "log2"}
    assert as_int8_knobs({"evolving": "matrices"}) == Int8Knobs(evolving="matrices")
    assert as_int8_knobs("egg.c") == int8_profile("egg.c") and as_int8_knobs(None) == NANO_EGG


@pytest.mark.parametrize("pairs, message", [
    (["noise=xorshift"], "unknown int8 knob 'noise'"),
    (["int8_noise=gaussian"], "use table \\(nano-egg\\) or xorshift \\(egg.c\\)"),
    (["int8_noise"], "is not KNOB=VALUE"),
    (["=x"], "is not KNOB=VALUE"),
])
def test_bad_knobs_are_refused_with_what_would_be_right(pairs, message):
    with pytest.raises(Int8KnobError, match=message):
        parse_int8_knobs(pairs)


def test_unknown_profile_lists_the_known():
    with pytest.raises(Int8KnobError, match="known: nano-egg, egg.c, egg.c-cpumulti"):
        int8_profile("eggc")
