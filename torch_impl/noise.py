"""Low-rank ES noise for a whole population: the reference's key scheme, pairing and scaling, plus knobs.

For leaf base key k, draw index p and `true_epoch = 0 if noise_reuse == 0 else epoch // noise_reuse`:
`Z = normal(fold_in(fold_in(k, true_epoch), p), (in + out, r))`, `B = Z[:in]`, `A = Z[in:] * (+-sigma/sqrt(r))`;
a bias gets `normal(same key, (out,)) * (+-sigma)`. The `antithetic` knob decides which draw and sign each
member gets; `rng=torch` swaps the generator (same layout); `bias_noise` changes only the bias noise.
"""
from __future__ import annotations

from typing import Mapping, NamedTuple

import torch

from torch_impl.config import Config, check_pairing
from torch_impl.knobs import Knobs
from torch_impl.model import leaf_names, n_layers_of

# Purposes of the torch generator's seeds (rng=torch): one stream per (seed, purpose, ...).
PURPOSE_INIT, PURPOSE_WEIGHT, PURPOSE_BIAS, PURPOSE_ACTION = 1, 2, 3, 4
_MASK64 = (1 << 64) - 1


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

    # Keep sample_noise's r-major storage (see _r_major) in the expanded factors.
    return Noise(A={k: _r_major(expand(v)) for k, v in noise.A.items()},
                 B={k: _r_major(repeat(v)) for k, v in noise.B.items()},
                 bias={k: expand(v) for k, v in noise.bias.items()})


def jax_random():
    """The JAX-compatible generator module, or a clear error while it does not exist."""
    try:
        from torch_impl import random as rnd
    except ImportError as err:  # pragma: no cover - only before torch_impl/random.py lands
        raise RuntimeError(
            "rng=jax needs torch_impl.random (the JAX-compatible threefry generator), which is not available yet; "
            "use rng=torch meanwhile"
        ) from err
    return rnd


def torch_seed(*parts: int) -> int:
    """Mix integers into one 63-bit generator seed (splitmix64 per part): distinct tuples, unrelated streams."""
    state = 0x9E3779B97F4A7C15
    for part in parts:
        state = (state ^ (int(part) & _MASK64)) & _MASK64
        state = (state + 0x9E3779B97F4A7C15) & _MASK64
        z = state
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK64
        state = z ^ (z >> 31)
    return state >> 1


def torch_generator(device: str | torch.device, *parts: int) -> torch.Generator:
    """A fresh torch generator on `device`, seeded from (seed, purpose, ...): no global RNG state."""
    return torch.Generator(device=torch.device(device)).manual_seed(torch_seed(*parts))


def true_epoch(epoch: int, noise_reuse: int) -> int:
    """Which noise generation an epoch uses: 0 forever when noise_reuse == 0, else epoch // noise_reuse."""
    return 0 if noise_reuse == 0 else epoch // noise_reuse


def member_layout(pop: int, antithetic: str, device: str | torch.device = "cpu") -> tuple[int, torch.Tensor, torch.Tensor]:
    """(number of draws, draw index per member (pop,), sign per member (pop,) float32 +-1)."""
    check_pairing(pop, antithetic)
    member = torch.arange(pop, device=device)
    if antithetic == "interleaved":      # members 2p, 2p+1 share draw p: + then -
        return pop // 2, member // 2, torch.where(member % 2 == 0, 1.0, -1.0)
    if antithetic == "halves":           # members i, i + N/2 share draw i: + then -
        half = pop // 2
        return half, member % half, torch.where(member < half, 1.0, -1.0)
    if antithetic == "off":              # every member its own draw, all +
        return pop, member, torch.ones(pop, device=device)
    raise ValueError(f"unknown antithetic layout {antithetic!r}; allowed: interleaved, halves, off")


def es_tree_keys(seed: int, n_layers: int) -> dict[str, torch.Tensor]:
    """Leaf name -> base key (2,): split(es_key, n_leaves) in leaf order, es_key = split(key(seed), 3)[1]."""
    rnd = jax_random()
    es_key = rnd.split(rnd.key(seed), 3)[1]
    names = leaf_names(n_layers)
    keys = rnd.split(es_key, len(names))
    return {name: keys[i] for i, name in enumerate(names)}


def _draw_jax(base_key: torch.Tensor, generation: int, n_draws: int, shape: tuple[int, ...]) -> torch.Tensor:
    """normal(fold_in(fold_in(k, generation), p), shape) for p = 0..n_draws-1 in one batched call."""
    rnd = jax_random()
    keys = rnd.fold_in(rnd.fold_in(base_key, generation), torch.arange(n_draws))   # (n_draws, 2)
    return rnd.normal(keys, shape)                                                   # (n_draws, *shape)


def _draw_torch(seed: int, purpose: int, leaf: int, generation: int, n_draws: int, shape: tuple[int, ...],
                device: str | torch.device) -> torch.Tensor:
    """The same block from torch's generator seeded from (seed, purpose, leaf index, generation)."""
    gen = torch_generator(device, seed, purpose, leaf, generation)
    return torch.randn((n_draws, *shape), generator=gen, device=device, dtype=torch.float32)


def _r_major(t: torch.Tensor) -> torch.Tensor:
    """The same (pop, n, r) values with memory laid out as (pop, r, n)."""
    return t.transpose(1, 2).contiguous().transpose(1, 2)


def sample_noise(
    params: dict[str, torch.Tensor],
    cfg: Config,
    knobs: Knobs,
    seed: int | Mapping[str, torch.Tensor],   # run seed, or a precomputed key tree (leaf name -> key) for rng=jax
    epoch: int,
    sigma: float,
    device: str | torch.device = "cpu",
    cache: dict | None = None,
) -> Noise:
    """Every member's low-rank weight factors and bias noise for `epoch` at noise scale `sigma`.

    Grouped by draw (see Noise) for antithetic=interleaved and off; per member for halves. `per_member`
    expands either form.

    `cache`: an optional dict the caller keeps between epochs; a leaf whose draws are those of the previous
    call (same generation, e.g. always with noise_reuse=0) is then not drawn again. Same numbers either way.
    """
    if cfg.rank < 1:
        raise ValueError(f"rank must be >= 1 (the number of columns of A and B), got {cfg.rank}")
    if epoch < 0:
        raise ValueError(f"epoch must be >= 0, got {epoch}")
    n_layers = n_layers_of(params)
    names = leaf_names(n_layers)
    n_draws, index, sign = member_layout(cfg.pop, knobs.antithetic, device)
    r = cfg.rank
    generation = true_epoch(epoch, knobs.noise_reuse)
    bias_generation = epoch if knobs.bias_noise == "fresh" else generation
    if knobs.rng == "jax":
        keys = es_tree_keys(seed, n_layers) if isinstance(seed, int) else dict(seed)
        missing = sorted(set(names) - set(keys))
        if missing:
            raise ValueError(f"key tree lacks leaves {missing}; expected keys for {names}")
    elif not isinstance(seed, int):
        raise ValueError("rng=torch needs an integer run seed, not a key tree")

    def draw(leaf: int, name: str, gen: int, shape: tuple[int, ...]) -> torch.Tensor:   # (n_draws, *shape)
        source = tuple(keys[name].tolist()) if knobs.rng == "jax" else seed
        tag = (knobs.rng, source, gen, n_draws, shape, str(device))
        if cache is not None and name in cache and cache[name][0] == tag:
            return cache[name][1]
        if knobs.rng == "jax":
            z = _draw_jax(keys[name], gen, n_draws, shape).to(device)
        else:
            purpose = PURPOSE_WEIGHT if name.endswith(".weight") else PURPOSE_BIAS
            z = _draw_torch(seed, purpose, leaf, gen, n_draws, shape, device)
        if cache is not None:
            cache[name] = (tag, z)
        return z

    # The reference's scales in float32: sigma / sqrt(r) on A, sigma on biases, sign by member.
    sigma32 = torch.tensor(sigma, dtype=torch.float32, device=device)
    a_scale32 = sigma32 / torch.sqrt(torch.tensor(float(r), dtype=torch.float32, device=device))
    # interleaved: members 2p, 2p+1 are draw p times (+1, -1); off: member m is draw m. Both are stored per
    # draw (grouped, read once per pair). halves pairs members N/2 apart, so it is expanded per member.
    grouped = {"interleaved": (1.0, -1.0), "off": (1.0,)}.get(knobs.antithetic)
    if grouped is not None:
        signs = grouped
        pick = lambda z: z                                                     # noqa: E731
        a_scale, b_scale = a_scale32.reshape(1), sigma32.reshape(1)            # (1,): every draw's + sign
    else:
        signs = None
        pick = lambda z: z[index]                                              # noqa: E731
        a_scale, b_scale = sign * a_scale32, sign * sigma32                    # (pop,)

    A: dict[str, torch.Tensor] = {}
    B: dict[str, torch.Tensor] = {}
    bias: dict[str, torch.Tensor] = {}
    for leaf, name in enumerate(names):
        out_dim, in_dim = params[name.replace(".bias", ".weight")].shape
        if name.endswith(".weight"):
            z = pick(draw(leaf, name, generation, (in_dim + out_dim, r)))     # (rows, in + out, r)
            # Shapes (rows, in, r) and (rows, out, r), stored r-major (a transposed view of (rows, r, n)):
            # the forward's batched products read them contiguously. Values are unaffected.
            B[name] = _r_major(z[:, :in_dim])                                # (rows, in, r)
            A[name] = _r_major(z[:, in_dim:] * a_scale[:, None, None])       # (rows, out, r)
        elif knobs.bias_noise != "off":
            eps = pick(draw(leaf, name, bias_generation, (out_dim,)))        # (rows, out)
            bias[name] = eps * b_scale[:, None]
    return Noise(A=A, B=B, bias=bias, signs=signs)
