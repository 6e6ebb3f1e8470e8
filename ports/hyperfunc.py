"""hyperfunc 0.3.0 (`ESHybridSystemOptimizer`) behind the parity protocol: both of its ES paths.

    python -m parity check --port ports.hyperfunc:model_path    # models through torcheggroll.TorchEggrollES
    python -m parity check --port ports.hyperfunc:lora_path     # LoRAWeight hp blocks, hyperfunc's own noise

hyperfunc ships without a license, so nothing of it is reproduced here: every number comes from calling it.
Paths and lines below are those of the 0.3.0 wheel (hyperfunc/es.py, hyperfunc/core.py). The optimiser is
configured as the README shows (antithetic=True, normalize_fitness=True) with the suite's pop, sigma, lr, rank.

Model path (`_register_gpu_model(name, model)` stores a torcheggroll TorchEggrollES built from the optimiser's
fields, es.py:61-83): the torcheggroll adapter with the trainer built through hyperfunc. In 0.3.0 `optimize()`
never steps these trainers (es.py:132-223 never reads `_gpu_optimizers`), so the adapter drives the trainer as a
user has to (`prepare_population` / `apply_fitness_scores`).

LoRAWeight path (`optimize()`, es.py:132-223): the MLP is a HyperSystem of hyperfunctions, one per parameter, named
"0.weight", "0.bias", ...: a weight is a `LoRAWeight.create(out, in, noise_rank=rank)` block (core.py:620-665), a
bias a 1-D block whose noise_rank is None; registered layer by layer, weight then bias, which is the optimiser's
param_idx (core.py:1282-1288).
  noise            `_generate_hp_noise(base, pop_idx, param_idx, epoch, noise_rank)` per member and block
                   (es.py:85-130); factors read from its torch.randn call (generate_lora_noise), padded where it
                   clips the rank; `seed` unused (its seed is hash((epoch, pair, block)) & 0x7FFFFFFF, es.py:111).
  perturbed_linear the weight hyperfunction's `fn_sync` under vmap (README "GPU batching with vmap") on base + noise.
  forward          the members' hp states base + noise (es.py:183) through the user's hyperfunctions, each one's
                   `fn_sync` under torch.vmap (the README's "GPU batching with vmap"): what optimize()'s
                   `evaluate_population` (core.py:1822-1930) computes candidate by candidate with `run()`, which
                   is too slow for the suite's rollouts (`evaluate_members` does that; the tests compare both).
  shape_fitness    the shaping inside `optimize()` (es.py:198-206), read back from one epoch's update over
                   unit-vector noise on a float64 1-D block. group_size > 0: NotImplementedError.
  gradient, optimizer_step
                   `optimize()` itself for one epoch (steps=1) with a stand-in `evaluate_population` returning the
                   given fitness and `_generate_hp_noise` replaced by a lookup of the given noise; gradient uses
                   normalize_fitness=False, base 0 and lr 1 (its update is sqrt(N) mean(f E), es.py:209-220).
  es_init/ask/tell/params
                   one system and optimiser; tell = `optimize()` for one epoch, its own noise drawn for `epoch`
                   (optimize() counts from 0 on every call, so the epoch argument of _generate_hp_noise is
                   offset), or the given noise when told another. This is one long optimize(steps=E) call.
  init_params      the package's auto-registration init, `get_hp_default_init` per block in registration
                   order (core.py:431-452, 1246-1250): randn(*shape) * sqrt(2 / sum(shape)), biases included.
  action_uniforms, actions: not part of the package.
"""
from __future__ import annotations

import asyncio
import math
from dataclasses import dataclass

import numpy as np
import torch
from torch.func import vmap

from ports import _torch as T
from ports import torcheggroll as te
from ports.readings import Reading

DIST, PINNED = "hyperfunc", "0.3.0"
ES, CORE = "hyperfunc/es.py", "hyperfunc/core.py"

COMMON = (
    Reading("rng", "torch", "per (epoch, pair, leaf) torch generator seeded hash(...) & 0x7FFFFFFF", f"{ES}:111",
            named=False),
    Reading("fitness", "std_unbiased", "(f - mean) / std(ddof 1), no epsilon; centred only when std <= 1e-8",
            f"{ES}:198-206"),
    Reading("bias_grad", "jax", "sqrt(N) * mean(f * sigma * eps)", f"{ES}:209-220", named=False),
    Reading("noise_reuse", 1, "the epoch enters every seed: new noise every epoch", f"{ES}:111, 165"),
    Reading("optimizer", "sgd", "base + lr * grad, its own", f"{ES}:220", named=False),
    Reading("lr_decay", 1.0, "constant lr", f"{ES}:220", named=False),
    Reading("sigma_decay", 1.0, "constant sigma (the reference decays it x0.999 per epoch)", f"{ES}:118, 125"),
    Reading(None, "seed unused", "the noise depends on (epoch, pair, leaf) only: every run seed gets the same noise",
            f"{ES}:111"),
    Reading(None, "rank clipped", "generate_lora_noise uses r = min(noise_rank, out, in)",
            "torcheggroll/es.py:133 (called from es.py:115)"),
)
MODEL_READINGS = te.READINGS + (
    Reading(None, "model path never stepped", "optimize() never reads _gpu_optimizers: a registered model is never "
            "trained by hyperfunc itself (the adapter steps the TorchEggrollES directly)", f"{ES}:132-223, 61-83"),
)
LORA_READINGS = (
    Reading("antithetic", "interleaved", "noise_idx = pop_idx // 2, sign + for even, - for odd", f"{ES}:102-105",
            named=False),
    Reading("bias_noise", "jax", "a 1-D bias block draws fresh Gaussian noise like the weights", f"{ES}:122-128",
            named=False),
    Reading("init", "randn * sqrt(2 / (out + in))", "auto-init randn(*shape) * sqrt(2 / sum(shape)), biases "
            "non-zero", f"{CORE}:431-452"),
    *COMMON,
    Reading(None, "epochs restart per optimize()", "every optimize() call counts epochs from 0: a loop of "
            "optimize(steps=1) calls reuses epoch 0's noise", f"{ES}:165"),
    Reading(None, "opt.rank unused", "each block's noise_rank sets its rank; the optimiser's rank is ignored",
            f"{ES}:114-121"),
)


# ============================================================================ the system (user code for hyperfunc)
def vector_type(n: int):
    """A 1-D hp type of n entries without low-rank noise (hyperfunc's hp-type protocol: shape, dim, noise_rank,
    to_tensor, from_tensor; core.py:403-430): the user's bias block."""
    @dataclass
    class Vector:
        value: torch.Tensor

        @classmethod
        def shape(cls):
            return (n,)

        @classmethod
        def dim(cls):
            return n

        @classmethod
        def noise_rank(cls):
            return None

        def to_tensor(self, device=None, dtype=torch.float32):
            return self.value.to(dtype)

        @classmethod
        def from_tensor(cls, t):
            return cls(value=t.view(n))
    return Vector


def _weight_fn(name: str):
    async def weight(x, hp):
        return x @ hp.weight.T
    weight.__name__ = name
    return weight


def _bias_fn(name: str):
    async def bias(x, hp):
        return x + hp.value
    bias.__name__ = name
    return bias


def mlp_system(shapes, params=None, rank: int = 4, activation: str = "pqn", seed: int | None = None):
    """The user's MLP as a HyperSystem (built lazily: hyperfunc is imported only when an adapter runs)."""
    from hyperfunc import HyperSystem, LoRAWeight, NoOpPromptOptimizer, hyperfunction

    class MLPSystem(HyperSystem):
        """Layer t: the "t.weight" hyperfunction (x @ W^T), the "t.bias" one (x + b), the activation between."""

        def __init__(self):
            super().__init__(prompt_optimizer=NoOpPromptOptimizer())
            self.hfs = {}
            self.act = T.ACTIVATIONS[activation]
            self.n = T.n_layers(shapes)
            for name in T.module_order(shapes):
                shape = tuple(shapes[name])
                kind = (LoRAWeight.create(shape[0], shape[1], noise_rank=rank) if len(shape) == 2
                        else vector_type(shape[0]))
                fn = _weight_fn(name) if len(shape) == 2 else _bias_fn(name)
                self.hfs[name] = hyperfunction(hp_type=kind, optimize_hparams=True, optimize_prompt=False)(fn)
                init = None if params is None else T.tensor(params[name])
                self.register_hyperfunction(self.hfs[name], hp_init=init)   # None: the package's auto-init

        async def run(self, x):
            for t in range(self.n):
                x = await self.hfs[f"{t}.weight"](x)
                if f"{t}.bias" in self.hfs:
                    x = await self.hfs[f"{t}.bias"](x)
                x = self.act(x) if t < self.n - 1 else x
            return x

        def run_batched(self, x, candidates):
            """run() for member i on x[i] with hp state candidates[name][i], all members at once: each
            hyperfunction's fn_sync under torch.vmap (the README's "GPU batching with vmap")."""
            for t in range(self.n):
                for name in (f"{t}.weight", f"{t}.bias"):
                    if name in self.hfs:
                        hf = self.hfs[name]
                        x = vmap(lambda xi, w, hf=hf: hf.fn_sync(xi, hp=hf.hp_type.from_tensor(w)))(x, candidates[name])
                x = self.act(x) if t < self.n - 1 else x
            return x

    with torch.random.fork_rng(devices=[]):
        if seed is not None:
            torch.manual_seed(int(seed))
        return MLPSystem()


def block_system(blocks: dict):
    """A HyperSystem of 1-D float64 blocks {name: size} whose run() is never called (for read-back updates)."""
    from hyperfunc import HyperSystem, NoOpPromptOptimizer, hyperfunction

    class Blocks(HyperSystem):
        def __init__(self):
            super().__init__(prompt_optimizer=NoOpPromptOptimizer())
            for name, size in blocks.items():
                hf = hyperfunction(hp_type=vector_type(size), optimize_hparams=True, optimize_prompt=False)(
                    _bias_fn(name))
                self.register_hyperfunction(hf, hp_init=torch.zeros(size, dtype=torch.float64))

        async def run(self, x):
            raise RuntimeError("never run")
    return Blocks()


def candidates(system, noise: dict) -> dict:
    """Every member's hp state, as optimize() forms it: base + noise, block by block (es.py:183)."""
    return {k: v[None] + noise[k] for k, v in system.get_hp_state().items()}


def evaluate_members(system, cands: dict, x):
    """Member i's logits on x[i] through the package's own population evaluation, candidate by candidate
    (`evaluate_population`, core.py:1822-1930); the logits are read from the metric function's preds. The
    adapter's forward computes the same with run_batched, much faster (tests/ports/test_pypi_adapters.py compares)."""
    from hyperfunc import Example

    m, seen = x.shape[0], []

    def keep(preds, expected):
        seen.append(preds[0])
        return 0.0
    states = [{k: v[i] for k, v in cands.items()} for i in range(m)]
    asyncio.run(system.evaluate_population(states, [Example({"x": x}, None)], keep))
    return torch.stack([seen[i][i] for i in range(m)])


def optimiser(pop: int, sigma: float, lr: float, rank: int, **kw):
    from hyperfunc import ESHybridSystemOptimizer

    return ESHybridSystemOptimizer(steps=1, pop_size=pop, sigma=sigma, lr=lr, rank=rank, **kw)


# ============================================================================ one epoch of optimize()
class Given:
    """Stands in for `opt._generate_hp_noise`: the given dense noise {name: (pop, *shape)} for (pop_idx, param_idx)."""

    def __init__(self, noise: dict, order: list[str]):
        self.noise, self.order = noise, order

    def __call__(self, base, pop_idx, param_idx, epoch, noise_rank=None):
        return self.noise[self.order[param_idx]][pop_idx]


def one_epoch(system, opt, fitness, epoch: int = 0, given: Given | None = None):
    """`opt.optimize(system, ...)` for one epoch with `fitness` as the population's rewards: its own noise drawn for
    `epoch` (optimize() counts from 0, so the epoch argument of _generate_hp_noise is offset) or the `given` one."""
    opt.steps = 1
    own = type(opt)._generate_hp_noise.__get__(opt)
    opt._generate_hp_noise = given or (lambda b, i, j, e, noise_rank=None: own(b, i, j, e + epoch,
                                                                               noise_rank=noise_rank))
    values = [float(v) for v in np.asarray(fitness, dtype=np.float32)]

    async def evaluate_population(hp_candidates, train_data, metric_fn, traces=None):
        return values
    system.evaluate_population = evaluate_population
    try:
        asyncio.run(opt.optimize(system, [None], lambda preds, expected: 0.0))
    finally:
        del system.evaluate_population
        del opt._generate_hp_noise
    return system


def lora_factors(opt, shapes, epoch: int, members, rank: int) -> dict:
    """The LoRAWeight path's own noise for `members` at `epoch`, as protocol factors: each block's draw recorded
    from `_generate_hp_noise` (es.py:85-130); interleaved signs when antithetic (es.py:102-105)."""
    out = {}
    members = [int(i) for i in members]
    sign = torch.tensor([1.0 if (i % 2 == 0 or not opt.antithetic) else -1.0 for i in members])
    for j, name in enumerate(T.module_order(shapes)):
        shape = tuple(shapes[name])
        draws = []
        for i in members:
            with T.record_randn() as calls:
                opt._generate_hp_noise(torch.zeros(shape), i, j, int(epoch),
                                       noise_rank=rank if len(shape) == 2 else None)
            draws.append(calls[0])
        z = torch.stack(draws)
        if len(shape) == 2:
            A, B = T.factors_of_draw(z, shape[1], opt.sigma, rank)
            out[name] = (A * sign[:, None, None], B)
        else:
            out[name] = z * opt.sigma * sign[:, None]
    return T.to_numpy(out)


# ============================================================================ the adapters
class ModelPathAdapter(te.TorchEggrollAdapter):
    """hyperfunc's model path: the torcheggroll adapter with the trainer from `_register_gpu_model`."""

    package = f"{DIST} {T.installed(DIST)}"
    trainer = "ESHybridSystemOptimizer, model path (TorchEggrollES via _register_gpu_model)"

    @staticmethod
    def make(model, pop, sigma, lr, rank, param_filter=None, **kw):
        opt = optimiser(pop, sigma, lr, rank, **kw)
        opt._register_gpu_model("model", model, param_filter=param_filter)
        return opt._gpu_optimizers["model"]


class LoRAPathAdapter:
    """hyperfunc's LoRAWeight path: `optimize()` over a HyperSystem of weight and bias blocks."""

    package = f"{DIST} {T.installed(DIST)}"
    jax_compatible_rng = False

    def __init__(self, cfg, model: T.UserModel = T.UserModel("pqn", "hyperfunc auto-init")):
        self.cfg, self.model = cfg, model
        self.name = (f"{self.package} ESHybridSystemOptimizer, LoRAWeight path [user model: {model.activation}, "
                     f"{model.init}]")

    # ---- required
    def noise(self, shapes, seed, epoch, members, pop, sigma, rank):
        return lora_factors(optimiser(pop, sigma, self.cfg.lr, rank), shapes, epoch, members, rank)

    def perturbed_linear(self, W, A, B, x):
        from hyperfunc import LoRAWeight, hyperfunction

        kind = LoRAWeight.create(W.shape[0], W.shape[1], noise_rank=A.shape[2])
        hf = hyperfunction(hp_type=kind, optimize_hparams=True, optimize_prompt=False)(_weight_fn("linear"))
        candidates = T.tensor(W)[None] + T.tensor(A) @ T.tensor(B).transpose(1, 2)      # es.py:183: base + noise
        with torch.no_grad():
            return vmap(lambda xi, w: hf.fn_sync(xi, kind.from_tensor(w)))(T.tensor(x), candidates).numpy()

    def shape_fitness(self, f, group_size=0):
        if group_size:
            raise NotImplementedError("hyperfunc has no grouped fitness shaping")
        n = len(f)

        def update(rows):
            system = block_system({"f": rows.shape[1]})
            one_epoch(system, optimiser(n, 1.0, 1.0, 1, antithetic=False), f, given=Given({"f": rows}, ["f"]))
            return system.get_hp_state()["f"]
        return T.read_back(update, n)

    def gradient(self, noise, shaped, sigma):
        shapes = T.noise_shapes(noise)
        n = len(shaped)
        system = mlp_system(shapes, {k: np.zeros(s, np.float32) for k, s in shapes.items()}, self.cfg.rank,
                            self.model.activation)
        opt = optimiser(n, sigma, 1.0, self.cfg.rank, normalize_fitness=False, antithetic=False)
        one_epoch(system, opt, shaped, given=Given(T.dense(noise, shapes, n), T.module_order(shapes)))
        return {k: (v / math.sqrt(n)).numpy() for k, v in system.get_hp_state().items()}

    # ---- optional
    def forward(self, params, noise, x):
        shapes = T.shapes_of(params)
        system = mlp_system(shapes, params, self.cfg.rank, self.model.activation)
        with torch.no_grad():
            if noise is None:
                return asyncio.run(system.run(T.tensor(x))).numpy()
            return system.run_batched(T.tensor(x), candidates(system, T.dense(noise, shapes, x.shape[0]))).numpy()

    def init_params(self, shapes, seed):
        system = mlp_system(shapes, None, self.cfg.rank, self.model.activation, seed=seed)
        return T.to_numpy(system.get_hp_state())

    def optimizer_init(self, params):
        return None

    def optimizer_step(self, params, state, noise, shaped, sigma, epoch):
        shapes, n = T.shapes_of(params), len(shaped)
        system = mlp_system(shapes, params, self.cfg.rank, self.model.activation)
        opt = optimiser(n, sigma, self.cfg.lr, self.cfg.rank, normalize_fitness=False, antithetic=False)
        one_epoch(system, opt, shaped, given=Given(T.dense(noise, shapes, n), T.module_order(shapes)))
        return T.to_numpy(system.get_hp_state()), state

    def es_init(self, params, seed):
        c = self.cfg
        shapes = T.shapes_of(params)
        return {"system": mlp_system(shapes, params, c.rank, self.model.activation),
                "opt": optimiser(c.pop, c.sigma, c.lr, c.rank), "shapes": shapes, "asked": None}

    def es_ask(self, state, epoch):
        if state["asked"] is None or state["asked"][0] != epoch:
            noise = lora_factors(state["opt"], state["shapes"], epoch, range(self.cfg.pop), self.cfg.rank)
            state["asked"] = (epoch, noise)
        return state["asked"][1]

    def es_tell(self, state, noise, fitness, epoch):
        own = self.es_ask(state, epoch)
        given = None if T.same_noise(noise, own) else Given(T.dense(noise, state["shapes"], self.cfg.pop),
                                                            T.module_order(state["shapes"]))
        one_epoch(state["system"], state["opt"], fitness, epoch=int(epoch), given=given)
        state["asked"] = None
        return state

    def es_params(self, state):
        return T.to_numpy(state["system"].get_hp_state())


def model_path(cfg):
    return ModelPathAdapter(cfg)


def lora_path(cfg):
    return LoRAPathAdapter(cfg)


def model_path_readme(cfg):
    """The model path around the README's user model (ReLU, nn.Linear's default init)."""
    return ModelPathAdapter(cfg, T.README_MODEL)


def lora_path_readme(cfg):
    """The LoRAWeight path with the README's activation (ReLU) and the package's auto-init."""
    return LoRAPathAdapter(cfg, T.UserModel("relu", "hyperfunc auto-init"))
