"""The bench's tree-suite section (bench/tree.py): each size runs in a process of its own whose peak memory is its own,
a size past the limits is stopped and said so, the suite's lines are read back, and the section states the aim. No
assertion here is on speed (the bench measures it)."""
from __future__ import annotations

import sys

import pytest

import bench.__main__ as cli
from bench import names as M
from bench import tree
from bench.report import _tree_section

MiB = 2 ** 20


def allocate(mib: int, then: str = "") -> list[str]:
    """A child that touches `mib` MiB, then runs `then`."""
    return [sys.executable, "-c", f"x = bytearray({mib} * 2 ** 20)\nfor i in range(0, len(x), 4096): x[i] = 1\n{then}"]


def test_each_process_peak_is_its_own():
    """Each command's own peak: a small child after a big one reads small (RUSAGE_CHILDREN would give the largest
    child so far), and neither counts this test process's memory (a child forked from it would: bench.tree.launch)."""
    big = tree.measure_process(allocate(300), timeout_s=120, max_rss=None)
    small = tree.measure_process(allocate(20), timeout_s=120, max_rss=None)
    assert big.exit_code == small.exit_code == 0 and not big.stopped
    assert big.peak_rss > 300 * MiB and small.peak_rss < 150 * MiB, (big.peak_rss, small.peak_rss)


def test_a_process_past_its_memory_or_time_is_stopped_and_said_so():
    grown = tree.measure_process(allocate(400, "import time; time.sleep(60)"), timeout_s=120, max_rss=100 * MiB)
    assert grown.exit_code is None and grown.stopped.startswith("stopped at") and "GiB resident" in grown.stopped
    assert grown.peak_rss > 100 * MiB                                # what it was seen holding when stopped
    slow = tree.measure_process([sys.executable, "-c", "import time; time.sleep(60)"], timeout_s=1, max_rss=None)
    assert slow.exit_code is None and slow.stopped.startswith("stopped after")
    failed = tree.measure_process([sys.executable, "-c", "print('no'); raise SystemExit(3)"], 60, None)
    assert failed.exit_code == 3 and failed.output.strip() == "no" and not failed.stopped


def test_the_suites_lines_are_read_back():
    out = ("parity check --task tree: port x vs jax_reference, size quick, seed 0\n"
           "init       pass  (39 rows, 19.1 s)\nnoise      FAIL  (30 rows, 2.6 s)  knob `x`\n"
           "forward    skip  (1 rows, 0.0 s)\nPASS: report in /tmp/x/summary.md\n")
    assert tree.parse_checks(out) == {"init": 19.1, "noise": 2.6, "forward": 0.0}
    summary = ("# Parity check\n- tree: 15 leaves, 162,954,240 parameters (mm 6, tmm 1, param 6, embedding 2, "
               "excluded 0)\n- settings: pop 16, rank 2, sigma 0.05\n")
    assert tree.parse_summary(summary) == (162954240, 16)
    assert tree.parse_summary("# nothing\n") == (None, None)


def test_the_section_gives_each_size_and_the_aim():
    def run(size, wall, rss_gib, code, stopped=""):
        proc = tree.Process(wall, int(rss_gib * 2 ** 30), code, "", stopped)
        return tree.TreeRun(size, 1000, 16, proc, {"init": 1.0, "trajectory": wall - 2, "noise": 0.5})
    rows = cli.tree_rows(run("GPTAdapter", 14.0, 0.66, 0)) + cli.tree_rows(run("gpt2_small", 330.0, 6.9, 0))
    text = "\n".join(_tree_section(rows))
    assert "| GPTAdapter | 1,000 | 16 | 14.0 | 0.66 | PASS | trajectory 12.0, init 1.0, noise 0.5 |" in text
    assert "- Aim: gpt2_small at pop 16 within 10 minutes and 8 GiB, passing: 330 s, 6.90 GiB, met." in text
    missed = cli.tree_rows(run("gpt2_small", 300.0, 14.0, None, "stopped at 14.0 GiB resident"))
    text = "\n".join(_tree_section(missed))
    assert "| stopped (see the notes) |" in text and "14.00 GiB, missed." in text
    assert [r.measure for r in missed if r.measure == M.TREE_EXIT] == [M.TREE_EXIT]
    assert _tree_section([]) == []


def test_the_sizes_flag():
    assert tree.check_sizes(None, quick=False) == tree.TREE_SIZES and tree.check_sizes(None, True) == ("GPTAdapter",)
    assert tree.check_sizes("none", False) == () and tree.check_sizes("gpt_4x128, gpt2_small", False) == (
        "gpt_4x128", "gpt2_small")
    with pytest.raises(ValueError, match="--tree-sizes takes names from GPTAdapter"):
        tree.check_sizes("gpt3", False)


def test_a_bad_sizes_flag_exits_2_before_any_work(tmp_path, capsys):
    assert cli.main(["--tree-sizes", "gpt3", "--out", str(tmp_path / "b")]) == 2
    assert "--tree-sizes takes names" in capsys.readouterr().err and not (tmp_path / "b").exists()


@pytest.mark.slow
def test_the_example_runs_as_the_bench_runs_it():
    """The smallest size through the real command: the bench reads its verdict, parameters, population and every
    check's seconds from the suite's own output."""
    run = tree.run_size("GPTAdapter")
    assert tree.verdict(run) == "PASS", run.process.output[-2000:]
    assert (run.params, run.pop) == (8480, 16)
    assert set(run.checks) == {"init", "noise", "products", "fitness", "gradients", "updates", "forward", "trajectory"}
    assert run.process.peak_rss > 100 * MiB
