"""The integer EGGROLL's drift knobs: egg.c's departures from nano-egg, one knob per aspect (issue 21 item 5).

Every knob's first value is nano-egg's (the faithful side), its second egg.c's (ljubomirj/egg.c
`full_trained_egg-cpumulti.c` and d0rc/egg.c `full_trained_egg.c`, read for facts). spec/int8.py states nano-egg's
math; the lines here state what each departure changes, in the words the parity report and the gap study use. The
torch int8 port and the C side implement every knob (one place per side); the JAX reference is nano-egg only. `INT8` is
the table (a spec.knob.KnobTable, the one knob type's), `Int8Knobs` its values class.

    int8_noise=xorshift      a matrix's factors from xorshift32 (x ^= x << 13; x ^= x >> 17; x ^= x << 5), A first, each
                             value (+1 if bit 0 else -1) * ((r >> 1) & 31), seeded step_seed + pair + 100 l + k (Wf 1,
                             Uf 2, Wh 3, Uh 4, mlp.0 5, mlp.1 6; the head step_seed + pair + 999), step_seed = base ^
                             (epoch * 0x9e3779b9) with base the run's seed (egg.c: time(NULL)); the member's sign on A.
                             Leaves egg.c never perturbs (embedding, biases, norm weights) keep the table's noise.
    vote_threshold=fixed160  +1 where Z > 160, -1 where Z < -160, saturating (no schedule; Z = 0 never moves)
    evolving=matrices        embedding, biases and norm weights: no noise, no update
    out_shift=fixed          x W^T >> 8 (in = d) or >> 9 (in = 4 d) in place of // (16 isqrt(in))
    ln_division=trunc        clip((x w) / mean), C's truncating division, mean = max(sum |x|, 1) / d, a zero mean 1
    log2=mitchell            ll = z[target] - (16 k + f - 64), k the leading bit of sum EXP2[z] and f its next 4 bits
                             (linear mantissa), of the sum itself (nano-egg: LOG2[sum - 1])
    state_reset=never        the recurrent state is never zeroed

Two structural switches follow egg.c's portable cpumulti file beyond the issue's seven aspects (INT8_STRUCTURE,
profile "egg.c-cpumulti" = "egg.c" plus both): gate_clip=nested (a gate is clip(clip(W x + U s) + bias)) and mlp=off
(no ln2 and no MLP in the forward; the MLP matrices are still noised and voted on). In egg.c's own run the biases
are 0 and frozen, so gate_clip=nested changes nothing there; it shows only with evolving=all.

Not knobs: egg.c's init (one xorshift32 stream from 42) and its data layout (pair p reads its own offset) are
functions of the C side (c_int8.xorshift_init_params, rollout.int8_data.egg_c_*, c_int8.train_egg_c), with which
profile egg.c-cpumulti reproduces full_trained_egg-cpumulti.c's program bit for bit (tests/c_int8/test_egg_c_conformance.py,
ljubomirj/egg.c fdef754, its portable scalar path). egg.c's AVX2 path (its Linux amd64 build target) sums |x| in the
layer norm as unsigned bytes (_mm256_sad_epu8: a negative x counts 256 + x), a different function, not modelled.

d0rc/egg.c `full_trained_egg.c` (b48ac38; the same file as ljubomirj/egg.c's own full_trained_egg.c, Apple NEON only)
agrees with the cpumulti file on vote_threshold, evolving, out_shift, ln_division, log2, state_reset, gate_clip,
the init and the data layout, and departs in two: its noise generator draws four more xorshift32 values (unused)
before each block of 16 values, so its factors are another stream than int8_noise=xorshift's; and it runs ln2 and
the MLP (mlp=on: expand >> 8, project >> 9, a residual add).
"""
from __future__ import annotations


from spec.knob import Knob, KnobError, KnobTable, KnobValues, Words


class Int8Knob(Knob):
    """A knob of two values, nano-egg's (the reference's) and egg.c's, and what egg.c's does, in a line."""

    @property
    def nano_egg(self) -> str:
        return self.values[0]

    @property
    def egg_c(self) -> str:
        return self.values[1]

    @property
    def means(self) -> str:
        return self.meanings[self.egg_c]


def _departures(table: dict[str, tuple[str, str, str]]) -> dict[str, Int8Knob]:
    """{knob: Int8Knob} from {knob: (nano-egg's value, egg.c's value, what egg.c's value does)}."""
    return {name: Int8Knob(name, (nano_egg, egg_c), meanings={egg_c: means})
            for name, (nano_egg, egg_c, means) in table.items()}


INT8_KNOBS: dict[str, Int8Knob] = _departures({  # knob: (nano-egg's value, egg.c's value, what egg.c's does)
    "int8_noise": ("table", "xorshift",
                   "matrix factors from xorshift32 (sign(bit 0) * U{0..31}, A first, seeds step_seed + pair + "
                   "100 l + k) in place of nano-egg's normal table windows"),
    "vote_threshold": ("ztest", "fixed160",
                       "a fixed vote threshold |Z| > 160 in place of the decaying z-test "
                       "(most entries move every epoch)"),
    "evolving": ("all", "matrices",
                 "only the matrices evolve: embedding, biases and norm weights get no noise and no update"),
    "out_shift": ("sqrt", "fixed",
                  "products shifted right by 8 (in = d) or 9 (in = 4 d) in place of // (16 isqrt(in))"),
    "ln_division": ("floor", "trunc",
                    "the layer norm divides by truncation (a zero mean becomes 1) in place of nano-egg's floor table"),
    "log2": ("table", "mitchell",
             "the loss's log2 by Mitchell's linear mantissa in place of the LOG2 table"),
    "state_reset": ("on_zero", "never",
                    "the recurrent state is never reset (nano-egg zeroes it before input byte 0)"),
})
# egg.c's structure beyond the seven aspects (its portable full_trained_egg-cpumulti.c), for conformance runs
INT8_STRUCTURE: dict[str, Int8Knob] = _departures({  # knob: (nano-egg's value, egg.c's value, what egg.c's does)
    "gate_clip": ("once", "nested", "a gate is clip(clip(W x + U s) + bias) in place of one clipped sum"),
    "mlp": ("on", "off", "no ln2 and no MLP in the forward (the MLP matrices are still noised and voted on)"),
})
ALL_INT8_KNOBS: dict[str, Int8Knob] = {**INT8_KNOBS, **INT8_STRUCTURE}

INT8_PROFILES: dict[str, dict[str, str]] = {
    "nano-egg": {},
    "egg.c": {k.name: k.egg_c for k in INT8_KNOBS.values()},
    "egg.c-cpumulti": {k.name: k.egg_c for k in ALL_INT8_KNOBS.values()},
}


class Int8KnobError(KnobError):
    """An unknown int8 knob, value or profile (the message lists what is known)."""


INT8 = KnobTable(tuple(ALL_INT8_KNOBS.values()), INT8_PROFILES, Words(
    not_assignment="{text!r} is not KNOB=VALUE; e.g. int8_noise=xorshift (knobs: {known})",
    unknown_knob="unknown int8 knob {name!r}; the int8 knobs: {known}",
    unknown_knobs="unknown int8 knob {name!r}; the int8 knobs: {known}",
    unknown_profile="unknown int8 profile {name!r}; known: {known}",
    bad_value="{name}={value!r}: use {knob.nano_egg} (nano-egg) or {knob.egg_c} (egg.c)", error=Int8KnobError))


class _Int8Knobs(KnobValues):
    """What Int8Knobs add to the table's values: the departures by name."""

    def departures(self) -> dict[str, str]:
        """{knob: value} for every aspect that is egg.c's, in the table's order."""
        return {name: value for name, (_, value) in INT8.drifts(self, type(self)()).items()}

    def is_egg_c(self, knob: str) -> bool:
        return getattr(self, knob) == ALL_INT8_KNOBS[knob].egg_c


Int8Knobs = INT8.values_class("Int8Knobs", __name__, "One value per aspect; the defaults are nano-egg's (the faithful "
                              "side).", base=_Int8Knobs)
NANO_EGG = Int8Knobs()


def evolves(cls: str, knobs: Int8Knobs) -> bool:
    """Whether a leaf of class cls (spec.int8.LEAF_CLASSES) takes noise and votes: every leaf (nano-egg), or only the
    matrices ("mm": not the embedding, biases or norm weights) under evolving=matrices."""
    return knobs.evolving == "all" or cls == "mm"


def table_noise(cls: str, knobs: Int8Knobs) -> bool:
    """Whether an evolving leaf's noise comes from nano-egg's table: always, except egg.c's matrices under
    int8_noise=xorshift (the leaves egg.c never perturbs keep the table's noise)."""
    return knobs.int8_noise == "table" or cls != "mm"


def int8_profile(name: str) -> Int8Knobs:
    """The knobs of a named profile (nano-egg, egg.c, egg.c-cpumulti); Int8KnobError for another name."""
    return INT8.resolve(NANO_EGG, name)


def parse_int8_knobs(pairs: list[str] | tuple[str, ...] = (), profile: str | None = None) -> Int8Knobs:
    """A profile (default nano-egg) with KNOB=VALUE overrides applied; Int8KnobError says what is wrong and what
    would be right."""
    return INT8.resolve(NANO_EGG, profile or None, pairs)


def as_int8_knobs(knobs: "Int8Knobs | dict | str | None") -> Int8Knobs:
    """Int8Knobs from Int8Knobs, {knob: value}, a profile name, or None (nano-egg)."""
    if knobs is None:
        return NANO_EGG
    if isinstance(knobs, Int8Knobs):
        return knobs
    if isinstance(knobs, str):
        return int8_profile(knobs)
    return NANO_EGG.replace(**dict(knobs))
