"""The bench's GPU section (bench.gpu, `python -m bench --device cuda`) on a CPU: its input checks, its deadline, the
rows and ratios it records, the aims' verdicts and the report; the captured forward run through the Emulated
backend. Its numbers are measured on a GPU only (`python -m bench.gpu_check`)."""
from __future__ import annotations

import argparse
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from bench import gpu, gpu_report, measure
from bench.__main__ import main, main_gpu
from bench.report import Measurement, RowLog, read_csv
from bench.runners import Case
from torch_impl.cuda_graphs import Emulated


def _args(**kw):
    base = dict(device="cuda", quick=True, out="runs/never-written", seed=0, threads=None, models=None, pops=None,
                solve=None, busy_seconds=None, deadline=None)
    return argparse.Namespace(**{**base, **kw})


def test_without_cuda_the_gpu_section_exits_2_before_any_work(tmp_path, capsys):
    assert main(["--device", "cuda", "--out", str(tmp_path / "b")]) == 2
    assert "--device cuda asked for, but torch sees no CUDA device; use --device cpu" in capsys.readouterr().err
    assert not (tmp_path / "b").exists()


@pytest.mark.parametrize("kw,message", [
    (dict(solve="cpu"), "--solve belong to the CPU bench; the GPU section (--device cuda) takes --pops"),
    (dict(busy_seconds=1.0, models="wide"), "--busy-seconds, --models belong to the CPU bench"),
    (dict(pops="2048,7"), "--pops takes even integers >= 2"),
])
def test_the_gpu_section_refuses_cpu_flags_and_bad_pops_before_any_work(kw, message, tmp_path, capsys):
    assert main_gpu(_args(out=str(tmp_path / "g"), **kw), []) == 2
    assert message in capsys.readouterr().err and not (tmp_path / "g").exists()


def test_the_aims_are_the_issues():
    labels = [(a.model, a.pop, a.target) for a in gpu.aims(gpu.GPU_FULL)]
    assert labels == [("cartpole", 2048, 1.0), ("cartpole", 16384, 1.0), ("lm", 0, 1.0), ("int8", 0, 0.5)]
    assert gpu.GPU_FULL.deadline_s <= 300 and gpu.GPU_FULL.lm_preset == gpu.GPU_FULL.int8_preset == "cpu"


def _rows_with_ratio(ratio: float, lo: float, hi: float) -> list[Measurement]:
    rows = RowLog()
    rows.add_value(gpu.GRAPHED, "lm", 0, gpu.RATIO, ratio, "x", "cuda")
    rows.add_value(gpu.GRAPHED, "lm", 0, gpu.RATIO + "_ci95_low", lo, "x", "cuda")
    rows.add_value(gpu.GRAPHED, "lm", 0, gpu.RATIO + "_ci95_high", hi, "x", "cuda")
    return rows


@pytest.mark.parametrize("ratio,lo,hi,word", [(1.3, 1.1, 1.4, "met"), (0.6, 0.5, 0.7, "missed"),
                                              (1.05, 0.9, 1.2, "undecided"), (1.0, 1.0, 1.1, "met")])
def test_an_aim_is_judged_by_the_interval_of_the_median_ratio(ratio, lo, hi, word):
    aim = gpu.Aim("lm", 0, gpu.GRAPHED, 1.0, "lm")
    assert gpu_report.judge(_rows_with_ratio(ratio, lo, hi), aim).word == word
    assert gpu_report.judge([], aim).word == "not measured"


class _Clock:
    """A fake perf_counter that only the cases advance: the group's timings are then exact, whatever the load."""

    def __init__(self):
        self.now = 0.0

    def perf_counter(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


def test_a_group_records_times_rates_first_calls_and_the_paired_ratio(monkeypatch):
    """Cases that take 2, 6 and 4 ms on the bench's clock (a fake one in bench.gpu and bench.measure: no timed
    assertion on this machine's load)."""
    clock = _Clock()
    monkeypatch.setattr(gpu, "time", clock)
    monkeypatch.setattr(measure, "time", clock)
    sleeper = lambda s: Case(lambda: clock.advance(s), lambda out: out, "cpu")              # noqa: E731
    plan = gpu.GPU_QUICK._replace(repeats=6, min_repeats=6, group_budget_s=5.0, warmup=1)
    r = gpu.GpuRun(plan, torch.device("cpu"), 0, lambda m: None)
    r.group("lm", 0, lambda: ({gpu.GRAPHED: sleeper(0.002), gpu.EAGER: sleeper(0.006), gpu.JAX: sleeper(0.004)},
                              100))
    look = lambda impl, measure: next(m for m in r.rows if (m.impl, m.measure) == (impl, measure))   # noqa: E731
    assert look(gpu.GRAPHED, gpu.RATIO).median > 1 > look(gpu.EAGER, gpu.RATIO).median
    assert look(gpu.GRAPHED, gpu.STEP_TOKENS).median > look(gpu.JAX, gpu.STEP_TOKENS).median
    assert {m.impl for m in r.rows if m.measure == gpu.FIRST_CALL_S} == {gpu.GRAPHED, gpu.EAGER, gpu.JAX}
    assert gpu_report.judge(r.rows, gpu.Aim("lm", 0, gpu.GRAPHED, 1.0, "")).word == "met"


def test_the_deadline_skips_groups_and_the_compiled_variant_with_the_reason():
    built = []
    plan = gpu.GPU_QUICK._replace(deadline_s=10.0, group_budget_s=6.0, compile_need_s=110.0)
    r = gpu.GpuRun(plan, torch.device("cpu"), 0, lambda m: None)
    r.group("cartpole", 2048, lambda: built.append(1))
    r.compiled(2048)
    assert not built and not r.rows
    assert any("cartpole pop 2048: skipped" in n and "10 s budget" in n for n in r.notes)
    assert any("torch_impl_compiled (compile=on) at pop 2048: skipped, its first call compiles for about 82 s" in n
               for n in r.notes)


def test_the_compiled_probe_is_bounded_by_its_timeout():
    assert "did not finish within the 0 s left" in gpu.compiled_probe(64, 0, 0.01)["skipped"]


def test_the_captured_cartpole_forward_gives_the_eager_forwards_numbers():
    cases = gpu.cartpole_cases(64, 3, torch.device("cpu"), Emulated)
    eager, graphed = cases[gpu.EAGER].fn(), cases[gpu.GRAPHED].fn()
    again = cases[gpu.GRAPHED].fn()                                           # the replay
    assert eager.shape == (64, 2) and torch.equal(graphed, eager) and torch.equal(again, eager)


def test_the_section_writes_its_csv_and_a_report_with_every_aim(tmp_path):
    plan = gpu.GPU_QUICK._replace(cartpole_pops=(64,), lm_preset=None, int8_preset=None, repeats=2)
    gpu.write_section(plan, torch.device("cpu"), 0, tmp_path, "python -m bench --device cuda --quick",
                      lambda m: None, backend=Emulated)
    rows = read_csv(tmp_path / "bench.csv")
    assert {m.impl for m in rows if m.measure == gpu.FORWARD_MS} == {gpu.EAGER, gpu.GRAPHED, gpu.JAX}
    text = (tmp_path / "summary.md").read_text()
    for part in ("## Aims (issue 35)", "CartPole forward at pop 64 >= 1.0x JAX", "## First calls, apart",
                 "JAX backend: cpu, default matmul precision", "seed: 0", "Quick run (tiny sizes): not a measurement",
                 "`python -m bench --device cuda --quick`", "torch_impl_compiled (compile=on) at pop 64: skipped"):
        assert part in text, part


def test_the_gpu_check_exits_2_without_cuda_before_any_work(tmp_path, capsys):
    from bench import gpu_check

    assert gpu_check.main(["--out", str(tmp_path / "c")]) == 2
    assert "needs a CUDA device, and torch sees none" in capsys.readouterr().err and not (tmp_path / "c").exists()
    assert gpu_check.missing_packages(("torch", "surely_not_a_package_here")) == ["surely_not_a_package_here"]
    text = gpu_check.readme([("tests", "-m pytest -m gpu", 0, 12.0, "5 passed")], "NVIDIA H100", 300.0)
    assert "| tests | `-m pytest -m gpu` | 0 | 12 | 5 passed |" in text and "NVIDIA H100" in text


ROOT = Path(__file__).resolve().parents[2]
# How a test file skips without CUDA: tests/marks.py's @on_gpu, or a skip whose reason begins "needs a CUDA device".
CUDA_SKIP = re.compile(r"^\s*@on_gpu\b|\breason\s*=\s*[\"']needs a CUDA device|\.skip\(\s*[\"']needs a CUDA device",
                       re.M)


def test_the_gpu_checks_selection_has_every_file_that_skips_without_cuda():
    """gpu_check's pytest selection, collected only (nothing run): not empty, only files that exist, and every test
    file that skips for want of a CUDA device (found by reading the files), so none is left out on a GPU machine."""
    from bench.gpu_check import GPU_TESTS

    done = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider",
                           *GPU_TESTS], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    ids = [line for line in done.stdout.splitlines() if "::" in line]
    assert ids, done.stdout[-3000:]
    files = {i.split("::")[0] for i in ids}
    assert all((ROOT / f).is_file() for f in files), files
    skipping = {f"tests/{p.name}" for p in sorted((ROOT / "tests").glob("test_*.py"))
                if CUDA_SKIP.search(p.read_text())}
    assert skipping, "no test file found that skips without CUDA: CUDA_SKIP reads none"
    assert skipping <= files, f"skip without CUDA but are not marked gpu: {sorted(skipping - files)}"
