"""Conformance vectors (parity.mlp.vectors): bad bundles refused before any work, checks without JAX, and the same
verdicts and causes as the live check."""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tomllib
import zipfile
from importlib import metadata
from pathlib import Path

import numpy as np
import pytest

from parity.core import tape
from parity.__main__ import main

ROOT = Path(__file__).resolve().parents[3]
QUICK = ROOT / "vectors" / "cartpole-quick"
MINIMAL = "examples.minimal_adapter:adapter"


def _bundle_copy(tmp_path: Path) -> Path:
    folder = tmp_path / "bundle"
    shutil.copytree(QUICK, folder)
    return folder


def _refused(argv: list[str], out: Path, capsys, expect: str) -> str:
    """main(argv) exits 2 with `expect` in its message and writes nothing under `out`."""
    code = main(["check", *argv, "--out", str(out), "--quiet"])
    err = capsys.readouterr().err
    assert code == 2, err
    assert re.search(expect, err), err
    assert not out.exists(), "a refused run wrote its report folder"
    return err


# ---------------------------------------------------------------- bad input: exit 2, nothing written
def test_committed_bundle_is_small_and_whole():
    bundle = tape.read_bundle(QUICK)
    size = sum(p.stat().st_size for p in QUICK.iterdir())
    assert size < 4e6, f"vectors/cartpole-quick is {size / 1e6:.1f} MB; docs/vectors.md says a few MB"
    assert bundle.manifest["task"] == "cartpole" and bundle.manifest["size"] == "quick"
    assert bundle.manifest["seed"] == 0 and bundle.manifest["format_version"] == tape.FORMAT_VERSION


def test_missing_bundle(tmp_path, capsys):
    _refused(["--port", MINIMAL, "--against", str(tmp_path / "nowhere")], tmp_path / "out", capsys,
             "no such folder")


def test_missing_file(tmp_path, capsys):
    folder = _bundle_copy(tmp_path)
    (folder / "arrays.npz").unlink()
    _refused(["--port", MINIMAL, "--against", str(folder)], tmp_path / "out", capsys, "arrays.npz is missing")


def test_truncated_arrays(tmp_path, capsys):
    folder = _bundle_copy(tmp_path)
    data = (folder / "arrays.npz").read_bytes()
    (folder / "arrays.npz").write_bytes(data[: len(data) // 2])
    _refused(["--port", MINIMAL, "--against", str(folder)], tmp_path / "out", capsys, "content hash")


def test_truncated_manifest(tmp_path, capsys):
    folder = _bundle_copy(tmp_path)
    text = (folder / "manifest.json").read_text()
    (folder / "manifest.json").write_text(text[: len(text) // 3])
    _refused(["--port", MINIMAL, "--against", str(folder)], tmp_path / "out", capsys, "not valid JSON")


def test_other_format_version(tmp_path, capsys):
    folder = _bundle_copy(tmp_path)
    manifest = json.loads((folder / "manifest.json").read_text())
    manifest["format_version"] = tape.FORMAT_VERSION + 1
    (folder / "manifest.json").write_text(json.dumps(manifest))
    _refused(["--port", MINIMAL, "--against", str(folder)], tmp_path / "out", capsys, "format version")


def test_changed_array_fails_the_hash(tmp_path, capsys):
    folder = _bundle_copy(tmp_path)
    with np.load(folder / "arrays.npz") as npz:
        arrays = {k: npz[k] for k in npz.files}
    name = next(k for k, v in arrays.items() if v.dtype == np.float32 and v.size)
    arrays[name] = arrays[name].copy()
    arrays[name].flat[0] += 1
    np.savez_compressed(folder / "arrays.npz", **arrays)
    assert zipfile.is_zipfile(folder / "arrays.npz")
    _refused(["--port", MINIMAL, "--against", str(folder)], tmp_path / "out", capsys, "content hash")


def test_sizes_of_another_harness(tmp_path, capsys):
    folder = _bundle_copy(tmp_path)
    manifest = json.loads((folder / "manifest.json").read_text())
    manifest["sizes"]["noise_pop"] += 1               # a whole bundle of another harness: its hash matches its manifest
    manifest["content_hash"] = tape.content_hash((folder / "arrays.npz").read_bytes(), manifest)
    (folder / "manifest.json").write_text(json.dumps(manifest))
    _refused(["--port", MINIMAL, "--against", str(folder)], tmp_path / "out", capsys, "another version")


def test_other_task(tmp_path, capsys):
    folder = tmp_path / "lm-bundle"
    tape.write_bundle(folder, tape.Store(), {"task": "lm", "size": "quick", "seed": 0})
    _refused(["--port", MINIMAL, "--against", str(folder)], tmp_path / "out", capsys, "task 'lm'")


@pytest.mark.parametrize("argv, expect", [(["--size", "full"], "size 'quick'"), (["--full"], "size 'quick'"),
                                          (["--seed", "3"], "seed 0")])
def test_size_or_seed_the_bundle_does_not_hold(argv, expect, tmp_path, capsys):
    _refused(["--port", MINIMAL, "--against", str(QUICK), *argv], tmp_path / "out", capsys, expect)


def test_record_refuses_bad_usage(tmp_path, capsys):
    out = tmp_path / "file"
    out.write_text("")
    assert main(["record", "--out", str(out)]) == 2
    assert main(["record", "--size", "huge", "--out", str(tmp_path / "b")]) == 2
    assert "unknown" in capsys.readouterr().err and not (tmp_path / "b").exists()


# ---------------------------------------------------------------- without JAX
def _base_requirements() -> list[str]:
    """pyproject.toml's base dependencies and, recursively, theirs (extras left out): what a plain install has."""
    todo = [re.match(r"[A-Za-z0-9_.\-]+", r).group(0)
            for r in tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]]
    seen: list[str] = []
    while todo:
        name = todo.pop()
        if name.lower() in (s.lower() for s in seen):
            continue
        seen.append(name)
        for req in metadata.requires(name) or ():
            if "extra ==" not in req:
                todo.append(re.match(r"[A-Za-z0-9_.\-]+", req).group(0))
    return seen


@pytest.fixture(scope="module")
def base_venv(tmp_path_factory) -> Path:
    """A virtual environment holding only the base install's packages (linked from this one) and this checkout."""
    home = tmp_path_factory.mktemp("venv")
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(home)], check=True)
    site = next(home.glob("lib/python*/site-packages"))
    for dist in _base_requirements():
        files = metadata.distribution(dist).files or ()
        base = Path(metadata.distribution(dist).locate_file(""))
        for top in {Path(f).parts[0] for f in files if not Path(f).parts[0].startswith("..")}:
            if (base / top).exists() and not (site / top).exists():
                (site / top).symlink_to(base / top)
    (site / "eggroll_checkout.pth").write_text(str(ROOT) + "\n")
    return home


def _run(python: str, argv: list[str], env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([python, *argv], cwd=ROOT, capture_output=True, text=True, env=env, timeout=600)


def test_base_install_has_no_jax_and_checks_the_minimal_adapter(base_venv, tmp_path):
    python = str(base_venv / "bin" / "python")
    probe = _run(python, ["-c", "import jax"])
    assert probe.returncode != 0 and "jax" in probe.stderr, "the base environment must not hold jax"
    done = _run(python, ["-m", "parity", "check", "--port", MINIMAL, "--against", str(QUICK), "--out",
                         str(tmp_path / "out"), "--quiet"])
    assert done.returncode == 0, done.stdout + done.stderr
    result = json.loads((tmp_path / "out" / "result.json").read_text())
    assert "vectors/cartpole-quick" in result["reference"] and result["verdict"] == "pass"


def test_base_install_names_the_drift_of_a_drifted_copy(base_venv, tmp_path):
    source = (ROOT / "examples" / "minimal_adapter.py").read_text()
    faithful = "np.sqrt(f.var() + np.float32(1e-5))"
    assert faithful in source, "the drift below edits this expression of examples/minimal_adapter.py"
    (tmp_path / "drifted_adapter.py").write_text(source.replace(faithful, "max(f.std(), np.float32(1e-8))"))
    env = {**os.environ, "PYTHONPATH": str(tmp_path)}
    done = _run(str(base_venv / "bin" / "python"), ["-m", "parity", "check", "--port", "drifted_adapter:adapter",
                                                    "--against", str(QUICK), "--out", str(tmp_path / "out"),
                                                    "--checks", "fitness,products", "--quiet"], env)
    assert done.returncode == 1, done.stdout + done.stderr
    result = json.loads((tmp_path / "out" / "result.json").read_text())
    assert result["knobs"] == ["fitness"], result["knobs"]


def test_exit_0_where_import_jax_fails(tmp_path):
    blocker = tmp_path / "site"
    blocker.mkdir()
    (blocker / "sitecustomize.py").write_text(
        "import sys\n"
        "class _NoJax:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name.split('.')[0] in ('jax', 'jaxlib', 'optax'):\n"
        "            raise ImportError(f'{name} is blocked in this test')\n"
        "sys.meta_path.insert(0, _NoJax())\n")
    env = {**os.environ, "PYTHONPATH": str(blocker)}
    assert _run(sys.executable, ["-c", "import jax"], env).returncode != 0
    done = _run(sys.executable, ["-m", "parity", "check", "--port", MINIMAL, "--against", str(QUICK), "--out",
                                 str(tmp_path / "out"), "--quiet"], env)
    assert done.returncode == 0, done.stdout + done.stderr


# ---------------------------------------------------------------- the same verdicts and causes as the live check
def _verdicts(out: Path) -> list[tuple[str, str, tuple[str, ...]]]:
    result = json.loads((out / "result.json").read_text())
    return [(c["name"], c["verdict"], tuple(sorted({k["knob"] for k in c["causes"] if k["knob"]})))
            for c in result["checks"]]


@pytest.fixture(scope="module")
def selftest_bundle(tmp_path_factory) -> Path:
    pytest.importorskip("jax")
    folder = tmp_path_factory.mktemp("vectors") / "cartpole-selftest"
    assert main(["record", "--size", "selftest", "--seed", "0", "--out", str(folder), "--quiet"]) == 0
    return folder


@pytest.mark.slow
@pytest.mark.parametrize("side, drift", [([], None), (["--torch", "antithetic=halves"], "antithetic"),
                                         (["--torch", "fitness=std"], "fitness"), (["--port", MINIMAL], None)])
def test_against_agrees_with_live(side, drift, selftest_bundle, tmp_path):
    live, replayed = tmp_path / "live", tmp_path / "replayed"
    code_live = main(["check", *side, "--size", "selftest", "--seed", "0", "--out", str(live), "--quiet"])
    code_replayed = main(["check", *side, "--against", str(selftest_bundle), "--out", str(replayed), "--quiet"])
    assert code_live == code_replayed == (1 if drift else 0)
    assert _verdicts(live) == _verdicts(replayed)
    if drift:
        assert any(drift in knobs for _, _, knobs in _verdicts(replayed))


@pytest.mark.slow
@pytest.mark.parametrize("knobs", [(), ("antithetic=halves",)], ids=["faithful", "halves"])
def test_another_shape_is_answered_in_numpy(knobs, selftest_bundle):
    """At a rank the bundle was not recorded at, every reference call misses the bundle and numpy_reference answers
    it (draws, ES loop, optimizer): the verdicts and causes are still the live check's."""
    import dataclasses

    from parity.mlp.sizes import SELFTEST
    from parity.mlp.suite import run_suite
    from parity.mlp.torch_side import TorchPort, one_thread
    from spec.knobs import resolve

    sizes = dataclasses.replace(SELFTEST, cfg=SELFTEST.cfg.replace(rank=2, hidden=12))
    with one_thread():
        runs = [run_suite(TorchPort(sizes.cfg, resolve("jax", knobs)), sizes, 0, against=against,
                          checks=("noise", "updates", "trajectory"))
                for against in (None, selftest_bundle)]
    live, replayed = ([(r.name, r.verdict, tuple(sorted(set(r.knobs)))) for r in results] for results in runs)
    assert live == replayed
    verdicts = {name: verdict for name, verdict, _ in replayed}
    assert "skip" not in (verdicts["trajectory"], verdicts["updates"], verdicts["noise"]), verdicts
    assert any(knobs and "antithetic" in k for _, _, k in replayed) == bool(knobs)


def test_make_setup_installs_every_extra_the_tests_need():
    """The base install is numpy, scipy and gymnasium only; make setup adds `all` (reference, torch, study) and
    `test`, so everything the old single dependency list held is still installed by it."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    names = lambda reqs: {re.match(r"[A-Za-z0-9_.\-]+", r).group(0).lower() for r in reqs}   # noqa: E731
    extras = project["optional-dependencies"]
    assert names(project["dependencies"]) == {"numpy", "scipy", "gymnasium"}
    assert extras["all"] == ["eggroll-parity[reference,torch,study]"]
    everything = names(project["dependencies"]) | set().union(*(names(extras[e]) for e in ("reference", "torch",
                                                                                          "study", "test")))
    assert {"jax", "jaxlib", "optax", "torch", "pandas", "matplotlib", "lifelines", "statsmodels", "pydoe",
            "pytest"} <= everything
    assert "-e '.[all,test]'" in (ROOT / "Makefile").read_text()


def test_the_plugin_api_checks_against_the_committed_bundle():
    """parity.testing.assert_port_parity(..., against=) reaches run_suite's bundle: a pass, and a size the bundle
    does not hold refused."""
    from examples.minimal_adapter import adapter
    from parity.core.port import UsageError
    from parity.testing import assert_port_parity

    assert_port_parity(adapter, size="quick", against=str(QUICK))
    with pytest.raises(UsageError, match="size 'quick'"):
        assert_port_parity(adapter, size="selftest", against=str(QUICK))
