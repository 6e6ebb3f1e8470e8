"""The port adapter protocol: how the parity suite talks to ANY implementation of EGGROLL.

A port is checked through a small object with the methods below. Every array goes in and comes
out as a numpy float32 array (integers: numpy int64), so a port in any framework can implement it
by converting at the boundary. Parameters are flat dicts named like DESIGN.md's torch params:
"{layer}.weight" (out, in) and "{layer}.bias" (out,), layers 0..L-1.

The noise of a population is a dict:
    {weight name: (A (m, out, r) already times +-sigma/sqrt(r), B (m, in, r)),
     bias name:   eps (m, out) already times +-sigma}     # bias names absent when biases are not perturbed
where row i belongs to member members[i].

Dense noise, for a port that keeps no factors (it materialises W + A_i B_i^T): it sets `dense_noise = True`
and then every weight's noise is
    E (m, out, in): member i's whole perturbation A_i B_i^T (float32), in place of the pair (A, B).
Every method that takes or returns noise uses this form: `noise` and `es_ask` return E; `perturbed_linear`
is perturbed_linear(W, E, x); `gradient`, `forward`, `optimizer_step` and `es_tell` get dicts whose weights
are E. Where the suite feeds the reference's noise it hands such a port E = fl32(A B^T) (formed in float64,
rounded once). It then checks that each member's E has numerical rank <= r (the threshold derived in
parity.core.tolerances.rank_threshold), that its entries have variance sigma^2 and that they are distributed as
EGGROLL's (an entry of A B^T / sigma is sqrt(chi2_r / r) N(0,1): kurtosis 3 + 6/r).

Forward and update noise apart, for a port whose forward does not apply the noise its update uses (e.g. bias
noise drawn for the update but never added in the forward): `noise` and `es_ask` may return
    {"forward": noise dict, "update": noise dict}
The weights must be the same in both; leave out of "forward" what the forward does not apply. The port's
`forward` is then given the forward part, `gradient`, `optimizer_step` and `es_tell` the update part. Where
the suite feeds the reference's noise, both parts are that one dict. A port that returns one dict uses it
for both.

A port that draws its noise inside its own step (no separate ask): replace its noise-drawing method on the
instance with one that returns the given noise for `es_tell`, and call that method for `noise`/`es_ask`
with its generator state saved and restored (docs/ports.md "Ports that draw their noise inside step()",
examples/instep_adapter.py).

Required methods
    noise(shapes, seed, epoch, members, pop, sigma, rank) -> noise dict
        shapes: {name: shape} of every parameter; seed: the run seed (DESIGN.md's key scheme:
        es_key = split(key(seed), 3)[1], leaf i of the JAX flatten order gets split(es_key, n_leaves)[i]);
        members: int64 array of member indices into a population of size pop. The port's own noise,
        from its own generator, exactly as its training loop would use it at that epoch and sigma.
    perturbed_linear(W (out, in), A (m, out, r), B (m, in, r), x (m, batch, in)) -> (m, batch, out)
        member i's x @ (W + A_i B_i^T)^T, however the port computes it (dense_noise: perturbed_linear(W, E, x)).
    shape_fitness(f (N,), group_size=0) -> (N,)
        the port's fitness shaping. Raising for NaN/inf input is advised; a port that accepts it
        behaves like upstream EggRoll and gets a warning with advice, never a drift.
    gradient(noise, shaped (N,), sigma) -> {name: array shaped like the param}
        the ES gradient estimate in the reference's convention: ascent direction, before the
        sqrt(N) factor (weights: einsum('nir,njr->ij', f*A, B) / N, dense: einsum('n,nij->ij', f, E) / N;
        biases: mean(f * eps)); zeros for leaves without noise. The noise covers members 0..N-1 in order.

Optional methods (a check that needs an absent one is reported as skipped)
    forward(params, noise, x (m, in)) -> logits (m, out)
        the full MLP with the port's hidden activation; noise None = the plain model (x (n, in)).
    init_params(shapes, seed) -> params                    the port's initial parameters for a run seed
    optimizer_init(params) -> state                        opaque optimizer state
    optimizer_step(params, state, noise, shaped, sigma, epoch) -> (params, state)
        one ES step from shaped fitness: gradient, -(g sqrt(N)) to the optimizer at the port's
        learning rate for `epoch` (its schedule), applied to params. Its gradient must be the one
        `gradient()` returns (the updates check feeds that to the reference's optimizer).
    es_init(params, seed) -> state                         a training run's state, from given params
    es_ask(state, epoch) -> noise dict                     all pop members, at the port's sigma for epoch
    es_tell(state, noise, fitness (pop,), epoch) -> state  one ES epoch from raw returns
        on the given noise; its gradient must be gradient(noise, shape_fitness(fitness), sigma_e) (the
        trajectory check feeds that to the reference's optimizer and compares the step).
    es_params(state) -> params
    action_uniforms(seed, epoch, pop) -> (500, pop)        the port's action randomness (inverse-CDF sampling)
    actions(logits (n, 2), u (n,)) -> (n,) int64           the port's action for each member, given its logits
        and its uniform (the reference: action 1 when u >= softmax(logits)[0], computed in float64)

Attributes
    name: str                       shown in reports
    jax_compatible_rng: bool        True when the port claims to draw JAX's very numbers (then noise,
                                    init and action uniforms are compared element by element, and any
                                    difference is a drift; a dense E must be within float32 rounding of
                                    the product of JAX's factors); False: compared in distribution only.
    dense_noise: bool (optional)    True: weight noise is E (m, out, in), see above. Default False.
    rank: int (optional)            the port's own rank, for a port whose rank is fixed (e.g. `rank = 1`). The
                                    whole suite then runs at that rank, the reference too (noise(..., rank) is
                                    called with it and factors are (m, out, rank)), instead of misreading
                                    zero-padded columns as a scaling and distribution drift. Absent: the run's
                                    rank. Anything but a positive int stops the run before any check (exit 2).
    layers, hidden: int (optional)  a network of another depth or width than the suite's size (layers counts
                                    Linear layers: sizes [4] + [hidden] * (layers - 1) + [2]); both sides then run
                                    at it, as `rank`. A port without biases needs no attribute: see docs/ports.md.

Loading: `--port package.module:attr`. attr is an adapter object, or a class/factory called with the
run's `spec.config.Config` (pop, rank, sigma, lr, hidden, layers, group_size) that returns one.
`CheckedPort` wraps an adapter so that a missing method, a wrong shape or dtype, or an exception
inside the port becomes a `PortError` naming the method and what was expected (and, for an exception,
the port's own frames). An output of the right form holding NaN or inf is a `NonFinite` (a PortError carrying
the output and the call): the check that made the call fails with it where the reference's answer to the same call
is finite (parity.core.nonfinite), a numerical failure and not a protocol break.
"""
from __future__ import annotations

import inspect
from typing import Any, Mapping

import numpy as np

from parity.core.port import (PortError, SplitNoise, UsageError, _array, _positional_arity, call_port, finite_outputs,
                              has_methods, imported_attr)
from parity.mlp.noiseform import dense_of, forward_of, is_dense, to_dense, update_of

REQUIRED = ("noise", "perturbed_linear", "shape_fitness", "gradient")
OPTIONAL = ("forward", "init_params", "optimizer_init", "optimizer_step", "es_init", "es_ask", "es_tell",
            "es_params", "action_uniforms", "actions")
SIGNATURES = {
    "noise": "noise(shapes, seed, epoch, members, pop, sigma, rank) -> {weight: (A (m,out,r), B (m,in,r)), bias: (m,out)}",
    "perturbed_linear": "perturbed_linear(W (out,in), A (m,out,r), B (m,in,r), x (m,batch,in)) -> (m,batch,out)",
    "perturbed_linear dense": "perturbed_linear(W (out,in), E (m,out,in), x (m,batch,in)) -> (m,batch,out)",
    "shape_fitness": "shape_fitness(f (N,), group_size=0) -> (N,)",
    "gradient": "gradient(noise, shaped (N,), sigma) -> {name: array shaped like the param}",
    "forward": "forward(params, noise or None, x (m,in)) -> logits (m,out)",
    "init_params": "init_params(shapes, seed) -> {name: array}",
    "optimizer_init": "optimizer_init(params) -> state",
    "optimizer_step": "optimizer_step(params, state, noise, shaped, sigma, epoch) -> (params, state)",
    "es_init": "es_init(params, seed) -> state",
    "es_ask": "es_ask(state, epoch) -> noise dict for all pop members",
    "es_tell": "es_tell(state, noise, fitness (pop,), epoch) -> state",
    "es_params": "es_params(state) -> {name: array}",
    "action_uniforms": "action_uniforms(seed, epoch, pop) -> (500, pop) float32 in [0, 1)",
    "actions": "actions(logits (n,2), u (n,)) -> (n,) int64 actions in {0, 1}",
}
# Groups of optional methods that only make sense together.
GROUPS = {
    "optimizer": ("optimizer_init", "optimizer_step"),
    "es": ("es_init", "es_ask", "es_tell", "es_params"),
}

Noise = dict  # {weight name: (A, B) or E, bias name: eps}; parity.mlp.noiseform.SplitNoise when given apart
Shapes = Mapping[str, tuple]



def load_port(spec: str, cfg: Any) -> Any:
    """The adapter named by `package.module:attr` (called with `cfg` when it is a class or factory)."""
    obj, attr = imported_attr(spec, "examples.my_port:adapter")
    return check_adapter(built_adapter(obj, cfg, spec, attr), spec)


def built_adapter(obj: Any, cfg: Any, spec: str, attr: str = "adapter") -> Any:
    """`obj`, or `obj(cfg)` when it is a class or factory (a callable without `noise`); UsageError if that raises."""
    if inspect.isclass(obj) or (callable(obj) and not hasattr(obj, "noise")):
        try:
            return obj(cfg)
        except Exception as err:   # the port's own constructor failed
            raise UsageError(f"--port {spec}: calling {attr}(cfg) to build the adapter raised "
                             f"{type(err).__name__}: {err}") from err
    return obj


def check_adapter(obj: Any, spec: str) -> Any:
    """`obj` when it has the required methods and sound declarations (rank, layers, dense_noise), else UsageError
    naming what is missing and the signatures expected: before any check runs."""
    missing = [m for m in REQUIRED if not callable(getattr(obj, m, None))]
    if missing:
        lines = "\n".join(f"  {SIGNATURES[m]}" for m in missing)
        raise UsageError(f"--port {spec}: the adapter lacks required method(s) {', '.join(missing)}; expected:\n{lines}")
    check_declarations(obj, spec)
    return obj



DECLARABLE = {"rank": "the port's own fixed rank, e.g. rank = 1",
              "layers": "its number of Linear layers, e.g. layers = 2 for 4-H-2",
              "hidden": "its hidden width, e.g. hidden = 32"}


def declared_config(obj: Any, spec: str = "the adapter") -> dict[str, int]:
    """What the port declares of its own shape (attributes `rank`, `layers`, `hidden`, each optional): {attr: value};
    UsageError unless each present one is a positive int (a bool is none)."""
    out = {}
    for attr, example in DECLARABLE.items():
        value = getattr(obj, attr, None)
        if value is None:
            continue
        if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)) or value < 1:
            raise UsageError(f"--port {spec}: the adapter's {attr} must be a positive int ({example}), got {value!r}; "
                             f"leave it out to run at the suite's {attr}")
        out[attr] = int(value)
    return out


def check_declarations(obj: Any, spec: str) -> None:
    """The adapter's declared noise form agrees with its perturbed_linear and its declared rank is a positive int,
    before any check runs (UsageError)."""
    declared_config(obj, spec)
    dense = getattr(obj, "dense_noise", False)
    if not isinstance(dense, (bool, np.bool_)):
        raise UsageError(f"--port {spec}: dense_noise must be True or False, got {dense!r}")
    arity = _positional_arity(obj.perturbed_linear)
    if dense and arity == 4:
        raise UsageError(f"--port {spec}: the adapter declares dense_noise = True, so perturbed_linear takes E instead "
                         f"of A, B; expected:\n  {SIGNATURES['perturbed_linear dense']}")
    if not dense and arity == 3:
        raise UsageError(f"--port {spec}: perturbed_linear takes three arguments, as a dense port's (W, E, x); set "
                         f"dense_noise = True on the adapter, or take factors:\n  {SIGNATURES['perturbed_linear']}")


# ----------------------------------------------------------------------------- validation
def _params(method: str, value: Any, shapes: Shapes) -> dict[str, np.ndarray]:
    if not isinstance(value, Mapping):
        raise PortError(method, f"returned a {type(value).__name__}; expected a dict {{name: array}} with names "
                                f"{sorted(shapes)}")
    if set(value) != set(shapes):
        raise PortError(method, f"returned names {sorted(value)}; expected {sorted(shapes)}")
    return {k: _array(method, f"'{k}'", value[k], tuple(shapes[k])) for k in shapes}


def _weight_noise(method: str, name: str, value: Any, shape: tuple, m: int, rank: int, dense: bool):
    """One weight's noise: E (m, out, in) for a dense port, else the pair (A (m, out, r), B (m, in, r))."""
    o, i = shape
    pair = isinstance(value, (tuple, list))
    if dense:
        if pair:
            raise PortError(method, f"'{name}' is a pair, but the port declares dense_noise = True; expected "
                                    f"E of shape {(m, o, i)}")
        return _array(method, f"E of '{name}'", value, (m, o, i))
    if not pair or len(value) != 2:
        if np.ndim(value) == 3:
            raise PortError(method, f"'{name}' must be a pair (A {(m, o, rank)}, B {(m, i, rank)}), got one array of "
                                    f"shape {np.shape(value)}; a port that keeps no factors sets dense_noise = True "
                                    f"and returns E {(m, o, i)}")
        raise PortError(method, f"'{name}' must be a pair (A, B), got {type(value).__name__}")
    return (_array(method, f"A of '{name}'", value[0], (m, o, rank)),
            _array(method, f"B of '{name}'", value[1], (m, i, rank)))


def _one_noise(method: str, value: Any, shapes: Shapes, m: int, rank: int, dense: bool, part: str = "") -> Noise:
    where = f"its {part!r} noise" if part else "a"
    expected = "E" if dense else "(A, B)"
    if not isinstance(value, Mapping):
        raise PortError(method, f"returned {where} {type(value).__name__}; expected a dict {{weight name: {expected}, "
                                f"bias name: eps}}")
    unknown = sorted(set(value) - set(shapes))
    if unknown:
        raise PortError(method, f"returned unknown names {unknown}; parameter names are {sorted(shapes)}")
    out: Noise = {}
    for name, shape in shapes.items():
        if name.endswith(".weight"):
            if name not in value:
                raise PortError(method, f"returned no noise for weight '{name}'" + (f" in {where}" if part else "")
                                + f"; every weight needs {expected}")
            out[name] = _weight_noise(method, name, value[name], tuple(shape), m, rank, dense)
        elif name in value:
            out[name] = _array(method, f"bias noise of '{name}'", value[name], (m,) + tuple(shape))
    return out


def check_noise(method: str, value: Any, shapes: Shapes, m: int, rank: int, dense: bool = False) -> Noise:
    """Validate a noise dict for m members against the parameter shapes; {"forward", "update"} gives a SplitNoise."""
    if isinstance(value, Mapping) and {"forward", "update"} & set(value):
        if set(value) != {"forward", "update"}:
            raise PortError(method, f"returned keys {sorted(value)}; noise given apart is "
                                    "{\"forward\": noise dict, \"update\": noise dict}")
        return SplitNoise(_one_noise(method, value["forward"], shapes, m, rank, dense, "forward"),
                          _one_noise(method, value["update"], shapes, m, rank, dense, "update"))
    return _one_noise(method, value, shapes, m, rank, dense)



@finite_outputs("noise", "perturbed_linear", "shape_fitness", "gradient", "forward", "init_params", "optimizer_step",
                "es_ask", "es_params", "action_uniforms", parts={"optimizer_step": 0})
class CheckedPort:
    """An adapter wrapped so that every call is validated; `has(method)` tells whether an optional one exists."""

    def __init__(self, port: Any):
        self.port = port
        self.name = str(getattr(port, "name", type(port).__name__))
        self.jax_compatible_rng = bool(getattr(port, "jax_compatible_rng", False))
        self.dense = bool(getattr(port, "dense_noise", False))
        self._converted: list[tuple[dict, dict]] = []     # the last few (given, as the port receives it)
        self.tape = None          # a parity.core.repro.Tape: told of each call (inputs as the port got them, output)
        self._pending = None

    def received(self, noise: Noise | None, part: str = "update") -> Noise | None:
        """What the port's method gets for `noise`: its forward or update part, as E for a dense port (the same
        object for the same noise, so a port may cache on it; a rollout calls forward at every step)."""
        if noise is None:
            return None
        chosen = forward_of(noise) if part == "forward" else update_of(noise)
        if not self.dense or is_dense(chosen):
            return chosen
        for given, converted in self._converted:
            if given is chosen:
                return converted
        converted = to_dense(chosen)
        self._converted = [(chosen, converted)] + self._converted[:3]
        return converted

    def has(self, method: str) -> bool:
        return has_methods(self.port, method, GROUPS)

    def unchecked(self, method: str, *args):
        """The port's own method called as is: no validation, its exceptions passed through (for a check that
        must see what the port itself raises, e.g. on NaN fitness)."""
        return getattr(self.port, method)(*args)

    def _call(self, method: str, *args, **kwargs):
        if self.tape is not None and self.tape.wants(method):
            self._pending = self.tape.before(method, args, kwargs)
        self.last_call = (method, args, kwargs)          # a NonFinite's repro when the tape does not keep the call
        return call_port(self.port, method, SIGNATURES, *args, **kwargs)

    def _taped(self, output):
        """`output` (validated, what the check gets), first handed to the tape with the call that produced it."""
        if self._pending is not None:
            self.tape.after(self._pending, output)
            self._pending = None
        return output

    # ---- required
    def noise(self, shapes: Shapes, seed: int, epoch: int, members: np.ndarray, pop: int, sigma: float,
              rank: int) -> Noise:
        members = np.asarray(members, dtype=np.int64)
        value = self._call("noise", dict(shapes), int(seed), int(epoch), members, int(pop), float(sigma), int(rank))
        return self._taped(check_noise("noise", value, shapes, members.size, rank, self.dense))

    def perturbed_linear(self, W, A, B, x) -> np.ndarray:
        """The port's product on factors A, B (a dense port gets E = fl32(A B^T) in their place)."""
        m, batch = x.shape[0], x.shape[1]
        value = (self._call("perturbed_linear", W, dense_of(A, B), x) if self.dense
                 else self._call("perturbed_linear", W, A, B, x))
        return self._taped(_array("perturbed_linear", "the result", value, (m, batch, W.shape[0])))

    def shape_fitness(self, f: np.ndarray, group_size: int = 0) -> np.ndarray:
        value = self._call("shape_fitness", np.asarray(f, dtype=np.float32), int(group_size))
        return self._taped(_array("shape_fitness", "the shaped fitness", value, f.shape))

    def gradient(self, noise: Noise, shaped: np.ndarray, sigma: float, shapes: Shapes) -> dict[str, np.ndarray]:
        value = self._call("gradient", self.received(noise), np.asarray(shaped, dtype=np.float32), float(sigma))
        return self._taped(_params("gradient", value, shapes))

    # ---- optional
    def forward(self, params: dict, noise: Noise | None, x: np.ndarray, n_out: int) -> np.ndarray:
        value = self._call("forward", params, self.received(noise, "forward"), x)
        return self._taped(_array("forward", "the logits", value, (x.shape[0], n_out)))

    def init_params(self, shapes: Shapes, seed: int) -> dict[str, np.ndarray]:
        return self._taped(_params("init_params", self._call("init_params", dict(shapes), int(seed)), shapes))

    def optimizer_init(self, params: dict):
        return self._call("optimizer_init", params)

    def optimizer_step(self, params, state, noise, shaped, sigma, epoch, shapes: Shapes):
        value = self._call("optimizer_step", params, state, self.received(noise), np.asarray(shaped, dtype=np.float32),
                           float(sigma), int(epoch))
        if not isinstance(value, (tuple, list)) or len(value) != 2:
            raise PortError("optimizer_step", f"returned a {type(value).__name__}; expected (params, state)")
        return _params("optimizer_step", value[0], shapes), value[1]

    def es_init(self, params: dict, seed: int):
        return self._call("es_init", params, int(seed))

    def es_ask(self, state, epoch: int, shapes: Shapes, pop: int, rank: int) -> Noise:
        return check_noise("es_ask", self._call("es_ask", state, int(epoch)), shapes, pop, rank, self.dense)

    def es_tell(self, state, noise: Noise, fitness: np.ndarray, epoch: int):
        return self._call("es_tell", state, self.received(noise), np.asarray(fitness, dtype=np.float32), int(epoch))

    def es_params(self, state, shapes: Shapes) -> dict[str, np.ndarray]:
        return _params("es_params", self._call("es_params", state), shapes)

    def action_uniforms(self, seed: int, epoch: int, pop: int, max_steps: int) -> np.ndarray:
        value = _array("action_uniforms", "the uniforms",
                       self._call("action_uniforms", int(seed), int(epoch), int(pop)), None)
        if value.ndim != 2 or value.shape[1] != pop or value.shape[0] < max_steps:
            raise PortError("action_uniforms", f"the uniforms have shape {value.shape}; expected ({max_steps}, {pop})")
        finite = value[np.isfinite(value)]             # NaN or inf: finite_outputs' NonFinite
        if finite.size and (finite.min() < 0 or finite.max() >= 1):
            raise PortError("action_uniforms", f"the uniforms lie in [{finite.min()}, {finite.max()}]; expected [0, 1)")
        return value

    def actions(self, logits: np.ndarray, u: np.ndarray) -> np.ndarray:
        value = _array("actions", "the actions", self._call("actions", np.asarray(logits, np.float32),
                                                            np.asarray(u, np.float32)), (len(u),), np.int64)
        if not np.all((value == 0) | (value == 1)):
            raise PortError("actions", f"the actions hold {sorted(set(value.tolist()) - {0, 1})[:5]}; expected 0 or 1")
        return self._taped(value)
