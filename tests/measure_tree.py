"""The tree suite's false-alarm rate and the noise-variance test's power, measured (issue 53's closing numbers):
`python -m tests.measure_tree --out reports/tree_diagnosis [--seeds 10] [--power-seeds 20]`.

- faithful: every faithful example (the GPT, its torch-rng twin, the module adapter, the CNN and its twin, and the
  faithful ports that step pair by pair, member by member and through torch.optim.SGD) at both self-test sizes and
  `--seeds` seeds, the whole tree suite: failing rows (must be 0) and the worst ratio to its bound per check.
- power: the in-distribution noise check alone on a GPT whose low-rank noise has c times the reference's variance
  (tests.ports.power_ports.VarianceScaled), c in 0.38, 0.8, 1.2, pops 8, 16, 64, `--power-seeds` seeds: the share of
  seeds caught by any row, by the mean-square rows and by the KS rows alone.

Resumes: runs.csv holds one line per finished run (kind, case, size, seed, ...); a rerun skips those lines' runs
and rebuilds summary.md from all of them. Progress on stderr (runs done, rate, time left).
"""
from __future__ import annotations

import argparse
import csv
import os
import sys
import time

import numpy as np

from reporting import atomic_write, markdown_table, versions

FIELDS = ["kind", "case", "size", "seed", "fails", "worst", "check_worst", "caught", "mean_square", "ks"]


def faithful_cases() -> dict:
    """{name: factory(size)} of the faithful examples and ports, at the self-tests' two sizes."""
    from examples import cnn_adapter
    from examples.gpt_adapter import GPTAdapter
    from examples.module_adapter import Adapter
    from spec.tree_knobs import TreeKnobs
    from tests.ports import lockstep_ports, module_ports, ndleaf_ports, order_ports
    from tests.parity.tree.test_check import SIZES
    return {"gpt": lambda s: GPTAdapter(**SIZES[s]),
            "gpt, torch rng": lambda s: GPTAdapter(TreeKnobs(rng="torch"), **SIZES[s]),
            "gpt, full rank": lambda s: GPTAdapter(freeze_nonlora=False, **SIZES[s]),
            "module": lambda s: Adapter(**(module_ports.SMALL if s == "small" else {})),
            "cnn": lambda s: cnn_adapter.CNNAdapter(**ndleaf_ports.SIZES[s]),
            "cnn, torch rng": lambda s: cnn_adapter.TorchRng(**ndleaf_ports.SIZES[s]),
            "gpt, step added pair by pair": lambda s: order_ports.PerPairStep(**SIZES[s]),
            "gpt, step added member by member": lambda s: order_ports.PerMemberStep(**SIZES[s]),
            "gpt, torch.optim.SGD": lambda s: lockstep_ports.PlainTorchSGD(**SIZES[s])}


def faithful_run(make, size: str, seed: int) -> dict:
    """One whole-suite run: its failing rows and the worst ratio to a bound, overall and per check."""
    from tests.parity.tree.test_check import rows_of
    rows = rows_of(make(size), seed)
    worst: dict[str, float] = {}
    for r in rows:
        if r.verdict != "skip" and "/ bound" in r.quantity and r.value == r.value:
            worst[r.check] = max(worst.get(r.check, 0.0), float(r.value))
    return {"fails": sum(r.verdict == "fail" for r in rows), "worst": max(worst.values(), default=0.0),
            "check_worst": ";".join(f"{c}={v:.3g}" for c, v in worst.items())}


def power_run(c: float, pop: int, size: str, seed: int) -> dict:
    """The noise check alone on a variance-scaled GPT: caught by any statistical row, the mean-square rows, KS."""
    from tests.ports.power_ports import VarianceScaled
    from tests.parity.tree.test_power import noise_rows
    from tests.parity.tree.test_check import SIZES
    settings = {k: v for k, v in SIZES[size].items() if k != "pop"}
    rows, _ = noise_rows(VarianceScaled(c, pop=pop, **settings), seed)
    stat = [r for r in rows if "alpha=" in r.allowed]
    square = [r for r in stat if "mean square of E" in r.quantity]
    ks = [r for r in stat if r not in square]
    return {"caught": int(any(r.verdict == "fail" for r in stat)),
            "mean_square": int(any(r.verdict == "fail" for r in square)),
            "ks": int(any(r.verdict == "fail" for r in ks))}


def plan(seeds: int, power_seeds: int) -> list[tuple]:
    runs = [("faithful", name, size, seed) for name in faithful_cases() for size in ("small", "example")
            for seed in range(seeds)]
    return runs + [("power", f"c={c} pop={pop}", size, seed) for size in ("small", "example") for pop in (8, 16, 64)
                   for c in (0.38, 0.8, 1.2) for seed in range(power_seeds)]


def run_one(kind: str, case: str, size: str, seed: int) -> dict:
    if kind == "faithful":
        return faithful_run(faithful_cases()[case], size, seed)
    c, pop = (float(x.split("=")[1]) for x in case.split())
    return power_run(c, int(pop), size, seed)


def summary(done: list[dict], command: str) -> str:
    """summary.md: per faithful case and size its failing rows and worst ratios; the power table."""
    lines = ["# The tree suite: false alarms and the noise-variance test's power", "",
             f"- command: `{command}`", f"- versions: {', '.join(f'{k} {v}' for k, v in versions().items())}",
             "- device: cpu (every check here is numpy or torch on the CPU; the reference is JAX on its CPU backend)",
             "", "## Faithful examples (the whole tree suite)", ""]
    table = []
    for (case, size) in dict.fromkeys((d["case"], d["size"]) for d in done if d["kind"] == "faithful"):
        rs = [d for d in done if d["kind"] == "faithful" and (d["case"], d["size"]) == (case, size)]
        per: dict[str, float] = {}
        for d in rs:
            for item in filter(None, d["check_worst"].split(";")):
                c, v = item.split("=")
                per[c] = max(per.get(c, 0.0), float(v))
        table.append([case, size, len(rs), sum(int(d["fails"]) for d in rs), f"{max(float(d['worst']) for d in rs):.3g}",
                      ", ".join(f"{c} {v:.3g}" for c, v in per.items())])
    lines += [markdown_table(["example", "size", "seeds", "failing rows", "worst ratio to bound", "per check"],
                             table), "", "## Power of the noise-variance test (in distribution)", ""]
    table = []
    for (case, size) in dict.fromkeys((d["case"], d["size"]) for d in done if d["kind"] == "power"):
        rs = [d for d in done if d["kind"] == "power" and (d["case"], d["size"]) == (case, size)]
        n = len(rs)
        table.append([size, *case.split(), *(f"{sum(int(d[k]) for d in rs)}/{n}" for k in ("caught", "mean_square",
                                                                                          "ks"))])
    lines += [markdown_table(["size", "variance factor", "population", "caught", "by the mean-square rows",
                              "by the KS rows alone"], table), ""]
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m tests.measure_tree", description=__doc__.split("\n")[0])
    p.add_argument("--out", required=True, help="folder for runs.csv and summary.md (resumed when it has them)")
    p.add_argument("--seeds", type=int, default=10, help="seeds per faithful example and size (default 10)")
    p.add_argument("--power-seeds", type=int, default=20, help="seeds per power cell (default 20)")
    args = p.parse_args(argv)
    if args.seeds < 1 or args.power_seeds < 0:
        p.error(f"--seeds must be >= 1 and --power-seeds >= 0 (got {args.seeds}, {args.power_seeds})")
    from spec.limits import check_out_dir
    try:
        check_out_dir(args.out)
    except ValueError as err:
        p.error(str(err))
    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, "runs.csv")
    done = list(csv.DictReader(open(path))) if os.path.exists(path) else []
    seen = {(d["kind"], d["case"], d["size"], int(d["seed"])) for d in done}
    todo = [r for r in plan(args.seeds, args.power_seeds) if r not in seen]
    command = "python -m tests.measure_tree " + " ".join(argv if argv is not None else sys.argv[1:])
    t0 = time.perf_counter()
    with open(path, "a", newline="") as fh:
        writer = csv.DictWriter(fh, FIELDS)
        if not done:
            writer.writeheader()
        for i, (kind, case, size, seed) in enumerate(todo, 1):
            got = {"kind": kind, "case": case, "size": size, "seed": seed, **run_one(kind, case, size, seed)}
            writer.writerow({k: got.get(k, "") for k in FIELDS})
            fh.flush()
            done.append({k: str(got.get(k, "")) for k in FIELDS})
            rate = i / (time.perf_counter() - t0)
            print(f"{i}/{len(todo)} {kind} {case} {size} seed {seed}: {rate:.2f} runs/s, "
                  f"{(len(todo) - i) / rate / 60:.1f} min left", file=sys.stderr, flush=True)
    atomic_write(os.path.join(args.out, "summary.md"), summary(done, command))
    return 0


if __name__ == "__main__":
    sys.exit(main())
