"""A repro for every failure (issue 22 item 4): a failed check writes <out>/repro/<check>/, and its repro.py, run
alone (another working directory, PYTHONPATH only what the port needs, jax and the suite unimportable), calls the
port's method and reproduces the failure; a faithful side writes nothing.

Seeds are fresh each run (printed on failure); the selftest size and `--checks` subsets keep it cheap.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from parity.__main__ import main
from parity.core.repro import Collector, Tape, margin
from tests import fresh_process

ROOT = Path(__file__).resolve().parents[3]
MINIMAL = ROOT / "examples" / "minimal_adapter.py"

# Runs a script with jax and the parity suite's own modules unimportable (for the torch side, whose port module is
# parity.mlp.torch_side, `parity` itself stays allowed), plus what REPRO_TEST_BLOCK lists.
BLOCKER = """
import os, runpy, sys
BLOCKED = ("jax", "jaxlib", "optax", "parity.mlp.suite", "parity.core.tape", "parity.mlp.adapter", "parity.core.repro",
           "parity.mlp.checks", "parity.mlp.reference", "jax_reference") + tuple(os.environ["REPRO_TEST_BLOCK"].split())
class Block:
    def find_spec(self, name, path=None, target=None):
        if any(name == b or name.startswith(b + ".") for b in BLOCKED):
            raise ImportError(f"blocked in this test: {name}")
sys.meta_path.insert(0, Block())
script = sys.argv[1]
sys.argv = sys.argv[1:]
runpy.run_path(script, run_name="__main__")
"""


NUMPY_PORT_BLOCK = "parity spec torch torch_impl reporting rollout"     # a numpy port needs none of them


@pytest.fixture
def seed() -> int:
    return int(np.random.SeedSequence().entropy % 2**32)


def check(out: Path, seed: int, *args: str) -> int:
    return main(["check", "--size", "selftest", "--seed", str(seed), "--out", str(out), "--quiet", *args])


def run_repro(folder: Path, cwd: Path, pythonpath: str, block: str = "") -> subprocess.CompletedProcess:
    (cwd / "blocker.py").write_text(BLOCKER)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.update(PYTHONPATH=pythonpath, REPRO_TEST_BLOCK=block)
    # A process of its own, forked from tests/fresh_process's server (torch preloaded, nothing of the checkout) where
    # torch is allowed: 18 torch-side runs here, ~1.4 s of torch's import each saved.
    return fresh_process.run(["blocker.py", str(folder / "repro.py")], cwd, env, timeout=300, blocked=block)


def drifted_minimal(where: Path, old: str, new: str, name: str) -> Path:
    """A copy of examples/minimal_adapter.py as module `name` in `where`, with `old` replaced by `new`."""
    text = MINIMAL.read_text()
    assert text.count(old) == 1, old
    where.mkdir(parents=True, exist_ok=True)
    (where / f"{name}.py").write_text(text.replace(old, new))
    return where / f"{name}.py"


def edit_port(module: Path, text: str) -> None:
    """The port author's edit of a port module the check imported: its bytecode (make test writes it) dropped too,
    since Python tells a cached module from its source by the second it was written and its length, and an edit
    within that second of the same length (1e-5 -> 1e-3) would run the old code again."""
    module.write_text(text)
    shutil.rmtree(module.parent / "__pycache__", ignore_errors=True)


def test_a_drifted_torch_side_writes_a_repro_that_fails_alone(tmp_path, seed):
    out = tmp_path / "report"
    assert check(out, seed, "--torch", "fitness=std", "--checks", "fitness"), f"seed {seed}"
    folder = out / "repro" / "fitness"
    assert {p.name for p in folder.iterdir()} == {"repro.py", "inputs.npz", "call.json", "command.txt"}
    call = json.loads((folder / "call.json").read_text())
    assert call["method"] == "shape_fitness" and call["port"]["knobs"] == ["fitness=std"]
    assert "--torch fitness=std" in (folder / "command.txt").read_text()
    assert f"`{folder}/`" in (out / "summary.md").read_text()
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    done = run_repro(folder, elsewhere, str(ROOT))
    assert done.returncode == 1, f"seed {seed}\n{done.stdout}\n{done.stderr}"
    assert "shape_fitness" in done.stdout and "max |port - reference|" in done.stdout
    assert "FAIL: the port still differs" in done.stdout


@pytest.mark.parametrize("knob, check_name, method", [
    ("antithetic=halves", "noise", "noise"),            # a pairing drift of a side claiming JAX's draws
    ("init=torch", "init", "init_params"),
    ("bias_grad=over_sigma", "gradients", "gradient"),
    ("activation=tanh", "products", "forward"),
    ("actions=greedy", "actions", "actions"),
])
def test_each_witnessing_check_of_a_drifted_torch_side_gets_a_repro(tmp_path, seed, knob, check_name, method):
    out = tmp_path / "report"
    assert check(out, seed, "--torch", knob, "--checks", check_name) == 1, f"seed {seed}"
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    done = run_repro(out / "repro" / check_name, elsewhere, str(ROOT))
    assert done.returncode == 1, f"seed {seed}\n{done.stdout}\n{done.stderr}"
    assert f"port {method}()" in done.stdout and "FAIL: the port still differs" in done.stdout


def test_the_faithful_torch_side_writes_none_and_removes_an_earlier_one(tmp_path, seed):
    out = tmp_path / "report"
    assert check(out, seed, "--torch", "fitness=std", "--checks", "fitness,gradients") == 1
    assert (out / "repro" / "fitness").is_dir()
    assert check(out, seed, "--checks", "fitness,gradients") == 0, f"seed {seed}"
    assert not (out / "repro").exists()
    assert "Repro" not in (out / "summary.md").read_text()


@pytest.mark.parametrize("old, new, checks, method", [
    ("/ np.float32(len(shaped))", "/ np.float32(len(shaped) - 1)", "gradients", "gradient"),   # the N-1 estimate
    ("np.float32(1e-5)", "np.float32(1e-3)", "fitness", "shape_fitness"),                    # another epsilon
])
def test_a_drifted_minimal_adapter_gets_a_repro_that_needs_only_numpy_and_the_port(tmp_path, monkeypatch, seed, old,
                                                                                      new, checks, method):
    ports = tmp_path / "ports"
    module = drifted_minimal(ports, old, new, f"drifted_{checks}")
    monkeypatch.syspath_prepend(str(ports))
    out = tmp_path / "report"
    assert check(out, seed, "--port", f"{module.stem}:adapter", "--checks", checks) == 1, f"seed {seed}"
    folder = out / "repro" / checks
    assert json.loads((folder / "call.json").read_text())["method"] == method
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    done = run_repro(folder, elsewhere, str(ports), NUMPY_PORT_BLOCK)
    assert done.returncode == 1, f"seed {seed}\n{done.stdout}\n{done.stderr}"
    assert f"port {method}()" in done.stdout and "FAIL" in done.stdout
    # the port author fixes the port: the same script now passes, and says the output moved
    edit_port(module, MINIMAL.read_text())
    fixed = run_repro(folder, elsewhere, str(ports), NUMPY_PORT_BLOCK)
    assert fixed.returncode == 0, f"seed {seed}\n{fixed.stdout}\n{fixed.stderr}"
    assert "PASS" in fixed.stdout and "differs from what it returned during the check" in fixed.stdout


def test_the_faithful_minimal_adapter_writes_none(tmp_path, seed):
    out = tmp_path / "report"
    assert check(out, seed, "--port", "examples.minimal_adapter:adapter", "--checks", "fitness,gradients,noise") == 0, \
        f"seed {seed}"
    assert not (out / "repro").exists()


@pytest.mark.parametrize("old, new, leaf", [
    ("np.float32(sigma / np.sqrt(rank))", "np.float32(sigma)", "A"),          # A without its 1/sqrt(r)
    ("z[:, :n_in])", "z[:, :n_in] * np.float32(1.5))", "B"),                  # B not standard normal
])
def test_a_statistical_scale_failure_gets_a_repro_that_recomputes_it(tmp_path, monkeypatch, seed, old, new, leaf):
    """The minimal adapter draws numpy's numbers: its noise is judged in distribution; the repro calls noise() afresh
    and recomputes the failing mean square against its chi-square interval."""
    ports = tmp_path / "ports"
    module = drifted_minimal(ports, old, new, f"drifted_scale_{leaf}")     # a module name per case: no stale import
    monkeypatch.syspath_prepend(str(ports))
    out = tmp_path / "report"
    assert check(out, seed, "--port", f"{module.stem}:adapter", "--checks", "noise") == 1, f"seed {seed}"
    folder = out / "repro" / "noise"
    call = json.loads((folder / "call.json").read_text())
    assert call["method"] == "noise" and call["statistic"]["kind"] == "mean square"
    assert call["case"].startswith(f"0.weight {leaf}") and call["path"] == ["0.weight", "AB".index(leaf)]
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    done = run_repro(folder, elsewhere, str(ports), NUMPY_PORT_BLOCK)
    assert done.returncode == 1, f"seed {seed}\n{done.stdout}\n{done.stderr}"
    assert "mean square of" in done.stdout and "FAIL: the statistic is still outside" in done.stdout
    edit_port(module, MINIMAL.read_text())
    fixed = run_repro(folder, elsewhere, str(ports), NUMPY_PORT_BLOCK)
    assert fixed.returncode == 0, f"seed {seed}\n{fixed.stdout}\n{fixed.stderr}"
    assert "PASS: the statistic is within" in fixed.stdout and "differ from those during the check" in fixed.stdout


def test_a_failure_no_call_shows_says_why_it_has_no_repro(tmp_path, seed):
    """A sigma schedule drift of a side on torch's generator shows only in the trajectory's sigma readings (its own
    epochs against each other), not in its step nor in noise compared with the reference's: no replay."""
    out = tmp_path / "report"
    assert check(out, seed, "--torch", "rng=torch", "--torch", "sigma_decay=0.9", "--checks", "trajectory") == 1, \
        f"seed {seed}"
    assert not (out / "repro").exists()
    assert "No repro: no single port call" in (out / "summary.md").read_text()


# ---------------------------------------------------------------- the pieces
@pytest.mark.parametrize("n", [3, 40])
def test_the_collector_keeps_the_worst_comparison_and_its_call(n):
    rng = np.random.default_rng()
    collector, calls = Collector(), []
    collector.start("fitness")
    ref = rng.standard_normal(n)
    for scale in (0.0, 3.0, 1.0):                  # within, the worst, beyond but less
        x = rng.standard_normal(n).astype(np.float32)
        pending = collector.tape.before("shape_fitness", (x, 0), {})
        x[:] = 0                                   # a port writing into its input cannot change the record
        out = ref + scale
        collector.tape.after(pending, out)
        calls.append(pending)
        collector.witness(f"scale {scale}", out, out, ref, 0.5, "test")
    ev = collector.evidence["fitness"]
    assert ev.label == "scale 3.0" and ev.ratio == pytest.approx(6.0)
    assert np.array_equal(ev.call.args[0], calls[1][1][0]) and np.any(ev.call.args[0] != 0)


@pytest.mark.parametrize("shape", [(1,), (5, 7)])
def test_margin_is_the_worst_excess_and_infinite_for_nan_or_nothing_allowed(shape):
    rng = np.random.default_rng()
    ref = rng.standard_normal(shape)
    allowed = np.abs(rng.standard_normal(shape)) + 0.1
    assert margin(ref + 0.5 * allowed, ref, allowed) == 0.0
    port = ref + 2 * allowed
    assert margin(port, ref, allowed) == pytest.approx(2.0)
    port.flat[-1] = np.nan
    assert margin(port, ref, allowed) == np.inf
    assert margin(ref + 1e-9, ref, 0.0) == np.inf


def test_the_tape_keeps_only_the_last_calls():
    tape = Tape(keep=2)
    outputs = [np.zeros(1) + i for i in range(3)]
    for i, out in enumerate(outputs):
        tape.after(tape.before("actions", (i,), {}), out)
    assert tape.producing(outputs[0]) is None and tape.producing(outputs[2]).args == (2,)


# ---------------------------------------------------------------- the LM suite
@pytest.fixture
def lm_fitness_only(monkeypatch):
    """The LM suite's CLI with only its fitness and products checks (the others take minutes on 2 cores)."""
    from parity.tree import check as tree_check

    plan = tree_check._plan
    monkeypatch.setattr(tree_check, "_plan", lambda *a, **k: [p for p in plan(*a, **k)
                                                              if p[0] in ("fitness", "products")])


def lm_check(out: Path, seed: int, *args: str) -> int:
    return main(["check", "--task", "lm", "--size", "selftest", "--seed", str(seed), "--out", str(out), "--quiet",
                 *args])


def test_a_drifted_lm_torch_side_writes_a_repro_and_the_faithful_one_none(tmp_path, seed, lm_fitness_only):
    out = tmp_path / "report"
    assert lm_check(out, seed, "--torch", "group_fitness=group_var") == 1, f"seed {seed}"
    folder = out / "repro" / "fitness"
    assert f"`{folder}/`" in (out / "summary.md").read_text()
    assert json.loads((folder / "call.json").read_text())["method"] == "shape"
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    done = run_repro(folder, elsewhere, str(ROOT))
    assert done.returncode == 1, f"seed {seed}\n{done.stdout}\n{done.stderr}"
    assert "port shape()" in done.stdout and "FAIL" in done.stdout
    assert lm_check(out, seed) == 0, f"seed {seed}"
    assert not (out / "repro").exists()


DRIFTED_LM = """
from examples.lm_adapter import LMAdapter
from spec.tree_knobs import TreeKnobs


class Drifted(LMAdapter):
    def __init__(self, cfg):
        super().__init__(cfg, TreeKnobs(group_fitness="group_var"))
"""


def test_a_drifted_tree_port_gets_a_repro_of_its_own_method(tmp_path, monkeypatch, seed, lm_fitness_only):
    ports = tmp_path / "ports"
    ports.mkdir()
    (ports / "drifted_lm.py").write_text(DRIFTED_LM)
    monkeypatch.syspath_prepend(str(ports))
    out = tmp_path / "report"
    assert lm_check(out, seed, "--port", "drifted_lm:Drifted") == 1, f"seed {seed}"
    folder = out / "repro" / "fitness"
    assert json.loads((folder / "call.json").read_text())["method"] == "shape_fitness"
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    done = run_repro(folder, elsewhere, os.pathsep.join([str(ports), str(ROOT)]), "parity")
    assert done.returncode == 1, f"seed {seed}\n{done.stdout}\n{done.stderr}"
    assert "port shape_fitness()" in done.stdout and "FAIL" in done.stdout


STD_GPT = """
import numpy as np
from examples.gpt_adapter import GPTAdapter


class Std(GPTAdapter):
    def shape_fitness(self, f, group_size):
        return ((f - f.mean()) / f.std()).astype(np.float32)


def Adapter():
    return Std(pop=8)
"""


def test_a_port_imported_from_the_working_folder_gets_a_repro_that_runs_from_anywhere(tmp_path, seed):
    """`python -m parity check --task tree --port myport:Adapter` run where myport.py lies (PYTHONPATH only the
    project root): call.json records that folder, so repro.py finds the port from any other folder."""
    work, elsewhere = tmp_path / "work", tmp_path / "elsewhere"
    work.mkdir()
    elsewhere.mkdir()
    (work / "myport.py").write_text(STD_GPT)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"} | {"PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-m", "parity", "check", "--task", "tree", "--port", "myport:Adapter",
                           "--size", "selftest", "--seed", str(seed), "--out", "out", "--quiet"], cwd=work, env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 1 and "knob `fitness`" in done.stdout, f"seed {seed}\n{done.stdout}\n{done.stderr}"
    folder = work / "out" / "repro" / "fitness"
    assert json.loads((folder / "call.json").read_text())["port"]["path"] == str(work.resolve())
    done = run_repro(folder, elsewhere, str(ROOT), "parity")
    assert done.returncode == 1, f"seed {seed}\n{done.stdout}\n{done.stderr}"
    assert "port shape_fitness()" in done.stdout and "FAIL" in done.stdout


def test_the_tape_records_only_while_a_witnessing_check_runs():
    collector = Collector()
    collector.start("trajectory")
    assert not collector.tape.wants("forward")
    collector.start("products")
    assert collector.tape.wants("forward") and not collector.tape.wants("es_tell")


def test_a_port_edited_to_the_wrong_shape_still_fails_with_the_shapes_named(tmp_path, monkeypatch, seed):
    ports = tmp_path / "ports"
    old = "/ np.float32(len(shaped))"
    module = drifted_minimal(ports, old, "/ np.float32(len(shaped) - 1)", "drifted_shape")
    monkeypatch.syspath_prepend(str(ports))
    out = tmp_path / "report"
    assert check(out, seed, "--port", "drifted_shape:adapter", "--checks", "gradients") == 1, f"seed {seed}"
    line = next(line for line in MINIMAL.read_text().splitlines() if old in line)
    indent = line[:len(line) - len(line.lstrip())]
    edit_port(module, MINIMAL.read_text().replace(line, f"{indent}grads[name] = np.zeros(3, np.float32)"))
    done = run_repro(out / "repro" / "gradients", tmp_path, str(ports), NUMPY_PORT_BLOCK)
    assert done.returncode == 1 and "returned shape (3,)" in done.stdout, f"{done.stdout}\n{done.stderr}"


# ---------------------------------------------------------------- replays: the optimizer's and the ES loop's epochs
def fixed_knobs(folder: Path) -> None:
    """call.json with the torch side's knobs dropped: the port author's fix, as the script will build it."""
    call = json.loads((folder / "call.json").read_text())
    call["port"]["knobs"] = []
    (folder / "call.json").write_text(json.dumps(call))


@pytest.mark.parametrize("knob, epoch", [
    ("optimizer=adam", 0),          # the first step already differs
    ("lr_decay=0.9", 1),            # the schedule: epoch 0 agrees, the replay runs two epochs
])
def test_a_drifted_optimizer_gets_a_replay_up_to_its_first_failing_epoch(tmp_path, seed, knob, epoch):
    out = tmp_path / "report"
    assert check(out, seed, "--torch", knob, "--checks", "updates") == 1, f"seed {seed}"
    folder = out / "repro" / "updates"
    call = json.loads((folder / "call.json").read_text())
    assert [s["method"] for s in call["steps"]] == ["optimizer_init"] + ["optimizer_step"] * (epoch + 1)
    assert call["case"].startswith(f"epoch {epoch} ") and call["result"] == "params"
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    done = run_repro(folder, elsewhere, str(ROOT))
    assert done.returncode == 1, f"seed {seed}\n{done.stdout}\n{done.stderr}"
    steps = "optimizer_step()" + (f" x{epoch + 1}" if epoch else "")
    assert f"port optimizer_init(), {steps} replayed" in done.stdout, done.stdout
    assert "0.weight: max |port - reference|" in done.stdout and "FAIL: the port still differs" in done.stdout
    assert "differs from what it returned" not in done.stdout          # deterministic: the check's own output
    fixed_knobs(folder)
    fixed = run_repro(folder, elsewhere, str(ROOT))
    assert fixed.returncode == 0, f"seed {seed}\n{fixed.stdout}\n{fixed.stderr}"
    assert "PASS" in fixed.stdout and "differs from what it returned during the check" in fixed.stdout


def test_the_faithful_optimizer_writes_no_replay(tmp_path, seed):
    out = tmp_path / "report"
    assert check(out, seed, "--checks", "updates") == 0, f"seed {seed}"
    assert not (out / "repro").exists()


@pytest.mark.parametrize("shape", [(3,), (4, 5)])
def test_the_collector_keeps_the_first_failing_replay_only(shape):
    rng = np.random.default_rng()
    collector = Collector()
    collector.start("updates")
    ref = {"w": rng.standard_normal(shape)}
    within = {"w": ref["w"] + 0.1}
    collector.replay("epoch 0", [], "params", within, ref, {"w": np.full(shape, 0.5)}, "test")
    assert "updates" not in collector.evidence
    first, later = {"w": ref["w"] + 1.0}, {"w": ref["w"] + 9.0}
    collector.replay("epoch 1", [], "params", first, ref, {"w": np.full(shape, 0.5)}, "test")
    collector.replay("epoch 2", [], "params", later, ref, {"w": np.full(shape, 0.5)}, "test")
    ev = collector.evidence["updates"]
    assert ev.label == "epoch 1" and ev.ratio == pytest.approx(2.0) and ev.allowed["w"].shape == shape


@pytest.mark.parametrize("knob, epoch", [("optimizer=adam", 0), ("lr_decay=0.9", 1)])
def test_a_drifted_es_loop_gets_a_replay_up_to_its_first_failing_step(tmp_path, seed, knob, epoch):
    out = tmp_path / "report"
    assert check(out, seed, "--torch", knob, "--checks", "trajectory") == 1, f"seed {seed}"
    folder = out / "repro" / "trajectory"
    call = json.loads((folder / "call.json").read_text())
    assert [s["method"] for s in call["steps"]] == ["es_init"] + ["es_ask", "es_tell"] * (epoch + 1) + ["es_params"]
    assert call["case"].startswith(f"epoch {epoch} ")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    done = run_repro(folder, elsewhere, str(ROOT))
    assert done.returncode == 1, f"seed {seed}\n{done.stdout}\n{done.stderr}"
    assert "port es_init(), es_ask(), es_tell()" in done.stdout and "es_params() replayed" in done.stdout
    assert "FAIL: the port still differs" in done.stdout and "differs from what it returned" not in done.stdout
    fixed_knobs(folder)
    fixed = run_repro(folder, elsewhere, str(ROOT))
    assert fixed.returncode == 0, f"seed {seed}\n{fixed.stdout}\n{fixed.stderr}"
    assert "PASS" in fixed.stdout


def test_the_faithful_es_loop_writes_no_replay(tmp_path, seed):
    out = tmp_path / "report"
    assert check(out, seed, "--checks", "trajectory") == 0, f"seed {seed}"
    assert not (out / "repro").exists()


@pytest.mark.parametrize("n", [4, 50])
def test_the_collector_keeps_a_statistic_only_for_a_taped_call_and_after_no_comparison(n):
    rng = np.random.default_rng()
    draws = rng.standard_normal((n, 3))
    collector = Collector()
    collector.start("noise")
    collector.statistic("A", draws, (), np.arange(n), 1.0, "mean square", 4.0, (0.5, 1.5), 1e-5, "test", draws)
    assert "noise" not in collector.evidence              # no call on the tape produced these draws
    collector.tape.after(collector.tape.before("noise", ({"w": (3,)}, 1), {}), draws)
    collector.statistic("A", draws, (), np.arange(n), 1.0, "mean square", 4.0, (0.5, 1.5), 1e-5, "test", draws)
    collector.statistic("B", draws, (), np.arange(n), 1.0, "mean square", 9.0, (0.5, 1.5), 1e-5, "test", draws)
    ev = collector.evidence["noise"]
    assert ev.label == "A" and ev.call.args[1] == 1 and np.array_equal(ev.port, draws)


def test_a_drifted_es_noise_gets_a_replay_up_to_its_first_failing_ask(tmp_path, seed):
    """A side claiming JAX's draws with another sigma schedule: its epoch-1 es_ask noise differs from the reference's
    (the noise row, before that epoch's step): replayed up to that es_ask, compared factor by factor, exactly."""
    out = tmp_path / "report"
    assert check(out, seed, "--torch", "sigma_decay=0.9", "--checks", "trajectory") == 1, f"seed {seed}"
    folder = out / "repro" / "trajectory"
    call = json.loads((folder / "call.json").read_text())
    assert [s["method"] for s in call["steps"]] == ["es_init", "es_ask", "es_tell", "es_ask"]
    assert call["result"] == "noise" and call["paths"]["0.weight A"] == ["0.weight", 0]
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    done = run_repro(folder, elsewhere, str(ROOT))
    assert done.returncode == 1, f"seed {seed}\n{done.stdout}\n{done.stderr}"
    assert "0.weight A: max |port - reference|" in done.stdout and "0.weight B: max |port - reference| 0," in done.stdout
    fixed_knobs(folder)
    fixed = run_repro(folder, elsewhere, str(ROOT))
    assert fixed.returncode == 0 and "PASS" in fixed.stdout, f"seed {seed}\n{fixed.stdout}\n{fixed.stderr}"
