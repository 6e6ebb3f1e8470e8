"""Low-rank ES noise for a whole population: the reference's pairing and scaling, with the knobs as tables.

For a leaf's source (its key under rng=jax), draw index p and noise generation g (`keys.true_epoch`):
`Z = normal(fold_in(fold_in(k, g), p), (in + out, r))`, `B = Z[:in]`, `A = Z[in:] * (+-sigma/sqrt(r))`;
a bias gets `normal(same key, (out,)) * (+-sigma)`. `LAYOUTS` (knob antithetic) decides which draw and sign
each member gets, `keys.GENERATORS` (knob rng) where the draws come from, `BIAS_SCHEDULES` (knob bias_noise)
which generation the bias noise uses. A `NoisePlan` holds the three, resolved once.
"""
from __future__ import annotations

from typing import Callable, Mapping, NamedTuple

import torch

from spec.config import check_pairing
from spec.layout import leaf_names, n_layers_of
from torch_impl.keys import GENERATORS, Generator, true_epoch


class Noise(NamedTuple):
    """The population's noise: per member, or one entry per draw shared by a group of consecutive members.

    signs None: A (pop, out, r), B (pop, in, r), bias (pop, out), one entry per member.
    signs, k floats each +1.0 or -1.0: A (draws, out, r), B (draws, in, r), bias (draws, out) with
    draws = pop / k, and member d k + j uses draw d times signs[j]. Interleaved antithetic pairs are (1.0, -1.0):
    each pair's factors are stored and read once, which halves the bytes the forward and gradient move.
    A already carries sigma/sqrt(r) and bias sigma (times the member's sign once expanded).
    """

    A: dict[str, torch.Tensor]      # weight name -> (pop | draws, out, r)
    B: dict[str, torch.Tensor]      # weight name -> (pop | draws, in, r)
    bias: dict[str, torch.Tensor]   # bias name -> (pop | draws, out); {} when bias_noise=off
    signs: tuple[float, ...] | None = None   # k signs when grouped (plain floats: no device sync)
    bias_in_forward: bool = True    # False (bias_noise=update_only): the bias noise enters the gradient only


def group_size(noise: Noise) -> int:
    """Members per stored draw: k for grouped noise, 1 for per-member noise (checks the signs)."""
    if noise.signs is None:
        return 1
    signs = tuple(noise.signs)
    if not signs or any(s not in (1.0, -1.0) for s in signs):
        raise ValueError(f"Noise.signs must be None or a non-empty tuple of 1.0 / -1.0, got {noise.signs!r}")
    return len(signs)


def population_of(noise: Noise) -> int | None:
    """How many members the noise is for (None when it holds no leaves)."""
    first = next(iter(noise.A.values()), None)
    if first is None:
        first = next(iter(noise.bias.values()), None)
    return None if first is None else first.shape[0] * group_size(noise)


def r_major(t: torch.Tensor) -> torch.Tensor:
    """The same (rows, n, r) values with memory laid out as (rows, r, n): the forward's bmm reads them contiguously."""
    return t.transpose(1, 2).contiguous().transpose(1, 2)


def per_member(noise: Noise) -> Noise:
    """The same noise with one entry per member (signs None): what adapters and per-member code read.

    Member d k + j gets draw d times signs[j]; multiplying by +-1 is exact, so the values are bit for bit
    those of drawing per member.
    """
    k = group_size(noise)
    if noise.signs is None:
        return noise

    def expand(t: torch.Tensor) -> torch.Tensor:   # (draws, ...) -> (draws k, ...)
        s = torch.tensor(noise.signs, dtype=t.dtype, device=t.device).view(1, k, *([1] * (t.dim() - 1)))
        return (t.unsqueeze(1) * s).flatten(0, 1)

    def repeat(t: torch.Tensor) -> torch.Tensor:
        return t.repeat_interleave(k, dim=0)

    return Noise(A={n: r_major(expand(v)) for n, v in noise.A.items()},
                 B={n: r_major(repeat(v)) for n, v in noise.B.items()},
                 bias={n: expand(v) for n, v in noise.bias.items()}, bias_in_forward=noise.bias_in_forward)


# ----------------------------------------------------------------------------- pairing layouts
class Layout(NamedTuple):
    """Which draw and sign each member gets (a value of knob antithetic)."""

    draws: Callable[[int], int]          # pop -> number of distinct draws
    signs: tuple[float, ...] | None      # grouped: member d k + j is draw d times signs[j]; None: per member
    members: Callable[[torch.Tensor, int], tuple[torch.Tensor, torch.Tensor]]   # arange(pop), pop -> draw, sign


LAYOUTS: dict[str, Layout] = {
    # members 2p, 2p+1 share draw p: + then -
    "interleaved": Layout(lambda pop: pop // 2, (1.0, -1.0),
                          lambda m, pop: (m // 2, torch.where(m % 2 == 0, 1.0, -1.0))),
    # members i, i + N/2 share draw i: + then - (stored per member)
    "halves": Layout(lambda pop: pop // 2, None,
                     lambda m, pop: (m % (pop // 2), torch.where(m < pop // 2, 1.0, -1.0))),
    # every member its own draw, all +
    "off": Layout(lambda pop: pop, (1.0,), lambda m, pop: (m, torch.ones(pop, device=m.device))),
}


def member_layout(pop: int, antithetic: str, device: str | torch.device = "cpu") -> tuple[int, torch.Tensor, torch.Tensor]:
    """(number of draws, draw index per member (pop,), sign per member (pop,) float32 +-1)."""
    check_pairing(pop, antithetic)
    if antithetic not in LAYOUTS:
        raise ValueError(f"unknown antithetic layout {antithetic!r}; allowed: {', '.join(LAYOUTS)}")
    layout = LAYOUTS[antithetic]
    index, sign = layout.members(torch.arange(pop, device=device), pop)
    return layout.draws(pop), index, sign


class BiasNoise(NamedTuple):
    """How the biases are perturbed (a value of knob bias_noise)."""

    generation: Callable[[int, int], int] | None   # (epoch, the weights' generation) -> the bias noise's; None: none
    in_forward: bool                                # whether the forward adds it (else it enters the update only)


BIAS_SCHEDULES: dict[str, BiasNoise] = {
    "jax": BiasNoise(lambda epoch, generation: generation, True),    # the weights' noise_reuse schedule
    "fresh": BiasNoise(lambda epoch, generation: epoch, True),       # new bias noise every epoch
    "update_only": BiasNoise(lambda epoch, generation: epoch, False),   # fresh, in the gradient, never applied
    "off": BiasNoise(None, True),                                 # none drawn (noise handed in is applied)
}


# ----------------------------------------------------------------------------- the plan and the draws
class NoisePlan(NamedTuple):
    """How a run draws its noise: generator, pairing, bias schedule, noise_reuse, population and rank."""

    generator: Generator
    layout: Layout
    antithetic: str
    bias: BiasNoise
    noise_reuse: int
    pop: int
    rank: int


def make_plan(pop: int, rank: int, knobs) -> NoisePlan:
    """The noise knobs (rng, antithetic, bias_noise, noise_reuse) resolved once for a population of `pop`."""
    if rank < 1:
        raise ValueError(f"rank must be >= 1 (the number of columns of A and B), got {rank}")
    check_pairing(pop, knobs.antithetic)
    return NoisePlan(GENERATORS[knobs.rng], LAYOUTS[knobs.antithetic], knobs.antithetic,
                     BIAS_SCHEDULES[knobs.bias_noise], knobs.noise_reuse, pop, rank)


Draws = Mapping[str, tuple[tuple, torch.Tensor]]   # leaf name -> (what it was drawn from, raw normals (n_draws, *shape))


def draw(plan: NoisePlan, sources: Mapping[str, object], shapes: Mapping[str, tuple[int, ...]], epoch: int,
         device: str | torch.device = "cpu", reuse: Draws | None = None) -> dict[str, tuple[tuple, torch.Tensor]]:
    """The raw (unscaled) normals of every perturbed leaf at `epoch`; a leaf found in `reuse` with the same
    source, generation, size and device is taken from there instead of drawn again (same numbers either way)."""
    if epoch < 0:
        raise ValueError(f"epoch must be >= 0, got {epoch}")
    names = leaf_names(n_layers_of(shapes))
    missing = sorted(set(names) - set(sources))
    if missing:
        raise ValueError(f"the sources lack leaves {missing}; expected one per leaf of {names}")
    n_draws = plan.layout.draws(plan.pop)
    generation = true_epoch(epoch, plan.noise_reuse)
    out: dict[str, tuple[tuple, torch.Tensor]] = {}
    for name in names:
        out_dim, in_dim = shapes[name.replace(".bias", ".weight")]
        if name.endswith(".weight"):
            gen, shape = generation, (in_dim + out_dim, plan.rank)
        elif plan.bias.generation is not None:
            gen, shape = plan.bias.generation(epoch, generation), (out_dim,)
        else:
            continue
        tag = (plan.generator.name, plan.generator.source_tag(sources[name]), gen, n_draws, shape, str(device))
        if reuse is not None and name in reuse and reuse[name][0] == tag:
            out[name] = reuse[name]
        else:
            out[name] = (tag, plan.generator.draws(sources[name], gen, n_draws, shape, device))
    return out


def scale(plan: NoisePlan, raw: Mapping[str, tuple[tuple, torch.Tensor]], shapes: Mapping[str, tuple[int, ...]],
          sigma: float, device: str | torch.device = "cpu") -> Noise:
    """The population's Noise from raw draws: B = Z[:in], A = Z[in:] * sigma/sqrt(r), bias eps * sigma, by layout.

    Grouped by draw (see Noise) for antithetic=interleaved and off; per member for halves (its pairs are N/2
    apart). The scales are the reference's, in float32.
    """
    sigma32 = torch.tensor(sigma, dtype=torch.float32, device=device)
    a_scale32 = sigma32 / torch.sqrt(torch.tensor(float(plan.rank), dtype=torch.float32, device=device))
    if plan.layout.signs is not None:
        pick = lambda z: z                                                     # noqa: E731
        a_scale, b_scale = a_scale32.reshape(1), sigma32.reshape(1)            # (1,): every draw's + sign
    else:
        _, index, sign = member_layout(plan.pop, plan.antithetic, device)
        pick = lambda z: z[index]                                              # noqa: E731
        a_scale, b_scale = sign * a_scale32, sign * sigma32                    # (pop,)
    A: dict[str, torch.Tensor] = {}
    B: dict[str, torch.Tensor] = {}
    bias: dict[str, torch.Tensor] = {}
    for name, (_, z) in raw.items():
        if name.endswith(".weight"):
            in_dim = shapes[name][1]
            z = pick(z)                                                        # (rows, in + out, r)
            B[name] = r_major(z[:, :in_dim])                                  # (rows, in, r)
            A[name] = r_major(z[:, in_dim:] * a_scale[:, None, None])         # (rows, out, r)
        else:
            bias[name] = pick(z) * b_scale[:, None]                            # (rows, out)
    return Noise(A=A, B=B, bias=bias, signs=plan.layout.signs, bias_in_forward=plan.bias.in_forward)


def sample_noise(plan: NoisePlan, sources: Mapping[str, object], shapes: Mapping[str, tuple[int, ...]], epoch: int,
                 sigma: float, device: str | torch.device = "cpu") -> Noise:
    """Every member's low-rank weight factors and bias noise for `epoch` at noise scale `sigma` (draw, then scale)."""
    return scale(plan, draw(plan, sources, shapes, epoch, device), shapes, sigma, device)


def seed_sources(plan: NoisePlan, seed: int, shapes: Mapping[str, tuple[int, ...]]) -> dict[str, object]:
    """Every leaf's source for a run seed (the ES key tree under rng=jax): what `draw` and `sample_noise` take."""
    return plan.generator.leaf_sources(seed, leaf_names(n_layers_of(shapes)))


def shapes_of(params: Mapping[str, torch.Tensor]) -> dict[str, tuple[int, ...]]:
    """{name: shape} of a params dict."""
    return {name: tuple(p.shape) for name, p in params.items()}
