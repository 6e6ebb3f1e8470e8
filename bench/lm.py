"""The byte-level LM's population forward and training run: torch_impl against jax_reference's jit.

Cases (each call scores every member's T tokens):
- `torch_impl`: the forward alone, on noise drawn once (rng=jax);
- `torch_impl+noise`: the noise drawn (rng=jax, JAX's very numbers) and the forward, per call;
- `jax_reference`: the jitted vmap of member scores, which draws its noise inside as upstream's noiser does.
So `torch_impl+noise` against `jax_reference` is the like-for-like ratio. The floor is the forward's matmul
FLOPs at the machine's measured matmul peak (elementwise work and the recurrence left out: a lower bound).
The training run is `python -m torch_impl --task lm` / `python -m jax_reference --task lm` at the cpu preset in
a fresh process with one thread, pinned to one core where `taskset` exists.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from typing import NamedTuple

import numpy as np
import torch

from bench.runners import Case
from spec.lm import LM_PRESETS, VOCAB, LMConfig
from spec.threads import single_thread_env

LM_POPS = (128, 512)        # the cpu preset's population, and four times it
QUICK_POPS = (16,)
RUN_PRESET, RUN_SEED = "cpu", 0


def lm_config(pop: int, quick: bool = False) -> LMConfig:
    """The cpu preset at population `pop` (quick: the selftest preset's model)."""
    base = LM_PRESETS["selftest" if quick else "cpu"]
    return base.replace(pop=pop, group_size=min(base.group_size, pop))


def forward_flops(cfg: LMConfig) -> float:
    """Matmul FLOPs of one population forward: the plain products and each low-rank term (2 r (a + b))."""
    d, h, r, L = cfg.d_model, cfg.d_hidden, cfg.rank, cfg.layers
    lowrank = lambda a, b: 2.0 * a * b + 2.0 * r * (a + b)        # noqa: E731
    per_token = L * (2 * lowrank(d, d) + 2 * lowrank(d, h)) + lowrank(VOCAB, d)
    return per_token * cfg.seq_len * cfg.pop


def tokens(cfg: LMConfig, seed: int) -> np.ndarray:
    """(pop, T + 1) uint8 windows of the shipped corpus at epoch 0, members sharing their group's stream."""
    from rollout.corpus import load_corpus, member_tokens, train_windows
    corpus = load_corpus(seq_len=cfg.seq_len)
    return member_tokens(train_windows(corpus, seed, 0, cfg.n_streams, cfg.seq_len), cfg.pop, cfg.group_size)


def torch_cases(cfg: LMConfig, seed: int, device: torch.device) -> dict[str, Case]:
    """torch_impl's forward alone (noise fixed) and noise + forward, both rng=jax."""
    from torch_impl.tree import es as lm_es, lm
    from torch_impl.tree.noise import sample
    es = lm_es.make(cfg)
    state = lm_es.init(es, seed, device)
    toks = torch.as_tensor(tokens(cfg, seed), device=device)
    noise, _ = lm_es.ask(es, state)
    sync = (lambda _: torch.cuda.synchronize(device)) if device.type == "cuda" else (lambda _: None)
    fixed = lambda: lm.forward(state.params, toks, noise)                                    # noqa: E731
    fresh = lambda: lm.forward(state.params, toks, sample(es.plan, state.sources, 0, cfg.sigma, device))  # noqa: E731
    return {"torch_impl": Case(fixed, sync, device.type), "torch_impl+noise": Case(fresh, sync, device.type)}


def jax_case(cfg: LMConfig, seed: int) -> Case:
    """jax_reference's jitted population scores (noise drawn inside, as upstream's do_mm draws it)."""
    import jax
    from jax_reference.lm import model as jlm
    from jax_reference.noiser import EggRoll
    init = jlm.init_lm(cfg, seed)
    keys = jlm.es_keys(init.params, init.scan_map, seed)
    frozen, noiser_params = EggRoll.init_noiser(init.params, cfg.sigma, cfg.lr,
                                                group_size=cfg.group_size, freeze_nonlora=cfg.freeze_nonlora,
                                                noise_reuse=cfg.noise_reuse, rank=cfg.rank)
    toks = jax.numpy.asarray(tokens(cfg, seed))
    fn = lambda: jlm.population_scores(EggRoll, frozen, noiser_params, init.params, keys, 0, toks)   # noqa: E731
    return Case(fn, lambda out: out.block_until_ready(), "cpu")


class RunTime(NamedTuple):
    impl: str
    wall_s: float
    val_bpb: float
    ok: bool
    note: str


def run_time(impl: str, quick: bool = False, timeout_s: float = 600.0) -> RunTime:
    """One LM training run at the cpu preset (quick: selftest) in a fresh one-thread process, timed end to end."""
    module = {"torch_impl": "torch_impl", "jax_reference": "jax_reference"}[impl]
    cmd = [sys.executable, "-m", module, "--task", "lm", "--preset", "selftest" if quick else RUN_PRESET,
           "--seed", str(RUN_SEED), "--quiet"]
    if shutil.which("taskset"):
        cmd = ["taskset", "-c", str(sorted(os.sched_getaffinity(0))[0])] + cmd
    t0 = time.perf_counter()
    try:
        proc = subprocess.run(cmd, env=single_thread_env(dict(os.environ)), capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        return RunTime(impl, float("nan"), float("nan"), False, f"killed after {timeout_s:.0f} s")
    wall = time.perf_counter() - t0
    val = float("nan")
    for line in proc.stdout.splitlines() + proc.stderr.splitlines():
        if line.startswith("validation ") and "bits/byte" in line:
            val = float(line.split()[1])
    ok = proc.returncode == 0 and val == val
    return RunTime(impl, wall, val, ok, "" if ok else (proc.stderr.strip().splitlines() or ["no output"])[-1])
