"""Speed on a busy machine: each forward at the goal size timed alone, then beside CPU-bound competitors.

Each implementation runs in a fresh child process (`python -m bench.busy --probe IMPL`), so an OpenMP setting
applies from the start: `torch_impl` as it ships (torch_impl sets OMP_WAIT_POLICY=PASSIVE before torch loads),
`torch_impl_spinning` with OMP_WAIT_POLICY=ACTIVE (torch's threads spin while they wait, the behaviour before
the fix), and `jax_reference`. The competitors are `cores + 1` processes spinning in Python; each stops by
itself after a bounded time and all are killed when the section ends.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from typing import NamedTuple

import numpy as np

PROBES = {"torch_impl": {}, "torch_impl_spinning": {"OMP_WAIT_POLICY": "ACTIVE"}, "jax_reference": {}}
PROBE_SECONDS = 5.0
KEEP_AIM = 0.25        # torch_impl should keep at least this fraction of its idle throughput under load


class Probe(NamedTuple):
    impl: str
    busy: bool
    seconds: list[float]     # per call


def _spin(seconds: float) -> None:
    end = time.time() + seconds
    x = 0
    while time.time() < end:
        for i in range(10_000):
            x += i


def start_competitors(n: int, seconds: float) -> list[subprocess.Popen]:
    """n CPU-bound processes that stop by themselves after `seconds` (bounded even if this process dies)."""
    code = f"from bench.busy import _spin; _spin({float(seconds)})"
    return [subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            for _ in range(n)]


def stop(procs: list[subprocess.Popen]) -> None:
    for p in procs:
        p.kill()
    for p in procs:
        p.wait()


def _probe_case(impl: str, pop: int, seed: int):
    """The goal-size forward (noise given) of `impl`, built as the main benchmark builds it."""
    import torch

    from bench import runners
    from bench.runners import ModelSpec

    spec = ModelSpec("cartpole", (4, 256, 256, 2))
    device = torch.device("cpu")
    params = runners.make_params(spec, seed, device)
    x = runners.make_inputs(spec, pop, seed, device)
    if impl == "jax_reference":
        return runners.jax_forward_case(runners.jax_setup(spec, params, seed), x.numpy(), pop)
    noise = runners.torch_noise(params, spec, pop, "torch", seed, device)
    return runners.forward_case("torch_impl", params, x, noise, spec.activation, device)


def run_probe(impl: str, pop: int, seed: int, seconds: float) -> list[float]:
    """In the child: warm up, then time calls for `seconds`; returns seconds per call."""
    case = _probe_case(impl, pop, seed)
    for _ in range(3):
        case.sync(case.fn())
    times, end = [], time.perf_counter() + seconds
    while time.perf_counter() < end or len(times) < 5:
        t0 = time.perf_counter()
        case.sync(case.fn())
        times.append(time.perf_counter() - t0)
    return times


def probe(impl: str, busy: bool, pop: int, seed: int, seconds: float = PROBE_SECONDS) -> Probe:
    """One child process timing `impl`; with busy=True, cores + 1 competitors run meanwhile."""
    env = {**os.environ, **PROBES[impl]}
    competitors = start_competitors((os.cpu_count() or 1) + 1, seconds + 120) if busy else []
    try:
        out = subprocess.run([sys.executable, "-m", "bench.busy", "--probe", impl, "--pop", str(pop), "--seed",
                              str(seed), "--seconds", str(seconds)], env=env, capture_output=True, text=True,
                             timeout=seconds + 300, check=True).stdout
    finally:
        stop(competitors)
    return Probe(impl, busy, json.loads(out.strip().splitlines()[-1]))


def measure(pop: int, seed: int, log=print, seconds: float = PROBE_SECONDS) -> list[Probe]:
    """Every probe idle, then busy; the machine rests a second between them."""
    out = []
    for busy in (False, True):
        for impl in PROBES:
            p = probe(impl, busy, pop, seed, seconds)
            log(f"busy-machine section: {impl} {'busy' if busy else 'idle'}: {np.median(p.seconds) * 1e3:.2f} ms "
                f"per forward ({len(p.seconds)} calls)")
            out.append(p)
            time.sleep(1.0)
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.busy", description="one timing probe (used by python -m bench)")
    ap.add_argument("--probe", choices=sorted(PROBES), required=True)
    ap.add_argument("--pop", type=int, default=2048)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--seconds", type=float, default=PROBE_SECONDS)
    args = ap.parse_args(argv)
    print(json.dumps(run_probe(args.probe, args.pop, args.seed, args.seconds)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
