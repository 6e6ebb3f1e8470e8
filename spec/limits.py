"""What a command's inputs may be, checked before any work: seeds, device names, output folders, memory.

Every CLI uses these, so one bad input gets one message everywhere, with exit code 2 (argparse's for a bad
argument) and nothing written.
"""
from __future__ import annotations

import argparse
import math
import os
import re
import tempfile
from typing import NamedTuple

from spec.config import Config
from spec.tree import Tree

# jax.random.key(seed) keeps the low 32 bits of the seed (x64 off): key(2**32) == key(0), and gymnasium's
# reset seeds must be >= 0. So a run seed is an integer in [0, 2**32 - 1].
SEED_MIN, SEED_MAX = 0, 2**32 - 1
DEVICES = "cpu, cuda, cuda:N"
_DEVICE = re.compile(r"^(cpu|cuda(:\d+)?)$")


def check_seed(seed: int, what: str = "--seed") -> int:
    if not SEED_MIN <= seed <= SEED_MAX:
        raise ValueError(f"{what} must be an integer in [{SEED_MIN}, {SEED_MAX:,}] (JAX keys keep 32 bits; "
                         f"environment seeds are >= 0), got {seed}")
    return seed


def seed_arg(text: str) -> int:
    """argparse type of a run seed: an integer in [0, 2**32 - 1]."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"a seed is an integer in [{SEED_MIN}, {SEED_MAX:,}], got {text!r}") from None
    try:
        return check_seed(value, "a seed")
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from None


def device_arg(text: str) -> str:
    """argparse type of a torch device name: cpu, cuda or cuda:N (whether CUDA is there is checked later)."""
    if not _DEVICE.match(text):
        raise argparse.ArgumentTypeError(f"unknown device {text!r}; accepted: {DEVICES}")
    return text


def cuda_missing(device: str, why: str = "") -> str:
    """The sentence every command refuses a CUDA device with, on a machine without one (exit 2, before any work)."""
    return f"--device {device}: CUDA is not available on this machine{why}; use --device cpu"


def check_out_dir(path: str, flag: str = "--out") -> str:
    """Raise ValueError unless `path` is, or can be created as, a writable folder; creates nothing."""
    target = os.path.abspath(path)
    probe = target
    while not os.path.exists(probe):
        parent = os.path.dirname(probe)
        if parent == probe:
            break
        probe = parent
    if not os.path.isdir(probe):
        where = "is a file" if probe == target else f"is inside {probe}, which is a file"
        raise ValueError(f"{flag} {path}: {where}; give a folder (it is created if missing)")
    try:   # os.access says yes to root on a read-only file system: try a real write
        with tempfile.NamedTemporaryFile(dir=probe, prefix=".write-test-"):
            pass
    except OSError as err:
        raise ValueError(f"{flag} {path}: cannot write in {probe} ({err.strerror or err}); give a writable "
                         "folder") from None
    return path


# ---------------------------------------------------------------- memory
class MemoryEstimate(NamedTuple):
    total: int                     # bytes
    parts: dict[str, int]
    fixed: int = 0                 # bytes of total that do not grow with the population


def estimate_population_bytes(pop: int, dims: tuple[int, ...], rank: int) -> MemoryEstimate:
    """The population forward's largest arrays (float32): every member's noise factors and bias noise, and a few
    activations per member."""
    layers = list(zip(dims[:-1], dims[1:]))
    parts = {"noise factors": pop * sum((i + o) * rank for i, o in layers) * 4,
             "bias noise": pop * sum(o for _, o in layers) * 4,
             "activations": 3 * pop * max(dims) * 4}
    return MemoryEstimate(sum(parts.values()), parts)


# Copies of the parameters the tree suite holds at once (float32), at least: the port's params before and after a step,
# the port's gradient, and the reference's gradient, step and copies of its inputs (measured at GPT-2's size: about 10,
# with the runtimes' own memory).
TREE_PARAM_COPIES = 6


def estimate_tree_check_bytes(tree: Tree, pop: int, rank: int, block_entries: int,
                              freeze_nonlora: bool = True) -> MemoryEstimate:
    """The tree suite's largest arrays on a declared tree: TREE_PARAM_COPIES copies of the parameters; every member's
    noise of every leaf the reference perturbs at two epochs (low-rank leaves as factors, (a + b) r per slice; param
    leaves at full size unless freeze_nonlora; float32); and the comparisons' dense perturbations, in blocks of at
    most `block_entries` entries (parity.tree.blocks: float64, about four arrays: both sides', the bound, the
    difference). A lower bound on the peak, used to refuse trees that cannot fit; what grows with the population is
    the noise, and the blocks until they reach their cap."""
    params = sum(math.prod(leaf.shape) for leaf in tree.leaves)
    noise = sum(leaf.n_slices * sum(leaf.factor_dims) * rank if leaf.factor_dims else
                math.prod(leaf.shape) if leaf.cls == "param" and not freeze_nonlora else 0 for leaf in tree.leaves)
    largest = max(math.prod(leaf.shape) for leaf in tree.leaves)
    capped = pop * largest > block_entries
    parts = {f"parameters (float32, {TREE_PARAM_COPIES} copies)": TREE_PARAM_COPIES * params * 4,
             "noise of every perturbed leaf, two epochs (float32)": 2 * pop * noise * 4,
             "dense perturbations of the largest leaf in blocks (float64, 4 arrays)":
                 4 * min(pop * largest, block_entries) * 8}
    fixed = parts[f"parameters (float32, {TREE_PARAM_COPIES} copies)"] + \
        (parts["dense perturbations of the largest leaf in blocks (float64, 4 arrays)"] if capped else 0)
    return MemoryEstimate(sum(parts.values()), parts, fixed)


def estimate_training_bytes(cfg: Config) -> MemoryEstimate:
    """The largest arrays a training epoch holds at once (either side): the population forward's, the action
    uniforms (500 steps) and the environment state.

    A lower bound on the real peak (allocator slack, compiled buffers and the interpreter come on top), used to
    refuse sizes that cannot fit, not to promise that the others do.
    """
    forward = estimate_population_bytes(cfg.pop, tuple(cfg.sizes), cfg.rank)
    parts = {**forward.parts, "action uniforms": 500 * cfg.pop * 4, "environment state": cfg.pop * 4 * 8 * 2}
    return MemoryEstimate(sum(parts.values()), parts)


def available_bytes() -> int | None:
    """Memory available to a new allocation on this machine (Linux MemAvailable), or None where unknown."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None


def gib(n: float) -> str:
    return f"{n / 2**30:,.1f} GiB" if n >= 2**30 else f"{n / 2**20:,.1f} MiB"


def check_fits(cfg: Config | None = None, available: int | None = None, where: str = "this machine",
               estimate: MemoryEstimate | None = None, pop: int | None = None) -> MemoryEstimate:
    """Raise ValueError when a run needing `estimate` (default: training `cfg`) cannot fit in `available` bytes
    (default: this machine's), naming the estimate, what is available and the largest population that fits."""
    est = estimate or estimate_training_bytes(cfg)
    pop = pop or cfg.pop
    available = available_bytes() if available is None else available
    if available is not None and est.total > available:
        per_member = (est.total - est.fixed) / pop
        largest = int((available - est.fixed) / per_member) // 2 * 2 if available > est.fixed and per_member else 0
        top = ", ".join(f"{k} {gib(v)}" for k, v in sorted(est.parts.items(), key=lambda kv: -kv[1])[:3])
        fits = (f"use a population of at most about {largest:,}" if largest >= 2 else
                "not even a population of 2 fits: give a smaller model or a machine with more memory")
        raise ValueError(f"pop {pop:,} needs at least {gib(est.total)} ({top}); {where} has {gib(available)} "
                         f"available: {fits}")
    return est
