"""`python -m bench.gpu_check` (make gpu): the whole GPU run in one command, within 9 minutes on one GPU.

    python -m bench.gpu_check --runs reports        (make gpu RUNS=reports: reports/gpu/ and reports/bench-gpu/)
    python -m bench.gpu_check --dry-run             the plan (each command and its budget), nothing run or written

Three stages, in this order, each within its own budget (BUDGETS_S):
1. tests: every test marked `gpu` (`pytest -m gpu tests`: tests/marks.py's on_gpu), log in gpu/tests.log;
2. suites: every suite with --device cuda against the JAX reference on the same GPU, at `default` (TF32 on NVIDIA
   GPUs of compute capability >= 8.0) and `highest` reference precision: check (CartPole), check --task lm and int8,
   each into gpu/<suite>-<precision>/, run side by side (correctness checks, not timings; the GPU has room for six);
3. bench: the bench's GPU section (`python -m bench --device cuda`, its own deadline inside the stage's budget), its
   summary.md and bench.csv in bench-gpu/.
A step past its budget is stopped and recorded (exit 124), and the run goes on; gpu/README.md and bench-gpu/README.md
(device, versions, commit, each step's command, exit and seconds) and run.json beside each are rewritten after every
stage, so a run cut short still says what it did (--steps: only the folders of the stages asked for). Exit 0 when every step passed, 1 when one did not (a finding: its report or
log says which and why), 2 when the machine cannot run it (no CUDA device for torch, JAX not on a GPU, a package
missing), before any work and writing nothing. `make gpu` itself exits 2 on any failure (make's own code); the
command's code is its last line.
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import NamedTuple, Sequence

STAGES = ("tests", "suites", "bench")
# Not yet measured on a GPU: the former bench-gpu's budgets (tests 220 s, the bench 330 s) cut to fit 9 minutes with the
# suites; a first run's README gives each step's seconds to set them by.
BUDGETS_S = {"tests": 140.0, "suites": 200.0, "bench": 160.0}
PREFLIGHT_S = 30.0                      # the JAX probe's limit; the checks before it take a second or two
TOTAL_S = 540.0                         # the 9 minutes the whole run is aimed at: stages + preflight fit in it
BENCH_MARGIN_S = 35.0                   # the bench's own deadline leaves this of its stage for start-up and the report
# The tests that need CUDA, chosen by their marker (tests/marks.py's on_gpu), not by a list of files to keep up to date.
GPU_TESTS = ("-m", "gpu", "tests")
# (name, arguments of python -m parity) of every suite that takes --device cuda
SUITES = (("cartpole", ("check",)), ("lm", ("check", "--task", "lm")), ("int8", ("int8",)))
PRECISIONS = ("default", "highest")
NOT_RUN = ("`check --task tree --port examples.gpt_adapter:GPTAdapter`: a port places its own tensors, and the tree "
           "suite refuses --device with --port (parity/tree/cli.py), so it has no CUDA run here",)
NEEDED = ("torch", "jax", "optax", "numpy", "scipy", "gymnasium", "pytest", "matplotlib")
TIMED_OUT = 124
NO_CUDA = ("the GPU run needs a CUDA device, and torch sees none{build}: run it on a machine with an NVIDIA GPU, with "
           "a CUDA build of torch and jax[cuda] installed in the environment (e.g. make setup CONSTRAINTS=<yours>)")


class Step(NamedTuple):
    """One command of the run: its stage, the arguments after `python`, where its output and report go."""
    name: str
    stage: str
    argv: tuple[str, ...]
    log: Path
    report: str                         # the step's report, relative to the output root (runs/)
    logged: str                         # its log, the same way


class Outcome(NamedTuple):
    """What a step did: exit status (TIMED_OUT when stopped at its budget), wall seconds, its log's last line."""
    rc: int
    seconds: float
    last: str


def plan(runs: Path, stages: Sequence[str] = STAGES) -> list[Step]:
    """Every step of the asked stages, in the order they run, writing under runs/gpu and runs/bench-gpu."""
    gpu, bench = runs / "gpu", runs / "bench-gpu"
    steps = []
    if "tests" in stages:
        steps.append(Step("tests", "tests", ("-m", "pytest", "-q", "-p", "no:cacheprovider", *GPU_TESTS),
                          gpu / "tests.log", "gpu/tests.log", "gpu/tests.log"))
    if "suites" in stages:
        for precision in PRECISIONS:
            for name, args in SUITES:
                label = f"{name}-{precision}"
                steps.append(Step(label, "suites", ("-m", "parity", *args, "--device", "cuda", "--reference-precision",
                                                    precision, "--out", str(gpu / label), "--quiet"),
                                  gpu / "logs" / f"{label}.log", f"gpu/{label}/summary.md", f"gpu/logs/{label}.log"))
    if "bench" in stages:
        deadline = BUDGETS_S["bench"] - BENCH_MARGIN_S
        steps.append(Step("bench", "bench", ("-m", "bench", "--device", "cuda", "--deadline", f"{deadline:.0f}",
                                             "--out", str(bench)), bench / "bench.log", "bench-gpu/summary.md",
                          "bench-gpu/bench.log"))
    return steps


def plan_text(steps: Sequence[Step], runs: Path) -> str:
    """The plan as --dry-run prints it: each stage's budget and commands, the total against TOTAL_S."""
    lines = [f"python -m bench.gpu_check: {len(steps)} steps -> {runs / 'gpu'}/, {runs / 'bench-gpu'}/"]
    stages = [s for s in STAGES if any(step.stage == s for step in steps)]
    for stage in stages:
        mine = [step for step in steps if step.stage == stage]
        together = " (side by side)" if len(mine) > 1 else ""
        lines.append(f"{stage}: within {BUDGETS_S[stage]:.0f} s{together}")
        lines += [f"  python {' '.join(step.argv)}" for step in mine]
    total = PREFLIGHT_S + sum(BUDGETS_S[s] for s in stages)
    lines.append(f"at most {total:.0f} s with the {PREFLIGHT_S:.0f} s checks before it (aimed at {TOTAL_S:.0f} s)")
    lines += [f"not run: {why}" for why in NOT_RUN]
    return "\n".join(lines)


def missing_packages(names: Sequence[str] = NEEDED) -> list[str]:
    return [n for n in names if importlib.util.find_spec(n) is None]


def child_env(parallel: int) -> dict[str, str]:
    """The steps' environment: JAX allocates GPU memory as used (torch and several processes share the GPU), output
    unbuffered (a stopped step's log keeps its last lines), and the CPU threads split among side-by-side steps."""
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    env.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
    if parallel > 1:
        env.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // parallel)))
    return env


def _stop(procs: Sequence[subprocess.Popen]) -> None:
    """Stop steps and every process each started (its own session, so its process group): TERM, up to 10 s for them
    to end, then KILL whatever of the groups is left (a worker a finished step left behind too)."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for proc in procs:
            try:
                os.killpg(proc.pid, sig)
            except ProcessLookupError:
                pass
        until = time.perf_counter() + 10.0
        for proc in procs:
            try:
                proc.wait(timeout=max(0.0, until - time.perf_counter()))
            except subprocess.TimeoutExpired:
                pass


def _last_line(log: Path) -> str:
    lines = [line for line in log.read_text(errors="replace").splitlines() if line.strip()] if log.exists() else []
    return lines[-1].strip() if lines else "no output"


def run_stage(steps: Sequence[Step], budget_s: float, python: str = sys.executable) -> list[Outcome]:
    """Start every step of one stage at once and poll them until the stage's budget is spent; a step still running
    then is stopped (with every process it started) and recorded as TIMED_OUT with its log's last line."""
    env, began = child_env(len(steps)), time.perf_counter()
    running = []
    for step in steps:
        step.log.parent.mkdir(parents=True, exist_ok=True)
        with open(step.log, "w") as log:
            running.append(subprocess.Popen([python, *step.argv], stdout=log, stderr=subprocess.STDOUT, env=env,
                                            start_new_session=True))
    ended: dict[int, tuple[int, float]] = {}
    try:
        while len(ended) < len(running) and time.perf_counter() - began < budget_s:
            for i, proc in enumerate(running):
                if i not in ended and proc.poll() is not None:
                    ended[i] = (proc.returncode, time.perf_counter() - began)
            time.sleep(0.1)
    except BaseException:                   # interrupted (Ctrl-C, the session's end): leave nothing on the GPU
        _stop(running)
        raise
    for i, proc in enumerate(running):
        if i not in ended and proc.poll() is not None:          # ended between the last poll and the budget
            ended[i] = (proc.returncode, time.perf_counter() - began)
    stopped_at = time.perf_counter() - began
    _stop(running)
    outcomes = []
    for i, step in enumerate(steps):
        rc, seconds = ended.get(i, (TIMED_OUT, stopped_at))
        last = _last_line(step.log) + (f" (stopped at the {budget_s:.0f} s budget)" if i not in ended else "")
        outcomes.append(Outcome(rc, seconds, last))
    return outcomes


class Machine(NamedTuple):
    """What the reports say the run ran on."""
    device: str                         # nvidia-smi's name, compute capability, driver, memory (or torch's)
    versions: str                       # python, torch (+ its CUDA), jax, jaxlib and JAX's backend
    commit: str


def readme(machine: Machine, steps: Sequence[Step], outcomes: Sequence[Outcome], command: str, here: str,
           seconds: float, budgets_s: dict[str, float] = BUDGETS_S) -> str:
    """gpu/README.md and bench-gpu/README.md: the machine, then every step (run or still to run) in one table."""
    rows = []
    for i, step in enumerate(steps):
        links = [path[len(here) + 1:] if path.startswith(here + "/") else "../" + path
                 for path in dict.fromkeys((step.report, step.logged))]
        report = ", ".join(f"[{link}]({link})" for link in links)
        if i < len(outcomes):
            o = outcomes[i]
            rows.append(f"| {step.stage} | `python {' '.join(step.argv)}` | {budgets_s[step.stage]:.0f} | {o.rc} "
                        f"| {o.seconds:.0f} | {o.last.replace('|', '/')} | {report} |")
        else:
            rows.append(f"| {step.stage} | `python {' '.join(step.argv)}` | {budgets_s[step.stage]:.0f} | not run yet "
                        f"| - | - | {report} |")
    done = len(outcomes) == len(steps)
    code = verdict(outcomes) if done else None
    state = (f"exit {code} ({'every step passed' if code == 0 else 'a finding: see the steps whose exit is not 0'})"
             if done else f"{len(outcomes)} of {len(steps)} steps done so far")
    return (f"# The GPU run (`make gpu`): CUDA tests, every suite on CUDA, the bench's GPU section\n\n"
            f"- command: `{command}`\n- device: {machine.device}\n- versions: {machine.versions}\n"
            f"- commit: {machine.commit}\n- result: {state}, {seconds:.0f} s (aimed at {TOTAL_S:.0f} s)\n"
            f"- exit 124: the step was stopped at its stage's budget (seconds: since its stage began)\n\n"
            f"| stage | command | stage's budget s | exit | seconds | last line | report, log |\n"
            f"| --- | --- | --- | --- | --- | --- | --- |\n" + "\n".join(rows) + "\n\n"
            + "".join(f"Not run: {why}.\n" for why in NOT_RUN))


def verdict(outcomes: Sequence[Outcome]) -> int:
    return 0 if all(o.rc == 0 for o in outcomes) else 1


def write_reports(runs: Path, machine: Machine, steps: Sequence[Step], outcomes: Sequence[Outcome], command: str,
                  seconds: float, budgets_s: dict[str, float] = BUDGETS_S) -> None:
    """README.md and run.json, as far as the run has got, in each folder a step of this run writes to (gpu/ for the
    tests and suites, bench-gpu/ for the bench): a rerun of one stage leaves the other folder's record alone."""
    record = {"command": command, "machine": machine._asdict(), "seconds": round(seconds, 1),
              "exit": verdict(outcomes) if len(outcomes) == len(steps) else None,
              "steps": [{"stage": s.stage, "name": s.name, "command": "python " + " ".join(s.argv),
                         "budget_s": budgets_s[s.stage], **(o._asdict() if o else {"rc": None})}
                        for s, o in zip(steps, [*outcomes, *[None] * (len(steps) - len(outcomes))])]}
    for here in dict.fromkeys("bench-gpu" if step.stage == "bench" else "gpu" for step in steps):
        (runs / here).mkdir(parents=True, exist_ok=True)
        text = readme(machine, steps, outcomes, command, here, seconds, budgets_s)
        (runs / here / "README.md").write_text(text)
        (runs / here / "run.json").write_text(json.dumps(record, indent=2) + "\n")


def execute(runs: Path, steps: Sequence[Step], machine: Machine, command: str,
            budgets_s: dict[str, float] = BUDGETS_S) -> int:
    """Run the stages in order, each within its budget, the reports rewritten after each; 0 all passed, else 1."""
    began, outcomes = time.perf_counter(), []
    write_reports(runs, machine, steps, outcomes, command, 0.0, budgets_s)
    for stage in STAGES:
        mine = [step for step in steps if step.stage == stage]
        if not mine:
            continue
        print(f"{stage}: {len(mine)} step(s) within {budgets_s[stage]:.0f} s", flush=True)
        for step, o in zip(mine, run_stage(mine, budgets_s[stage])):
            print(f"  {step.name}: exit {o.rc} in {o.seconds:.0f} s: {o.last}", flush=True)
            outcomes.append(o)
        write_reports(runs, machine, steps, outcomes, command, time.perf_counter() - began, budgets_s)
    code = verdict(outcomes)
    print(f"wrote {runs / 'gpu' / 'README.md'} and {runs / 'bench-gpu' / 'README.md'}; exit {code}", flush=True)
    return code


JAX_PROBE = ("import json, jax, jaxlib; print(json.dumps({'jax': jax.__version__, 'jaxlib': jaxlib.__version__, "
             "'backend': jax.default_backend(), 'devices': str(jax.devices())}))")


def _output(cmd: Sequence[str], timeout_s: float, env: dict[str, str] | None = None) -> str | None:
    """A command's stdout, stripped, or None when it cannot run, fails or outlasts timeout_s."""
    try:
        done = subprocess.run(list(cmd), capture_output=True, text=True, timeout=timeout_s, env=env)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout.strip() if done.returncode == 0 else None


def probe_jax(python: str = sys.executable) -> dict | str:
    """JAX's versions and backend, read in a process of its own (so this one holds no JAX client on the GPU the
    steps use), or the sentence that says why the machine cannot run the suites' reference on the GPU."""
    out = _output([python, "-c", JAX_PROBE], PREFLIGHT_S, child_env(1))
    try:
        info = json.loads(out.splitlines()[-1]) if out else None
    except ValueError:
        info = None
    if info is None:
        return f"JAX could not be imported, or did not answer within {PREFLIGHT_S:.0f} s (install jax[cuda])"
    if info["backend"] != "gpu":
        return f"JAX {info['jax']} runs on {info['backend']}, not a GPU: install jax[cuda] (its CUDA plugin)"
    return info


def describe_machine(torch, jax_info: dict) -> Machine:
    """The device (nvidia-smi's name, compute capability, driver and memory, or torch's where nvidia-smi is not
    there), the versions and the commit, for the reports."""
    device = _output(["nvidia-smi", "--query-gpu=name,compute_cap,driver_version,memory.total",
                      "--format=csv,noheader"], 30.0)
    parts = [part.strip() for part in device.splitlines()[0].split(",")] if device else []
    if len(parts) == 4:
        device = f"{parts[0]}, compute capability {parts[1]}, driver {parts[2]}, {parts[3]}"
    else:
        major, minor = torch.cuda.get_device_capability(0)
        device = f"{torch.cuda.get_device_name(0)}, compute capability {major}.{minor} (torch's; no nvidia-smi)"
    versions = (f"python {sys.version.split()[0]}, torch {torch.__version__} (CUDA {torch.version.cuda}), "
                f"jax {jax_info['jax']}, jaxlib {jax_info['jaxlib']}, JAX backend {jax_info['backend']} "
                f"{jax_info['devices']}")
    head = _output(["git", "rev-parse", "HEAD"], 30.0)
    dirty = _output(["git", "status", "--porcelain", "--untracked-files=no"], 30.0)
    commit = f"{head}{' (with local changes)' if dirty else ''}" if head else "unknown (not a git checkout)"
    return Machine(device, versions, commit)


def cannot_run(runs: Path, torch) -> str | None:
    """Why this machine cannot run the GPU run (the sentence for exit 2), or None; reads, writes nothing."""
    if not torch.cuda.is_available():
        build = " (this torch, " + torch.__version__ + ", is a CPU-only build)" if torch.version.cuda is None else ""
        return NO_CUDA.format(build=build)
    missing = missing_packages()
    if missing:
        return (f"missing packages: {', '.join(missing)} (install them, or bring their wheels and "
                f"`pip install --no-index --no-deps` them)")
    from spec.limits import check_out_dir
    try:
        for here in ("gpu", "bench-gpu"):
            check_out_dir(str(runs / here), "--runs")
    except ValueError as err:
        return str(err)
    return None


def _stages(text: str) -> tuple[str, ...]:
    asked = tuple(part.strip() for part in text.split(",") if part.strip())
    wrong = [s for s in asked if s not in STAGES]
    if wrong or not asked:
        raise argparse.ArgumentTypeError(f"unknown stage(s) {', '.join(wrong) or '(none given)'}; the stages are "
                                         f"{', '.join(STAGES)} (comma-separated)")
    return asked


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.gpu_check", description=__doc__.splitlines()[0])
    ap.add_argument("--runs", default="runs", help="output root: writes RUNS/gpu/ and RUNS/bench-gpu/ (default "
                                                   "runs, which git ignores; the published run is --runs reports)")
    ap.add_argument("--steps", type=_stages, default=STAGES, metavar="STAGES",
                    help=f"the stages to run, comma-separated (default all: {','.join(STAGES)}), e.g. to rerun one")
    ap.add_argument("--dry-run", action="store_true", help="print the plan (commands and budgets); run nothing")
    try:
        args = ap.parse_args(argv)
    except SystemExit as exit_:
        return int(exit_.code or 0)
    runs = Path(args.runs)
    steps = plan(runs, args.steps)
    if args.dry_run:
        print(plan_text(steps, runs))
        return 0
    import torch
    problem = cannot_run(runs, torch)
    jax_info = probe_jax() if problem is None else None
    if isinstance(jax_info, str):
        problem = jax_info
    if problem is not None:
        print(f"error: {problem}", file=sys.stderr)
        return 2
    command = "python -m bench.gpu_check " + " ".join(argv if argv is not None else sys.argv[1:])
    return execute(runs, steps, describe_machine(torch, jax_info), command.strip())


if __name__ == "__main__":
    sys.exit(main())
