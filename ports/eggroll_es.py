"""eggroll-es 0.2.0 (`eggroll.core`, MIT) behind as much of the parity protocol as its noise allows.

    python -m parity check --port ports.eggroll_es:adapter --checks fitness,products,updates,init

Its perturbation is not low rank: `LowRankNoiser.sample_perturbations` (eggroll/core.py:70-101) draws A, B of
shape (d, r) per parameter of d entries and forms `(A * B).sum(1) * sigma`, an elementwise product: a dense,
full-rank array whose entries have variance sigma^2 / r and are not normal. The protocol's noise is low-rank
factors (A (m, out, r), B (m, in, r)), so `noise` cannot be expressed: it raises, and every check that needs the
port's own noise (noise, the synthetic half of gradients, trajectory through es_ask) cannot run. `perturbations`
returns the package's dense noise for the survey's probes (rank, scale, kurtosis).

What each method calls (lines of the 0.2.0 wheel):
  perturbed_linear, forward
                   `EggrollTrainer._evaluate_population(base, perturbations, batch)` (trainer.py:94-119): each
                   member's base + perturbation loaded into the user's model, the reward function (here: keep the
                   model's output) called on the batch.
  shape_fitness    `fitness_shaping(f, "centered_rank")` (core.py:125-154), the config's default. No groups.
  gradient, optimizer_step
                   `evolve_step(params, perturbations, f, config)` (core.py:157-195) with fitness_shaping="raw":
                   its update is lr * sum_i f_i E_i / (n sigma); gradient() is that update at lr 1 from zero
                   params divided by sqrt(N), so the reference's optimizer (lr * sqrt(N) * g) makes the same step.
  init_params      the user's model.
  es_*, action_uniforms, actions: not expressible (es_ask needs the noise) or not part of the package.
"""
from __future__ import annotations

import contextlib
import io
import math

import numpy as np
import torch

from ports import _torch as T
from ports.readings import Reading

DIST, PINNED = "eggroll-es", "0.2.0"
CORE = "eggroll/core.py"

READINGS = (
    Reading("fitness", "rank", "default fitness_shaping 'centered_rank': argsort ranks / (n - 1) - 0.5",
            f"{CORE}:125-154"),
    Reading("bias_grad", "over_sigma", "every leaf's update is sum(f E) / (n sigma): 1/(sigma sqrt N) times the "
            "reference's lr * sqrt(N) * mean(f E)", f"{CORE}:186-193"),
    Reading("optimizer", "sgd", "param + lr * grad (optional weight decay, elite top-k)", f"{CORE}:175-193",
            named=False),
    Reading(None, "not low rank", "(A * B).sum(1) * sigma per parameter: dense, full rank, variance sigma^2 / r, "
            "not normal", f"{CORE}:85-91"),
    Reading(None, "population doubled", "antithetic=True returns 2 * population_size members (each draw, then its "
            "negation: interleaved)", f"{CORE}:96-99"),
    Reading(None, "one sequential stream", "one torch.Generator seeded config.seed, drawn member after member, "
            "leaf after leaf, generation after generation", f"{CORE}:67-68, 87-88"),
    Reading(None, "best generation returned", "evolve() restores the parameters of the generation with the best "
            "single member", "eggroll/trainer.py:180-182, 218-220"),
)


def config(pop: int, sigma: float, lr: float, rank: int, seed: int = 42, shaping: str = "centered_rank"):
    """The package's config for a protocol population of `pop` members (population_size = pop / 2 draws, each
    with its mirror)."""
    from eggroll import EggrollConfig

    return EggrollConfig(population_size=pop // 2, rank=rank, sigma=sigma, lr=lr, device="cpu", seed=int(seed),
                         fitness_shaping=shaping, antithetic=True, weight_decay=0.0, elite_k=0)


def perturbations(shapes, pop: int, sigma: float, rank: int, seed: int = 42) -> dict[str, np.ndarray]:
    """The package's own dense perturbations {name: (pop, *shape)} for one generation
    (`LowRankNoiser.sample_perturbations`, core.py:70-101)."""
    from eggroll import LowRankNoiser

    noiser = LowRankNoiser({k: torch.Size(s) for k, s in shapes.items()}, config(pop, sigma, 1.0, rank, seed))
    members = noiser.sample_perturbations(pop // 2)
    return {k: torch.stack([m[k] for m in members]).numpy().astype(np.float32) for k in shapes}


def _as_list(noise_dense: dict, m: int) -> list[dict]:
    return [{k: v[i] for k, v in noise_dense.items()} for i in range(m)]


def evaluate(net, noise_dense: dict, batch: torch.Tensor, cfg) -> list[torch.Tensor]:
    """Each member's model output on `batch`, through the package's own population evaluation."""
    from eggroll import EggrollTrainer

    outputs = []

    def keep_output(model, data):          # the reward function: the survey wants the logits, not a score
        outputs.append(model(data).detach().clone())
        return 0.0
    with contextlib.redirect_stdout(io.StringIO()):   # its constructor prints a banner
        trainer = EggrollTrainer(net, cfg, keep_output)
    base = trainer._get_params()
    m = next(iter(noise_dense.values())).shape[0]
    trainer._evaluate_population(base, _as_list({k: noise_dense[k] for k in base}, m), batch)
    return outputs


class EggrollEsAdapter:
    package = f"{DIST} {T.installed(DIST)}"
    jax_compatible_rng = False

    def __init__(self, cfg, model: T.UserModel = T.REFERENCE_NETWORK):
        self.cfg, self.model = cfg, model
        self.name = f"{self.package} eggroll.core (LowRankNoiser, evolve_step) [user model: {model.label()}]"

    # ---- required
    def noise(self, shapes, seed, epoch, members, pop, sigma, rank):
        raise NotImplementedError("eggroll-es perturbs every parameter with (A * B).sum(1) * sigma (eggroll/core.py:"
                                  "85-91): a dense full-rank array, not low-rank factors (A, B); the protocol "
                                  "cannot carry it")

    def perturbed_linear(self, W, A, B, x):
        layer = torch.nn.Linear(W.shape[1], W.shape[0])
        with torch.no_grad():
            layer.weight.copy_(T.tensor(W))
            layer.bias.zero_()
        layer.bias.requires_grad_(False)              # a target parameter is one that requires grad (trainer.py:62)
        noise = {"weight": T.tensor(A) @ T.tensor(B).transpose(1, 2)}
        outs = evaluate(layer, noise, T.tensor(x), config(x.shape[0] + x.shape[0] % 2, 1.0, 1.0, A.shape[2]))
        return torch.stack([outs[i][i] for i in range(x.shape[0])]).numpy()

    def shape_fitness(self, f, group_size=0):
        from eggroll.core import fitness_shaping

        if group_size:
            raise NotImplementedError("eggroll-es has no grouped fitness shaping")
        return fitness_shaping(T.tensor(f), "centered_rank").numpy()

    def _evolve(self, params: dict, noise, shaped, sigma: float, lr: float) -> dict:
        from eggroll.core import evolve_step

        n = len(shaped)
        cfg = config(n + n % 2, sigma, lr, self.cfg.rank, shaping="raw")
        base = {k: T.tensor(v) for k, v in params.items()}
        updated = evolve_step(base, _as_list(T.dense(noise, T.shapes_of(params), n), n), T.tensor(shaped), cfg)
        return {k: v.numpy() for k, v in updated.items()}

    def gradient(self, noise, shaped, sigma):
        shapes = T.noise_shapes(noise)
        zeros = {k: np.zeros(s, np.float32) for k, s in shapes.items()}
        return {k: (v / np.float32(math.sqrt(len(shaped)))).astype(np.float32)
                for k, v in self._evolve(zeros, noise, shaped, sigma, 1.0).items()}

    # ---- optional
    def forward(self, params, noise, x):
        net = T.user_model(T.shapes_of(params), params, self.model)
        with torch.no_grad():
            if noise is None:
                return net(T.tensor(x)).numpy()
        m = x.shape[0]
        outs = evaluate(net, T.dense(noise, T.shapes_of(params), m), T.tensor(x),
                        config(m + m % 2, self.cfg.sigma, self.cfg.lr, self.cfg.rank))
        return torch.stack([outs[i][i] for i in range(m)]).numpy()

    def init_params(self, shapes, seed):
        return T.to_numpy(T.user_model(shapes, None, self.model, seed=seed).state_dict())

    def optimizer_init(self, params):
        return None

    def optimizer_step(self, params, state, noise, shaped, sigma, epoch):
        stepped = self._evolve(params, noise, shaped, sigma, self.cfg.lr)
        return {k: v.astype(np.float32) for k, v in stepped.items()}, state


adapter = EggrollEsAdapter
