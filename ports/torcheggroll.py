"""torcheggroll 0.2.0 (`TorchEggrollES`, MIT) behind the parity protocol: every number comes from the package.

    python -m parity check --port ports.torcheggroll:adapter          # the user's model = the reference's network
    python -m parity check --port ports.torcheggroll:readme_model     # the README's model (ReLU, nn.Linear init)

The trainer is configured as the README shows (antithetic=True, normalize_fitness=True), with the suite's pop,
sigma, lr and rank. What each protocol method calls (paths and lines of the 0.2.0 wheel, torcheggroll/es.py):

  noise            `_generate_all_noise()` at `es.epoch = epoch` (431-456); it returns only dense A B^T, so the
                   factors are read from the torch.randn calls it makes (generate_lora_noise_batched, 52-70),
                   padded with zero columns where it clips r to min(rank, out, in) (51). `seed` is not used: the
                   package seeds each draw with hash((epoch, pair, leaf index)) & 0x7FFFFFFF (436-440).
  perturbed_linear `prepare_population()` + `get_stacked_params()` (base + E, 610-664) on a one-layer model with the
                   given noise injected (the instance's `_generate_all_noise` replaced), then vmap(functional_call),
                   the forward of `step()` (530-540).
  shape_fitness    the shaping inside `apply_fitness_scores()` (696-704), read back from its update over unit-vector
                   noise in float64 (there is no shaping function). group_size > 0: NotImplementedError (no groups).
  gradient         `apply_fitness_scores()` with normalize_fitness=False (it still centres, 704), base 0, lr 1,
                   the given noise injected; its update sqrt(N) mean(f E) (713) divided by sqrt(N).
  forward          the same population forward as perturbed_linear on the user's MLP.
  optimizer_step   `prepare_population()` + `apply_fitness_scores(shaped)` with the noise injected and
                   normalize_fitness=False: the package's own SGD (714), constant lr.
  es_init/ask/tell/params
                   one TorchEggrollES; ask = `prepare_population()` (its own epoch counter, 575/723); tell =
                   `apply_fitness_scores(returns)` on its pending noise, or on the given noise when told another.
  init_params      not the package's (it takes a user model): the user's model init.
  action_uniforms, actions
                   not part of the package (left out: the suite skips those checks).
"""
from __future__ import annotations

import math

import numpy as np
import torch
from torch.func import functional_call, vmap

from ports import _torch as T
from ports.readings import Reading

DIST, PINNED = "torcheggroll", "0.2.0"
WHERE = "torcheggroll/es.py"

# What the package's code does, knob by knob (read from the 0.2.0 wheel), and whether a correct suite names it.
READINGS = (
    Reading("rng", "torch", "one torch.Generator per (epoch, pair, leaf), seeded hash((epoch, pair, leaf)) & "
            "0x7FFFFFFF; leaves in module order", f"{WHERE}:431-440, 52-70", named=False),
    Reading("antithetic", "halves", "members i and i + N/2 share a draw, the second negated", f"{WHERE}:452-454"),
    Reading("fitness", "std_unbiased", "(f - mean) / std(ddof 1) with no epsilon; only centred when std <= 1e-8",
            f"{WHERE}:696-704"),
    Reading("bias_noise", "jax", "biases drawn with the weights' key scheme and schedule, applied in the forward "
            "and used in the update", f"{WHERE}:443-450, 616-620", named=False),
    Reading("bias_grad", "jax", "sqrt(N) * mean(f * sigma * eps), no 1/sigma", f"{WHERE}:713", named=False),
    Reading("noise_reuse", 1, "the epoch enters every seed: new noise every epoch", f"{WHERE}:437, 723"),
    Reading("optimizer", "sgd", "params + lr * grad, its own", f"{WHERE}:714", named=False),
    Reading("lr_decay", 1.0, "lr is a constant attribute", f"{WHERE}:358, 714", named=False),
    Reading("sigma_decay", 1.0, "sigma is a constant attribute (the reference decays it x0.999 per epoch)",
            f"{WHERE}:357, 445"),
    Reading(None, "rank clipped", "r = min(rank, out, in): a 2-row layer gets rank 2 with A scaled sigma/sqrt(2) "
            "(entries of A B^T: kurtosis 3 + 6/2 = 6, not 4.5)", f"{WHERE}:51, 133"),
    Reading(None, "seed unused", "the noise depends on (epoch, pair, leaf) only: every run seed gets the same noise",
            f"{WHERE}:437"),
    Reading(None, "dense perturbation", "W + A_i B_i^T is materialised per member, (pop, out, in)",
            f"{WHERE}:66-70, 511"),
)


def make_es(model, pop: int, sigma: float, lr: float, rank: int, **kwargs):
    """The trainer (hyperfunc's model path builds the same one through its optimiser)."""
    from torcheggroll import TorchEggrollES

    return TorchEggrollES(model, pop_size=pop, sigma=sigma, lr=lr, rank=rank, **kwargs)


def inject(es, noise: dict):
    """Make the trainer use the given dense noise {name: (pop, *shape)} instead of drawing its own."""
    es._generate_all_noise = lambda: {k: noise[k] for k in es.param_names}
    return es


def factors(es, draws: list, shapes: dict, rank: int) -> dict:
    """Protocol noise of all pop members from the draws of one `_generate_all_noise()`: per leaf (es.param_names
    order) one draw per seed index; halves layout, so member j >= N/2 is draw j - N/2 negated (es.py:452-454)."""
    n_seeds = es.pop_size // 2 if es.antithetic else es.pop_size
    if len(draws) != n_seeds * len(es.param_names):
        raise RuntimeError(f"torcheggroll drew {len(draws)} tensors, expected {n_seeds} per leaf for "
                           f"{len(es.param_names)} leaves: not the 0.2.0 draw this adapter reads")
    idx = torch.arange(es.pop_size) % n_seeds
    sign = torch.where(torch.arange(es.pop_size) < n_seeds, 1.0, -1.0) if es.antithetic else torch.ones(es.pop_size)
    out = {}
    for j, name in enumerate(es.param_names):
        z = torch.stack(draws[j * n_seeds:(j + 1) * n_seeds])[idx]
        if z.ndim == 3:
            A, B = T.factors_of_draw(z, shapes[name][1], es.sigma, rank)
            out[name] = (A * sign[:, None, None], B)
        else:
            out[name] = z * es.sigma * sign[:, None]
    return out


def population_forward(model, es, x_members: torch.Tensor) -> torch.Tensor:
    """Member i's output on x_members[i]: the package's stacked params (base + E) through vmap(functional_call)."""
    es.prepare_population()
    stacked = es.get_stacked_params()
    names = list(stacked)
    return vmap(lambda p, xi: functional_call(model, dict(zip(names, p)), (xi,)))(
        tuple(stacked[k] for k in names), x_members)


class TorchEggrollAdapter:
    """TorchEggrollES on the user's MLP; `make` builds the trainer (overridden by hyperfunc's model path)."""

    package = f"{DIST} {T.installed(DIST)}"
    trainer = "TorchEggrollES"
    jax_compatible_rng = False
    make = staticmethod(make_es)

    def __init__(self, cfg, model: T.UserModel = T.REFERENCE_NETWORK):
        self.cfg, self.model = cfg, model
        self.name = f"{self.package} {self.trainer} [user model: {model.label()}]"

    def _es(self, params_or_shapes, pop: int, sigma: float, lr: float = 1.0, rank: int | None = None, **kw):
        """A trainer over the user's MLP (params given, or fresh for shapes)."""
        first = next(iter(params_or_shapes.values()))
        is_params = not isinstance(first, tuple)
        shapes = T.shapes_of(params_or_shapes) if is_params else params_or_shapes
        net = T.user_model(shapes, params_or_shapes if is_params else None, self.model, seed=0)
        return net, self.make(net, pop, sigma=sigma, lr=lr, rank=rank or self.cfg.rank, **kw)

    # ---- required
    def noise(self, shapes, seed, epoch, members, pop, sigma, rank):
        _, es = self._es(shapes, pop, sigma, rank=rank)
        es.epoch = int(epoch)                       # the package's epoch counter; `seed` has no role in it
        with T.record_randn() as draws:
            es._generate_all_noise()
        return T.select(T.to_numpy(factors(es, draws, shapes, rank)), members)

    def perturbed_linear(self, W, A, B, x):
        layer = torch.nn.Linear(W.shape[1], W.shape[0])
        with torch.no_grad():
            layer.weight.copy_(T.tensor(W))
            layer.bias.zero_()
        es = self.make(layer, x.shape[0], sigma=1.0, lr=1.0, rank=A.shape[2], antithetic=False,
                       param_filter=lambda p, n: n == "weight")
        inject(es, {"weight": T.tensor(A) @ T.tensor(B).transpose(1, 2)})
        with torch.no_grad():
            return population_forward(layer, es, T.tensor(x)).numpy()

    def shape_fitness(self, f, group_size=0):
        if group_size:
            raise NotImplementedError("torcheggroll has no grouped fitness shaping")
        f = T.tensor(f)

        def update(rows):                           # apply_fitness_scores over a float64 1-D leaf, base 0, lr 1
            leaf = torch.nn.Module()
            leaf.w = torch.nn.Parameter(torch.zeros(rows.shape[1], dtype=torch.float64))
            es = self.make(leaf, len(f), sigma=1.0, lr=1.0, rank=1, antithetic=False)
            inject(es, {"w": rows})
            es.prepare_population()
            es.apply_fitness_scores(f)
            return es.base_params["w"]
        return T.read_back(update, len(f))

    def gradient(self, noise, shaped, sigma):
        shapes = T.noise_shapes(noise)
        n = len(shaped)
        zeros = {k: np.zeros(s, np.float32) for k, s in shapes.items()}
        _, es = self._es(zeros, n, sigma, lr=1.0, normalize_fitness=False, antithetic=False)
        inject(es, T.dense(noise, shapes, n))
        es.prepare_population()
        es.apply_fitness_scores(T.tensor(shaped))   # base 0, lr 1: sqrt(N) * mean(f E) (es.py:713-714)
        return {k: (v / math.sqrt(n)).numpy() for k, v in es.base_params.items()}

    # ---- optional
    def forward(self, params, noise, x):
        shapes = T.shapes_of(params)
        net = T.user_model(shapes, params, self.model)
        with torch.no_grad():
            if noise is None:
                return net(T.tensor(x)).numpy()
            m = x.shape[0]
            es = self.make(net, m, sigma=self.cfg.sigma, lr=self.cfg.lr, rank=self.cfg.rank, antithetic=False)
            inject(es, T.dense(noise, shapes, m))
            return population_forward(net, es, T.tensor(x)[:, None, :])[:, 0].numpy()

    def init_params(self, shapes, seed):
        return T.to_numpy(T.user_model(shapes, None, self.model, seed=seed).state_dict())

    def optimizer_init(self, params):
        return None

    def optimizer_step(self, params, state, noise, shaped, sigma, epoch):
        n = len(shaped)
        _, es = self._es(params, n, sigma, lr=self.cfg.lr, normalize_fitness=False, antithetic=False)
        inject(es, T.dense(noise, T.shapes_of(params), n))
        es.prepare_population()
        es.apply_fitness_scores(T.tensor(shaped))
        return T.to_numpy(es.base_params), state

    def es_init(self, params, seed):
        c = self.cfg
        _, es = self._es(params, c.pop, c.sigma, lr=c.lr)        # README: antithetic=True, normalize_fitness=True
        return {"es": es, "shapes": T.shapes_of(params), "asked": None}

    def es_ask(self, state, epoch):
        es = state["es"]
        if state["asked"] is not None and state["asked"][0] == epoch:
            return state["asked"][1]                # asked twice for one epoch: the same pending population
        if es.epoch != epoch:
            raise ValueError(f"torcheggroll counts its own epochs: it is at epoch {es.epoch}, asked for {epoch} "
                             "(es_ask must follow the es_tell of the previous epoch)")
        with T.record_randn() as draws:
            es.prepare_population()
        noise = T.to_numpy(factors(es, draws, state["shapes"], self.cfg.rank))
        state["asked"] = (epoch, noise)
        return noise

    def es_tell(self, state, noise, fitness, epoch):
        es = state["es"]
        if state["asked"] is None or state["asked"][0] != epoch:
            self.es_ask(state, epoch)
        if not T.same_noise(noise, state["asked"][1]):  # told another noise than it drew: update with that one
            es._current_noise = T.dense(noise, state["shapes"], self.cfg.pop)
        es.apply_fitness_scores(T.tensor(fitness))
        state["asked"] = None
        return state

    def es_params(self, state):
        return T.to_numpy(state["es"].base_params)


adapter = TorchEggrollAdapter


def readme_model(cfg):
    """The README's user model (ReLU, nn.Linear's default init) around the same trainer."""
    return TorchEggrollAdapter(cfg, T.README_MODEL)
