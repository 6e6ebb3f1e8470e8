"""spec.knob: the CartPole, tree and int8 knob tables are one type, and parse, resolve and the drift listing behave
alike on each: a fresh value sets that knob alone and is listed as its one drift; a bad one is refused in the table's
own words, naming what is known."""
import dataclasses
import pickle

import pytest

from spec.int8_knobs import INT8, NANO_EGG, Int8KnobError, Int8Knobs, parse_int8_knobs
from spec.knob import Knob, KnobError, KnobTable, KnobValues
from spec.knobs import CARTPOLE, RUN, Knobs, RunSettings, drifts, resolve
from spec.tree_knobs import TREE, TreeKnobs, resolve_tree, tree_drifts

TABLES = {"cartpole": (CARTPOLE, Knobs), "run": (RUN, RunSettings), "tree": (TREE, TreeKnobs),
          "int8": (INT8, Int8Knobs)}
FRESH_NUMBERS = {"noise_reuse": ("3", 3), "lr_decay": ("0.5", 0.5), "sigma_decay": ("1", 1.0)}


def _fresh(knob: Knob) -> list[tuple[str, object]]:
    """(text, value) for every value of a knob other than the reference's."""
    if knob.number is not None:
        return [FRESH_NUMBERS[knob.name]]
    return [(value, value) for value in knob.values[1:]]


@pytest.mark.parametrize("task", TABLES)
def test_every_table_is_a_knob_table_and_its_values_class_has_one_field_per_knob(task):
    table, values_class = TABLES[task]
    assert isinstance(table, KnobTable) and all(isinstance(k, Knob) for k in table.knobs)
    assert values_class.TABLE is table and issubclass(values_class, KnobValues)
    fields = dataclasses.fields(values_class)
    assert [(f.name, f.default) for f in fields] == [(k.name, k.default) for k in table.knobs]
    assert all(k.default == k.values[0] for k in table.knobs if k.number is None)   # the reference's value first
    reference = values_class()
    assert pickle.loads(pickle.dumps(reference)) == reference                       # a spawned worker gets it back
    with pytest.raises(dataclasses.FrozenInstanceError):
        reference.__setattr__(table.names[0], table.knobs[0].default)


@pytest.mark.parametrize("task", ["cartpole", "tree", "int8"])
def test_a_fresh_value_sets_that_knob_alone_and_is_its_one_drift(task):
    table, values_class = TABLES[task]
    reference = values_class()
    for knob in table.knobs:
        for text, value in _fresh(knob):
            assert table.parse(f" {knob.name} = {text} ") == (knob.name, value)
            resolved = table.resolve(reference, None, [f"{knob.name}={text}"])
            assert resolved == reference.replace(**{knob.name: value})
            assert table.drifts(resolved, reference) == {knob.name: (knob.default, value)}
    for name, departures in table.profiles.items():     # a profile sets its knobs; a later assignment wins
        resolved = table.resolve(reference, name)
        assert {k: v for k, (_, v) in table.drifts(resolved, reference).items()} == dict(departures)
        last = table.knobs[-1]
        assert getattr(table.resolve(reference, name, [f"{last.name}={_fresh(last)[0][0]}",
                                                       f"{last.name}={last.default}"]), last.name) == last.default


def test_the_modules_names_are_the_tables_calls():
    assert resolve("oop-port", ["noise_reuse=2"]) == CARTPOLE.resolve(Knobs(), "oop-port", ["noise_reuse=2"])
    assert drifts(resolve("oop-port")) == CARTPOLE.drifts(resolve("oop-port"), Knobs())
    assert resolve("jax", ["activation=relu"], RunSettings(lr_decay=0.5)).lr_decay == 0.5   # a reference's settings
    assert resolve_tree("jax-torchrng", ["leaf_order=insertion"]) == TreeKnobs(rng="torch", leaf_order="insertion")
    assert tree_drifts(TreeKnobs(rng="torch")) == {"rng": ("jax", "torch")}
    assert parse_int8_knobs(["log2=mitchell"], "egg.c") == INT8.resolve(NANO_EGG, "egg.c", ["log2=mitchell"])
    assert parse_int8_knobs(["log2=mitchell"]).departures() == {"log2": "mitchell"}
    assert CARTPOLE.knob("rng") is TREE.knob("rng")                    # the tree's rng is the CartPole knob itself


KNOWN = {task: ", ".join(TABLES[task][0].names) for task in TABLES}
REFUSALS = [
    ("cartpole", "antithetic=sideways", "unknown value 'sideways' for knob 'antithetic'; allowed: interleaved, halves, off"),
    ("cartpole", "antithetics=halves", f"unknown knob 'antithetics'; known knobs: {KNOWN['cartpole']}"),
    ("cartpole", "antithetic", "expected KNOB=VALUE, got 'antithetic' (for example antithetic=halves)"),
    ("cartpole", "=halves", "expected KNOB=VALUE, got '=halves' (for example antithetic=halves)"),
    ("cartpole", "noise_reuse=1.5",
     "knob 'noise_reuse' takes an integer >= 0 (0 = the same noise every epoch), got '1.5'"),
    ("cartpole", "lr_decay=2", "lr_decay must be a multiplicative factor per epoch in (0, 1], got 2.0"),
    ("tree", "stack_keys=maybe", "unknown value 'maybe' for knob 'stack_keys'; allowed: split, shared"),
    ("tree", "antithetic=halves", f"unknown knob 'antithetic' for --task lm; known: {KNOWN['tree']}"),
    ("tree", "stack_keys", "expected KNOB=VALUE, got 'stack_keys' (for example stack_keys=shared)"),
    ("tree", "stack_keys=", "expected KNOB=VALUE, got 'stack_keys=' (for example stack_keys=shared)"),
    ("int8", "int8_noise=gaussian", "int8_noise='gaussian': use table (nano-egg) or xorshift (egg.c)"),
    ("int8", "noise=xorshift", f"unknown int8 knob 'noise'; the int8 knobs: {KNOWN['int8']}"),
    ("int8", "int8_noise", f"'int8_noise' is not KNOB=VALUE; e.g. int8_noise=xorshift (knobs: {KNOWN['int8']})"),
    ("int8", "=x", f"'=x' is not KNOB=VALUE; e.g. int8_noise=xorshift (knobs: {KNOWN['int8']})"),
]


@pytest.mark.parametrize("task, text, message", REFUSALS)
def test_a_bad_assignment_is_refused_in_the_tables_words(task, text, message):
    table, values_class = TABLES[task]
    error = Int8KnobError if task == "int8" else KnobError
    with pytest.raises(error) as parsed:
        table.parse(text)
    with pytest.raises(error) as resolved:
        table.resolve(values_class(), None, ["rng=torch" if task != "int8" else "log2=mitchell", text])
    assert str(parsed.value) == str(resolved.value) == message


@pytest.mark.parametrize("task, message", [
    ("cartpole", "unknown profile 'pytorch'; known profiles: jax, jax-torchrng, oop-port, functional-port"),
    ("tree", "unknown profile 'pytorch' for --task lm; known: jax, jax-torchrng"),
    ("int8", "unknown int8 profile 'pytorch'; known: nano-egg, egg.c, egg.c-cpumulti"),
])
def test_an_unknown_profile_lists_the_known(task, message):
    table, values_class = TABLES[task]
    with pytest.raises(KnobError) as err:
        table.resolve(values_class(), "pytorch")
    assert str(err.value) == message


@pytest.mark.parametrize("task, changes, message", [
    ("cartpole", {"zeta": 1, "alpha": 2}, f"unknown knob(s) alpha, zeta; known knobs: {KNOWN['cartpole']}"),
    ("run", {"fitness": "std"}, f"unknown run setting(s) fitness; run settings: {KNOWN['run']}"),
    ("tree", {"antithetic": "halves"}, f"unknown knob(s) antithetic for a tree model; known: {KNOWN['tree']}"),
    ("int8", {"zeta": 1, "alpha": 2}, f"unknown int8 knob 'zeta'; the int8 knobs: {KNOWN['int8']}"),
])
def test_replace_refuses_an_unknown_knob_and_a_made_value_is_checked(task, changes, message):
    table, values_class = TABLES[task]
    with pytest.raises(KnobError) as err:
        values_class().replace(**changes)
    assert str(err.value) == message
    first = table.knobs[0]
    with pytest.raises(KnobError, match="nano-egg" if task == "int8" else "must be|allowed"):
        values_class(**{first.name: "no such value" if first.number is None else -1})


def test_a_knob_is_either_a_choice_or_a_number_on_a_known_side():
    for bad in (dict(), dict(values=("a",), number=int), dict(values=("a",), side="both"),
                dict(values=("a",), meanings={"b": "not a value"})):
        with pytest.raises(ValueError, match="knob 'k'"):
            Knob("k", **bad)
    assert Knob("k", ("a", "b")).default == "a"
