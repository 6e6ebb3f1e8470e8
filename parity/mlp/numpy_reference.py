"""The JAX reference's math in numpy float32, for the calls a replay must answer on the port's own outputs.

A bundle holds the reference's answers to the suite's own inputs; where the reference responds to what the port
computed (its optimizer applied to the port's gradient from the port's parameters, a forward with another
activation) no recorded answer can exist, so `NumpyReference` computes it: the same expressions as
jax_reference (EggRoll.convert_fitnesses, do_mm, factor_grad / noise_grad, solver_input, optax sgd / adam / adamw
at optax's defaults), in float32; the reference's draws (noise, init, action uniforms) come from
parity.core.numpy_random, JAX's generator in numpy, bit for bit. Tested equal to the JAX reference within the float32
bounds of parity.core.tolerances, the draws exactly (tests/parity/mlp/test_numpy_reference.py).
"""
from __future__ import annotations

from typing import NamedTuple

import numpy as np

from parity.core import numpy_random as nr
# optax's optimizers in numpy (OPTIMIZERS: the ones this reference runs, part of its surface)
from parity.core.optimizers import OPTIMIZERS, OptState, optimizer_apply, optimizer_init  # noqa: F401
from rollout.cartpole import MAX_STEPS
from rollout.episodes import sample_actions
from spec.config import Config, schedule
from spec.knobs import RunSettings

F32 = np.float32
LN_EPS = F32(1e-5)          # the layer norm's and the fitness shaping's epsilon (jax_reference)


def _sigmoid(z: np.ndarray) -> np.ndarray:
    return (F32(1) / (F32(1) + np.exp(-z))).astype(F32)


def layer_norm(x: np.ndarray) -> np.ndarray:
    """Parameter-free layer norm over the last axis (population variance), as jax_reference.models.layer_norm."""
    mean = x.mean(-1, keepdims=True, dtype=F32)
    var = np.square(x - mean).mean(-1, keepdims=True, dtype=F32)
    return ((x - mean) / np.sqrt(var + LN_EPS)).astype(F32)


ACTIVATIONS = {
    "relu": lambda z: np.maximum(z, F32(0)),
    "silu": lambda z: (z * _sigmoid(z)).astype(F32),
    "pqn": lambda z: np.maximum(layer_norm(z), F32(0)),
    "tanh": lambda z: np.tanh(z).astype(F32),
}


def shape_fitness(f: np.ndarray, group_size: int = 0) -> np.ndarray:
    """(f - mean) / sqrt(var + 1e-5), population variance; with groups, group means but the global variance."""
    f = np.asarray(f, F32)
    scale = np.sqrt(f.var(dtype=F32) + LN_EPS).astype(F32)
    if not group_size:
        return ((f - f.mean(dtype=F32)) / scale).astype(F32)
    if f.size % group_size:
        raise ValueError(f"population {f.size} is not a multiple of group_size {group_size}")
    groups = f.reshape(-1, group_size)
    return ((groups - groups.mean(-1, keepdims=True, dtype=F32)) / scale).astype(F32).ravel()


def perturbed_linear(W: np.ndarray, A: np.ndarray, B: np.ndarray, x: np.ndarray) -> np.ndarray:
    """Each member's do_mm on its own batch: x @ W^T + (x @ B) @ A^T, x (m, batch, in) -> (m, batch, out)."""
    x = np.asarray(x, F32)
    return (x @ np.asarray(W, F32).T + (x @ np.asarray(B, F32)) @ np.swapaxes(np.asarray(A, F32), 1, 2)).astype(F32)


def forward(params: dict, noise: dict | None, x: np.ndarray, activation: str) -> np.ndarray:
    """The reference MLP: member i's row of x through W + A_i B_i^T (+ b + eps_i), `activation` between layers."""
    if activation not in ACTIVATIONS:
        raise ValueError(f"unknown activation {activation!r}; known: {', '.join(ACTIVATIONS)}")
    n_layers = sum(name.endswith(".weight") for name in params)
    h = np.asarray(x, F32)
    for t in range(n_layers):
        W, b = np.asarray(params[f"{t}.weight"], F32), np.asarray(params[f"{t}.bias"], F32)
        value = None if noise is None else noise.get(f"{t}.weight")
        z = h @ W.T
        if value is not None:
            A, B = (np.asarray(v, F32) for v in value)
            z = z + np.einsum("mr,mor->mo", np.einsum("mi,mir->mr", h, B), A)
        z = z + b
        if noise is not None and f"{t}.bias" in noise:
            z = z + np.asarray(noise[f"{t}.bias"], F32)
        h = ACTIVATIONS[activation](z.astype(F32)) if t < n_layers - 1 else z.astype(F32)
    return h


def gradient(noise: dict, shaped: np.ndarray) -> dict[str, np.ndarray]:
    """factor_grad for weights (einsum('nir,njr->ij', f A, B) / N), noise_grad for biases (mean f eps); zeros for
    a weight's bias that has no noise."""
    f = np.asarray(shaped, F32)
    n = F32(f.shape[0])
    out = {}
    for name, value in noise.items():
        if isinstance(value, tuple):
            A, B = (np.asarray(v, F32) for v in value)
            out[name] = (np.einsum("nir,njr->ij", f[:, None, None] * A, B) / n).astype(F32)
            out.setdefault(name.replace(".weight", ".bias"), np.zeros(A.shape[1], F32))
        else:
            out[name] = (f[:, None] * np.asarray(value, F32)).mean(0, dtype=F32)
    return out


# ------------------------------------------------------------------------------------------- draws
def leaf_keys(shapes: dict, seed: int) -> dict[str, np.ndarray]:
    """DESIGN.md's es_tree_key: leaf i of the JAX flatten order (names sorted) gets split(es_key, n_leaves)[i],
    es_key = split(key(seed), 3)[1]."""
    names = sorted(shapes)
    keys = nr.split(nr.split(nr.key(seed), 3)[1], len(names))
    return dict(zip(names, keys))


def member_keys(leaf_key: np.ndarray, noise_reuse: int, epoch: int, members: np.ndarray) -> np.ndarray:
    """(m, 2): fold_in(fold_in(k, true epoch), member // 2), the noiser's member_key (pairs share a key)."""
    true_epoch = 0 if noise_reuse == 0 else int(epoch) // int(noise_reuse)
    return nr.fold_in(nr.fold_in(leaf_key, true_epoch), np.asarray(members, np.int64) // 2)


def normal_of(normals: str = "cpu"):
    """numpy_random's normal of JAX's `normals` backend (a bundle recorded on a GPU draws the GPU's); where
    numpy_random has no such backend, a draw raises tape.NotRecorded (the check that needs it is skipped, saying so)."""
    if normals == "cpu":
        return nr.normal
    import inspect
    if "backend" not in inspect.signature(nr.normal).parameters:
        def missing(keys, shape):
            from parity.core.tape import NotRecorded
            raise NotRecorded("noise", f"parity.core.numpy_random draws no {normals.upper()} normals in this checkout, so a "
                                       "bundle recorded with them cannot be redrawn; check against the live reference")
        return missing
    return lambda keys, shape: nr.normal(keys, shape, backend=normals)


def noise(shapes: dict, seed: int, epoch: int, members, sigma: float, rank: int, noise_reuse: int = 0,
          normals: str = "cpu") -> dict:
    """ReferencePort.noise: Z = normal(member key, (in + out, r)), B = Z[:in], A = Z[in:] * (+-sigma/sqrt(r));
    biases normal(member key, (out,)) * (+-sigma); the sign + for even members, - for odd ones."""
    normal = normal_of(normals)
    members = np.asarray(members, np.int64)
    sign = np.where(members % 2 == 0, F32(1), F32(-1))
    a_scale = F32(sigma) / np.sqrt(F32(rank))
    out = {}
    for name, k in leaf_keys(shapes, seed).items():
        keys = member_keys(k, noise_reuse, epoch, members)
        shape = tuple(shapes[name])
        if name.endswith(".weight"):
            n_out, n_in = shape
            z = normal(keys, (n_in + n_out, int(rank)))
            out[name] = (z[:, n_in:] * (sign * a_scale).astype(F32)[:, None, None], np.ascontiguousarray(z[:, :n_in]))
        else:
            out[name] = normal(keys, shape) * (sign * F32(sigma)).astype(F32)[:, None]
    return out


def init_params(shapes: dict, seed: int, normals: str = "cpu") -> dict:
    """The reference MLP's init: layer t's weight normal(split(model_key, L)[t], (out, in)) * (1 / sqrt(in)) in
    float32, biases zero; model_key = split(key(seed), 3)[0]."""
    normal = normal_of(normals)
    n_layers = sum(name.endswith(".weight") for name in shapes)
    keys = nr.split(nr.split(nr.key(seed), 3)[0], n_layers)
    out = {}
    for t in range(n_layers):
        n_out, n_in = shapes[f"{t}.weight"]
        out[f"{t}.weight"] = normal(keys[t], (n_out, n_in)) * (F32(1) / np.sqrt(F32(n_in)))
        out[f"{t}.bias"] = np.zeros(shapes[f"{t}.bias"], F32)
    return out


def action_uniforms(seed: int, epoch: int, pop: int) -> np.ndarray:
    """(500, pop) uniforms: uniform(fold_in(action_key, epoch)), action_key = split(key(seed), 3)[2]."""
    return nr.uniform(nr.fold_in(nr.split(nr.key(seed), 3)[2], int(epoch)), (MAX_STEPS, int(pop)))


class ESState(NamedTuple):
    """The numpy reference's ES run: its parameters, optimizer state and run seed."""

    params: dict
    opt: OptState
    seed: int


class NumpyReference:
    """ReferencePort's surface in numpy for a Config and RunSettings: draws, schedules, shaping, products,
    forward, gradient, the optimizer, the ES loop and actions."""

    jax_compatible_rng = True
    name = "jax_reference (numpy)"

    def __init__(self, cfg: Config, run: RunSettings | None = None, normals: str = "cpu"):
        self.cfg, self.run, self.normals = cfg, run or RunSettings(), normals

    def with_run_knobs(self, **changes) -> "NumpyReference":
        return NumpyReference(self.cfg, self.run.replace(**changes), self.normals)

    def sigma_at(self, epoch: int) -> float:
        return float(F32(schedule(self.cfg.sigma, self.run.sigma_decay, epoch)))

    def lr_at(self, epoch: int) -> float:
        return float(F32(schedule(self.cfg.lr, self.run.lr_decay, epoch)))

    def noise(self, shapes, seed, epoch, members, pop, sigma, rank):
        return noise(shapes, seed, epoch, members, sigma, rank, self.run.noise_reuse, self.normals)

    def init_params(self, shapes, seed):
        return init_params(shapes, seed, self.normals)

    def action_uniforms(self, seed, epoch, pop):
        return action_uniforms(seed, epoch, pop)

    def shape_fitness(self, f, group_size=0):
        return shape_fitness(f, int(group_size))

    def perturbed_linear(self, W, A, B, x):
        return perturbed_linear(W, A, B, x)

    def gradient(self, noise, shaped, sigma):
        return gradient(noise, shaped)

    def forward(self, params, noise, x):
        return forward(params, noise, x, self.run.activation)

    def optimizer_init(self, params):
        return optimizer_init(self.run.optimizer, params)

    def optimizer_apply(self, params, state, grads, n, epoch):
        return optimizer_apply(params, state, grads, n, self.lr_at(epoch))

    def optimizer_step(self, params, state, noise, shaped, sigma, epoch):
        return self.optimizer_apply(params, state, self.gradient(noise, shaped, sigma), shaped.shape[0], epoch)

    def rejects_nonfinite(self, noise, f, shapes):
        """None: like upstream EggRoll, the reference validates no fitness (it accepts NaN and inf)."""
        return None

    # ---- the ES loop: EggRoll.convert_fitnesses + do_updates, which redraws the members' noise from its keys
    def es_init(self, params, seed):
        params = {k: np.asarray(v, F32).copy() for k, v in params.items()}
        return ESState(params, optimizer_init(self.run.optimizer, params), int(seed))

    def es_ask(self, state, epoch):
        shapes = {k: v.shape for k, v in state.params.items()}
        return self.noise(shapes, state.seed, epoch, np.arange(self.cfg.pop), self.cfg.pop, self.sigma_at(epoch),
                          self.cfg.rank)

    def es_tell(self, state, noise, fitness, epoch):
        shaped = shape_fitness(fitness, self.cfg.group_size)
        n = shaped.shape[0]
        shapes = {k: v.shape for k, v in state.params.items()}
        drawn = self.noise(shapes, state.seed, epoch, np.arange(n), n, self.sigma_at(epoch), self.cfg.rank)
        params, opt = optimizer_apply(state.params, state.opt, gradient(drawn, shaped), n, self.lr_at(epoch))
        return ESState(params, opt, state.seed)

    def es_params(self, state):
        return {k: v.copy() for k, v in state.params.items()}

    def actions(self, logits, u):
        return sample_actions(logits, u)
