"""How big the CartPole suite runs: `Sizes` and the three sizes (quick, full, selftest) a command line names.

Below the suite and its vectors both: a bundle is checked against the sizes it was recorded at (parity.mlp.vectors).
"""
from __future__ import annotations

from dataclasses import dataclass

from spec.config import PRESETS, Config


@dataclass(frozen=True)
class Sizes:
    """How big each check runs. `cfg` carries pop, rank, sigma, lr and the MLP widths."""

    name: str
    cfg: Config
    noise_pop: int = 512             # members drawn for noise statistics and pairing
    probe_pop: int = 8               # members drawn per probed epoch (schedule, reuse across epochs)
    probe_epochs: tuple = tuple(range(18)) + (24, 31, 32, 33, 48, 64, 100, 128, 256, 1000, 1024, 4096, 10_000,
                                              65_536, 1_000_000)
    product_members: int = 8         # members in the perturbed-product and forward checks
    product_batch: int = 4           # inputs per member in perturbed_linear
    extra_linear: tuple = ((64, 4), (128, 128))   # (out, in) of perturbed_linear shapes besides the MLP's
    fitness_sizes: tuple = (2, 8, 256, 2048)
    grad_pops: tuple = (256,)        # populations of the shared-noise gradient check
    synthetic_pops: tuple = (16, 64, 256)
    synthetic_repeats: int = 6
    update_epochs: int = 4
    init_seeds: int = 3
    traj_epochs: int = 3
    traj_max_steps: int = 500
    sigma_epochs: int = 32           # es_ask/es_tell epochs of the sigma schedule reading: the least that resolve a
                                     # 0.999 decay (parity.mlp.sigma_schedule.epochs_needed at this size's effective n and alpha)


QUICK = Sizes("quick", Config())


FULL = Sizes("full", PRESETS["paper"][0], noise_pop=2048, extra_linear=((256, 4), (256, 256), (2, 256)),
             fitness_sizes=(2, 8, 256, 2048, 8192), grad_pops=(256, 2048), synthetic_pops=(16, 64, 256, 1024),
             synthetic_repeats=8, update_epochs=8, init_seeds=4, traj_epochs=8, sigma_epochs=14)


SELFTEST = Sizes("selftest", Config(pop=32, hidden=8), noise_pop=128, probe_pop=8,
                 probe_epochs=(0, 1, 2, 3, 4, 5, 7, 8, 16, 100, 1000, 1_000_000), product_members=4,
                 extra_linear=((16, 4),), fitness_sizes=(2, 8, 64), grad_pops=(32,), synthetic_pops=(32,),
                 synthetic_repeats=3, update_epochs=3, init_seeds=2, traj_epochs=2, traj_max_steps=200,
                 sigma_epochs=113)


SIZES = {s.name: s for s in (QUICK, FULL, SELFTEST)}
