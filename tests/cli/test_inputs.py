"""Every CLI refuses bad input before any work, with exit 2 and a message that says what would be right; trainers
share one exit-code convention; the suite's terminal, summary and CSVs account for every check; results are
machine-readable; user runs write only where git ignores."""
import json
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from bench import __main__ as bench_cli
from gap import __main__ as gap_cli
from jax_reference import __main__ as jax_cli
from parity import __main__ as parity_cli
from spec.config import Config
from spec.limits import SEED_MAX, check_fits, check_out_dir, estimate_training_bytes
from spec.knobs import Knobs
from torch_impl import __main__ as torch_cli

ROOT = Path(__file__).resolve().parents[2]


def code_of(main, argv) -> int:
    """The exit code of a CLI's main(argv), whether it returns it or exits through argparse."""
    try:
        return main(argv)
    except SystemExit as exit_:
        return int(exit_.code or 0)


def bad_outs(tmp_path) -> list[str]:
    a_file = tmp_path / "a_file"
    a_file.write_text("x")
    return [str(a_file), str(a_file / "inside"), "/proc/parity-cannot-write-here"]


# ---------------------------------------------------------------- --out
@pytest.mark.parametrize("cli", ["check", "gap", "bench"])
def test_a_bad_out_is_refused_before_any_work(cli, tmp_path, capsys, monkeypatch):
    monkeypatch.setattr("gap.runs.train_spec", lambda spec: pytest.fail("trained before checking --out"))
    for out in bad_outs(tmp_path):
        argv = {"check": ["--out", out, "--size", "selftest"], "gap": ["--out", out, "--seeds", "1"],
                "bench": ["--out", out, "--quick"]}[cli]
        main = {"check": parity_cli.main, "gap": gap_cli.main, "bench": bench_cli.main}[cli]
        assert code_of(main, argv) == 2, (cli, out)
        err = capsys.readouterr().err
        assert "--out" in err and ("is a file" in err or "inside" in err or "cannot write" in err), err


def test_out_check_creates_nothing(tmp_path):
    target = tmp_path / "new" / "deeper"
    assert check_out_dir(str(target)) == str(target)
    assert not (tmp_path / "new").exists() and list(tmp_path.iterdir()) == []


# ---------------------------------------------------------------- seeds
@pytest.mark.parametrize("seed", ["-1", str(SEED_MAX + 1), "1e3"])
def test_out_of_range_seeds_are_refused_at_parse_time_everywhere(seed, capsys):
    for main, argv in ((torch_cli.main, ["--seed", seed]), (jax_cli.main, ["--seed", seed]),
                       (parity_cli.main, ["--seed", seed]), (bench_cli.main, ["--seed", seed, "--quick"]),
                       (gap_cli.main, ["--seed-list", f"42,{seed}", "--plan"])):
        assert code_of(main, argv) == 2, (main.__module__, seed)
        assert "4,294,967,295" in capsys.readouterr().err


@pytest.mark.parametrize("task", ["cartpole", "lm", "int8"])
def test_a_bad_c_generator_switch_is_refused_before_any_work(task, capsys, monkeypatch):
    monkeypatch.setenv("TORCH_IMPL_RNG", "sometimes")
    assert code_of(torch_cli.main, ["--task", task]) == 2
    assert "TORCH_IMPL_RNG='sometimes'; allowed: auto, c, triton, table, formula" in capsys.readouterr().err


def test_the_largest_seed_is_accepted(capsys):
    assert code_of(gap_cli.main, ["--seed-list", f"0,{SEED_MAX}", "--plan", "--no-ladder"]) == 0


# ---------------------------------------------------------------- memory
def test_a_population_that_cannot_fit_is_refused_with_the_estimate(capsys, tmp_path):
    for main, argv in ((torch_cli.main, ["--pop", "100000000"]), (jax_cli.main, ["--pop", "100000000"]),
                       (bench_cli.main, ["--pops", "100000000", "--out", str(tmp_path / "b")])):
        assert code_of(main, argv) == 2, main.__module__
        err = capsys.readouterr().err
        assert "needs at least" in err and "available" in err and "at most about" in err, err
    assert not (tmp_path / "b").exists()


def test_the_estimate_scales_with_the_population_and_names_its_parts():
    small, big = estimate_training_bytes(Config(pop=256)), estimate_training_bytes(Config(pop=2560))
    assert big.total == pytest.approx(10 * small.total, rel=1e-9)
    assert set(small.parts) >= {"noise factors", "bias noise", "action uniforms"}
    assert check_fits(Config(pop=2048, hidden=256), available=1 << 40).total < 1 << 30   # the paper preset fits
    with pytest.raises(ValueError, match="at most about"):
        check_fits(Config(pop=2048, hidden=256), available=1 << 20)


# ---------------------------------------------------------------- devices
def test_unknown_devices_name_the_accepted_ones(capsys, tmp_path):
    for main, argv in ((torch_cli.main, ["--device", "tpu"]), (parity_cli.main, ["--device", "tpu"]),
                       (gap_cli.main, ["--device", "tpu", "--plan"]),
                       (bench_cli.main, ["--device", "tpu", "--out", str(tmp_path)])):
        assert code_of(main, argv) == 2, main.__module__
        err = capsys.readouterr().err
        assert "tpu" in err and "cuda" in err and "cpu" in err, err


# ---------------------------------------------------------------- trainer exit codes
@pytest.mark.parametrize("cli,module", [(torch_cli, "torch_impl.train"), (jax_cli, "jax_reference.train")])
def test_trainers_exit_0_when_solved_and_1_when_not(cli, module, monkeypatch, capsys):
    from spec.run import TrainResult

    for solved, expected in ((True, 0), (False, 1)):
        result = TrainResult(solved, 1234 if solved else None, 3, 1234, [])
        monkeypatch.setattr(f"{module}.train", lambda *a, _r=result, **k: _r)
        assert code_of(cli.main, ["--quiet"]) == expected
        out = capsys.readouterr().out
        assert ("steps_to_solve 1234" if solved else "not solved") in out
    assert "0 solved, 1 not solved" in cli.__doc__


# ---------------------------------------------------------------- the suite's output
def test_quiet_prints_the_verdict_and_skips_are_explained_everywhere(tmp_path, capsys):
    argv = ["--port", "examples.minimal_adapter:adapter", "--size", "selftest", "--out", str(tmp_path), "--quiet",
            "--checks", "fitness,init,updates"]
    assert parity_cli.main(argv) == 0
    out = capsys.readouterr().out.strip().splitlines()
    assert len(out) == 1 and out[0].startswith("PASS: report in"), out
    summary = (tmp_path / "summary.md").read_text()
    assert "skipped: the port has no `init_params`" in summary
    assert "skipped: the port has no `optimizer_init`/`optimizer_step`" in summary
    rows = (tmp_path / "parity.csv").read_text().splitlines()
    assert any(r.startswith("init,skipped,port") and r.endswith("the port has no `init_params`.") for r in rows), rows
    assert (tmp_path / "init.csv").exists() and (tmp_path / "updates.csv").exists()
    result = json.loads((tmp_path / "result.json").read_text())
    assert result["verdict"] == "pass" and result["exit_code"] == 0 and result["seed"] == 0
    assert [c["verdict"] for c in result["checks"]] == ["pass", "skip", "skip"]
    assert "torch" in result["versions"] and result["device"]


def test_terminal_lines_give_the_skip_reason_not_an_empty_allowance(tmp_path, capsys):
    argv = ["--port", "examples.minimal_adapter:adapter", "--size", "selftest", "--out", str(tmp_path),
            "--checks", "init"]
    assert parity_cli.main(argv) == 0
    out = capsys.readouterr().out
    line = next(line for line in out.splitlines() if line.strip().startswith("init"))
    assert "skipped: the port has no `init_params`" in line and "(allowed )" not in line


def test_an_errored_check_has_a_csv_row_and_json_exit_2(tmp_path, capsys):
    argv = ["--port", "tests.ports.broken:TransposedLinear", "--size", "selftest", "--out", str(tmp_path),
            "--checks", "products", "--json"]
    assert parity_cli.main(argv) == 2
    printed = capsys.readouterr().out
    rows = (tmp_path / "products.csv").read_text().splitlines()
    assert len(rows) == 2 and rows[1].startswith("products,error,port"), rows
    result = json.loads((tmp_path / "result.json").read_text())
    assert result["verdict"] == "error" and result["exit_code"] == 2
    assert json.loads(printed) == result      # --json prints the same, alone, on stdout


# ---------------------------------------------------------------- a clean tree, a clean install, make help
def test_user_runs_write_only_where_git_ignores():
    defaults = {"check": parity_cli.build_parser().parse_args([]).out,
                "bench": bench_cli.parse_args([]).out,
                "gap": "runs/gap"}
    for name, out in defaults.items():
        assert out.startswith("runs/"), (name, out)
        probe = subprocess.run(["git", "check-ignore", "-q", f"{out}/summary.md"], cwd=ROOT)
        assert probe.returncode == 0, f"{out} is not ignored by git"
    makefile = (ROOT / "Makefile").read_text()
    assert "--out $(RUNS)/parity" in makefile and "RUNS        ?= runs" in makefile


def test_the_license_is_an_spdx_expression():
    meta = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert meta["project"]["license"] == "MIT"     # a table ({text = ...}) makes setuptools warn on install


def test_make_help_lists_the_targets():
    out = subprocess.run(["make", "-s", "help"], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    for target in ("setup", "test", "parity", "gap", "gap-paper", "bench"):
        assert f"make {target} " in out, out


def test_knobs_default_is_faithful():   # the torch trainer's CLI default is the reference's own knobs
    args = torch_cli.build_parser().parse_args([])
    assert torch_cli.configure(args)[1] == Knobs()
    assert sys.executable


def test_cuda_asked_for_without_a_gpu_stops_up_front(capsys, tmp_path):
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a CUDA device: the refusal cannot be seen here")
    for main, argv in ((torch_cli.main, ["--device", "cuda"]), (parity_cli.main, ["--device", "cuda"]),
                       (gap_cli.main, ["--device", "cuda", "--out", str(tmp_path / "g")]),
                       (bench_cli.main, ["--device", "cuda", "--out", str(tmp_path / "b")])):
        assert code_of(main, argv) == 2, main.__module__
        assert "CUDA" in capsys.readouterr().err
    assert not (tmp_path / "g").exists() and not (tmp_path / "b").exists()
