"""The bench's GPU section (bench.gpu, `python -m bench --device cuda`) on a CPU: its input checks, its deadline, the
rows and ratios it records, the aims' verdicts and the report; the captured forward run through the Emulated
backend. Its numbers are measured on a GPU only (`python -m bench.gpu_check`)."""
from __future__ import annotations

import argparse
import ast
import json
import re
import subprocess
import sys
import time
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


@pytest.mark.skipif(torch.cuda.is_available(), reason="on a CUDA machine main would run the whole GPU run")
def test_the_gpu_run_exits_2_without_cuda_before_any_work_with_the_cuda_sentence(tmp_path, capsys):
    """On this machine torch really sees no CUDA device: exit 2, the one sentence, nothing written under --runs."""
    from bench import gpu_check

    assert gpu_check.main(["--runs", str(tmp_path / "r")]) == 2
    err = capsys.readouterr().err
    assert "the GPU run needs a CUDA device, and torch sees none" in err, err
    assert "a CUDA build of torch and jax[cuda]" in err and err.count("\n") == 1, err
    assert not (tmp_path / "r").exists()
    assert gpu_check.missing_packages(("torch", "surely_not_a_package_here")) == ["surely_not_a_package_here"]


def test_the_jax_probe_says_when_jax_is_not_on_a_gpu():
    """The run's second exit-2 check, read in a process of its own: this machine's JAX runs on its CPU."""
    import jax

    from bench.gpu_check import probe_jax

    if jax.default_backend() != "cpu":
        pytest.skip("JAX runs on a GPU here")
    assert probe_jax() == f"JAX {jax.__version__} runs on cpu, not a GPU: install jax[cuda] (its CUDA plugin)"
    assert probe_jax("/nonexistent/python").startswith("JAX could not be imported")


@pytest.mark.parametrize("target", ["gpu", "gpu-check", "bench-gpu"])
def test_make_gpu_and_its_former_names_run_the_one_command_into_runs(target, tmp_path):
    """make gpu RUNS=dir (and gpu-check, bench-gpu, its aliases) gives python -m bench.gpu_check --runs dir, which
    writes dir/gpu and dir/bench-gpu (make -n: printed, not run)."""
    done = subprocess.run(["make", "-n", "-s", target, f"RUNS={tmp_path / 'r'}"], cwd=ROOT, capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    runs = [line.split(" -m ", 1)[1].strip() for line in done.stdout.splitlines() if "bench.gpu_check" in line]
    assert runs == [f"bench.gpu_check --runs {tmp_path / 'r'}"], done.stdout


def test_the_gpu_run_refuses_an_unknown_stage(tmp_path, capsys):
    from bench import gpu_check

    assert gpu_check.main(["--steps", "tests,bogus", "--runs", str(tmp_path / "r")]) == 2
    assert "unknown stage(s) bogus; the stages are tests, suites, bench" in capsys.readouterr().err
    assert not (tmp_path / "r").exists()


def test_the_dry_run_prints_every_command_and_budget_within_9_minutes_and_writes_nothing(tmp_path, capsys):
    from bench import gpu_check as G

    runs = tmp_path / "r"
    assert G.main(["--dry-run", "--runs", str(runs)]) == 0
    text = capsys.readouterr().out
    steps = G.plan(runs)
    assert [s.stage for s in steps] == ["tests"] + ["suites"] * 6 + ["bench"]
    for step in steps:
        assert f"python {' '.join(step.argv)}" in text, step
    for stage, budget in G.BUDGETS_S.items():
        assert f"{stage}: within {budget:.0f} s" in text
    assert G.PREFLIGHT_S + sum(G.BUDGETS_S.values()) <= G.TOTAL_S <= 540
    assert "not run: `check --task tree --port examples.gpt_adapter:GPTAdapter`" in text
    suites = [" ".join(s.argv) for s in steps if s.stage == "suites"]
    for precision in ("default", "highest"):
        for args in ("-m parity check --device", "-m parity check --task lm --device", "-m parity int8 --device"):
            assert any(a.startswith(args) and f"--device cuda --reference-precision {precision} " in a
                       for a in suites), (args, precision)
    assert all(f"--out {runs / 'gpu'}/" in a for a in suites)
    bench = steps[-1].argv
    assert bench[:4] == ("-m", "bench", "--device", "cuda") and bench[-1] == str(runs / "bench-gpu")
    assert float(bench[bench.index("--deadline") + 1]) < G.BUDGETS_S["bench"]
    assert [s.stage for s in G.plan(runs, ("bench",))] == ["bench"]
    assert not runs.exists()


@pytest.mark.skipif(torch.cuda.is_available(), reason="on a CUDA machine these commands would run")
def test_every_suite_and_bench_command_of_the_plan_is_taken_by_its_command_line(tmp_path, capsys):
    """Each command the GPU run will give, given here where CUDA is absent: its command line takes every flag and
    stops at the CUDA device (exit 2 with the CUDA sentence, not a flag error), so none fails on the GPU for a flag."""
    from bench import gpu_check as G
    from bench.__main__ import main as bench_main
    from parity.__main__ import main as parity_main

    runs = tmp_path / "r"
    for step in [s for s in G.plan(runs) if s.stage != "tests"]:
        main = {"parity": parity_main, "bench": bench_main}[step.argv[1]]
        assert main(list(step.argv[2:])) == 2, step
        err = capsys.readouterr().err
        assert "--device cuda: CUDA is not available on this machine" in err or \
            "--device cuda asked for, but torch sees no CUDA device" in err, (step, err)
    assert not runs.exists()


def _step(tmp_path, name: str, stage: str, code: str) -> "Step":
    from bench.gpu_check import Step

    return Step(name, stage, ("-c", code), tmp_path / "logs" / f"{name}.log", f"gpu/{name}.log", f"gpu/{name}.log")


def test_a_stage_stops_a_step_past_its_budget_and_keeps_the_others_outcomes(tmp_path):
    from bench.gpu_check import TIMED_OUT, run_stage

    steps = [_step(tmp_path, "sleeper", "suites", "import os, time; print(os.getpid(), flush=True); time.sleep(60)"),
             _step(tmp_path, "failing", "suites", "import sys; print('3 checks failed'); sys.exit(1)"),
             _step(tmp_path, "passing", "suites", "print('all passed')")]
    began = time.perf_counter()
    slept, failed, passed = run_stage(steps, budget_s=3.0)
    assert time.perf_counter() - began < 20
    pid, stopped = slept.last.split(" ", 1)
    assert slept.rc == TIMED_OUT and stopped == "(stopped at the 3 s budget)" and slept.seconds >= 3
    assert not _alive(int(pid))
    assert (failed.rc, failed.last) == (1, "3 checks failed") and failed.seconds < slept.seconds
    assert (passed.rc, passed.last) == (0, "all passed")


def _alive(pid: int) -> bool:
    """Whether a process runs (a zombie, ended but not yet reaped by its new parent, does not)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except (FileNotFoundError, ProcessLookupError):
        return False


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads /proc")
def test_a_stage_leaves_no_process_a_step_started_behind(tmp_path):
    from bench.gpu_check import run_stage

    code = ("import subprocess, sys; p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']); "
            "print(p.pid, flush=True)")
    left = _step(tmp_path, "leaves-a-worker", "suites", code)
    (outcome,) = run_stage([left], budget_s=20.0)
    assert outcome.rc == 0
    worker = int(outcome.last)
    deadline = time.perf_counter() + 5
    while _alive(worker) and time.perf_counter() < deadline:
        time.sleep(0.05)
    assert not _alive(worker), f"the step's worker {worker} still runs"


def test_the_run_goes_on_past_a_failed_and_a_stopped_step_and_writes_both_reports(tmp_path, capsys):
    from bench import gpu_check as G

    runs = tmp_path / "r"
    steps = [_step(tmp_path, "tests", "tests", "print('8 passed')"),
             _step(tmp_path, "lm-default", "suites", "import time; time.sleep(60)"),
             _step(tmp_path, "int8-default", "suites", "raise SystemExit(3)"),
             _step(tmp_path, "bench", "bench", "print('wrote bench.csv')")]
    machine = G.Machine("NVIDIA H200, compute capability 9.0", "torch 2.x (CUDA 12.8), jax 0.x", "abc123")
    budgets = {"tests": 20.0, "suites": 2.0, "bench": 20.0}
    assert G.execute(runs, steps, machine, "python -m bench.gpu_check --runs r", budgets) == 1
    for here in ("gpu", "bench-gpu"):
        text = (runs / here / "README.md").read_text()
        for part in ("NVIDIA H200, compute capability 9.0", "torch 2.x (CUDA 12.8), jax 0.x", "commit: abc123",
                     "result: exit 1 (a finding", "`python -m bench.gpu_check --runs r`",
                     "| tests | `python -c print('8 passed')` | 20 | 0 |",
                     "| suites | `python -c raise SystemExit(3)` | 2 | 3 |",
                     "| bench | `python -c print('wrote bench.csv')` | 20 | 0 |", "stopped at the 2 s budget"):
            assert part in text, (here, part)
    assert "[../gpu/tests.log](../gpu/tests.log)" in (runs / "bench-gpu" / "README.md").read_text()
    record = json.loads((runs / "gpu" / "run.json").read_text())
    assert record["exit"] == 1 and [s["rc"] for s in record["steps"]] == [0, G.TIMED_OUT, 3, 0]
    assert json.loads((runs / "bench-gpu" / "run.json").read_text()) == record
    assert "exit 1" in capsys.readouterr().out.splitlines()[-1]
    G.execute(runs, steps[1:3], machine, "python -m bench.gpu_check --steps suites", budgets)     # one stage again
    assert "--steps suites" in (runs / "gpu" / "README.md").read_text()
    assert "--steps suites" not in (runs / "bench-gpu" / "README.md").read_text()          # the bench's record kept


def test_the_reports_list_the_steps_still_to_run():
    from bench import gpu_check as G

    steps = G.plan(Path("runs"))
    text = G.readme(G.Machine("NVIDIA H100", "torch", "abc"), steps, [G.Outcome(0, 12.0, "8 passed")], "cmd", "gpu",
                    12.0)
    assert "| tests | `python -m pytest -q -p no:cacheprovider -m gpu tests` | 140 | 0 | 12 | 8 passed |" in text
    assert "1 of 8 steps done so far" in text and text.count("not run yet") == 7
    assert "[cartpole-default/summary.md](cartpole-default/summary.md), [logs/cartpole-default.log]" in text
    assert "| [tests.log](tests.log) |" in text
    assert "[../bench-gpu/summary.md](../bench-gpu/summary.md)" in text


ROOT = Path(__file__).resolve().parents[2]
# How a test file skips without CUDA: tests/marks.py's @on_gpu, or a skip whose reason begins "needs a CUDA device".
CUDA_SKIP = re.compile(r"^\s*@on_gpu\b|\breason\s*=\s*[\"']needs a CUDA device|\.skip\(\s*[\"']needs a CUDA device",
                       re.M)
# A test that puts something on a CUDA device: .cuda(), device="cuda...", torch.device("cuda...").
CUDA_USE = re.compile(r"\.cuda\(|\bdevice\s*=\s*[\"']cuda|torch\.device\(\s*[\"']cuda")
# Tests that match CUDA_USE yet need no device, each with the reason.
CUDA_USE_WITHOUT_A_DEVICE: dict[str, str] = {
    "test_the_rule_picks_the_first_backend_that_takes_the_request": "asks torch_impl.random's rule about a CUDA "
                                                                     "device; puts nothing on it",
    "test_the_switch_turns_the_kernel_off": "asks whether the triton backend would take CUDA keys; draws nothing",
}
# The CUDA tests when the GPU run took the gpu marker (issue 51): graphs x3 (int8 at two presets), _int_mm, the CUDA
# keys, the table and formula backends on CUDA, the Triton kernel's mantissas. The selection may grow, never shrink
# below this.
GPU_TESTS_FLOOR = 8


def _gpu_selection() -> list[str]:
    from bench.gpu_check import GPU_TESTS

    done = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider",
                           *GPU_TESTS], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return [line for line in done.stdout.splitlines() if "::" in line]


def _tests_using_cuda() -> list[str]:
    """'path::name' of every test function under tests/ whose body puts something on a CUDA device."""
    found = []
    for path in sorted((ROOT / "tests").rglob("test_*.py")):
        source = path.read_text()
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, ast.FunctionDef) and node.name.startswith("test") \
                    and CUDA_USE.search(ast.get_source_segment(source, node)):
                found.append(f"{path.relative_to(ROOT).as_posix()}::{node.name}")
    return found


def test_the_gpu_checks_selection_has_every_test_that_needs_cuda():
    """The GPU run's pytest selection, collected only (nothing run): at least the floor of CUDA tests, only files that
    exist, every test file that skips for want of a CUDA device, and every test that puts a tensor on one (found by
    reading the files), so none is left out on a GPU machine."""
    ids = _gpu_selection()
    assert len(ids) >= GPU_TESTS_FLOOR, ids
    files = {i.split("::")[0] for i in ids}
    assert all((ROOT / f).is_file() for f in files), files
    skipping = {p.relative_to(ROOT).as_posix() for p in sorted((ROOT / "tests").rglob("test_*.py"))
                if CUDA_SKIP.search(p.read_text())}
    assert skipping, "no test file found that skips without CUDA: CUDA_SKIP reads none"
    assert skipping <= files, f"skip without CUDA but are not marked gpu: {sorted(skipping - files)}"
    selected = {i.split("[")[0] for i in ids}
    using = _tests_using_cuda()
    assert len(using) >= GPU_TESTS_FLOOR - 1, using            # the int8 graphs test is one function, two presets
    unmarked = [t for t in using if t not in selected and t.split("::")[1] not in CUDA_USE_WITHOUT_A_DEVICE]
    assert not unmarked, f"put tensors on CUDA but are not marked gpu (tests.marks.on_gpu): {unmarked}"
