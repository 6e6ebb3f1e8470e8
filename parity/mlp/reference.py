"""The JAX reference as the parity suite sees it: `jax_reference` behind the port adapter protocol.

Noise is drawn with the noiser's own key (`noiser.member_key`) and `jax.random.normal`, vmapped over
members and padded to a few compiled sizes for speed, then scaled by sigma/sqrt(r) and the member's sign in
float32 as the noiser's eager code does (tests/parity/mlp/test_reference.py checks it bit for bit against
`population_noise`, the noiser's own `lowrank_factors` / `fullrank_noise`). Forwards run the reference
`MLP` with `population.CachedNoise`, the noiser whose key slot carries given factors (EggRoll's `do_mm`
expression, fed shared noise); the ES epoch (`es_tell`) is the real `EggRoll.convert_fitnesses` +
`EggRoll.do_updates`. The reference run is configured by `RunSettings` (activation, noise_reuse,
optimizer, lr_decay, sigma_decay); `with_run_knobs` builds the candidates the diagnosis compares a port with.
"""
from __future__ import annotations

import functools
from functools import lru_cache
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax

from jax_reference import emulation
from jax_reference.models import MLP, MM_PARAM, PARAM, simple_es_tree_key
from jax_reference.noiser import EggRoll, factor_grad, lowrank_sigma, member_key, noise_grad, solver_input
from jax_reference.platform import normals_available, resolve, scope
from jax_reference.population import CachedNoise, flat_to_params, params_to_flat
from jax_reference.train import SOLVERS
from rollout.cartpole import MAX_STEPS
from rollout.episodes import sample_actions
from spec.config import Config, schedule
from spec.jax_rng import size_bucket
from spec.knobs import RunSettings
from spec.platform import ReferencePlatform


def backend_info(platform: ReferencePlatform | None = None) -> dict:
    """Where the reference runs, for a bundle's manifest: JAX's backend and the host CPU, the matmul precision, and
    the platform's fields (spec.platform; `check --against` reads them back)."""
    from reporting import cpu_name

    platform = platform or resolve()
    return {"device": f"JAX reference on {platform.backend}; host CPU {cpu_name()}",
            "matmul_precision": platform.precision_words(), "platform": platform.fields()}


def on_platform(cls):
    """Every public method of cls runs inside jax_reference.platform.scope(self.platform): the reference's calls
    only, so nothing leaks into the torch side or the suite's own numpy."""
    def scoped(fn):
        @functools.wraps(fn)
        def call(self, *args, **kwargs):
            with scope(self.platform):
                return fn(self, *args, **kwargs)
        return call

    for name, fn in list(vars(cls).items()):
        if callable(fn) and not name.startswith("_") and not isinstance(fn, (staticmethod, classmethod, type)):
            setattr(cls, name, scoped(fn))
    return cls


def _round32(x: float) -> float:
    return float(np.float32(x))


def _signature(shapes) -> tuple:
    return tuple((name, tuple(int(d) for d in shape)) for name, shape in sorted(shapes.items()))


def _zeros_tree(signature: tuple) -> dict:
    return flat_to_params({name: np.zeros(shape, np.float32) for name, shape in signature})


def _maps(tree: dict) -> tuple[dict, dict]:
    """(scan_map, es_map) for an MLP-shaped tree: weights are MM leaves, biases plain leaves; nothing scanned."""
    scan_map = jax.tree_util.tree_map_with_path(lambda p, _: (), tree)
    es_map = jax.tree_util.tree_map_with_path(lambda p, _: MM_PARAM if str(p[-1].key) == "weight" else PARAM, tree)
    return scan_map, es_map


@lru_cache(maxsize=64)
def _key_tree(signature: tuple, seed: int):
    """DESIGN.md's es_tree_key for a run seed: simple_es_tree_key(params, split(key(seed), 3)[1], scan_map)."""
    tree = _zeros_tree(signature)
    scan_map, _ = _maps(tree)
    es_key = jax.random.split(jax.random.key(seed), 3)[1]
    return simple_es_tree_key(tree, es_key, scan_map)


CHUNKS = (32, 512)   # members per compiled draw: small calls pad to 32, larger ones go in chunks of 512


@lru_cache(maxsize=32)
def _draw_fn(noise_reuse: int, length: int):
    """Jitted (base keys (leaves,), epoch, thread ids (m,)) -> normals (leaves, m, length) float32.

    Member t of leaf k draws normal(member_key(k, noise_reuse, (epoch, t)), shape): the noiser's key
    (noiser.member_key) and jax.random.normal. JAX's threefry draws depend only on the flat index, so
    the first prod(shape) values of a (length,) draw are the draw for `shape`; the +-sigma scaling is
    applied outside (in float32, as the noiser's eager code does: a jitted fusion may round it differently).
    """
    def one(key, epoch, thread_id):
        return emulation.normal(member_key(key, noise_reuse, (epoch, thread_id)), (length,), jnp.float32)

    over_members = jax.vmap(one, in_axes=(None, None, 0))
    return jax.jit(jax.vmap(over_members, in_axes=(0, None, None)))


@lru_cache(maxsize=64)
def _base_keys(signature: tuple, seed: int):
    """The leaves' base keys stacked in the order of `signature`, then the first repeated up to
    size_bucket(leaves): one compiled draw serves every depth (the extra rows are drawn and dropped)."""
    keys = _key_tree(signature, seed)
    stacked = jnp.stack([keys[name.split(".")[0]][name.split(".")[1]] for name, _ in signature])
    return jnp.concatenate([stacked, jnp.broadcast_to(stacked[:1], (size_bucket(len(signature)) - len(signature),))])


@lru_cache(maxsize=64)
def _rejection(platform, do_updates, signature: tuple, sigma: float, lr: float, rank: int, dtype: str, shape: tuple,
               data: bytes):
    """ReferencePort.rejects_nonfinite's answer for one fitness vector (given as dtype, shape and bytes): the
    reference's do_updates (EggRoll's, or whatever replaces it) run for real, eagerly, on the platform whose scope
    calls it, once per process for the same inputs (each check asks three times, the checks of one seed alike)."""
    tree = _zeros_tree(signature)
    _, es_map = _maps(tree)
    frozen, nparams = EggRoll.init_noiser(tree, sigma, lr, rank=rank)
    f = np.frombuffer(data, dtype=dtype).reshape(shape)
    iterinfos = (jnp.zeros(shape[0], jnp.int32), jnp.arange(shape[0], dtype=jnp.int32))
    try:
        do_updates(frozen, nparams, tree, _key_tree(signature, 0), jnp.asarray(f), iterinfos, es_map)
    except Exception as err:   # validation, had the reference any
        return f"{type(err).__name__}: {err}"
    return None


@lru_cache(maxsize=64)
def _a_scale(sigma: float, rank: int) -> np.float32:
    """sigma / sqrt(r) exactly as the noiser computes it (noiser.lowrank_sigma)."""
    return np.float32(lowrank_sigma({"sigma": sigma}, {"rank": rank}))


@lru_cache(maxsize=16)
def _forward_fn(activation: str, noisy: bool):
    frozen_params = {"activation": activation}

    if not noisy:
        @jax.jit
        def plain(params, x):
            return MLP.forward(EggRoll, {}, {}, frozen_params, params, params, None, x)
        return plain

    def one(params, factors, x):
        return MLP.forward(CachedNoise, {}, {}, frozen_params, params, factors, (0, 0), x)

    return jax.jit(jax.vmap(one, in_axes=(None, 0, 0)))


@jax.jit
def _linear(W, A, B, x):
    """Every member's EggRoll.do_mm on its own batch, factors given: x (m, batch, in) -> (m, batch, out)."""
    return jax.vmap(lambda a, b, xm: CachedNoise.do_mm({}, {}, W, (a, b), (0, 0), xm))(A, B, x)


@jax.jit
def _grads(noise: dict, shaped):
    """The noiser's gradient expressions on given noise: factor_grad for (A, B), noise_grad for biases."""
    return {name: factor_grad(*value, shaped) if isinstance(value, tuple) else noise_grad(value, shaped)
            for name, value in noise.items()}


def _nest(noise: dict, signature: tuple) -> dict:
    """Protocol noise -> the {layer: {"weight": (A, B), "bias": eps or None}} tree CachedNoise reads."""
    tree: dict = {}
    for name, _ in signature:
        layer, leaf = name.split(".")
        value = noise.get(name)
        tree.setdefault(layer, {})[leaf] = None if value is None else (
            tuple(jnp.asarray(v) for v in value) if isinstance(value, tuple) else jnp.asarray(value))
    return tree


def _with_lr(opt_state, lr: float):
    """An inject_hyperparams state with this epoch's learning rate (a new state; the old one is untouched)."""
    return opt_state._replace(hyperparams={**opt_state.hyperparams, "learning_rate": jnp.asarray(lr, jnp.float32)})


def _np(tree) -> Any:
    return jax.tree.map(lambda v: np.asarray(v), tree)


@on_platform
class ReferencePort:
    """jax_reference behind the adapter protocol (numpy float32 in and out), on `platform` (default: where JAX
    runs, at its default precision; spec.platform.ReferencePlatform)."""

    jax_compatible_rng = True

    def __init__(self, cfg: Config, run: RunSettings | None = None, platform: ReferencePlatform | None = None):
        self.cfg = cfg
        self.run = run or RunSettings()
        self.platform = platform or resolve()
        self.name = "jax_reference"

    def with_run_knobs(self, **changes) -> "ReferencePort":
        """The reference with other run knobs (optimizer, lr_decay, ...): a candidate for the diagnosis."""
        return ReferencePort(self.cfg, self.run.replace(**changes), self.platform)

    def on_other_normals(self) -> "ReferencePort | None":
        """The same reference drawing the other backend's normals (CPU for a GPU reference and back), or None where
        that table is not at hand: what a port on the wrong backend's normals equals (the noise and init checks)."""
        other = "cpu" if self.platform.normals == "gpu" else "gpu"
        if not normals_available(self.platform.replace(normals=other)):
            return None
        return ReferencePort(self.cfg, self.run, self.platform.replace(normals=other))

    # ---- schedules
    def sigma_at(self, epoch: int) -> float:
        return _round32(schedule(self.cfg.sigma, self.run.sigma_decay, epoch))

    def lr_at(self, epoch: int) -> float:
        return _round32(schedule(self.cfg.lr, self.run.lr_decay, epoch))

    # ---- required
    def noise(self, shapes, seed, epoch, members, pop, sigma, rank) -> dict:
        """The noiser's factors: Z = normal(member key, (in + out, r)), B = Z[:in], A = Z[in:] * (+-sigma/sqrt(r))."""
        sig = _signature(shapes)
        members = np.asarray(members, dtype=np.int64)
        m, rank = members.size, int(rank)
        length = max((shape[0] + shape[1]) * rank if len(shape) == 2 else shape[0] for _, shape in sig)
        chunk = CHUNKS[0] if m <= CHUNKS[0] else CHUNKS[1]
        draw, keys = _draw_fn(self.run.noise_reuse, size_bucket(length)), _base_keys(sig, int(seed))
        parts = []
        for start in range(0, m, chunk):
            padded = np.zeros(chunk, np.int32)
            part = members[start:start + chunk]
            padded[:part.size] = part
            parts.append(np.asarray(draw(keys, jnp.int32(epoch), jnp.asarray(padded)))[:len(sig), :part.size])
        z = np.concatenate(parts, axis=1)                                              # (leaves, m, length)
        sign = np.where(members % 2 == 0, np.float32(1), np.float32(-1))             # signed_sigma's sign
        out: dict = {}
        for leaf, (name, shape) in enumerate(sig):
            if name.endswith(".weight"):
                n_out, n_in = shape
                zz = z[leaf, :, :(n_in + n_out) * rank].reshape(m, n_in + n_out, rank)
                scale = (sign * _a_scale(float(sigma), rank)).astype(np.float32)
                out[name] = (zz[:, n_in:] * scale[:, None, None], np.ascontiguousarray(zz[:, :n_in]))
            else:
                scale = (sign * np.float32(sigma)).astype(np.float32)
                out[name] = z[leaf, :, :shape[0]] * scale[:, None]
        return out

    def perturbed_linear(self, W, A, B, x):
        return np.asarray(_linear(W, A, B, x))

    def shape_fitness(self, f, group_size=0):
        return np.asarray(EggRoll.convert_fitnesses({"group_size": int(group_size)}, {}, jnp.asarray(f)))

    def gradient(self, noise, shaped, sigma):
        grads = _np(_grads({k: (tuple(v) if isinstance(v, tuple) else v) for k, v in noise.items()},
                           jnp.asarray(shaped)))
        for name, value in noise.items():     # leaves without noise get zeros
            if name.endswith(".weight"):
                bias = name.replace(".weight", ".bias")
                grads.setdefault(bias, np.zeros(value[0].shape[1], np.float32))
        return grads

    def rejects_nonfinite(self, noise: dict, f: np.ndarray, shapes) -> str | None:
        """The error text EggRoll.do_updates raises for this fitness vector, or None if it accepts it.

        Run for real, so the suite reports what the reference does: like upstream EggRoll, which validates
        no fitness, it accepts NaN and inf (None); the built-in trainers reject them before the update.
        """
        f = np.asarray(f)
        return _rejection(self.platform, EggRoll.do_updates, _signature(shapes), float(self.cfg.sigma),
                          float(self.cfg.lr), int(self.cfg.rank), f.dtype.str, f.shape, f.tobytes())

    # ---- optional
    def forward(self, params, noise, x):
        tree, nested = self._device_inputs(params, noise)
        if noise is None:
            return np.asarray(_forward_fn(self.run.activation, False)(tree, jnp.asarray(x)))
        return np.asarray(_forward_fn(self.run.activation, True)(tree, nested, jnp.asarray(x)))

    def _device_inputs(self, params, noise):
        """params and noise as JAX trees, converted once per (params, noise) pair (a rollout calls forward per step)."""
        cached = getattr(self, "_inputs", None)
        if cached is not None and cached[0] is params and cached[1] is noise:
            return cached[2], cached[3]
        sig = _signature({k: v.shape for k, v in params.items()})
        tree = flat_to_params(params)
        nested = None if noise is None else _nest(noise, sig)
        self._inputs = (params, noise, tree, nested)     # holds params and noise, so identity stays meaningful
        return tree, nested

    def init_params(self, shapes, seed):
        sig = _signature(shapes)
        n_layers = sum(name.endswith(".weight") for name, _ in sig)
        dims = [dict(sig)[f"{t}.weight"] for t in range(n_layers)]            # (out, in)
        model_key = jax.random.split(jax.random.key(int(seed)), 3)[0]
        init = MLP.rand_init(model_key, dims[0][1], dims[-1][0], [d[0] for d in dims[:-1]], True,
                             self.run.activation, jnp.float32)
        return {k: np.asarray(v) for k, v in params_to_flat(init.params).items()}

    def _solver(self):
        return optax.inject_hyperparams(SOLVERS[self.run.optimizer])(learning_rate=self.cfg.lr)

    def optimizer_init(self, params):
        return self._solver().init(flat_to_params(params))

    def optimizer_step(self, params, state, noise, shaped, sigma, epoch):
        return self.optimizer_apply(params, state, self.gradient(noise, shaped, sigma), shaped.shape[0], epoch)

    def optimizer_apply(self, params, state, grads, n, epoch):
        """The noiser's solver step on a given gradient g (ascent, before sqrt(N)): -(g sqrt(N)) to optax at lr_e."""
        tree = flat_to_params(params)
        direction = flat_to_params({k: np.asarray(solver_input(jnp.asarray(g), n, jnp.float32))
                                    for k, g in grads.items()})
        state = _with_lr(state, self.lr_at(epoch))
        updates, state = self._solver().update(direction, state, tree)
        return {k: np.asarray(v) for k, v in params_to_flat(optax.apply_updates(tree, updates)).items()}, state

    # ---- the ES loop, the reference's own path (convert_fitnesses + do_updates)
    def es_init(self, params, seed):
        tree = flat_to_params(params)
        sig = _signature({k: v.shape for k, v in params.items()})
        _, es_map = _maps(tree)
        frozen, nparams = EggRoll.init_noiser(tree, self.cfg.sigma, self.cfg.lr, noise_reuse=self.run.noise_reuse,
                                              rank=self.cfg.rank, group_size=self.cfg.group_size,
                                              solver=optax.inject_hyperparams(SOLVERS[self.run.optimizer]))
        return {"tree": tree, "sig": sig, "frozen": frozen, "nparams": nparams, "es_map": es_map,
                "keys": _key_tree(sig, int(seed)), "seed": int(seed)}

    def es_ask(self, state, epoch):
        shapes = dict(state["sig"])
        return self.noise(shapes, state["seed"], epoch, np.arange(self.cfg.pop), self.cfg.pop,
                          self.sigma_at(epoch), self.cfg.rank)

    def es_tell(self, state, noise, fitness, epoch):
        nparams = dict(state["nparams"])
        nparams["sigma"] = jnp.float32(self.sigma_at(epoch))
        nparams["opt_state"] = _with_lr(nparams["opt_state"], self.lr_at(epoch))
        shaped = EggRoll.convert_fitnesses(state["frozen"], nparams, jnp.asarray(fitness))
        n = shaped.shape[0]
        iterinfos = (jnp.full((n,), epoch, jnp.int32), jnp.arange(n, dtype=jnp.int32))
        nparams, tree = EggRoll.do_updates(state["frozen"], nparams, state["tree"], state["keys"], shaped,
                                           iterinfos, state["es_map"])
        return {**state, "tree": tree, "nparams": nparams}

    def es_params(self, state):
        return {k: np.asarray(v) for k, v in params_to_flat(state["tree"]).items()}

    def actions(self, logits, u):
        return sample_actions(logits, u)

    def action_uniforms(self, seed, epoch, pop):
        action_key = jax.random.split(jax.random.key(int(seed)), 3)[2]
        return np.asarray(jax.random.uniform(jax.random.fold_in(action_key, int(epoch)), (MAX_STEPS, int(pop))))
