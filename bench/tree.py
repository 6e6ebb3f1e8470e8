"""The bench's tree-suite section: `python -m parity check --task tree` on the example GPT (examples/gpt_adapter.py's
factories) from 2 blocks x 16 wide up to GPT-2 small's shapes, at pop 16, each size in a fresh process, so that its
wall time and its peak resident memory (the child's own ru_maxrss, from os.wait4) are its own and growth with the
model is visible. Per-check seconds come from the suite's lines, the parameter count from its summary.md.

The bench does not import the suite (DESIGN.md's layering: the suite, the study and the benchmark are siblings); it
runs the command as a user would.
"""
from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import NamedTuple, Sequence

ROOT = Path(__file__).resolve().parent.parent
TREE_SIZES = ("GPTAdapter", "gpt_4x128", "gpt_6x384", "gpt2_small")      # examples.gpt_adapter's factories
QUICK_SIZES = ("GPTAdapter",)
AIM_SIZE, AIM_S, AIM_RSS = "gpt2_small", 600.0, 8 * 2 ** 30     # GPT-2 small at pop 16: 10 minutes of 2 cores, 8 GiB
TIMEOUT_S = 2 * AIM_S                                           # a size slower than this is stopped and said so
POLL_S = 0.2

CHECK_LINE = re.compile(r"^(\w+)\s+(pass|FAIL|skip)\s+\((\d+) rows, ([\d.]+) s\)")
TREE_LINE = re.compile(r"^- tree: \d+ leaves, ([\d,]+) parameters")
SETTINGS_LINE = re.compile(r"^- settings: pop (\d+),")


class Process(NamedTuple):
    """One child process, measured: wall seconds, its own peak resident bytes, its exit code (None: stopped), its
    output, and why it was stopped ('' if it ran to the end)."""

    wall_s: float
    peak_rss: int
    exit_code: int | None
    output: str
    stopped: str


def rss_now(pid: int) -> int:
    """A running process's resident bytes now (VmRSS of /proc/<pid>/status; 0 where it cannot be read)."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def children(pid: int) -> list[int]:
    """The running children of a process (Linux's /proc/<pid>/task/<pid>/children; [] where it cannot be read)."""
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as f:
            return [int(c) for c in f.read().split()]
    except OSError:
        return []


def launch(report: str, cmd: Sequence[str]) -> int:
    """`python -m bench.tree REPORT CMD...`: run CMD as this small process's child, write its peak resident bytes
    (ru_maxrss from os.wait4) to REPORT and exit with its code. A child's ru_maxrss counts the memory of the process
    it was forked from (Linux keeps the old image's high-water mark across exec), so the measured command is
    forked from this launcher (a bare interpreter, ~10 MB), not from the bench (JAX and torch loaded)."""
    pid = os.fork()
    if pid == 0:
        try:
            os.execvp(cmd[0], list(cmd))
        finally:
            os._exit(127)
    _, status, usage = os.wait4(pid, 0)
    Path(report).write_text(str(usage.ru_maxrss * 1024))
    return os.waitstatus_to_exitcode(status)


def measure_process(cmd: Sequence[str], timeout_s: float, max_rss: int | None, cwd: Path = ROOT) -> Process:
    """Run cmd to its end (or stop it past timeout_s, or once its resident memory passes max_rss) through `launch`:
    its wall time, its own peak RSS (a stopped one's: the most seen while polling), its output (stdout and stderr
    through a file, so no pipe can fill)."""
    with tempfile.TemporaryDirectory(prefix="bench-process-") as tmp, open(Path(tmp) / "log", "w+") as log:
        report = Path(tmp) / "maxrss"
        t0 = time.perf_counter()
        proc = subprocess.Popen([sys.executable, "-m", "bench.tree", str(report), *cmd], cwd=cwd, stdout=log,
                                stderr=subprocess.STDOUT, start_new_session=True)
        stopped, seen = "", 0
        while proc.poll() is None:
            elapsed, rss = time.perf_counter() - t0, sum(rss_now(c) for c in children(proc.pid))
            seen = max(seen, rss)
            if not stopped and (elapsed > timeout_s or (max_rss is not None and rss > max_rss)):
                stopped = (f"stopped after {elapsed:.0f} s (the limit)" if elapsed > timeout_s else
                           f"stopped at {rss / 2 ** 30:.1f} GiB resident (the limit, {max_rss / 2 ** 30:.1f} GiB)")
                os.killpg(proc.pid, signal.SIGKILL)
            time.sleep(POLL_S)
        wall = time.perf_counter() - t0
        peak = int(report.read_text()) if report.exists() else seen     # stopped: the most it was seen holding
        log.seek(0)
        output = log.read()
    return Process(wall, peak, None if stopped else proc.returncode, output, stopped)


class TreeRun(NamedTuple):
    """The tree suite on one size: the factory, its parameters and population (from its report), the process."""

    size: str
    params: int | None
    pop: int | None
    process: Process
    checks: dict[str, float]          # check -> seconds, as the suite printed them


def parse_checks(output: str) -> dict[str, float]:
    """{check: seconds} from the suite's per-check lines ("noise      pass  (30 rows, 2.6 s)")."""
    return {m.group(1): float(m.group(4)) for m in map(CHECK_LINE.match, output.splitlines()) if m}


def parse_summary(text: str) -> tuple[int | None, int | None]:
    """(parameters, pop) from the suite's summary.md ("- tree: 15 leaves, 8,480 parameters (...)", "- settings: pop
    16, ..."); None where a line is missing."""
    params = pop = None
    for line in text.splitlines():
        if (m := TREE_LINE.match(line)) is not None:
            params = int(m.group(1).replace(",", ""))
        if (m := SETTINGS_LINE.match(line)) is not None:
            pop = int(m.group(1))
    return params, pop


def tree_command(size: str, out: Path) -> list[str]:
    return [sys.executable, "-m", "parity", "check", "--task", "tree", "--port", f"examples.gpt_adapter:{size}",
            "--out", str(out)]


def run_size(size: str, timeout_s: float = TIMEOUT_S, max_rss: int | None = None) -> TreeRun:
    """`python -m parity check --task tree --port examples.gpt_adapter:<size>` in a fresh process, measured."""
    with tempfile.TemporaryDirectory(prefix="bench-tree-") as out:
        proc = measure_process(tree_command(size, Path(out)), timeout_s, max_rss)
        summary = Path(out) / "summary.md"
        params, pop = parse_summary(summary.read_text()) if summary.exists() else (None, None)
    return TreeRun(size, params, pop, proc, parse_checks(proc.output))


def memory_guard(available: int | None) -> int | None:
    """The resident size past which a child is stopped: 90% of the memory available when the section starts (a size
    too large for the machine then reads "stopped at ... GiB" rather than taking the machine down)."""
    return None if available is None else int(0.9 * available)


def verdict(run: TreeRun) -> str:
    """PASS, FAIL, exit N or the reason it was stopped."""
    p = run.process
    if p.stopped:
        return p.stopped
    return {0: "PASS", 1: "FAIL"}.get(p.exit_code, f"exit {p.exit_code}")


def check_sizes(text: str | None, quick: bool) -> tuple[str, ...]:
    """--tree-sizes: comma-separated names of TREE_SIZES, or none; default every size (quick: the example only)."""
    if text is None:
        return QUICK_SIZES if quick else TREE_SIZES
    if text.strip() == "none":
        return ()
    names = tuple(n.strip() for n in text.split(",") if n.strip())
    unknown = [n for n in names if n not in TREE_SIZES]
    if unknown or not names:
        raise ValueError(f"--tree-sizes takes names from {', '.join(TREE_SIZES)} (comma-separated) or none, got "
                         f"{text!r}")
    return names


if __name__ == "__main__":
    sys.exit(launch(sys.argv[1], sys.argv[2:]))
