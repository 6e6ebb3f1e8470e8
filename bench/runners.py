"""Build the callables the benchmark times: one population forward, noise, or ES step per call.

Every builder returns a `Case` (a zero-argument callable, the function that waits for its
result, and the device it runs on) so the timing loop treats torch and JAX alike. Inputs are
built once, outside the timed call, from explicit seeds.
"""
from __future__ import annotations

import math
from functools import partial
from typing import Callable, NamedTuple, Sequence

import numpy as np
import torch

from bench import impls
from bench.measure import torch_sync
from reporting import Agreement, agreement
from spec.config import PRESETS, Config
from spec.knobs import Knobs
from spec.layout import param_shapes
from torch_impl import es as es_mod
from torch_impl import random as rnd
from torch_impl.model import forward, make_forward
from torch_impl.noise import Noise, per_member, sample_noise, seed_sources
from torch_impl.random import status as rng_status

SIGMA, LR = PRESETS["paper"][0].sigma, PRESETS["paper"][0].lr


class ModelSpec(NamedTuple):
    """A benchmarked MLP: layer sizes, rank of the noise, hidden activation."""

    name: str
    sizes: tuple[int, ...]
    rank: int = 4
    activation: str = "pqn"

    @property
    def label(self) -> str:
        return "-".join(map(str, self.sizes)) + f", rank {self.rank}, {self.activation}"


class Case(NamedTuple):
    """What one timed call runs, how to wait for it, and where it runs (the CSV's device)."""

    fn: Callable[[], object]
    sync: Callable[[object], object]
    device: str


def jax_sync(out):
    import jax
    return jax.block_until_ready(out)


def jax_device() -> str:
    import jax
    return jax.devices()[0].platform


# ------------------------------------------------------------------------------------ inputs
def make_params(spec: ModelSpec, seed: int, device: torch.device) -> dict[str, torch.Tensor]:
    """Random float32 params: weights normal / sqrt(in) (the reference's init), small nonzero biases."""
    g = torch.Generator().manual_seed(seed)
    params = {}
    for l, (d_in, d_out) in enumerate(zip(spec.sizes[:-1], spec.sizes[1:])):
        params[f"{l}.weight"] = (torch.randn(d_out, d_in, generator=g) / math.sqrt(d_in)).to(device)
        params[f"{l}.bias"] = (0.1 * torch.randn(d_out, generator=g)).to(device)
    return params


def make_inputs(spec: ModelSpec, pop: int, seed: int, device: torch.device) -> torch.Tensor:
    """One observation per member: x (pop, in)."""
    g = torch.Generator().manual_seed(seed + 1)
    return torch.randn(pop, spec.sizes[0], generator=g).to(device)


def config_for(spec: ModelSpec, pop: int) -> Config:
    """A Config carrying pop and rank for the spec's MLP."""
    return Config(pop=pop, rank=spec.rank, sigma=SIGMA, lr=LR, hidden=spec.sizes[1], layers=len(spec.sizes) - 1)


def knobs_for(spec: ModelSpec, rng: str) -> Knobs:
    return Knobs(rng=rng, activation=spec.activation)


def noise_call(spec: ModelSpec, pop: int, rng: str, seed: int, device: torch.device) -> Callable[[], Noise]:
    """A call drawing torch_impl's own noise for epoch 0 (rng=torch or rng=jax), as `sample_noise` does per epoch."""
    plan = es_mod.make(config_for(spec, pop), knobs_for(spec, rng)).plan
    shapes = param_shapes(spec.sizes)
    return partial(sample_noise, plan, seed_sources(plan, seed, shapes), shapes, 0, SIGMA, device)


def torch_noise(params, spec: ModelSpec, pop: int, rng: str, seed: int, device: torch.device) -> Noise:
    """torch_impl's own noise for epoch 0 (rng=torch or rng=jax)."""
    return noise_call(spec, pop, rng, seed, device)()


# ------------------------------------------------------------------------------------ torch forwards
def forward_case(impl: str, params, x, noise: Noise, activation: str, device: torch.device) -> Case:
    """One population forward with fixed noise, in the style `impl` names.

    torch_impl gets the noise as sample_noise returns it (grouped: one entry per antithetic pair, read
    once per pair); `torch_impl_members` is the same forward handed the noise per member. hooks,
    materialized and loop get it per member, as those styles look up a member's perturbation; the
    expansion happens here, outside the timed call (a no-op when `noise` is already per member).
    """
    sync = torch_sync(device)
    dev = device.type
    if impl in ("torch_impl", "torch_impl_jaxrng"):
        return Case(partial(forward, params, x, noise, activation), sync, dev)
    if impl in KNOB_IMPLS:                       # torch_impl with compile=on or matmul_precision=high
        precision, compiled = KNOB_IMPLS[impl]
        return Case(partial(make_forward(activation, precision, compiled), params, x, noise), sync, dev)
    members = per_member(noise)
    if impl == "torch_impl_members":
        return Case(partial(forward, params, x, members, activation), sync, dev)
    if impl == "hooks":
        module = impls.build_module(params, activation)
        return Case(partial(impls.hooks_forward, module, x, members), sync, dev)
    if impl == "materialized":
        return Case(partial(impls.materialized_forward, params, x, members, activation), sync, dev)
    if impl == "loop":
        return Case(partial(impls.loop_forward, params, x, members, activation), sync, dev)
    raise ValueError(f"unknown torch implementation {impl!r}")


RNG_OF = {"torch_impl": "torch", "torch_impl_jaxrng": "jax"}   # bench impl -> torch_impl's knob rng
# bench impl -> torch_impl's knobs (matmul_precision, compile): the speed-ups the parity suite checks
KNOB_IMPLS = {"torch_impl_compiled": ("highest", "on"), "torch_impl_tf32": ("high", "off")}


def forward_noise_case(impl: str, params, x, spec: ModelSpec, pop: int, seed: int, device: torch.device) -> Case:
    """torch_impl's noise (its own generator, or the JAX-compatible one) then the forward, per call."""
    draw = noise_call(spec, pop, RNG_OF[impl], seed, device)
    return Case(lambda: forward(params, x, draw(), spec.activation), torch_sync(device), device.type)


def noise_case(impl: str, params, spec: ModelSpec, pop: int, seed: int, device: torch.device) -> Case:
    return Case(noise_call(spec, pop, RNG_OF[impl], seed, device), torch_sync(device), device.type)


# ------------------------------------------------------------------------------------ JAX reference
class JaxSetup(NamedTuple):
    """The reference's pieces for one model: MLP init maps, the EggRoll noiser, keys, params."""

    frozen_params: object
    params: object
    es_map: object
    es_tree_key: object
    frozen_noiser_params: dict
    noiser_params: dict


def jax_setup(spec: ModelSpec, torch_params: dict[str, torch.Tensor], seed: int) -> JaxSetup:
    """The reference MLP with the same numbers as `torch_params`, its EggRoll noiser and ES keys."""
    import jax

    from jax_reference.models import MLP, simple_es_tree_key
    from jax_reference.noiser import EggRoll
    from jax_reference.population import flat_to_params

    model_key, es_key, _ = jax.random.split(jax.random.key(seed), 3)
    init = MLP.rand_init(model_key, spec.sizes[0], spec.sizes[-1], list(spec.sizes[1:-1]), True,
                         spec.activation, jax.numpy.float32)
    params = flat_to_params({k: v.detach().cpu().numpy() for k, v in torch_params.items()})
    if jax.tree.structure(params) != jax.tree.structure(init.params):
        raise RuntimeError("torch params do not map onto the reference MLP's pytree")
    es_tree_key = simple_es_tree_key(params, es_key, init.scan_map)
    frozen_noiser, noiser_params = EggRoll.init_noiser(params, SIGMA, LR, rank=spec.rank)
    return JaxSetup(init.frozen_params, params, init.es_map, es_tree_key, frozen_noiser, noiser_params)


def jax_forward_noise_case(setup: JaxSetup, x: np.ndarray) -> Case:
    """jit(vmap(MLP.forward)) with EggRoll drawing each member's noise inside the product."""
    import jax.numpy as jnp

    from jax_reference.population import make_population_forward

    fwd = make_population_forward(setup.frozen_params, setup.frozen_noiser_params)
    xj = jnp.asarray(x)
    return Case(lambda: fwd(setup.noiser_params, setup.params, setup.es_tree_key, 0, xj), jax_sync, jax_device())


def jax_noise_tree(setup: JaxSetup, pop: int):
    """Every member's (A, B) and bias noise as drawn by the noiser, jitted."""
    import jax

    from jax_reference.population import member_noise_tree

    draw = jax.jit(lambda npar, p, k: member_noise_tree(setup.frozen_noiser_params, npar, p, k, setup.es_map, 0, pop))
    return draw


def jax_noise_case(setup: JaxSetup, pop: int) -> Case:
    draw = jax_noise_tree(setup, pop)
    return Case(lambda: draw(setup.noiser_params, setup.params, setup.es_tree_key), jax_sync, jax_device())


def jax_forward_case(setup: JaxSetup, x: np.ndarray, pop: int) -> Case:
    """The reference's jit(vmap(MLP.forward)) with each member's noise handed in (forward alone)."""
    import jax
    import jax.numpy as jnp

    from jax_reference.population import make_cached_population_forward

    noise = jax.block_until_ready(jax_noise_tree(setup, pop)(setup.noiser_params, setup.params, setup.es_tree_key))
    fwd = make_cached_population_forward(setup.frozen_params, setup.frozen_noiser_params)
    xj = jnp.asarray(x)
    return Case(lambda: fwd(setup.noiser_params, setup.params, noise, xj), jax_sync, jax_device())


def jax_step_case(setup: JaxSetup, x: np.ndarray, pop: int) -> Case:
    """One jitted ES step: noisy forward, fitness = sum of outputs, convert_fitnesses, do_updates."""
    import jax
    import jax.numpy as jnp

    from jax_reference.noiser import EggRoll
    from jax_reference.population import make_population_forward, population_iterinfos

    fwd = make_population_forward(setup.frozen_params, setup.frozen_noiser_params)
    iterinfos = population_iterinfos(0, pop)
    fnp, es_map, keys = setup.frozen_noiser_params, setup.es_map, setup.es_tree_key

    @jax.jit
    def step(noiser_params, params, xj):
        out = fwd(noiser_params, params, keys, 0, xj)                    # (pop, out)
        fitness = out.sum(axis=-1)                                        # synthetic fitness
        shaped = EggRoll.convert_fitnesses(fnp, noiser_params, fitness)
        return EggRoll.do_updates(fnp, noiser_params, params, keys, shaped, iterinfos, es_map)

    xj = jnp.asarray(x)
    return Case(lambda: step(setup.noiser_params, setup.params, xj), jax_sync, jax_device())


# ------------------------------------------------------------------------------------ torch ES step
class TorchStep(NamedTuple):
    """The pieces of one torch_impl ES step, each a Case, plus the whole step."""

    noise: Case
    forward: Case
    tell: Case
    step: Case
    step_cached: Case   # from a state holding the draws: noise_reuse=0 draws once, later epochs reuse them


def torch_step_cases(spec: ModelSpec, pop: int, rng: str, seed: int, device: torch.device) -> TorchStep:
    """ask (noise), forward over one observation per member, tell (shaping, gradient, update)."""
    strategy = es_mod.make(config_for(spec, pop), knobs_for(spec, rng))
    state = es_mod.init(strategy, seed, device, params=make_params(spec, seed, device))
    x = make_inputs(spec, pop, seed, device)
    sync = torch_sync(device)
    noise, warm = es_mod.ask(strategy, state)                          # warm: its draws cached in the state
    fitness = forward(state.params, x, noise, spec.activation).sum(-1)  # synthetic fitness (pop,)

    def step(start: es_mod.ESState):
        n, s = es_mod.ask(strategy, start)
        f = forward(s.params, x, n, spec.activation).sum(-1)
        return es_mod.tell(strategy, s, n, f)[0]

    dev = device.type
    return TorchStep(
        noise=Case(lambda: es_mod.ask(strategy, state)[0], sync, dev),
        forward=Case(lambda: forward(state.params, x, noise, spec.activation), sync, dev),
        tell=Case(lambda: es_mod.tell(strategy, state, noise, fitness)[0], sync, dev),
        step=Case(lambda: step(state), sync, dev),
        step_cached=Case(lambda: step(warm), sync, dev),
    )


# ------------------------------------------------------------------------------------ generators
def factor_shapes(spec: ModelSpec) -> list[tuple[int, int]]:
    """(in + out, r) per layer: the draw each pair makes for each weight."""
    return [(d_in + d_out, spec.rank) for d_in, d_out in zip(spec.sizes[:-1], spec.sizes[1:])]


def generator_cases(spec: ModelSpec, pairs: int, seed: int, device: torch.device) -> dict[str, Case]:
    """The paper preset's factor draws, `pairs` keys x (in + out, r) per layer, by three generators."""
    import jax
    import jax.numpy as jnp

    shapes = factor_shapes(spec)
    sync = torch_sync(device)
    gen = torch.Generator(device=device).manual_seed(seed)
    cases = {"torch_impl": Case(lambda: [torch.randn((pairs, *s), generator=gen, device=device) for s in shapes],
                                sync, device.type)}
    base = rnd.key(seed)
    keys = [rnd.fold_in(rnd.fold_in(k, 0), torch.arange(pairs)).to(device) for k in rnd.split(base, len(shapes))]
    cases["torch_impl_jaxrng"] = Case(lambda: [rnd.normal(k, s) for k, s in zip(keys, shapes)], sync, device.type)
    jkeys = [jax.vmap(lambda p, k=k: jax.random.fold_in(jax.random.fold_in(k, 0), p))(jnp.arange(pairs))
             for k in jax.random.split(jax.random.key(seed), len(shapes))]
    draws = [jax.jit(jax.vmap(partial(jax.random.normal, shape=s))) for s in shapes]
    cases["jax_reference"] = Case(lambda: [d(k) for d, k in zip(draws, jkeys)], jax_sync, jax_device())
    return cases


def _jax_normals(key_words: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    """jax.random.normal for each key (K, 2) uint32 -> (K, *shape) float32, on JAX's default backend."""
    import jax
    import jax.numpy as jnp

    keys = jax.random.wrap_key_data(jnp.asarray(key_words, dtype=jnp.uint32))
    return np.asarray(jax.jit(jax.vmap(lambda k: jax.random.normal(k, shape)))(keys))


def normal_agreement(n: int, seed: int = 0, reference: Callable = _jax_normals) -> Agreement:
    """torch_impl.random.normal against jax.random.normal over at least n draws from several keys and shapes."""
    shapes = [(260, 4), (3, 5, 7), (1001,)]         # a factor draw, a 3-d and an odd 1-d shape
    per_key = sum(math.prod(s) for s in shapes)
    keys = rnd.fold_in(rnd.key(seed), torch.arange(max(1, -(-int(n) // per_key))))   # (K, 2)
    ours, theirs = [], []
    for i, shape in enumerate(shapes):
        ks = rnd.fold_in(keys, i)
        ours.append(rnd.normal(ks, shape).reshape(-1).numpy())
        theirs.append(np.asarray(reference(rnd.to_uint32(ks), shape), np.float32).reshape(-1))
    return agreement(np.concatenate(ours), np.concatenate(theirs))


def agreement_report(n: int) -> str:
    """One line for the summary: the JAX-compatible generator's agreement with jax.random.normal."""
    result = normal_agreement(n)
    drew = rng_status().drew["normal/cpu"][0]                  # the backend that drew them (torch_impl.random)
    return f"torch_impl.random.normal (CPU draws: the {drew} backend) vs jax.random.normal: {result}"


def pops_within(pops: Sequence[int], cap: int | None) -> list[int]:
    return [p for p in pops if cap is None or p <= cap]
