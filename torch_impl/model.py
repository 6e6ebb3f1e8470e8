"""The policy MLP as plain tensors: init, activations and the batched low-rank forward.

Params are a `dict[str, Tensor]` with `"{layer}.weight"` (out, in) and `"{layer}.bias"` (out,).
The forward runs the whole population at once: member i sees `W + A_i @ B_i^T` through
`x @ W^T + (x @ B_i) @ A_i^T`, so the (out x in) perturbation is never formed.
`ACTIVATIONS` (knob activation) and `INITS` (knob init) are the tables the knobs resolve through.
"""
from __future__ import annotations

import functools
import math
from typing import Callable, NamedTuple, Sequence

import torch

from spec.layout import n_layers_of
from torch_impl.keys import Generator
from torch_impl.noise import Noise, group_size, population_of

LN_EPS = 1e-5  # the reference's parameter-free layer norm
Params = dict[str, torch.Tensor]


# ----------------------------------------------------------------------------- init
def init_reference(sizes: Sequence[int], generator: Generator, seed: int) -> Params:
    """The reference's MLP.rand_init recipe: weight normal(out, in) / sqrt(in) from the run's generator, zero bias.

    With rng=jax the normals are MLP.rand_init(model_key)'s, bit for bit.
    """
    dims = [(fan_out, fan_in) for fan_in, fan_out in zip(sizes[:-1], sizes[1:])]
    normals = generator.init_normals(seed, dims)
    params: Params = {}
    for t, (fan_out, fan_in) in enumerate(dims):
        # The reference: scale = 1 / sqrt(in) in float32, then normal * scale.
        scale = 1.0 / torch.sqrt(torch.tensor(float(fan_in), dtype=torch.float32))
        params[f"{t}.weight"] = normals[t].to(torch.float32).cpu() * scale
        params[f"{t}.bias"] = torch.zeros(fan_out, dtype=torch.float32)
    return params


def init_torch(sizes: Sequence[int], generator: Generator, seed: int) -> Params:
    """nn.Linear's default (kaiming-uniform weight, uniform bias, both +-1/sqrt(in)), drawn layer by layer from
    a torch.Generator seeded with the run seed, as `torch.manual_seed(seed)` then building the Linears would."""
    gen = torch.Generator(device="cpu").manual_seed(seed)
    params: Params = {}
    for t, (fan_in, fan_out) in enumerate(zip(sizes[:-1], sizes[1:])):
        weight = torch.empty(fan_out, fan_in)
        torch.nn.init.kaiming_uniform_(weight, a=math.sqrt(5), generator=gen)
        bound = 1.0 / math.sqrt(fan_in)
        bias = torch.empty(fan_out).uniform_(-bound, bound, generator=gen)
        params[f"{t}.weight"], params[f"{t}.bias"] = weight, bias
    return params


NORMAL_INIT_STD = 0.1   # init=normal: the later functional port's fixed weight std


def init_normal(sizes: Sequence[int], generator: Generator, seed: int) -> Params:
    """Weights normal with std 0.1 whatever the fan-in (the later functional port), zero biases; the normals are
    the run's generator's, as for the reference's init."""
    dims = [(fan_out, fan_in) for fan_in, fan_out in zip(sizes[:-1], sizes[1:])]
    normals = generator.init_normals(seed, dims)
    std = torch.tensor(NORMAL_INIT_STD, dtype=torch.float32)
    params: Params = {}
    for t, (fan_out, _) in enumerate(dims):
        params[f"{t}.weight"] = normals[t].to(torch.float32).cpu() * std
        params[f"{t}.bias"] = torch.zeros(fan_out, dtype=torch.float32)
    return params


INITS: dict[str, Callable[[Sequence[int], Generator, int], Params]] = {
    "jax": init_reference,
    "torch": init_torch,
    "normal": init_normal,
}


def init_params(sizes: Sequence[int], init: str, generator: Generator, seed: int,
                device: str | torch.device = "cpu") -> Params:
    """Initial float32 params for layer widths `sizes` by the init named `init`, on `device`."""
    if not isinstance(seed, int) or isinstance(seed, bool):
        raise ValueError(f"the init needs an integer run seed, got {seed!r}")
    return {name: p.to(device) for name, p in INITS[init](sizes, generator, seed).items()}


# ----------------------------------------------------------------------------- activations
def _pqn(x: torch.Tensor) -> torch.Tensor:
    """relu(layer_norm(x)) with a parameter-free layer norm (ddof 0, eps 1e-5).

    group_norm with one group over (rows, 1, n) is the layer norm over n: (x - mean) * rsqrt(var + eps), the
    reference's (x - mean) / sqrt(var + eps) up to float32 rounding. On the CPU it runs about 3x faster than
    F.layer_norm at (2048, 256) (0.17 vs 0.48 ms, 2 threads), the biggest cost after the matmuls.
    """
    n = x.shape[-1]
    return torch.nn.functional.group_norm(x.reshape(-1, 1, n), 1, eps=LN_EPS).view(x.shape).relu_()


class Activation(NamedTuple):
    """A hidden activation: `fn(x)` and `inplace(x)`, which may overwrite x (a fresh tensor the caller owns)."""

    fn: Callable[[torch.Tensor], torch.Tensor]
    inplace: Callable[[torch.Tensor], torch.Tensor]


ACTIVATIONS: dict[str, Activation] = {
    "pqn": Activation(_pqn, _pqn),
    "tanh": Activation(torch.tanh, torch.Tensor.tanh_),
    "relu": Activation(torch.relu, torch.Tensor.relu_),
}


def activation_of(name: str) -> Activation:
    """The table's entry, or a ValueError naming the allowed activations."""
    if name not in ACTIVATIONS:
        raise ValueError(f"unknown activation {name!r}; allowed: {', '.join(ACTIVATIONS)}")
    return ACTIVATIONS[name]


def activate(x: torch.Tensor, activation: str) -> torch.Tensor:
    """The hidden activation `activation` applied to x (x is not modified)."""
    return activation_of(activation).fn(x)


# ----------------------------------------------------------------------------- matmul precision
def tf32_round(t: torch.Tensor) -> torch.Tensor:
    """float32 values rounded to TF32 (10 mantissa bits, round to nearest even), as a TF32 matmul rounds its
    inputs before multiplying; products and sums stay float32."""
    i = t.contiguous().view(torch.int32)
    lsb = (i >> 13) & 1
    return ((i + 0xFFF + lsb) & ~0x1FFF).view(torch.float32)


def _tf32_on_cuda(x: torch.Tensor) -> bool:
    return x.device.type == "cuda"


class Precision(NamedTuple):
    """A matmul precision: how operands are rounded on a CPU (None: not at all) and whether CUDA may use TF32."""

    cpu_round: Callable[[torch.Tensor], torch.Tensor] | None
    cuda_tf32: bool


PRECISIONS: dict[str, Precision] = {
    "highest": Precision(None, False),
    "high": Precision(tf32_round, True),
}


# ----------------------------------------------------------------------------- forward
@functools.lru_cache(maxsize=16)
def _sign_tensor(signs: tuple[float, ...], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """Grouped noise's signs as a (k,) tensor, made once per (signs, dtype, device): forward is called
    every environment step and this would otherwise be a host-to-device copy per call."""
    return torch.tensor(signs, dtype=dtype, device=device)


def forward(
    params: Params,
    x: torch.Tensor,                 # (pop, in) or (pop, batch, in)
    noise: Noise | None = None,
    activation: str = "pqn",
    precision: str = "highest",
) -> torch.Tensor:                   # (pop, out) or (pop, batch, out)
    """Every member's perturbed MLP in one batched call per layer; the plain MLP when `noise` is None.

    Per layer, as the reference: `x @ W^T + (x @ B) @ A^T + b + bias noise` (summed in another order,
    within float32 rounding). Per layer: addmm (shared product and b), bmm (B^T x^T), in-place baddbmm
    (+ (x B) A^T), in-place bias-noise add, the activation. Grouped noise (Noise.signs) is read once per
    draw: the k members of a group go through one bmm with that draw's factors, and the negative
    members' (x B) and bias noise change sign (one small in-place kernel each).
    `precision` (knob matmul_precision): "high" runs the matmuls as TF32, on CUDA by its TF32 mode, on a CPU
    by rounding every matmul operand to TF32 first.
    """
    mode = PRECISIONS[precision]
    if mode.cuda_tf32 and _tf32_on_cuda(x):
        previous = torch.backends.cuda.matmul.allow_tf32
        torch.backends.cuda.matmul.allow_tf32 = True
        try:
            return forward(params, x, noise, activation)
        finally:
            torch.backends.cuda.matmul.allow_tf32 = previous
    rnd = mode.cpu_round or (lambda t: t)
    n_layers = n_layers_of(params)
    if x.dim() not in (2, 3):
        raise ValueError(f"x must be (pop, in) or (pop, batch, in), got shape {tuple(x.shape)}")
    act = activation_of(activation).inplace
    pop = x.shape[0]
    batch = 1 if x.dim() == 2 else x.shape[1]
    k, signs = 1, (1.0,)
    if noise is not None:
        k, noise_pop = group_size(noise), population_of(noise)
        if noise_pop is not None and noise_pop != pop:
            raise ValueError(f"x has {pop} rows but the noise is for a population of {noise_pop}")
        signs = noise.signs or (1.0,)
    draws = pop // k
    sign_t = None if all(s == 1.0 for s in signs) else _sign_tensor(signs, x.dtype, x.device)   # (k,)
    h = x.reshape(pop * batch, x.shape[-1]).contiguous()                 # (pop batch, in)
    for t in range(n_layers):
        w, b = params[f"{t}.weight"], params[f"{t}.bias"]               # (out, in), (out,)
        if h.shape[-1] != w.shape[1]:
            raise ValueError(f"layer {t} expects {w.shape[1]} inputs, got {h.shape[-1]}")
        h = rnd(h) if mode.cpu_round else h
        out = torch.addmm(b, h, rnd(w).T)                                # (pop batch, out)
        a_f = None if noise is None else noise.A.get(f"{t}.weight")
        if a_f is not None:
            b_f = noise.B[f"{t}.weight"]                                 # (draws, in, r); a_f (draws, out, r)
            if mode.cpu_round:
                a_f, b_f = rnd(a_f), rnd(b_f)
            # The k members of a draw share its factors: rows grouped as (draws, k batch, in). B^T @ h^T
            # (draws, r, k batch) is ~25% faster on the CPU than h @ B and reads the r-major B contiguously.
            low = torch.bmm(b_f.transpose(1, 2), h.view(draws, k * batch, -1).transpose(1, 2))
            for j, s in enumerate(signs):
                if s != 1.0:                                             # member j of each group: exact -1
                    (low[:, :, j] if batch == 1 else low.view(draws, -1, k, batch)[:, :, j]).neg_()
            low = rnd(low) if mode.cpu_round else low
            out.view(draws, k * batch, -1).baddbmm_(low.transpose(1, 2), a_f.transpose(1, 2))   # += (x B) A^T
        eps = None if noise is None or not noise.bias_in_forward else noise.bias.get(f"{t}.bias")   # (draws, out)
        if eps is not None:
            # (draws, k, [batch,] out): 3-d when batch is 1, where broadcasting runs faster.
            grouped = (draws, k, -1) if batch == 1 else (draws, k, batch, -1)
            eps_g = eps.view(draws, 1, -1) if batch == 1 else eps.view(draws, 1, 1, -1)
            if sign_t is None:
                out.view(grouped).add_(eps_g)
            else:
                out.view(grouped).addcmul_(eps_g, sign_t.view(1, k, *([1] * (len(grouped) - 2))))   # + s eps, exact
        h = act(out) if t < n_layers - 1 else out
    return h.view(pop, -1) if x.dim() == 2 else h.view(pop, batch, -1)


def _compiled(fn: Callable) -> Callable:
    """fn torch.compile'd with dynamic shapes and without duck sizing: by default dynamo assumes two sizes that are
    equal on the first call (pop 4 and in 4) always are, and compiles again when they part (the selftest suite
    compiled 5 graphs where 3 serve it: 39.1 -> 32.1 s on two cores)."""
    compiled = torch.compile(fn, dynamic=True)
    try:
        from torch.fx.experimental import _config as fx_config
    except ImportError:
        return compiled
    if not hasattr(fx_config, "use_duck_shape"):               # in the pinned torch; another: its duck sizing
        return compiled

    @functools.wraps(fn)
    def call(*args, **kwargs):
        duck = fx_config.use_duck_shape     # set and restored, not fx_config.patch: 3.7 against 18.5 us a call here
        fx_config.use_duck_shape = False
        try:
            return compiled(*args, **kwargs)
        finally:
            fx_config.use_duck_shape = duck
    return call


COMPILERS: dict[str, Callable[[Callable], Callable]] = {
    "off": lambda fn: fn,
    "on": _compiled,
}


@functools.lru_cache(maxsize=32)
def make_forward(activation: str = "pqn", precision: str = "highest", compile: str = "off") -> Callable:
    """forward(params, x, noise) with the knobs activation, matmul_precision and compile resolved once."""
    activation_of(activation)
    if precision not in PRECISIONS or compile not in COMPILERS:
        raise ValueError(f"matmul_precision must be one of {', '.join(PRECISIONS)} and compile one of "
                         f"{', '.join(COMPILERS)}; got {precision!r}, {compile!r}")
    return COMPILERS[compile](functools.partial(forward, activation=activation, precision=precision))
