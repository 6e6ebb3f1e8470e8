"""One knob type for every task: a `Knob` is one named way a port may depart from the reference (its values, what
each means, the reference's value, the side that obeys it), and a `KnobTable` is a task's knobs and profiles with the
one parse (`KNOB=VALUE`), resolve (a profile, then the assignments) and drift listing every task uses.

The tables: `spec.knobs.CARTPOLE` (the MLP's knobs; `RUN`, its run settings), `spec.tree_knobs.TREE` (tree models)
and `spec.int8_knobs.INT8` (egg.c's departures from nano-egg). `KnobTable.values_class` makes the frozen dataclass a
port is configured by (Knobs, RunSettings, TreeKnobs, Int8Knobs): one field per knob, the reference's value by
default, each value checked when it is made. A table's `Words` are the messages its command lines have always printed.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Callable, ClassVar, Iterable, Mapping, NamedTuple, NoReturn

SIDES = ("port", "run")     # port: only a port has the knob; run: the reference run's own setting, both sides obey it


class KnobError(ValueError):
    """A knob, value or profile that does not exist; the message says what would be right."""


@dataclass(frozen=True)
class Knob:
    """One knob: its values (the reference's first), what a value means where that is written, what the knob is in
    the verdicts' words, and the side that obeys it. A numeric knob has no values: its type, what a valid value is
    (`valid`, and the test `accepts`) and the reference's value (`default`)."""

    name: str
    values: tuple[str, ...] = ()
    about: str = ""
    meanings: Mapping[str, str] = field(default_factory=dict, hash=False)    # a dict: hashed on the rest
    side: str = "port"
    number: type | None = None
    valid: str = ""
    accepts: Callable[[Any], bool] | None = None
    default: Any = None

    def __post_init__(self) -> None:
        if self.side not in SIDES or bool(self.values) == (self.number is not None) or not set(self.meanings) <= set(
                self.values):
            raise ValueError(f"knob {self.name!r}: a side of {SIDES}, and either values (each meaning one of them) "
                             "or a number type")
        if self.values:
            object.__setattr__(self, "default", self.values[0])


class Words(NamedTuple):
    """A table's messages, str.format templates over name, value, text, names, known, allowed and knob (the Knob):
    each table keeps the words its command lines have always printed; the error is the table's exception type."""

    not_assignment: str
    unknown_knob: str
    unknown_knobs: str
    unknown_profile: str
    bad_value: str = "unknown value {value!r} for knob {name!r}; allowed: {allowed}"
    not_a_number: str = "knob {name!r} takes {knob.valid}, got {text!r}"
    out_of_range: str = "{name} must be {knob.valid}, got {value!r}"
    error: type[KnobError] = KnobError


@dataclass(frozen=True)
class KnobTable:
    """A task's knobs (their order is the values class's fields and every listing's), its profiles (name -> the
    knobs it sets, in the order they are set; the first is the default profile) and its words."""

    knobs: tuple[Knob, ...]
    profiles: Mapping[str, Mapping[str, Any]]
    words: Words

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(k.name for k in self.knobs)

    def fail(self, template: str, **fields: Any) -> NoReturn:
        """Raise the table's error with one of its templates filled (`known`: the knob names unless given)."""
        raise self.words.error(template.format(**{"known": ", ".join(self.names), **fields}))

    def knob(self, name: str) -> Knob:
        """The knob called `name`, or the table's error listing the known knobs."""
        for knob in self.knobs:
            if knob.name == name:
                return knob
        self.fail(self.words.unknown_knob, name=name)

    def check(self, name: str, value: Any) -> None:
        """Raise the table's error if `value` is not one knob `name` takes."""
        knob = self.knob(name)
        if knob.number is None and value not in knob.values:
            self.fail(self.words.bad_value, name=name, value=value, knob=knob, allowed=", ".join(knob.values))
        if knob.number is not None and not knob.accepts(value):
            self.fail(self.words.out_of_range, name=name, value=value, knob=knob)

    def parse(self, text: str) -> tuple[str, Any]:
        """One `KNOB=VALUE` string -> (knob, value), or the table's error saying what was wrong and what is known."""
        name, sep, value = (part.strip() for part in text.partition("="))
        if not (sep and name and value):
            self.fail(self.words.not_assignment, text=text)
        return name, self.parse_value(name, value)

    def parse_value(self, name: str, text: str) -> Any:
        """The value the text of `KNOB=VALUE` gives knob `name` (a number for a numeric knob), or the table's error."""
        knob = self.knob(name)
        if knob.number is None:
            self.check(name, text)
            return text
        try:
            value = knob.number(text)
        except ValueError:
            self.fail(self.words.not_a_number, name=name, text=text, knob=knob)
        self.check(name, value)
        return value

    def resolve(self, start: KnobValues, profile: str | None = None, assignments: Iterable[str] = ()) -> Any:
        """`start` (the reference's values) with the profile's knobs set (the first profile by default), then each
        `KNOB=VALUE` in order (a later one wins)."""
        profile = next(iter(self.profiles)) if profile is None else profile
        if profile not in self.profiles:
            self.fail(self.words.unknown_profile, name=profile, known=", ".join(self.profiles))
        values = start.replace(**self.profiles[profile])
        for text in assignments:
            name, value = self.parse(text)
            values = values.replace(**{name: value})
        return values

    def drifts(self, values: Any, reference: Any) -> dict[str, tuple[Any, Any]]:
        """The knobs on which `values` departs from `reference`: name -> (reference value, this value), in order."""
        return {name: (getattr(reference, name), getattr(values, name)) for name in self.names
                if getattr(values, name) != getattr(reference, name)}

    def values_class(self, name: str, module: str, doc: str, base: type | None = None) -> type:
        """A frozen dataclass (subclassing `base`, a KnobValues) with one field per knob at the reference's value."""
        fields = [(k.name, k.number or str, field(default=k.default)) for k in self.knobs]
        cls = dataclasses.make_dataclass(name, fields, bases=(base or KnobValues,), frozen=True,
                                         namespace={"__doc__": doc, "TABLE": self})
        cls.__module__ = module      # where it is bound, so a pickled one (a spawned worker's) finds its class
        return cls


class KnobValues:
    """What every table's values class does: check each value when made, and `replace` only known knobs."""

    TABLE: ClassVar[KnobTable]

    def __post_init__(self) -> None:
        for name in self.TABLE.names:
            self.TABLE.check(name, getattr(self, name))

    def replace(self, **changes: Any) -> Any:
        unknown = [name for name in changes if name not in self.TABLE.names]
        if unknown:
            self.TABLE.fail(self.TABLE.words.unknown_knobs, names=", ".join(sorted(unknown)), name=unknown[0])
        return dataclasses.replace(self, **changes)
