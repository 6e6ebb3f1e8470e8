"""tests/fresh_process runs a script as a new interpreter would: its exit code and output, its working directory,
sys.path from its own PYTHONPATH only, nothing a run imported left for the next, and a new interpreter where torch
must stay unimportable."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import zlib
from pathlib import Path

import pytest

from tests import fresh_process


def script(where: Path, name: str, text: str) -> str:
    where.mkdir(parents=True, exist_ok=True)
    (where / name).write_text(textwrap.dedent(text))
    return str(where / name)


def env_with(pythonpath: str) -> dict:
    return {**{k: v for k, v in os.environ.items() if k != "PYTHONPATH"}, "PYTHONPATH": pythonpath}


def new_interpreter(argv: list[str], cwd: Path, env: dict) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *argv], cwd=cwd, env=env, capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("tag", ["a", "b"])
def test_exit_code_output_and_working_directory_are_a_new_interpreters(tmp_path, tag):
    value = zlib.crc32(tag.encode()) % 250 + 2
    path = script(tmp_path / "s", "exits.py", f"""
        import os, sys
        print("cwd", os.getcwd(), "argv", sys.argv[1:])
        print("to stderr {value}", file=sys.stderr)
        sys.exit({value})
    """)
    env = env_with(str(tmp_path))
    got = fresh_process.run([path, tag], tmp_path, env, timeout=60)
    want = new_interpreter([path, tag], tmp_path, env)
    assert (got.returncode, got.stdout, got.stderr) == (want.returncode, want.stdout, want.stderr) == \
        (value, f"cwd {tmp_path} argv ['{tag}']\n", f"to stderr {value}\n")
    raised = fresh_process.run([script(tmp_path / "s", "raises.py", "raise ValueError('no')\n")], tmp_path, env, 60)
    assert raised.returncode == 1 and "ValueError: no" in raised.stderr


def test_sys_path_comes_from_the_runs_own_pythonpath_and_no_import_outlives_its_run(tmp_path):
    script(tmp_path / "lib", "portmod_xyz.py", "VALUE = 7\n")
    path = script(tmp_path / "s", "uses.py", "import portmod_xyz\nprint(portmod_xyz.VALUE)\n")
    seen = fresh_process.run([path], tmp_path, env_with(str(tmp_path / "lib")), timeout=60)
    assert (seen.returncode, seen.stdout) == (0, "7\n"), seen.stderr
    elsewhere = env_with(str(tmp_path / "elsewhere"))
    unseen = fresh_process.run([path], tmp_path, elsewhere, timeout=60)
    assert unseen.returncode == 1
    assert unseen.stderr.splitlines()[-1] == new_interpreter([path], tmp_path, elsewhere).stderr.splitlines()[-1] \
        == "ModuleNotFoundError: No module named 'portmod_xyz'"


@pytest.mark.parametrize("blocked, forked", [("", True), ("portmod_xyz json.decoder", False),
                                             ("parity spec torch", False), ("numpy", False)])
def test_a_run_that_blocks_a_module_the_server_holds_gets_a_new_interpreter(tmp_path, blocked, forked):
    """Forked from the server, torch, numpy and what they import are already loaded (and could not be blocked);
    blocking any of them, the run is a new interpreter's, where nothing is loaded that the script did not import."""
    done = fresh_process.run(["-c", "import sys; print('torch' in sys.modules, 'jax' in sys.modules)"], tmp_path,
                             env_with(str(tmp_path)), timeout=60, blocked=blocked)
    assert (done.returncode, done.stdout) == (0, f"{forked} False\n"), done.stderr


def test_two_replies_written_together_are_read_one_at_a_time():
    """A run that ends at once has the server write its pid line and its exit-code line together: reading the first
    must leave the second on the pipe, where _reply's select finds it (a buffered read took both, and the run timed
    out)."""
    proc = fresh_process._unbuffered([sys.executable, "-c", "import sys, time\n"
                                      "sys.stdout.write('{\"pid\": 5}\\n{\"returncode\": 0}\\n'); sys.stdout.flush()\n"
                                      "time.sleep(60)"], dict(os.environ))
    try:
        assert fresh_process._reply(proc, 30) == {"pid": 5}
        assert fresh_process._reply(proc, 5) == {"returncode": 0}
    finally:
        proc.kill()
        proc.wait()
