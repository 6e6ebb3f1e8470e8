"""Timing: run a callable after a warm-up, collect per-call wall times, summarise as quantiles."""
from __future__ import annotations

import functools
import time
from typing import Callable, NamedTuple, Sequence

import numpy as np


def torch_sync(device) -> Callable[[object], object]:
    """Wait for queued CUDA work on `device` (a no-op on the CPU, where torch calls return finished)."""
    def sync(out):
        if device.type == "cuda":
            import torch

            torch.cuda.synchronize(device)
        return out
    return sync


class Timing(NamedTuple):
    """Per-call wall times in seconds (warm-up excluded) of one measured callable."""

    seconds: tuple[float, ...]

    @property
    def median_s(self) -> float:
        return float(np.median(self.seconds))


class Summary(NamedTuple):
    """Median and 10th/90th percentiles of one measure over the repeats."""

    median: float
    p10: float
    p90: float


def quantiles(values: Sequence[float]) -> Summary:
    """Median, p10 and p90 of a sample (linear interpolation between order statistics)."""
    v = np.asarray(values, dtype=np.float64)
    if v.size == 0 or not np.all(np.isfinite(v)):
        raise ValueError(f"need a non-empty sample of finite values, got {values!r}")
    p10, med, p90 = np.percentile(v, [10, 50, 90])
    return Summary(float(med), float(p10), float(p90))


def time_calls(
    fn: Callable[[], object],
    sync: Callable[[object], object] = lambda out: out,
    *,
    warmup: int = 2,
    repeats: int = 10,
    budget_s: float | None = None,
    min_repeats: int = 3,
) -> Timing:
    """Time `fn()` followed by `sync(result)` (block_until_ready / cuda sync) per call.

    `warmup` calls run first and are discarded (compilation, allocator warm-up). Then up to
    `repeats` timed calls; with `budget_s`, timing stops early once the budget is spent and at
    least `min_repeats` calls were timed, so a slow configuration cannot blow the run's budget.
    """
    if repeats < 1 or warmup < 0 or min_repeats < 1:
        raise ValueError(f"need repeats >= 1, warmup >= 0, min_repeats >= 1; got {repeats}, {warmup}, {min_repeats}")
    for _ in range(warmup):
        sync(fn())
    times: list[float] = []
    start = time.perf_counter()
    for _ in range(repeats):
        t0 = time.perf_counter()
        sync(fn())
        times.append(time.perf_counter() - t0)
        if budget_s is not None and len(times) >= min_repeats and time.perf_counter() - start > budget_s:
            break
    return Timing(tuple(times))


def rate_summary(timing: Timing, work: float) -> Summary:
    """Throughput (`work` units per second) quantiles: computed per call, then summarised."""
    return quantiles([work / s for s in timing.seconds])


def ms_summary(timing: Timing) -> Summary:
    """Per-call time quantiles in milliseconds."""
    return quantiles([1e3 * s for s in timing.seconds])


def paired_ratio(base: Timing, other: Timing) -> Summary:
    """Quantiles of other's time / base's time, round by round (base's speed over other's, > 1: base faster).

    Both must come from one round-robin run (call i of each in round i): a ratio taken within a round
    cancels what the machine did between rounds, which the ratio of two medians does not.
    """
    if len(base.seconds) != len(other.seconds):
        raise ValueError(f"paired timings need the same rounds, got {len(base.seconds)} and {len(other.seconds)}")
    return quantiles([o / b for b, o in zip(base.seconds, other.seconds)])


@functools.lru_cache(maxsize=64)
def _median_rank(n: int, level: float) -> int:
    """The largest l with P(Binomial(n, 1/2) <= l - 1) <= (1 - level) / 2, or 0."""
    from scipy.stats import binom

    ks = np.arange(1, n // 2 + 1)
    ok = ks[binom.cdf(ks - 1, n, 0.5) <= (1.0 - level) / 2.0]
    return int(ok.max()) if ok.size else 0


def median_ci(values: Sequence[float], level: float = 0.95) -> tuple[float, float]:
    """Distribution-free confidence interval of the median: the order statistics (l, n + 1 - l) with the
    largest l such that P(Binomial(n, 1/2) < l) <= (1 - level) / 2. Needs n >= 6 for 95%; smaller samples
    get the full range (an interval that cannot be narrowed honestly)."""
    v = np.sort(np.asarray(values, dtype=np.float64))
    n = v.size
    if n == 0:
        raise ValueError("need at least one value")
    l = _median_rank(n, level)                   # 1-based rank of the lower bound; 0: none qualifies
    if l == 0:
        return float(v[0]), float(v[-1])
    return float(v[l - 1]), float(v[n - l])


class Skipped(NamedTuple):
    """A case that was not timed, and why (said in the report)."""

    reason: str


def _warm_up(fn, sync, warmup: int, max_call_s: float, first_limit: float) -> tuple[float, float]:
    """Call `fn` `warmup` times (at least once); returns (first call's seconds, the last call's seconds).

    The first call may include compilation: if it alone is slow, one more call tells compilation from a slow
    case (unless it is slow beyond any compile time). Stops early once a call is over its limit.
    """
    calls, i, first, steady = max(warmup, 1), 0, 0.0, 0.0
    while i < calls:
        t0 = time.perf_counter()
        sync(fn())
        took = time.perf_counter() - t0
        if i == 0:
            first = took
            if took > max_call_s and calls == 1 and took < first_limit:
                calls = 2
        steady = took
        if took > (first_limit if i == 0 else max_call_s):
            break
        i += 1
    return first, steady


def _rounds(live: dict, steady_s: dict[str, float], repeats: int, budget_s: float, min_repeats: int,
            rewarm_below_s: float) -> dict[str, Timing]:
    """Timed rounds over the live cases, the order rotating each round (call i of every case is in round i)."""
    times: dict[str, list[float]] = {name: [] for name in live}
    order = list(live)
    start = time.perf_counter()
    for rnd in range(repeats):
        shift = rnd % max(len(order), 1)
        for name in order[shift:] + order[:shift]:
            fn, sync = live[name]
            if steady_s[name] < rewarm_below_s:
                sync(fn())                      # untimed: this case's own data back in cache
            t0 = time.perf_counter()
            sync(fn())
            times[name].append(time.perf_counter() - t0)
        if rnd + 1 >= min_repeats and time.perf_counter() - start > budget_s:
            break
    return {name: Timing(tuple(ts)) for name, ts in times.items()}


def time_round_robin(
    cases: dict[str, tuple[Callable[[], object], Callable[[object], object]]],
    *,
    warmup: int = 2,
    repeats: int = 10,
    budget_s: float = 5.0,
    min_repeats: int = 3,
    max_call_s: float = float("inf"),
    max_first_call_s: float | None = None,
    rewarm_below_s: float = 0.0,
) -> tuple[dict[str, Timing | Skipped], dict[str, float]]:
    """Time several callables in turns (a, b, c, then b, c, a, ...) so background load hits all alike.

    The order rotates each round, so every case follows every other equally often. A case whose steady
    call is faster than `rewarm_below_s` makes one untimed call at the start of its turn, so the timed call
    finds its own data in cache after the other cases ran (as in a rollout, where the same params and
    noise serve every step) rather than paying for their evictions. Call i of every case is in round i
    (see paired_ratio).

    Each (fn, sync) pair is first called `warmup` times (the first call's time is returned as its
    compile/first-call time); a case whose warm-up call takes longer than `max_call_s` is skipped
    (the first call, which may compile, may take up to `max_first_call_s`, default 20 x max_call_s).
    Timed rounds continue until `repeats` rounds or, once `min_repeats` rounds are done, until
    `budget_s` seconds of timed rounds have passed.
    """
    first_limit = 20 * max_call_s if max_first_call_s is None else max_first_call_s
    first_call: dict[str, float] = {}
    steady_s: dict[str, float] = {}
    live: dict[str, tuple[Callable[[], object], Callable[[object], object]]] = {}
    result: dict[str, Timing | Skipped] = {}
    for name, (fn, sync) in cases.items():
        try:
            first_call[name], steady = _warm_up(fn, sync, warmup, max_call_s, first_limit)
        except (RuntimeError, MemoryError) as err:   # e.g. out of memory on a large population
            result[name] = Skipped(f"failed: {type(err).__name__}: {str(err).splitlines()[0][:120]}")
            continue
        if steady > max_call_s:
            result[name] = Skipped(f"one call took {steady:.2f} s (> {max_call_s:g} s per call allowed)")
            continue
        live[name], steady_s[name] = (fn, sync), steady
    result.update(_rounds(live, steady_s, repeats, budget_s, min_repeats, rewarm_below_s))
    return result, first_call
