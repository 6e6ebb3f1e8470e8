"""The study on a real Ray cluster: a local head with 2 CPUs, a tiny study, a worker killed mid-run; the study
completes and every run is in the store exactly once."""
import csv
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time

import pytest

ray = pytest.importorskip("ray")   # in the `test` extra, so `make test` runs this

from gap.executors import Ray  # noqa: E402
from gap.runs import run_all  # noqa: E402
from gap.store import RunStore  # noqa: E402
from tests.gap.test_runs import _specs  # noqa: E402

VICTIM_SEED = 1


def slow_fake_train(spec):
    """A run of ~2 s; the victim's first attempt announces its pid and then waits to be killed."""
    flag_dir = os.environ["GAP_RAY_TEST_DIR"]
    victim = spec.seed == VICTIM_SEED and spec.arm.name == "torch:jax"
    if victim and not os.path.exists(os.path.join(flag_dir, "killed")):
        with open(os.path.join(flag_dir, "victim.pid"), "w") as f:
            f.write(str(os.getpid()))
        time.sleep(120)                        # the test kills this process long before
    time.sleep(2.0)
    steps = 1_000 * (10 + spec.seed + len(spec.arm.name) % 5)
    history = [{"epoch": 0, "env_steps": steps, "mean_return": 480.0, "max_return": 500.0, "sigma": 0.2, "lr": 0.1,
                "wall_s": 0.0}]
    return dict(solved=True, steps_to_solve=steps, epochs=1, env_steps=steps, history=history)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    ray_bin = shutil.which("ray", path=os.path.dirname(sys.executable)) or shutil.which("ray")
    if ray_bin is None:
        pytest.fail("the `ray` command is not installed beside this Python; `make setup` installs it")
    flag_dir = tmp_path_factory.mktemp("ray_flags")
    port = _free_port()
    env = {**os.environ, "GAP_RAY_TEST_DIR": str(flag_dir), "RAY_USAGE_STATS_ENABLED": "0",
           "PYTHONPATH": os.pathsep.join([os.getcwd(), os.environ.get("PYTHONPATH", "")])}
    subprocess.run([ray_bin, "start", "--head", f"--port={port}", "--num-cpus=2", "--include-dashboard=false",
                    "--disable-usage-stats"], check=True, env=env, capture_output=True, timeout=180)
    os.environ["GAP_RAY_TEST_DIR"] = str(flag_dir)
    try:
        yield f"127.0.0.1:{port}", flag_dir
    finally:
        ray.shutdown()
        subprocess.run([ray_bin, "stop", "--force"], env=env, capture_output=True, timeout=120)


def _kill_victim(flag_dir, log):
    """Wait for the victim's pid, then SIGKILL its worker process, as a node losing a worker would."""
    pid_file = flag_dir / "victim.pid"
    deadline = time.time() + 120
    while not pid_file.exists() and time.time() < deadline:
        time.sleep(0.1)
    if pid_file.exists():
        (flag_dir / "killed").write_text("1")
        os.kill(int(pid_file.read_text()), signal.SIGKILL)
        log.append("killed")


def test_a_study_on_ray_survives_a_killed_worker_and_counts_each_run_once(cluster, tmp_path):
    address, flag_dir = cluster
    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])   # the workers need not import this test
    specs = _specs((0, 1, 2))                                         # 3 arms x 3 seeds
    store = RunStore(str(tmp_path / "study"))
    events: list[str] = []
    killer = threading.Thread(target=_kill_victim, args=(flag_dir, events), daemon=True)
    killer.start()
    lines: list[str] = []
    out = run_all(specs, store, slow_fake_train, executor=Ray(address), log=lines.append)
    killer.join(timeout=5)
    assert events == ["killed"], "the victim never started"
    assert out.failed == [] and out.finished == len(specs), (out, lines)
    with open(store.runs_path) as f:
        rows = list(csv.DictReader(f))
    assert sorted(r["run_id"] for r in rows) == sorted(s.run_id for s in specs)      # each run once
    assert "Ray cluster at" in lines[0]
    # Resuming on the cluster retrains nothing.
    again = run_all(specs, store, slow_fake_train, executor=Ray(address), log=lambda _: None)
    assert again.skipped == len(specs) and again.finished == 0
