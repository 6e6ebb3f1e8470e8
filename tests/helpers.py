"""Small conveniences the tests share (no assertions here)."""
from __future__ import annotations

import subprocess
from pathlib import Path

import numpy as np
import pytest
import torch

from spec.config import Config
from spec.knobs import Knobs
from torch_impl import noise as noise_mod


def noise_of(params: dict[str, torch.Tensor], cfg: Config, knobs: Knobs, seed: int, epoch: int, sigma: float,
             device: str = "cpu") -> noise_mod.Noise:
    """torch_impl's noise for a run seed at an epoch, as its trainer draws it (cfg gives pop and rank)."""
    plan = noise_mod.make_plan(cfg.pop, cfg.rank, knobs)
    shapes = noise_mod.shapes_of(params)
    return noise_mod.sample_noise(plan, noise_mod.seed_sources(plan, seed, shapes), shapes, epoch, sigma, device)


def exit_code(main, argv: list[str]) -> int | str | None:
    """The code of the SystemExit main(argv) raises (an argparse error: 2), or "returned" when main returns."""
    try:
        main(argv)
    except SystemExit as exit:
        return exit.code
    return "returned"


def upstream_files(mirror: Path | None, env: str, repo: str, commit: str,
                   names: tuple[str, ...]) -> tuple[list[str], str]:
    """(the texts of names, the commit read) from a git mirror of repo: commit if the mirror has it, else HEAD; the
    test is skipped, saying how to run it, where env names no mirror, the mirror is absent or holds none of them."""
    if mirror is None:
        pytest.skip(f"set {env} to a clone or mirror of {repo} to run this conformance test")
    if not (mirror / "HEAD").exists() and not (mirror / ".git").exists():
        pytest.skip(f"{repo}'s git mirror is absent ({mirror}; set {env} to a clone of {repo} to check commit "
                    f"{commit})")
    for rev in (commit, "HEAD"):
        got = [subprocess.run(["git", "-C", str(mirror), "show", f"{rev}:{name}"], capture_output=True, text=True)
               for name in names]
        if all(g.returncode == 0 for g in got):
            read = subprocess.run(["git", "-C", str(mirror), "rev-parse", rev], capture_output=True, text=True)
            return [g.stdout for g in got], read.stdout.strip()
    pytest.skip(f"{mirror} holds no {' and '.join(names)} at {commit} or HEAD")


GPU_NORMALS = Path(__file__).resolve().parent / "data" / "jax-gpu-normal"


def measured_gpu_table(cpu_table: np.ndarray) -> np.ndarray:
    """JAX's (2^23,) float32 normals measured on an H100: the CPU table with delta.npz's bit differences applied
    (tests/data/jax-gpu-normal/README.md)."""
    delta = np.load(GPU_NORMALS / "delta.npz")
    bits = np.asarray(cpu_table, np.float32).view(np.int32).copy()
    bits[delta["mantissa"].astype(np.int64)] += delta["bits_delta"].astype(np.int32)
    return bits.view(np.float32)


# `python -c NO_JAX ARGS`: the parity CLI on ARGS in a process where importing jax, jaxlib fails (and the run must
# not have imported jax, optax or jax_reference by its end); exits with the CLI's code.
NO_JAX = ("import sys\n"
          "class NoJax:\n"
          "    def find_spec(self, name, path=None, target=None):\n"
          "        if name.split('.')[0] in ('jax', 'jaxlib'):\n"
          "            raise ImportError(f'No module named {name!r} (blocked by the test)')\n"
          "sys.meta_path.insert(0, NoJax())\n"
          "from parity.__main__ import main\n"
          "code = main(sys.argv[1:])\n"
          "assert not {m.split('.')[0] for m in sys.modules} & {'jax', 'jaxlib', 'optax', 'jax_reference'}\n"
          "sys.exit(code)\n")
