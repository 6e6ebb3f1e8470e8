"""A numpy EGGROLL port written only from the adapter protocol's documentation (parity/adapter.py) and
the reference's described behaviour, with one switch per row of DESIGN.md's knob table: the suite's self-test subject.

`Drift()` is the faithful port; each field set away from its default makes the port drift in that one
way (the field names are the knob table's). `rng="jax"` draws JAX's own numbers through `jax.random`
(so it may claim `jax_compatible_rng`); `rng="numpy"` draws from numpy generators seeded per
(seed, purpose, leaf, generation) and, unless told to lie with `claims_jax_rng=True`, says so.
Three protocol forms beyond the knobs: `dense` materialises each member's perturbation E (dense_noise, as the
PyPI ports do), `split` gives forward and update noise apart, `rejects_nonfinite=False` accepts NaN fitness.
Nothing here imports torch_impl, jax_reference or parity: it is an outside port.
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from functools import lru_cache

import jax
import jax.numpy as jnp
import numpy as np
from scipy.special import ndtr

MAX_STEPS = 500
LN_EPS = np.float32(1e-5)
PURPOSE_WEIGHT, PURPOSE_BIAS, PURPOSE_INIT, PURPOSE_ACTION = 1, 2, 3, 4
SEED_IGNORED = 42       # the seed a port with ignores_seed draws from, whatever the run seed
OPTIONAL = ("forward", "init_params", "optimizer_init", "optimizer_step", "es_init", "es_ask", "es_tell",
            "es_params", "action_uniforms", "actions")


@dataclass(frozen=True)
class Drift:
    """How this port departs from the reference; the defaults are the reference's behaviour."""

    rng: str = "jax"                    # jax (jax.random's numbers) | numpy (numpy's generator)
    claims_jax_rng: bool | None = None  # what the adapter claims; None: the truth (rng == "jax")
    antithetic: str = "interleaved"     # interleaved | halves | off
    fitness: str = "jax"                # jax | std | std_unbiased | rank
    bias_noise: str = "jax"             # jax | fresh | update_only (fresh, never added in the forward) | off
                                        # | none (no notion of bias noise: none drawn or applied, zero bias gradients)
    bias_grad: str = "jax"              # jax | over_sigma
    noise_reuse: int = 0
    activation: str = "pqn"             # pqn | tanh | relu
    init: str = "jax"                   # jax | torch (nn.Linear's uniform default) | normal (std 0.1)
    optimizer: str = "sgd"              # sgd | adam | adamw (optax's semantics and defaults)
    lr_decay: float = 1.0
    sigma_decay: float = 0.999
    actions: str = "sample"             # sample (inverse CDF on the uniforms) | greedy (argmax)
    dense: str = ""                     # "" (factors) | product (E = A B^T: faithful) | gaussian (iid N(0, sigma^2):
                                        # full rank, kurtosis 3) | wrong_scale (A times sigma, not sigma/sqrt r)
                                        # | uniform_factors (rank r, unit-variance uniform factors: kurtosis ~3.06)
    split: bool = False                 # noise() / es_ask() give {"forward": ..., "update": ...}
    rejects_nonfinite: bool = True      # False: shape_fitness accepts NaN/inf, as upstream EggRoll
    ignores_seed: bool = False          # True: every draw from a hard-coded seed (SEED_IGNORED), not the run seed
    fixed_rank: int = 0                 # 0: the rank it is given; k: always rank k (padded with zero columns
                                        # to the given rank unless the adapter declares `rank = k`)
    declares_rank: bool = False         # with fixed_rank: the adapter says so (its `rank` attribute)
    grad_scale: str = ""                # "" | over_sigma (its optimizer steps on gradient / sigma) | no_sqrt_n (without
                                        # the reference's sqrt(N) factor)

    def label(self) -> str:
        changed = [f"{f.name}={getattr(self, f.name)}" for f in dataclasses.fields(self)
                   if getattr(self, f.name) != f.default]
        return ", ".join(changed) or "faithful"


# ----------------------------------------------------------------------------- names and keys
def leaf_order(shapes) -> list[str]:
    """Parameter names in JAX's flatten order: layer keys sorted as strings, "bias" before "weight"."""
    layers = sorted({name.split(".")[0] for name in shapes})
    return [f"{layer}.{leaf}" for layer in layers for leaf in ("bias", "weight") if f"{layer}.{leaf}" in shapes]


@lru_cache(maxsize=None)
def _jax_normals(length: int):
    """Jitted (base key, generation, pair ids (n,)) -> normal(fold_in(fold_in(key, generation), p), (length,)) (n,
    length). Threefry's bits go by flat index (jax_threefry_partitionable), so a slice's draw is the first prod(shape)
    of a longer one: a few bucketed lengths serve every leaf's shape, a compile each instead of one per shape."""
    def one(key, generation, pair):
        return jax.random.normal(jax.random.fold_in(jax.random.fold_in(key, generation), pair), (length,), jnp.float32)

    return jax.jit(jax.vmap(one, in_axes=(None, None, 0)))


def _pow2(n: int) -> int:
    """n rounded up to a power of two, at least 8: the port's few compiled sizes."""
    return max(8, 1 << (int(n) - 1).bit_length())


def _jax_normals_of(shape: tuple[int, ...], key, generation: int, pairs: np.ndarray) -> np.ndarray:
    """(n, *shape) normals of `shape` for pair ids (n,): _jax_normals of a bucketed length, cut to the shape."""
    size = int(np.prod(shape))
    length = _pow2(size) if jax.config.jax_threefry_partitionable else size
    return np.asarray(_jax_normals(length)(key, np.int32(generation), pairs))[:, :size].reshape((-1, *shape))


def _seed_key(seed: int, purpose: int):
    """split(key(seed), 3)[purpose]: 0 model, 1 ES, 2 actions (DESIGN.md's key scheme)."""
    return jax.random.split(jax.random.key(int(seed)), 3)[purpose]


@lru_cache(maxsize=64)
def _leaf_keys(seed: int, n_leaves: int):
    """split(es_key, n_leaves): leaf i of the JAX flatten order gets key i."""
    return jax.random.split(_seed_key(seed, 1), n_leaves)


def _numpy_rng(*parts: int) -> np.random.Generator:
    return np.random.default_rng([int(p) for p in parts])


def _float32(x: np.ndarray) -> np.ndarray:
    return np.asarray(x, dtype=np.float32)


# ----------------------------------------------------------------------------- fitness shaping
def centred_ranks(f: np.ndarray) -> np.ndarray:
    """Ranks scaled to [-0.5, 0.5], ties sharing their average rank."""
    n = f.size
    order = np.sort(f)
    rank = (np.searchsorted(order, f, "left") + np.searchsorted(order, f, "right") - 1) / 2.0
    return _float32(rank / max(n - 1, 1) - 0.5)


def shape_fitness(f: np.ndarray, method: str, group_size: int = 0, reject: bool = True) -> np.ndarray:
    f = _float32(f)
    if f.ndim != 1 or (reject and not np.all(np.isfinite(f))):
        raise ValueError(f"fitness must be a finite 1-D vector; got shape {f.shape}, {int(np.sum(~np.isfinite(f)))} non-finite")
    if method == "rank":
        return centred_ranks(f)
    centred = (f.reshape(-1, group_size) - f.reshape(-1, group_size).mean(1, keepdims=True)).reshape(-1) \
        if group_size else f - f.mean()
    if method == "jax":
        return centred / np.sqrt(f.var() + np.float32(1e-5))
    if method == "std":
        std = np.sqrt(f.var())
        return np.zeros_like(f) if std < 1e-8 else centred / std
    if method == "std_unbiased":
        return centred / (f.std(ddof=1) + np.float32(1e-8))
    raise ValueError(f"unknown fitness shaping {method!r}")


# ----------------------------------------------------------------------------- the port
class NumpyPort:
    """The adapter: numpy float32 in and out, built from the run's Config (pop, rank, sigma, lr, group_size)."""

    def __init__(self, cfg, drift: Drift = Drift(), omit: tuple[str, ...] = ()):
        self.cfg, self.drift = cfg, drift
        self.name = f"tests.ports.numpy_port ({drift.label()})"
        self.jax_compatible_rng = drift.rng == "jax" if drift.claims_jax_rng is None else drift.claims_jax_rng
        self.dense_noise = bool(drift.dense)
        if drift.fixed_rank and drift.declares_rank:
            self.rank = drift.fixed_rank
        for method in omit:         # an absent optional method: the attribute is not callable
            if method not in OPTIONAL:
                raise ValueError(f"only optional methods can be omitted, not {method!r}")
            setattr(self, method, None)

    # ---- schedules
    def sigma_at(self, epoch: int) -> float:
        return float(np.float32(self.cfg.sigma * self.drift.sigma_decay ** epoch))

    def lr_at(self, epoch: int) -> float:
        return float(np.float32(self.cfg.lr * self.drift.lr_decay ** epoch))

    # ---- noise
    def _layout(self, members: np.ndarray, pop: int) -> tuple[np.ndarray, np.ndarray]:
        """(draw index, sign) of each member under the antithetic layout."""
        if self.drift.antithetic == "interleaved":
            return members // 2, np.where(members % 2 == 0, 1, -1)
        if self.drift.antithetic == "halves":
            half = pop // 2
            return members % half, np.where(members < half, 1, -1)
        return members, np.ones_like(members)

    def _draws(self, seed: int, leaf: int, name: str, generation: int, draws: np.ndarray,
               shape: tuple[int, ...], n_leaves: int) -> np.ndarray:
        """Standard normals (len(draws), *shape) for draw indices `draws` of one leaf and generation."""
        if self.drift.rng == "jax":
            key = _leaf_keys(int(seed), n_leaves)[leaf]
            padded = np.zeros(_pow2(len(draws)), np.int32)                               # few compiled sizes
            padded[:len(draws)] = draws
            return _jax_normals_of(shape, key, generation, padded)[:len(draws)]
        purpose = PURPOSE_WEIGHT if name.endswith(".weight") else PURPOSE_BIAS
        block = _numpy_rng(seed, purpose, leaf, generation).standard_normal(
            (int(draws.max()) + 1, *shape), dtype=np.float32)       # draw p is the p-th block of the stream
        return block[draws]

    def _weight_noise(self, z: np.ndarray, a_scale: np.ndarray, n_in: int, gaussian) -> tuple | np.ndarray:
        """(A, B) from a (m, in + out, r) draw, or, for a dense port, E = A B^T (or its drifted forms)."""
        mode = self.drift.dense
        if mode == "gaussian":
            return gaussian()
        if mode == "uniform_factors":                      # N(0,1) -> U(-sqrt 3, sqrt 3): unit variance, not normal
            z = ((2 * ndtr(z) - 1) * np.sqrt(3)).astype(np.float32)
        if mode == "wrong_scale":
            a_scale = a_scale * np.sqrt(np.float32(z.shape[-1]))
        A, B = z[:, n_in:] * a_scale[:, None, None], np.ascontiguousarray(z[:, :n_in])
        return A @ np.swapaxes(B, 1, 2) if mode else (A, B)     # float32 matmul, as a torch port's A @ B.T

    def _seed(self, seed: int) -> int:
        return SEED_IGNORED if self.drift.ignores_seed else int(seed)

    def noise(self, shapes, seed, epoch, members, pop, sigma, rank):
        d = self.drift
        seed, given_rank = self._seed(seed), rank
        rank = d.fixed_rank or rank
        members = np.asarray(members, dtype=np.int64)
        draws, sign = self._layout(members, pop)
        generation = 0 if d.noise_reuse == 0 else epoch // d.noise_reuse
        bias_generation = epoch if d.bias_noise in ("fresh", "update_only") else generation
        sign32 = sign.astype(np.float32)
        a_scale = sign32 * (np.float32(sigma) / np.sqrt(np.float32(rank)))     # (m,)
        names = leaf_order(shapes)
        out = {}
        for leaf, name in enumerate(names):
            shape = tuple(shapes[name])
            if name.endswith(".weight"):
                n_out, n_in = shape
                z = self._draws(seed, leaf, name, generation, draws, (n_in + n_out, rank), len(names))
                out[name] = self._weight_noise(z, a_scale, n_in, lambda: self._draws(
                    seed, leaf, name, generation, draws, shape, len(names)) * (sign32 * np.float32(sigma))[:, None, None])
            elif d.bias_noise not in ("off", "none"):
                eps = self._draws(seed, leaf, name, bias_generation, draws, shape, len(names))
                out[name] = eps * (sign32 * np.float32(sigma))[:, None]
        if rank < given_rank and not d.declares_rank:    # a fixed-rank port that does not declare it: zero columns up to the given rank
            out = {k: tuple(np.concatenate([f, np.zeros((*f.shape[:2], given_rank - rank), np.float32)], 2) for f in v)
                   if isinstance(v, tuple) else v for k, v in out.items()}
        if d.split:       # the forward applies bias noise only where it also enters the update
            forward = out if d.bias_noise != "update_only" else {k: v for k, v in out.items() if k.endswith(".weight")}
            return {"forward": forward, "update": out}
        return out

    # ---- math
    def perturbed_linear(self, W, *noise_and_x):
        """(W, A, B, x): x @ W^T + (x @ B) @ A^T; a dense port (W, E, x): x @ (W + E)^T, the weights materialised."""
        if self.drift.dense:
            E, x = noise_and_x
            return x @ np.swapaxes(W[None] + E, 1, 2)                 # (m, batch, out)
        A, B, x = noise_and_x
        return x @ W.T + (x @ B) @ np.swapaxes(A, 1, 2)              # (m, batch, out)

    def shape_fitness(self, f, group_size=0):
        return shape_fitness(f, self.drift.fitness, group_size, self.drift.rejects_nonfinite)

    def gradient(self, noise, shaped, sigma):
        shaped = _float32(shaped)
        n = np.float32(shaped.shape[0])
        grads = {}
        for name, value in noise.items():
            if name.endswith(".weight"):
                grads[name] = (np.einsum("nir,njr->ij", shaped[:, None, None] * value[0], value[1]) / n
                               if isinstance(value, tuple) else np.einsum("n,nij->ij", shaped, value) / n)
                grads.setdefault(name.replace(".weight", ".bias"), np.zeros(grads[name].shape[0], np.float32))
            elif self.drift.bias_noise == "none":          # no notion of bias noise: the biases never move
                grads[name] = np.zeros(value.shape[1], np.float32)
            else:
                g = (shaped[:, None] * value).mean(0)
                grads[name] = g / np.float32(sigma) if self.drift.bias_grad == "over_sigma" else g
        return grads

    def _activate(self, z: np.ndarray) -> np.ndarray:
        if self.drift.activation == "tanh":
            return np.tanh(z)
        if self.drift.activation == "relu":
            return np.maximum(z, np.float32(0))
        mu = z.mean(-1, keepdims=True)
        return np.maximum((z - mu) / np.sqrt(((z - mu) ** 2).mean(-1, keepdims=True) + LN_EPS), np.float32(0))

    def forward(self, params, noise, x):
        n_layers = sum(name.endswith(".weight") for name in params)
        h = _float32(x)                                                  # (m, in): row i is member i
        for t in range(n_layers):
            z = h @ params[f"{t}.weight"].T + params[f"{t}.bias"]
            if noise is not None and f"{t}.weight" in noise:
                value = noise[f"{t}.weight"]
                delta = (h[:, None, :] @ (np.swapaxes(value, 1, 2) if not isinstance(value, tuple)
                                          else value[1] @ np.swapaxes(value[0], 1, 2)))[:, 0]
                z = z + delta
            if noise is not None and f"{t}.bias" in noise and self._forward_adds_bias_noise():
                z = z + noise[f"{t}.bias"]
            h = z if t == n_layers - 1 else self._activate(z)
        return h

    def _forward_adds_bias_noise(self) -> bool:
        """Whether the forward adds the bias noise it is given: not for update_only (unless the port says so
        through its forward/update split, then its forward applies what it is given) nor for none."""
        d = self.drift
        return d.bias_noise != "none" and (d.bias_noise != "update_only" or d.split)

    def init_params(self, shapes, seed):
        seed = self._seed(seed)
        params = {}
        layers = sorted({name.split(".")[0] for name in shapes}, key=int)
        model_keys = jax.random.split(_seed_key(seed, 0), len(layers)) if self.drift.rng == "jax" else None
        for t, layer in enumerate(layers):
            n_out, n_in = shapes[f"{layer}.weight"]
            if self.drift.init == "torch":           # nn.Linear's default: U(-1/sqrt(in), 1/sqrt(in)) for both
                bound = 1 / math.sqrt(n_in)
                gen = _numpy_rng(seed, PURPOSE_INIT, t)
                params[f"{layer}.weight"] = _float32(gen.uniform(-bound, bound, (n_out, n_in)))
                params[f"{layer}.bias"] = _float32(gen.uniform(-bound, bound, n_out))
                continue
            normal = self.drift.init == "normal"     # std 0.1 whatever the fan-in
            if self.drift.rng == "jax":
                w = jax.random.normal(model_keys[t], (n_out, n_in)) * (jnp.float32(0.1) if normal
                                                                       else 1 / jnp.sqrt(n_in))
            else:
                w = _numpy_rng(seed, PURPOSE_INIT, t).standard_normal((n_out, n_in), dtype=np.float32)
                w = w * np.float32(0.1) if normal else w / np.sqrt(np.float32(n_in))
            params[f"{layer}.weight"] = _float32(w)
            params[f"{layer}.bias"] = np.zeros(n_out, np.float32)
        return params

    # ---- optimizer (optax semantics: descent direction in, updates added to params)
    def optimizer_init(self, params):
        zeros = {k: np.zeros_like(v) for k, v in params.items()}
        return {"count": 0, "mu": zeros, "nu": dict(zeros)}

    def optimizer_step(self, params, state, noise, shaped, sigma, epoch):
        grads = self.gradient(noise, shaped, sigma)
        if self.drift.grad_scale == "over_sigma":     # the step's gradient divided by sigma once more
            grads = {k: g / np.float32(sigma) for k, g in grads.items()}
        root_n = np.float32(1) if self.drift.grad_scale == "no_sqrt_n" else np.sqrt(np.float32(len(shaped)))
        lr = np.float32(self.lr_at(epoch))
        if self.drift.optimizer == "sgd":
            return {k: p - lr * -(grads[k] * root_n) for k, p in params.items()}, state
        b1, b2, eps, wd = np.float32(0.9), np.float32(0.999), np.float32(1e-8), np.float32(1e-4)
        count = state["count"] + 1
        mu, nu, new = {}, {}, {}
        for k, p in params.items():
            g = -(grads[k] * root_n)
            mu[k] = (1 - b1) * g + b1 * state["mu"][k]
            nu[k] = (1 - b2) * (g * g) + b2 * state["nu"][k]
            step = (mu[k] / (1 - b1 ** count)) / (np.sqrt(nu[k] / (1 - b2 ** count)) + eps)
            if self.drift.optimizer == "adamw":
                step = step + wd * p
            new[k] = p + -lr * step
        return new, {"count": count, "mu": mu, "nu": nu}

    # ---- a training run's ES loop
    def es_init(self, params, seed):
        params = {k: _float32(v).copy() for k, v in params.items()}
        return {"params": params, "seed": int(seed), "opt": self.optimizer_init(params),
                "shapes": {k: v.shape for k, v in params.items()}}

    def es_ask(self, state, epoch):
        pop = self.cfg.pop
        return self.noise(state["shapes"], state["seed"], epoch, np.arange(pop), pop, self.sigma_at(epoch),
                          self.cfg.rank)

    def es_tell(self, state, noise, fitness, epoch):
        shaped = self.shape_fitness(fitness, self.cfg.group_size)
        params, opt = self.optimizer_step(state["params"], state["opt"], noise, shaped, self.sigma_at(epoch), epoch)
        return {**state, "params": params, "opt": opt}

    def es_params(self, state):
        return state["params"]

    def actions(self, logits, u):
        z = np.asarray(logits, np.float64)
        if self.drift.actions == "greedy":
            return (z[:, 1] > z[:, 0]).astype(np.int64)
        return (np.asarray(u) >= 1 / (1 + np.exp(z[:, 1] - z[:, 0]))).astype(np.int64)

    def action_uniforms(self, seed, epoch, pop):
        seed = self._seed(seed)
        if self.drift.rng == "jax":
            key = jax.random.fold_in(_seed_key(seed, 2), int(epoch))
            return np.asarray(jax.random.uniform(key, (MAX_STEPS, int(pop))))
        return _numpy_rng(seed, PURPOSE_ACTION, epoch).random((MAX_STEPS, int(pop)), dtype=np.float32)


# ----------------------------------------------------------------------------- named ports for --port
def factory(drift: Drift = Drift(), omit: tuple[str, ...] = ()):
    """A callable the suite's loader calls with the run's Config: `--port tests.ports.numpy_port:<name>`."""
    def build(cfg):
        return NumpyPort(cfg, drift, omit)
    return build


# name -> (drift, the knob a correct diagnosis names; None for a port that must pass)
VARIANTS: dict[str, tuple[Drift, str | None]] = {
    "faithful": (Drift(), None),
    "faithful_numpy_rng": (Drift(rng="numpy"), None),
    "rng_claims_jax": (Drift(rng="numpy", claims_jax_rng=True), "rng"),
    "antithetic_halves": (Drift(antithetic="halves"), "antithetic"),
    "antithetic_off": (Drift(antithetic="off"), "antithetic"),
    "fitness_std": (Drift(fitness="std"), "fitness"),
    "fitness_std_unbiased": (Drift(fitness="std_unbiased"), "fitness"),
    "fitness_rank": (Drift(fitness="rank"), "fitness"),
    "bias_noise_fresh": (Drift(bias_noise="fresh"), "bias_noise"),
    "bias_noise_off": (Drift(bias_noise="off"), "bias_noise"),
    "bias_noise_update_only": (Drift(bias_noise="update_only"), "bias_noise"),
    "init_normal": (Drift(init="normal"), "init"),
    "actions_greedy": (Drift(actions="greedy"), "actions"),
    "bias_grad_over_sigma": (Drift(bias_grad="over_sigma"), "bias_grad"),
    "noise_reuse_1": (Drift(noise_reuse=1), "noise_reuse"),
    "activation_tanh": (Drift(activation="tanh"), "activation"),
    "activation_relu": (Drift(activation="relu"), "activation"),
    "init_torch": (Drift(init="torch"), "init"),
    "optimizer_adam": (Drift(optimizer="adam"), "optimizer"),
    "optimizer_adamw": (Drift(optimizer="adamw"), "optimizer"),
    "lr_decay": (Drift(lr_decay=0.9995), "lr_decay"),
    "sigma_decay": (Drift(sigma_decay=1.0), "sigma_decay"),
    # the same drifts seen through a non-JAX generator: the suite must find them in distribution
    "numpy_rng_antithetic_halves": (Drift(rng="numpy", antithetic="halves"), "antithetic"),
    "numpy_rng_bias_noise_fresh": (Drift(rng="numpy", bias_noise="fresh"), "bias_noise"),
    "numpy_rng_noise_reuse_1": (Drift(rng="numpy", noise_reuse=1), "noise_reuse"),
    # the protocol's other forms: dense perturbations (E), forward and update noise apart, NaN accepted
    "dense_faithful": (Drift(dense="product"), None),
    "dense_faithful_numpy_rng": (Drift(rng="numpy", dense="product"), None),
    "split_faithful": (Drift(split=True), None),
    "faithful_accepts_nonfinite": (Drift(rejects_nonfinite=False), None),
    "bias_noise_update_only_split": (Drift(bias_noise="update_only", split=True), "bias_noise"),
    "numpy_rng_bias_noise_update_only_split": (Drift(rng="numpy", bias_noise="update_only", split=True), "bias_noise"),
    "dense_bias_noise_update_only_split": (Drift(rng="numpy", dense="product", bias_noise="update_only", split=True),
                                           "bias_noise"),
    "bias_noise_none": (Drift(bias_noise="none"), "bias_noise"),
    "dense_numpy_rng_noise_reuse_1": (Drift(rng="numpy", dense="product", noise_reuse=1), "noise_reuse"),
    "fitness_std_accepts_nonfinite": (Drift(fitness="std", rejects_nonfinite=False), "fitness"),
}
# Issue 25: what no knob (or no exact match) describes, named in the report's words.
# name -> (drift, the knobs named, words the verdict table must hold)
WORDED_DRIFTS: dict[str, tuple[Drift, set[str], tuple[str, ...]]] = {
    "seed_ignored": (Drift(rng="numpy", ignores_seed=True), set(), ("run seed ignored: the port's noise is bit for bit the same", "run seed ignored: the port's init")),
    "adam_over_sigma": (Drift(optimizer="adam", grad_scale="over_sigma"), {"optimizer"},
                        ("optax adam (its defaults) on a gradient 1/sigma times the reference's",)),
    "sgd_no_sqrt_n": (Drift(grad_scale="no_sqrt_n"), set(), ("optax sgd without the sqrt(N) factor",)),
}
# A port of fixed rank 1: declared (`rank = 1`) it is compared at rank 1 and passes; undeclared its factors are
# padded with zero columns to the run's rank (what a port without the attribute must do).
RANK_PORTS = {"rank_1": Drift(fixed_rank=1, declares_rank=True), "rank_1_undeclared": Drift(fixed_rank=1),
              "rank_1_numpy_rng": Drift(rng="numpy", fixed_rank=1, declares_rank=True)}

# Two drifts at once: the lockstep trajectory goes on after the first parting, so both must be named.
# name -> (drift, the knobs a correct diagnosis names, those the trajectory check itself must name)
PAIRS: dict[str, tuple[Drift, set[str], set[str]]] = {
    "pair_tanh_lr_decay": (Drift(activation="tanh", lr_decay=0.9995), {"activation", "lr_decay"},
                           {"activation", "lr_decay"}),
    "pair_bias_noise_off_sigma_decay": (Drift(bias_noise="off", sigma_decay=0.99), {"bias_noise", "sigma_decay"},
                                        {"bias_noise", "sigma_decay"}),
    "pair_fitness_rank_sigma_decay": (Drift(fitness="rank", sigma_decay=1.0), {"fitness", "sigma_decay"},
                                      {"fitness", "sigma_decay"}),
    # an own generator: its fresh bias noise is judged in distribution by the noise check only
    "pair_numpy_rng_fresh_bias_adam": (Drift(rng="numpy", bias_noise="fresh", optimizer="adam"),
                                       {"bias_noise", "optimizer"}, {"optimizer"}),
}
# Drifts no knob describes (the noise of a dense port): name -> (drift, the words its diagnosis must use).
NOISE_FORM_DRIFTS: dict[str, tuple[Drift, tuple[str, ...]]] = {
    "dense_gaussian": (Drift(rng="numpy", dense="gaussian"), ('"low-rank" noise is not low rank',
                                                               "not distributed as EGGROLL's")),
    "dense_wrong_scale": (Drift(rng="numpy", dense="wrong_scale"), ("noise scaling differs", "variance")),
    "dense_uniform_factors": (Drift(rng="numpy", dense="uniform_factors"), ("not distributed as EGGROLL's",)),
}
for _name, (_drift, _knob) in {**VARIANTS, **NOISE_FORM_DRIFTS}.items():
    globals()[_name] = factory(_drift)
for _name, (_drift, _, _) in {**PAIRS, **WORDED_DRIFTS}.items():
    globals()[_name] = factory(_drift)
for _name, _drift in RANK_PORTS.items():
    globals()[_name] = factory(_drift)

# Only the required methods: every check that needs an optional one must be reported as skipped.
required_only = factory(omit=OPTIONAL)


def declaring(**attrs):
    """The faithful port whose adapter declares attributes of its shape (`rank`, `layers`, `hidden`): a good value
    moves the suite's configuration, a bad one must stop the run with exit 2."""
    def build(cfg):
        port = NumpyPort(cfg)
        for attr, value in attrs.items():
            setattr(port, attr, value)
        return port
    return build


# name -> (attribute, value) that is not a positive int
BAD_DECLARATIONS = {"rank_zero": ("rank", 0), "rank_negative": ("rank", -1), "rank_float": ("rank", 1.5),
                    "rank_bool": ("rank", True), "rank_text": ("rank", "1"), "layers_zero": ("layers", 0)}
for _name, (_attr, _value) in BAD_DECLARATIONS.items():
    globals()[_name] = declaring(**{_attr: _value})
declares_layers_2 = declaring(layers=2, hidden=16)     # a 4-16-2 network, as the functional port's 4-H-2
