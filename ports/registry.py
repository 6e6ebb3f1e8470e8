"""The survey's rows: which adapter checks which installed package, configured how, read from which code.

To add a port: write `ports/<name>.py` (an adapter calling the installed package, its `READINGS`), pin the
package in pyproject.toml's `ports` extra, and add an `Entry` here.
"""
from __future__ import annotations

from typing import NamedTuple

from parity.mlp.suite import CHECKS
from ports.readings import Reading


class Entry(NamedTuple):
    key: str                      # folder of the port's parity report, and its id in the CSVs
    spec: str                     # MODULE:ATTR of the adapter
    dist: str                     # the distribution pip installs
    pinned: str                   # the version pinned in pyproject.toml's `ports` extra
    module: str                   # what the adapter imports (installed or not)
    configured: str               # how the adapter configures the package, in words
    readings: tuple[Reading, ...]
    checks: tuple[str, ...] = CHECKS
    cannot: tuple[tuple[str, str], ...] = ()   # (what the protocol cannot check, why) beyond missing methods
    dense: str | None = None      # MODULE:ATTR of (shapes, pop, sigma, rank, seed) -> dense noise, for probes


def _entries() -> tuple[Entry, ...]:
    """Built on first use: the adapter modules import no third-party package at import time."""
    from ports import eggroll_es, eggroll_trainer, hyperfunc, torcheggroll

    te = ("torcheggroll", "0.2.0", "torcheggroll")
    hf = ("hyperfunc", "0.3.0", "hyperfunc")
    et = ("eggroll-trainer", "0.1.0", "eggroll_trainer")
    return (
        Entry("torcheggroll", "ports.torcheggroll:adapter", *te,
              "TorchEggrollES(model, pop, sigma, lr, rank), antithetic and normalize_fitness on (README); the "
              "user's model: the reference's network", torcheggroll.READINGS),
        Entry("hyperfunc-model", "ports.hyperfunc:model_path", *hf,
              "ESHybridSystemOptimizer(pop_size, sigma, lr, rank) (README), the model registered with "
              "_register_gpu_model and its TorchEggrollES stepped directly (optimize() never does)",
              hyperfunc.MODEL_READINGS),
        Entry("hyperfunc-lora", "ports.hyperfunc:lora_path", *hf,
              "ESHybridSystemOptimizer(pop_size, sigma, lr, rank) (README) over a HyperSystem: one LoRAWeight "
              "block (noise_rank = rank) per weight, one 1-D block per bias, auto-initialised",
              hyperfunc.LORA_READINGS),
        Entry("eggroll-trainer", "ports.eggroll_trainer:adapter", *et,
              "EGGROLLTrainer(population_size, learning_rate, sigma, rank, noise_reuse=0, group_size=0) (README)",
              eggroll_trainer.READINGS),
        Entry("eggroll-trainer-reuse2", "ports.eggroll_trainer:antithetic", *et,
              "the same with noise_reuse=2 (the README's comment: \"2 = antithetic sampling\")",
              eggroll_trainer.ANTITHETIC_READINGS),
        Entry("eggroll-es", "ports.eggroll_es:adapter", "eggroll-es", "0.2.0", "eggroll",
              "EggrollConfig(population_size=pop/2, rank, sigma, lr, antithetic=True) with the default "
              "centered_rank shaping; LowRankNoiser and evolve_step", eggroll_es.READINGS,
              checks=("fitness", "products", "actions", "updates", "init"),
              cannot=(("noise (pairing, scaling, distribution, reuse, generator)",
                       "its perturbation (A * B).sum(1) * sigma is dense and full rank; the protocol's noise is "
                       "low-rank factors (A, B), so `noise` cannot be expressed"),
                      ("gradients", "its synthetic half draws the port's own noise (`noise`)"),
                      ("trajectory", "es_ask must return the port's noise as factors")),
              dense="ports.eggroll_es:perturbations"),
    )


def entries() -> tuple[Entry, ...]:
    return _entries()


def by_key(keys: list[str]) -> list[Entry]:
    """The entries named by key, in the given order; ValueError listing the known keys for an unknown one."""
    known = {e.key: e for e in entries()}
    unknown = [k for k in keys if k not in known]
    if unknown:
        raise ValueError(f"unknown port(s) {', '.join(unknown)}; known: {', '.join(known)}")
    return [known[k] for k in keys]
