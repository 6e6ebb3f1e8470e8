"""A fresh process for each repro script a test runs, forked from a server that has imported numpy and torch and
nothing of this checkout, so each run skips torch's import (1.3-1.5 s of CPU of the ~2.5 s a torch port's repro took
as `python repro.py`).

Each run is still its own process: its own working directory, environment and sys.path (the script's folder, then
PYTHONPATH's entries, then the interpreter's own, as a new interpreter builds it), its own sys.modules beyond the
server's, its exit code and output. What a fork cannot give is a module the server holds made unimportable: a run
that blocks one (a numpy port's repro blocks torch) takes a new interpreter; the server lists what it holds when it
starts, and run() decides.
"""
from __future__ import annotations

import atexit
import contextlib
import functools
import json
import os
import select
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

SERVER = r"""
import json, os, runpy, sys, traceback
root = sys.argv[1]
import numpy, torch
assert not {"jax", "jaxlib", "optax"} & set(sys.modules), "the fork server imported jax"
ours = {name.removesuffix(".py") for name in os.listdir(root) if name.endswith(".py")
        or os.path.isfile(os.path.join(root, name, "__init__.py"))}        # the checkout's top-level modules
mine = sorted(ours & {name.split(".")[0] for name in sys.modules})
assert not mine, f"the fork server imported modules of the checkout: {mine}"
BASE = sys.path[1:]          # the interpreter's own entries (the server runs with no PYTHONPATH)
print(json.dumps({"held": sorted(sys.modules)}), flush=True)       # what every fork holds already


def child(req):
    for fd, path in ((1, req["stdout"]), (2, req["stderr"])):
        os.dup2(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC), fd)
    os.dup2(os.open(os.devnull, os.O_RDONLY), 0)
    os.chdir(req["cwd"])
    os.environ.clear()
    os.environ.update(req["env"])
    script = req["argv"][0]            # a script's path, or -c and the code (python -c CODE ARGS)
    entries = [p for p in req["env"].get("PYTHONPATH", "").split(os.pathsep) if p]
    first = "" if script == "-c" else os.path.dirname(os.path.realpath(script))
    sys.path[:] = [first, *entries, *BASE]
    sys.argv = ["-c", *req["argv"][2:]] if script == "-c" else list(req["argv"])
    code = 0
    try:
        if script == "-c":
            exec(compile(req["argv"][1], "<string>", "exec"), {"__name__": "__main__", "__builtins__": __builtins__})
        else:
            runpy.run_path(script, run_name="__main__")
    except SystemExit as exit:
        if exit.code is None or isinstance(exit.code, int):
            code = exit.code or 0
        else:
            print(exit.code, file=sys.stderr)
            code = 1
    except BaseException:
        traceback.print_exc()
        code = 1
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


for line in sys.stdin:
    req = json.loads(line)
    pid = os.fork()
    if pid == 0:
        child(req)
    print(json.dumps({"pid": pid}), flush=True)
    _, status = os.waitpid(pid, 0)
    print(json.dumps({"returncode": os.waitstatus_to_exitcode(status)}), flush=True)
"""


def needs_a_new_interpreter(blocked: str, held: frozenset) -> bool:
    """Whether a module the run blocks (or one inside it) is one the server holds (`held`, torch and numpy among
    them): a fork would find it loaded, so only a new interpreter keeps it unimportable."""
    names = blocked.split()
    return any(module == name or module.startswith(name + ".") for module in held for name in names)


@functools.cache
def _server() -> tuple[subprocess.Popen, frozenset]:
    """The fork server, started once per test process and ended at its exit, and the modules it holds."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    proc = _unbuffered([sys.executable, "-c", SERVER, str(ROOT)], env)
    atexit.register(_stop, proc)
    return proc, frozenset(_reply(proc, 120)["held"])


def _unbuffered(argv: list[str], env: dict[str, str]) -> subprocess.Popen:
    """argv with its stdin and stdout as unbuffered byte pipes. _reply waits on the pipe with select, so a line
    already read into a Python buffer would be waited for in vain: a run that ends at once has the server write its
    pid line and its exit-code line together, and a buffered readline of the first took both (a run then timed out
    after 60 s, found here under load)."""
    return subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env, cwd=tempfile.gettempdir(),
                            bufsize=0)


def _stop(proc: subprocess.Popen) -> None:
    """End the server: its input closed, it leaves its loop (if it has not ended already)."""
    with contextlib.suppress(OSError):
        proc.stdin.close()
    proc.wait(timeout=30)


def _send(proc: subprocess.Popen, request: dict) -> None:
    """One request line to the server, all of it (an unbuffered pipe's write may take part of it)."""
    data = memoryview((json.dumps(request) + "\n").encode())
    while data:
        data = data[proc.stdin.write(data):]


def _reply(proc: subprocess.Popen, timeout: float) -> dict:
    """The server's next line; TimeoutError after `timeout` seconds without one. Read a byte at a time from the
    unbuffered pipe, so nothing past the line is taken from it."""
    if not select.select([proc.stdout], [], [], timeout)[0]:
        raise TimeoutError
    line = proc.stdout.readline()
    if not line:
        raise RuntimeError(f"the fork server ended (exit code {proc.poll()})")
    return json.loads(line)


def run(argv: list[str], cwd: Path, env: dict[str, str], timeout: float, blocked: str = ""
        ) -> subprocess.CompletedProcess:
    """`python *argv` (a script and its arguments, or -c CODE ARGS) in cwd with exactly env, as subprocess.run(...,
    capture_output=True, text=True) gives it: forked from the server, or in a new interpreter where a module the
    server holds must stay unimportable (`blocked` names it)."""
    proc, held = _server()
    if needs_a_new_interpreter(blocked, held):
        return subprocess.run([sys.executable, *argv], cwd=cwd, env=env, capture_output=True, text=True,
                              timeout=timeout)
    with tempfile.TemporaryDirectory() as tmp:
        out, err = Path(tmp) / "stdout", Path(tmp) / "stderr"
        request = {"argv": [str(a) for a in argv], "cwd": str(cwd), "env": env, "stdout": str(out), "stderr": str(err)}
        _send(proc, request)
        pid = _reply(proc, 30)["pid"]
        try:
            code = _reply(proc, timeout)["returncode"]
        except TimeoutError:
            os.kill(pid, signal.SIGKILL)
            _reply(proc, 30)
            raise subprocess.TimeoutExpired([sys.executable, *argv], timeout) from None
        return subprocess.CompletedProcess([sys.executable, *argv], code, out.read_text(), err.read_text())
