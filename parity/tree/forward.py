"""The forward check on a declared tree (`--task tree`): the model the user runs, against itself unperturbed.

The oracle needs no model of the suite's own. For member i, the port's population forward with the noise E_i must
equal the port's PLAIN forward of the same model at the materialized parameters theta + E_i (A_i B_i^T at the stored
slice shape on each low-rank leaf, an N-D mm leaf's matrix reshaped row-major to the slice, eps_i on each full-rank
one, on every leaf the port's noise has; nothing on the others), up to float32 rounding. The plain forward is usually
the code the port was ported from (for an nn.Module, torch.func.functional_call: parity.tree.torch_module), which is
rarely where the bug is. No JAX and no reference noise are needed, so the check runs alike draw by draw, in
distribution and against a bundle.

The protocol (optional methods; without them the check is skipped, saying so):
    batch(seed) -> an input the model takes, the same for every member (numpy arrays, or dicts/tuples of them)
    population_forward(params, noise, batch) -> (m, ...)     the port's own perturbed forward for noise's m members
    plain_forward(params, batch) -> (...)                    one set of parameters, no EGGROLL code; float64
                                                             parameters give a float64 evaluation where it can

What runs: on fresh parameters (init_params' values moved by fresh normal noise, so no leaf sits at the init's ones
and zeros) and BATCHES fresh batches, the population forward at two population sizes, the whole population (members
0..N-1, compared at positions 0, 1 and N - 1) and SUBSET members drawn at random in a random order (each compared),
each compared member against the plain forward at theta + E_i; and the subset's call made twice (determinism).
The params the forwards were given must come back bit for bit (a digest of each leaf before and after).

The bound, per member and batch: FORWARD_SPREAD times the plain forward's own float32 rounding at that point,
max |plain32 - plain64| over the output (floored at one float32 ulp of the output's largest entry), against the
float64 evaluation. Why: the population forward evaluates the same composition of float32 operations with, in each
perturbed product, x W^T + (x B) A^T in place of x fl(W + A B^T)^T; the standard bounds of the two forms,
gamma_{in + r + 1} |x| (|W| + |A||B|^T) and gamma_{in + 1} |x| |W + A B^T| + u |x||W|, are within a factor 2 of each
other, so the plain forward's own rounding is the unit of the population's. How far the realized maximum of one
float32 evaluation's error over an output strays from another's is measured: the population's error over the plain
forward's own had median 0.98, 99th percentile 2.8 and maximum 4.7 over 960 members (four GPTs, 30 seeds), and at most
3.4 (0.106 of the bound) over the check's 960 compared members of the faithful examples (module and GPT, low and full
rank, two sizes, 10 seeds each: no false alarm). 32 leaves a margin of 6.8 over the largest seen, while a member whose
noise is mishandled moves the output by sigma-sized amounts: the planted bugs fail by 3.4e3 to 1e6 times the bound
(tests/parity/tree/test_forward.py). A port whose plain forward gives float32 even for float64 parameters is compared with
its float32 plain forward within FALLBACK_ULPS ulps of the output's largest entry (the LM forward's measured
allowance, parity.tree.check.FORWARD_ULPS). The plain forward itself must be deterministic: two calls within
FALLBACK_ULPS ulps, or it is no oracle (dropout left on in the plain model would widen its own spread).

When a member fails, the check localises: the noise is switched on one unit at a time in the model's forward order
(each leaf, a stacked leaf slice by slice; the order the port's module calls its layers where it has one
(parity.tree.hooks), else the tree's declaration order), and a bisection over those prefixes finds the first unit
whose noise the forward mishandles; then it says how, in plain words: none of its noise applied (though the port
hands it out and its gradient uses it), a member's output depending on the other members (alone it is right),
the perturbation at another named scale, the low-rank term summing x and B apart (an einsum's index), transposed,
an N-D leaf's A B^T laid over its axes in another order than its declared row-major matrix (the orders tried: every
permutation of the slice's axes, those keeping the leading axis first tried first), or in another direction; and,
before any of that, whether two calls on the same inputs differ (dropout left on?).
The failing call, with the noise up to that unit, is the check's repro.
"""
from __future__ import annotations

import math
from typing import Any, Callable, NamedTuple

import numpy as np

from parity.core.tolerances import U32, drift_bound
from parity.core.optscale import named_scales as gradient_scales
from parity.core.port import PortError
from parity.tree import hooks
from parity.tree import blocks as B
from parity.tree.base import IN_PLACE, Row
from parity.tree.blocks import laid_out, matricization_words, matricizations
from parity.tree.dist import dense64
from spec.tree import Leaf, slice_index

FORWARD_SPREAD = 32      # allowance in units of the plain forward's own float32 rounding (the docstring: why)
FALLBACK_ULPS = 64       # without a float64 plain forward: ulps of the output's largest entry (check.FORWARD_ULPS)
SUBSET = 3               # members of the second population size, drawn at random
BATCHES = 2              # fresh batches
COMPARED = (0, 1, -1)    # positions compared in the whole population
PARAM_JITTER = 0.5       # fresh parameters: init + this x the leaf's spread x N(0, 1) (0.05 x N(0, 1) on constants)
MODEL = ("population_forward", "plain_forward", "batch")
NO_MODEL = ("the port has no population_forward/plain_forward/batch, so the model it runs is not checked: add them "
            "(docs/ports.md, the forward check) and each member's forward is compared with the plain model at "
            "theta + E_i")


class Unit(NamedTuple):
    """What the localisation switches on at once: a leaf, or one slice of a stacked leaf."""

    path: str
    index: tuple[int, ...] = ()

    @property
    def label(self) -> str:
        return self.path + (f"[{', '.join(map(str, self.index))}]" if self.index else "")


class Plain(NamedTuple):
    """The plain forward at one point: the value compared against (float64 where the port computes it) and the
    allowed max |population - value|."""

    value: np.ndarray
    bound: float
    exact: bool                 # a float64 evaluation (else float32, FALLBACK_ULPS)


class Case(NamedTuple):
    """One population forward: its label, the members (into the run's population) in the order given, the positions
    compared, the batch."""

    label: str
    members: np.ndarray
    positions: tuple[int, ...]
    batch: Any


# ----------------------------------------------------------------------------- the noise, restricted and materialized
def take(noise: dict, rows) -> dict:
    """The noise of the members at `rows` (positions in the noise's member axis)."""
    rows = np.asarray(rows, np.int64)
    return {p: tuple(t[rows] for t in v) if isinstance(v, tuple) else v[rows] for p, v in noise.items()}


def restrict(noise: dict, units) -> dict:
    """The noise with every unit not in `units` zeroed (A's slice, or eps's): the same members and shapes, so the
    port's every perturbed code path still runs, with a zero perturbation where the unit is off."""
    on: dict[str, set] = {}
    for u in units:
        on.setdefault(u.path, set()).add(u.index)
    out = {}
    for path, value in noise.items():
        first = value[0] if isinstance(value, tuple) else value           # (m, *stack, ...): the array to zero
        kept = np.zeros_like(first)
        for index in on.get(path, ()):                                    # a stack's axes lead (declared_run)
            at = (slice(None),) + tuple(index)
            kept[at] = first[at]
        out[path] = (kept, value[1]) if isinstance(value, tuple) else kept
    return out


def perturbation(leaf: Leaf, value, row: int) -> np.ndarray:
    """Member `row`'s perturbation of one leaf at its stored shape, float64 (parity.tree.dist.dense64 of its row)."""
    one = tuple(t[row:row + 1] for t in value) if isinstance(value, tuple) else value[row:row + 1]
    return dense64(leaf, one)[0]


def point(params: dict, tree, noise: dict, row: int, extra: dict | None = None) -> dict:
    """theta + E_row in float64 (plus `extra` {path: float64 perturbation}), every leaf of params."""
    out = {p: np.array(v, np.float64) for p, v in params.items()}          # copies: added to in place
    for path, value in noise.items():
        out[path] += perturbation(tree.leaf(path), value, row)
    for path, d in (extra or {}).items():
        out[path] += d
    return out


def forward_params(side, cfg, seed: int) -> dict:
    """Fresh parameters: init_params(seed) moved by PARAM_JITTER of each leaf's spread (0.05 on a constant leaf), or
    0.1 N(0, 1) at every leaf's shape without init_params."""
    rng = np.random.default_rng([seed, 23])
    if not side.port.has("init_params"):
        return {leaf.path: (rng.standard_normal(leaf.shape) * 0.1).astype(np.float32) for leaf in cfg.tree.leaves}
    out = {}
    for path, v in side.port.init_params(seed).items():
        spread = float(np.std(v)) or 0.05 / PARAM_JITTER
        out[path] = (v + PARAM_JITTER * spread * rng.standard_normal(v.shape)).astype(np.float32)
    return out


def units_in_order(tree, noise: dict, order: list[str] | None = None) -> list[Unit]:
    """The units of the leaves `noise` perturbs, in forward order: `order` (paths in the order the model first uses
    them) where known, else the tree's declaration order with each run of stacked leaves of one stack shape taken
    slice by slice (layer 0's leaves, then layer 1's)."""
    paths = [p for p in (order or []) if p in noise] + [p for p in tree.declared if p in noise and p not in (order or [])]
    units: list[Unit] = []
    run: list[Leaf] = []

    def flush():
        if run:
            units.extend(Unit(leaf.path, idx) for idx in slice_index(run[0]) for leaf in run)
            run.clear()

    for path in paths:
        leaf = tree.leaf(path)
        if not leaf.scan_axes:
            flush()
            units.append(Unit(path))
        else:
            if run and run[0].stack_shape != leaf.stack_shape:
                flush()
            run.append(leaf)
    flush()
    return units


# ----------------------------------------------------------------------------- one member against the plain model
class Judge:
    """The port, the run and the fresh parameters: population forwards and plain forwards, compared."""

    def __init__(self, side, cfg, params: dict):
        self.side, self.port, self.cfg, self.tree, self.params = side, side.port, cfg, cfg.tree, params
        self.members = 0            # members the population forwards evaluated on params (_params_kept_row)

    def plain(self, noise: dict, row: int, batch, extra: dict | None = None) -> Plain:
        """The plain forward at theta + E_row (+ extra): its float64 value where the port gives one, and the bound.
        One point's copies at a time (a GPT-2-sized tree's float64 point is 1 GB)."""
        at64 = point(self.params, self.tree, noise, row, extra)
        y64 = self.port.plain_forward(at64, batch)
        at32 = {p: v.astype(np.float32) for p, v in at64.items()}
        del at64
        y32 = self.port.plain_forward(at32, batch)
        del at32
        if y32.shape != y64.shape:
            raise PortError("plain_forward", f"returned shape {y64.shape} for float64 parameters and {y32.shape} for "
                                             f"float32 ones")
        scale = float(np.max(np.abs(y64))) if y64.size else 0.0
        if y64.dtype != np.float64:
            return Plain(y32.astype(np.float64), max(FALLBACK_ULPS * 2 * U32 * scale, 1e-30), False)
        spread = float(np.max(np.abs(y32.astype(np.float64) - y64))) if y64.size else 0.0
        return Plain(y64, max(FORWARD_SPREAD * max(spread, 2 * U32 * scale), 1e-30), True)

    def population(self, noise: dict, batch) -> np.ndarray:
        out = hooks.population(self.side, self.params, noise, batch)
        self.members += out.shape[0]
        return out

    def ratio(self, out: np.ndarray, plain: Plain) -> float:
        if out.shape != plain.value.shape:
            raise PortError("population_forward", f"a member's outputs have shape {out.shape}; the plain forward's "
                                                  f"are {plain.value.shape}")
        return float(np.max(np.abs(out.astype(np.float64) - plain.value)) / plain.bound) if out.size else 0.0


# ----------------------------------------------------------------------------- the check
def check_forward(side, cfg, seed: int, keep: Callable | None = None) -> list[Row]:
    """Each compared member's population forward against the plain model at theta + E_i (the module's docstring),
    the subset's call repeated; a failure localised to a unit and a kind (localise), its call kept as the repro."""
    if not side.port.has("population_forward"):
        return [Row("forward", "-", float("nan"), "-", "skip", NO_MODEL)]
    rng = np.random.default_rng([seed, 22])
    judge = Judge(side, cfg, forward_params(side, cfg, seed))
    digest = _digests(judge.params)
    pop = cfg.pop
    subset = rng.choice(pop, size=min(SUBSET, pop), replace=False)
    batch_seeds = [int(s) for s in rng.integers(0, 2 ** 31, size=BATCHES)]
    full_noise = side.port.noise(seed, 0, np.arange(pop), pop, cfg.sigma, cfg.rank)
    plain_row = _plain_determinism_row(judge, take(full_noise, [0]), side.port.batch(batch_seeds[0]))
    if plain_row.verdict == "fail":          # the bound is the plain forward's own spread: nothing to judge against
        return [plain_row]
    rows, failures, plains = [plain_row], [], {}
    for b, bseed in enumerate(batch_seeds):
        batch = side.port.batch(bseed)
        cases = [Case(f"population of {pop}", np.arange(pop), tuple(sorted({p % pop for p in COMPARED})), batch),
                 Case(f"{len(subset)} members {list(map(int, subset))}", subset, tuple(range(len(subset))), batch)]
        for case in cases:
            noise = take(full_noise, case.members)
            out = judge.population(noise, batch)
            for pos in case.positions:
                member = int(case.members[pos])
                if (member, b) not in plains:
                    plains[(member, b)] = judge.plain(take(full_noise, [member]), 0, batch)
                plain = plains[(member, b)]
                ratio = judge.ratio(out[pos], plain)
                rows.append(Row("forward", f"{case.label}, batch {b}: member {member}: max |population forward - "
                                           f"plain forward at theta + E_i| / bound", ratio, _allowed(plain),
                                "pass" if ratio <= 1 else "fail"))
                if ratio > 1:
                    failures.append((case, noise, pos, out, plain))
            if case.members is subset and b == 0:
                rows.append(_determinism_row(judge, noise, out, plains[(int(subset[0]), 0)], side, case))
    if failures:
        rows = _explained(rows, judge, failures[0], side, keep)
    return rows + [_params_kept_row(judge, digest, forward_params(side, cfg, seed), full_noise)]


_KEPT = "the params given to population_forward, entries changed by its calls"


def _digests(params: dict) -> dict:
    """A blake2b digest of each leaf's bytes: whether the forward gave its params back bit for bit, without a copy."""
    import hashlib
    return {p: hashlib.blake2b(np.ascontiguousarray(v).tobytes()).digest() for p, v in params.items()}


def _params_kept_row(judge: Judge, digest: dict, fresh: dict, noise: dict) -> Row:
    """The params the population forwards were given must come back bit for bit. A forward that adds each member's
    noise into the weights and subtracts it again leaves them drifted by rounding: moves within drift_bound of the
    members evaluated (|E_n| <= N mean_n |E_n| of the full noise) are named IN_PLACE, larger ones as noise left in
    the weights. fresh: the same params made again (forward_params is deterministic), to count what moved."""
    changed = [p for p, d in _digests(judge.params).items() if d != digest[p]]
    if not changed:
        return Row("forward", _KEPT, 0.0, "== 0 (given back bit for bit)", "pass")
    moved, ratio = {}, 0.0
    for p in changed:
        d = np.abs(np.asarray(judge.params[p], np.float64) - fresh[p])
        moved[p] = (int(np.count_nonzero(d)), float(np.max(d)))
        leaf = judge.tree.leaf(p)
        noise_sum = 0.0 if p not in noise else \
            judge.members * judge.cfg.pop * B.mean_abs(leaf, B.magnitude_of(noise[p]), np.ones(judge.cfg.pop))
        bound = drift_bound(fresh[p], noise_sum, judge.members, judge.cfg.rank)
        ratio = max(ratio, float(np.max(d / np.maximum(bound, 1e-300))))
    where = "; ".join(f"{p}: {moved[p][0]} of {np.size(fresh[p])} entries moved, by up to {moved[p][1]:.3g}"
                      for p in sorted(changed, key=lambda p: -moved[p][0])[:3])
    what = IN_PLACE if ratio <= 1 else "it leaves more than rounding in the weights (noise not removed?)"
    return Row("forward", _KEPT, float(sum(n for n, _ in moved.values())), "== 0 (given back bit for bit)", "fail",
               f"population_forward changes the params it is given: {what} ({where})")



def _bound_words(plain: Plain) -> str:
    return (f"{FORWARD_SPREAD} x the plain forward's own float32 rounding, |plain32 - plain64|" if plain.exact
            else f"{FALLBACK_ULPS} float32 ulps of the output's largest entry: the port's plain forward has no "
                 f"float64 evaluation")


def _allowed(plain: Plain) -> str:
    return f"<= 1 ({_bound_words(plain)})"


def _plain_determinism_row(judge: Judge, noise: dict, batch) -> Row:
    """The plain forward called twice at theta + E_0 in float32: the two must agree within FALLBACK_ULPS float32 ulps
    of the output's largest entry (a reduction whose order varies from call to call, as on a GPU, moves a few; a
    random draw moves entries by their own size), or it cannot be the oracle: its own spread would be the draw's."""
    at32 = {p: v.astype(np.float32) for p, v in point(judge.params, judge.tree, noise, 0).items()}
    first, second = (judge.port.plain_forward(at32, batch).astype(np.float64) for _ in range(2))
    allowed = max(FALLBACK_ULPS * 2 * U32 * float(np.max(np.abs(first))) if first.size else 0.0, 1e-30)
    diff = float(np.max(np.abs(first - second))) if first.size else 0.0
    ok = diff <= allowed
    return Row("forward", "the plain forward, two calls on the same inputs: max |difference| / allowed", diff / allowed,
               f"<= 1 ({FALLBACK_ULPS} float32 ulps of the output's largest entry)", "pass" if ok else "fail",
               "" if ok else f"the plain forward is not deterministic (two calls on the same inputs differ by up to "
                             f"{diff:.3g}: dropout left on in the plain model?), so it cannot be the forward check's "
                             f"oracle; run it in eval mode")


def _determinism_row(judge: Judge, noise: dict, out: np.ndarray, plain: Plain, side, case: Case) -> Row:
    """The subset's population forward called again on the same inputs: the outputs must agree within the plain
    forward's bound at the subset's first member (a faithful forward gives the same bits)."""
    batch = case.batch
    again = judge.population(noise, batch)
    diff = float(np.max(np.abs(again.astype(np.float64) - out))) if out.size else 0.0
    ok = diff <= plain.bound
    why = ""
    if not ok:
        where = hooks.first_nondeterministic(side, judge.params, noise, batch)
        why = (f"the forward is not deterministic: two population forwards on the same inputs differ by up to "
               f"{diff:.3g} (dropout left on while scoring, or another random draw inside the forward?)" +
               (f"; {where}" if where else ""))
    return Row("forward", f"{case.label}: two population forwards on the same inputs, max |difference|", diff,
               f"<= {plain.bound:.3g} (the plain forward's bound)", "pass" if ok else "fail", why)


def _explained(rows: list[Row], judge: Judge, failure, side, keep) -> list[Row]:
    """The failing rows with one cause: the nondeterminism if the determinism row failed, else the localisation of
    the first failure (a row of its own, and its call kept as the repro)."""
    nondeterministic = next((r for r in rows if r.verdict == "fail" and "not deterministic" in r.cause), None)
    if nondeterministic is not None:
        text = nondeterministic.cause
        case, noise, pos, out, plain = failure
        _keep(keep, case, pos, (judge.params, noise, case.batch), out, plain, "a member's forward")
    else:
        found = localise(judge, failure, side)
        text = found.cause
        rows = rows + [Row("forward", f"localised: the first unit whose noise the forward mishandles, in forward "
                                      f"order ({found.order})", found.ratio, "<= 1 with that unit's noise on",
                           "fail", text)]
        _keep(keep, failure[0], failure[2], found.call, found.out, found.plain, f"noise on up to {found.unit}")
    return [r._replace(cause=text) if r.verdict == "fail" and not r.cause else r for r in rows]


def _keep(keep, case: Case, pos: int, args: tuple, out: np.ndarray, plain: Plain, what: str) -> None:
    """The failing population_forward call as the forward check's repro evidence (parity.core.repro.Evidence)."""
    if keep is None:
        return
    from parity.core.repro import Call, Evidence
    ratio = float(np.max(np.abs(out[pos].astype(np.float64) - plain.value)) / plain.bound)
    keep(Evidence("forward", f"{case.label}, position {pos}, {what}", Call("population_forward", args, {}, out),
                  (pos,), np.array(out[pos]), plain.value, np.full(plain.value.shape, plain.bound),
                  _bound_words(plain), ratio))


# ----------------------------------------------------------------------------- localisation
class Found(NamedTuple):
    """Where and how the forward departs: the unit, the cause in words, the failing call and what it gave."""

    unit: str
    cause: str
    ratio: float
    order: str
    call: tuple
    out: np.ndarray
    plain: Plain


def localise(judge: Judge, failure, side) -> Found:
    """Bisect the prefixes of the forward-ordered units (noise on up to unit k, zero after) for the first that fails
    at the failing member, then classify how that unit's noise is mishandled (classify)."""
    case, noise, pos, _, _ = failure
    order = hooks.forward_order(side, judge.params, noise, case.batch)
    units = units_in_order(judge.tree, noise, order)
    how = "the order the module calls its layers" if order else "the tree's declaration order"
    memo: dict[int, tuple] = {}

    def at(k: int) -> tuple:
        if k not in memo:
            restricted = restrict(noise, units[:k])
            out = judge.population(restricted, case.batch)
            plain = judge.plain(restricted, pos, case.batch)
            memo[k] = (judge.ratio(out[pos], plain), restricted, out, plain)
        return memo[k]

    if at(0)[0] > 1:
        ratio, restricted, out, plain = at(0)
        return Found("(no noise)", "the population forward differs from the plain model even with every perturbation "
                     f"zero ({ratio:.3g} x the bound): the two do not compute the same model (state left from an "
                     f"earlier call, another architecture, or training-mode layers?)", ratio, how,
                     (judge.params, restricted, case.batch), out, plain)
    lo, hi = 0, len(units)      # at(lo) passes, at(hi) fails (every unit on: the failing call itself)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if at(mid)[0] > 1 else (mid, hi)
    unit = units[hi - 1]
    ratio, restricted, out, plain = at(hi)
    text = classify(judge, case, pos, units[:hi - 1], unit, at(hi - 1), at(hi))
    member = int(case.members[pos])
    leaf = f"{unit.label} ({judge.tree.leaf(unit.path).cls})"
    said = (f"once the noise of {leaf} is on (the members' inputs differ from there), {text}" if text.startswith("a "
            "member's output depends") else f"the forward mishandles the noise of {leaf}: {text}")
    return Found(unit.label, f"{said} (member {member}, {case.label}; {ratio:.3g} x the bound)", ratio, how,
                 (judge.params, restricted, case.batch), out, plain)


def other_matricization(leaf: Leaf, M: np.ndarray, matches: Callable[[np.ndarray], bool]) -> str:
    """Words for the order the forward lays the matrix M (*stack, a, b) over the slice's axes in, where one other
    than the declared row-major one matches it (matches(E) on a perturbation at the stored shape), else ''."""
    for perm in matricizations(leaf.slice_shape):
        if matches(laid_out(M, leaf.slice_shape, perm)):
            return matricization_words(leaf.slice_shape, leaf.matrix, perm)
    return ""


def named_scales(cfg) -> dict[str, float]:
    """The factors a perturbation's scale is read as: the gradient's vocabulary (parity.core.optscale, in sigma, N and
    r) and the ones a perturbation has besides (the opposite sign, sqrt(2), r)."""
    out = {**gradient_scales(cfg.sigma, cfg.pop, cfg.rank), "-1 (the opposite sign)": -1.0, "sqrt(2)": math.sqrt(2),
           "1/sqrt(2)": 1 / math.sqrt(2), "r": float(cfg.rank), "1/r": 1 / cfg.rank}
    return {k: v for k, v in out.items() if abs(v - 1) > 1e-9}


def classify(judge: Judge, case: Case, pos: int, before, unit: Unit, passing: tuple, failing: tuple) -> str:
    """How the forward mishandles `unit`'s noise, with the units `before` it on: in the order of the kinds' list in
    the module's docstring, each verified by a forward within the bound."""
    _, _, _, plain_before = passing
    _, restricted, out, plain_on = failing
    y = out[pos].astype(np.float64)
    if np.max(np.abs(y - plain_before.value)) <= plain_before.bound:
        return "the forward applies none of its noise, though the port hands it out (and its gradient uses it)"
    if len(case.members) > 1:
        alone = judge.population(take(restricted, [pos]), case.batch)
        if judge.ratio(alone[0], plain_on) <= 1:
            return (f"a member's output depends on the other members' inputs: member {int(case.members[pos])} alone "
                    f"matches the plain model at theta + E_i, among {len(case.members)} members it does not (member "
                    f"0's input used for every member?)")
    leaf = judge.tree.leaf(unit.path)
    value = restrict(restricted, [unit])[unit.path]
    E = perturbation(leaf, value, pos)                                 # the unit's own perturbation, float64
    d_pop, d_ref = (y - plain_before.value).ravel(), (plain_on.value - plain_before.value).ravel()
    c = float(d_pop @ d_ref / max(float(d_ref @ d_ref), 1e-300))
    cosine = float(d_pop @ d_ref / max(np.linalg.norm(d_pop) * np.linalg.norm(d_ref), 1e-300))
    before_noise = restrict(restricted, before)

    def matches(extra: np.ndarray) -> bool:
        plain = judge.plain(before_noise, pos, case.batch, {unit.path: extra})
        return float(np.max(np.abs(y - plain.value))) <= plain.bound

    for name, v in named_scales(judge.cfg).items():
        if abs(c / v - 1) < 0.1 and matches(v * E):
            return f"its perturbation is applied at {name} times its scale ({v:.6g}x)"
    if leaf.cls in ("mm", "tmm"):
        M = E.reshape(leaf.stack_shape + leaf.factor_dims)          # the matrix A B^T (an N-D slice: its declared one)
        summed = np.broadcast_to(M.sum(axis=-1 if leaf.cls == "mm" else -2, keepdims=True), M.shape)
        if matches(np.array(summed).reshape(E.shape)):
            return ("its low-rank term sums x and B over the input separately (an einsum naming their input index "
                    "differently): the forward applies A B^T 1 1^T, the all-ones direction")
        if M.shape[-1] == M.shape[-2] and matches(np.swapaxes(M, -1, -2).reshape(E.shape)):
            return "its perturbation is applied transposed: (A B^T)^T in place of A B^T"
        if leaf.matrix is not None:
            order = other_matricization(leaf, M, matches)
            if order:
                return order
    if abs(cosine) > 0.999 and matches(c * E):
        return f"its perturbation is applied at {c:.4g} times its scale"
    return (f"its perturbation is applied in another direction or scale: the output moves {abs(c):.3g}x as far "
            f"as the plain model's at theta + E_i, at cosine {cosine:.3g} with it")
