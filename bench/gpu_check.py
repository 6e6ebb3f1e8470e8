"""`python -m bench.gpu_check`: the GPU paths' tests and the bench's GPU section in one go, for a machine with a GPU.

    python -m bench.gpu_check --out reports/bench-gpu        (make bench-gpu)

1. the tests that need CUDA (GPU_TESTS: pytest -m gpu over tests/, every test marked `gpu`: CUDA graphs equal to the
   eager CUDA runs, the integer model on torch._int_mm equal to the CPU, the compiled and Triton normals equal to the
   eager definition), at most TESTS_S seconds, the log in tests.log;
2. `python -m bench --device cuda` (bounded by its own 300 s), its bench.csv and summary.md;
3. README.md: what ran, the tests' last line, each step's time, the machine.
About 8 minutes in all, under 10. No CUDA device, or a package the steps need missing: exit 2 before any work, saying
which (a machine without a package index can install wheels brought along: `pip install --no-index --no-deps`).
Exit 0 when the tests passed and the bench finished, else 1.
"""
from __future__ import annotations

import argparse
import importlib.util
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Sequence

# The tests that need CUDA, chosen by their marker (tests/marks.py's on_gpu), not by a list of files to keep up to date.
GPU_TESTS = ("-m", "gpu", "tests")
NEEDED = ("torch", "jax", "optax", "numpy", "scipy", "gymnasium", "pytest", "matplotlib")
TESTS_S, BENCH_S = 220.0, 330.0


def missing_packages(names: Sequence[str] = NEEDED) -> list[str]:
    return [n for n in names if importlib.util.find_spec(n) is None]


def _run(cmd: list[str], log: Path, timeout_s: float) -> tuple[int, float, str]:
    """(exit status, seconds, last non-empty line) of cmd, its output teed into log; 124 when it timed out."""
    t0 = time.perf_counter()
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    with open(log, "w") as f:
        try:
            rc = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT, timeout=timeout_s, env=env).returncode
        except subprocess.TimeoutExpired:
            rc = 124
    lines = [line for line in log.read_text().splitlines() if line.strip()]
    return rc, time.perf_counter() - t0, (lines[-1] if lines else "no output")


def readme(steps: list[tuple[str, str, int, float, str]], device: str, total_s: float) -> str:
    rows = "\n".join(f"| {name} | `{cmd}` | {rc} | {secs:.0f} | {last.replace('|', '/')} |"
                     for name, cmd, rc, secs, last in steps)
    return (f"# GPU check: the GPU paths' tests and the bench's GPU section\n\n"
            f"- machine: {device}; {total_s:.0f} s in all\n- the bench's report: [summary.md](summary.md) "
            f"(bench.csv beside it); the tests' log: tests.log\n\n"
            f"| step | command | exit | seconds | last line |\n| --- | --- | --- | --- | --- |\n{rows}\n")


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.gpu_check", description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="runs/bench-gpu", help="output folder (default runs/bench-gpu; the published "
                                                             "one is reports/bench-gpu)")
    args = ap.parse_args(argv)
    import torch
    if not torch.cuda.is_available():
        print("error: the GPU check needs a CUDA device, and torch sees none; run it on a machine with a GPU",
              file=sys.stderr)
        return 2
    missing = missing_packages()
    if missing:
        print(f"error: missing packages: {', '.join(missing)} (install them, or bring their wheels and "
              f"`pip install --no-index --no-deps` them)", file=sys.stderr)
        return 2
    from spec.limits import check_out_dir
    try:
        check_out_dir(args.out)
    except ValueError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    tests = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *GPU_TESTS]
    bench = [sys.executable, "-m", "bench", "--device", "cuda", "--out", str(out)]
    steps = []
    for name, cmd, log, limit in (("tests", tests, out / "tests.log", TESTS_S),
                                  ("bench", bench, out / "bench.log", BENCH_S)):
        rc, secs, last = _run(cmd, log, limit)
        print(f"{name}: exit {rc} in {secs:.0f} s: {last}", flush=True)
        steps.append((name, " ".join(cmd[1:]), rc, secs, last))
    (out / "README.md").write_text(readme(steps, torch.cuda.get_device_name(0), time.perf_counter() - start))
    print(f"wrote {out / 'README.md'}, {out / 'summary.md'}, {out / 'bench.csv'}, {out / 'tests.log'}")
    return 0 if all(rc == 0 for _, _, rc, _, _ in steps) else 1


if __name__ == "__main__":
    sys.exit(main())
