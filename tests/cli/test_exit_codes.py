"""`python -m parity check`: exit codes, clear messages for bad input, and the subcommand dispatch."""
from __future__ import annotations

import subprocess
import sys
import types

import pytest

from parity import __main__ as cli


@pytest.mark.parametrize("argv,needle", [
    (["--torch", "antithetic=sideways"], "unknown value 'sideways' for knob 'antithetic'; allowed: interleaved"),
    (["--torch", "flavour=jax"], "unknown knob 'flavour'; known knobs:"),
    (["--torch", "noise_reuse=often"], "knob 'noise_reuse' takes an integer"),
    (["--torch", "antithetic"], "expected KNOB=VALUE"),
    (["--torch", "lr_decay=1.5"], "lr_decay must be"),
    (["--profile", "pytorch"], "unknown profile 'pytorch'; known profiles: jax, jax-torchrng"),
    (["--port", "no_colon"], "package.module:attr"),
    (["--port", "a.b:c", "--torch", "rng=torch"], "do not apply with --port"),
    (["--checks", "noise,vibes"], "unknown check(s) vibes"),
    (["--seed", "many"], "a seed is an integer in [0, 4,294,967,295], got 'many'"),
    (["--quick", "--full"], "not allowed with argument"),
    # the integer task's own inputs (parity/int8/cli.py), through the same command
    (["--task", "int8", "--hidden", "8"], "not a power of 4"),
    (["--task", "int8", "--pop", "7"], "pop 7 is odd"),
    (["--task", "int8", "--sigma-shift", "40"], "sigma_shift 40 is out of range"),
    (["--task", "int8", "--corpus", "/nonexistent/corpus.txt"], "no such file"),
    (["--task", "int8", "--torch", "noise=xorshift"], "unknown int8 knob 'noise'"),
    (["--task", "int8", "--torch", "log2=exact"], "use table (nano-egg) or mitchell (egg.c)"),
    (["--task", "int8", "--profile", "eggc"], "unknown int8 profile 'eggc'"),
    (["--task", "int8", "--size", "paper"], "--size 'paper': use one of selftest, quick"),
    (["--task", "int8", "--epochs", "9", "--size", "selftest"], "--epochs 9: the trajectory runs 1..4"),
    # every task's flags (parity/core/flags.py): a flag a task cannot honour, a seed out of range
    (["--checks", "bogus"], "unknown check(s) bogus; known: "),
    (["--seed", "-1"], "a seed must be an integer in [0, 4,294,967,295]"),
    (["--task", "lm", "--checks", "bogus"], "unknown check(s) bogus; known: init, noise"),
    (["--task", "lm", "--seed", "-1"], "a seed must be an integer"),
    (["--task", "int8", "--port", "x:y"], "--task int8 does not take --port: "),
    (["--task", "int8", "--against", "vectors/lm-quick"], "--task int8 does not take --against: "),
    (["--task", "int8", "--checks", "bogus"], "unknown check(s) bogus; known: init, starts"),
    (["--task", "int8", "--checks", "init"], "it takes no subset (cartpole, lm and tree do"),
    (["--task", "int8", "--seed", "-1"], "a seed must be an integer"),
    (["int8", "--port", "x:y"], "--task int8 does not take --port: "),       # the alias keeps the contract
])
def test_bad_usage_exits_2_with_a_clear_message_and_writes_nothing(argv, needle, capsys, tmp_path):
    out = tmp_path / "out"
    assert cli.main(argv + ["--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert needle in err and (err.startswith("parity int8: ") or "int8" not in argv), err
    assert not out.exists()


def test_a_passing_subset_exits_0_and_writes_the_report(tmp_path, capsys):
    rc = cli.main(["--size", "selftest", "--checks", "fitness,products", "--out", str(tmp_path)])
    assert rc == 0
    out = capsys.readouterr().out
    assert "[fitness] pass" in out and "PASS" in out
    summary = (tmp_path / "summary.md").read_text()
    assert summary.startswith("# Parity check: PASS")
    assert "--size selftest --checks fitness,products" in summary


def test_a_port_that_breaks_the_protocol_exits_2(tmp_path, monkeypatch):
    from parity.mlp.reference import ReferencePort

    class Broken(ReferencePort):
        def shape_fitness(self, f, group_size=0):
            return f[:-1]

    module = types.ModuleType("broken_port_for_cli")
    module.adapter = Broken
    monkeypatch.setitem(sys.modules, "broken_port_for_cli", module)
    rc = cli.main(["--port", "broken_port_for_cli:adapter", "--size", "selftest", "--checks", "fitness",
                   "--out", str(tmp_path), "--quiet"])
    assert rc == 2
    summary = (tmp_path / "summary.md").read_text()
    assert "ERROR" in summary and "port method `shape_fitness`" in summary


def test_moved_subcommands_name_their_new_command(capsys):
    assert cli.main(["gap", "--out", "x"]) == 2
    assert "python -m gap" in capsys.readouterr().err
    assert cli.main(["bench", "--quick"]) == 2
    assert "python -m bench" in capsys.readouterr().err


def test_unknown_words_are_usage_errors(capsys):
    assert cli.main(["chekc"]) == 2
    assert "unrecognized arguments: chekc" in capsys.readouterr().err


def test_module_entry_point_runs_as_a_process():
    done = subprocess.run([sys.executable, "-m", "parity", "check", "--torch", "bogus=1"], capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 2 and "unknown knob 'bogus'" in done.stderr


def test_internal_crash_is_not_read_as_a_mismatch(monkeypatch, tmp_path, capsys):
    """A bug inside the suite exits 3 with a message, never 1 (which means 'mismatch found')."""
    import parity.mlp.suite
    from parity import __main__ as cli

    def broken(*args, **kwargs):
        raise RuntimeError("deliberate crash")

    monkeypatch.setattr(parity.mlp.suite, "run_suite", broken)
    code = cli.main(["--size", "selftest", "--out", str(tmp_path / "out"), "--quiet"])
    assert code == cli.EXIT_INTERNAL == 3
    assert "internal error in the suite" in capsys.readouterr().err
    assert not (tmp_path / "out" / "summary.md").exists()


CRASH_SITES = {   # task: (the function its command runs the suite through, the command line)
    "lm": ("parity.tree.check", "run", ["check", "--task", "lm", "--size", "selftest"]),
    "tree": ("parity.tree.check", "run", ["check", "--task", "tree", "--port", "tests.ports.gpt_ports:Small"]),
    "int8": ("parity.int8.cli", "run", ["int8", "--size", "selftest"]),
}


@pytest.mark.parametrize("task", CRASH_SITES)
def test_a_crash_of_the_suite_exits_3_on_every_task_and_writes_nothing(task, monkeypatch, tmp_path, capsys):
    """The exit contract (parity.core.exits) on the LM, tree and int8 commands as on CartPole's: a bug inside the
    suite exits 3 with the traceback and 'internal error', never the mismatch code 1, and --out stays untouched."""
    import importlib
    from parity import __main__ as cli
    module, name, argv = CRASH_SITES[task]

    def broken(*args, **kwargs):
        raise RuntimeError("deliberate crash")

    monkeypatch.setattr(importlib.import_module(module), name, broken)
    out = tmp_path / "out"
    assert cli.main([*argv, "--out", str(out), "--quiet"]) == cli.EXIT_INTERNAL == 3
    err = capsys.readouterr().err
    assert "internal error in the suite (exit 3)" in err and "RuntimeError: deliberate crash" in err
    assert not out.exists() or not any(out.iterdir())


def test_int8_runs_as_a_task_and_prints_result_json_alone(tmp_path, capsys):
    """`check --task int8` is `parity int8`; --json prints its result.json alone on stdout (progress on stderr)."""
    import json
    from parity import __main__ as cli
    assert cli.main(["check", "--task", "int8", "--size", "selftest", "--epochs", "2", "--no-c", "--out",
                     str(tmp_path), "--json"]) == 0
    out, err = capsys.readouterr()
    assert json.loads(out) == json.loads((tmp_path / "result.json").read_text())
    assert json.loads(out)["exit_code"] == 0 and "PASS: report in" in err and "PASS" not in out
    assert cli.main(["check", "--task", "int8", "--size", "nope", "--out", str(tmp_path / "x")]) == 2
    assert not (tmp_path / "x").exists()


def test_a_port_accepting_nan_passes_with_the_warning_in_the_terminal(tmp_path, capsys):
    """The reference accepts NaN fitness, as upstream EggRoll: exit 0, and the terminal says so with advice, in the
    check's progress line and again after the verdict (stderr, shown with --quiet too)."""
    rc = cli.main(["--port", "parity.mlp.reference:ReferencePort", "--size", "selftest", "--checks", "fitness",
                   "--out", str(tmp_path)])
    captured = capsys.readouterr()
    assert rc == 0
    assert "[fitness] warning (not a drift): the port accepts NaN, +inf, -inf fitness" in captured.out
    assert "parity check: fitness: warning (not a drift)" in captured.err and "advice: reject NaN/inf" in captured.err
