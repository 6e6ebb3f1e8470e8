"""The ES gradient estimate from shaped fitness and the population's noise, in the reference's convention.

Ascent direction, before the sqrt(N) factor: the optimizer later receives -(g * sqrt(N)).
`BIAS_GRADS` (knob bias_grad) is the table of bias-gradient scalings.
"""
from __future__ import annotations

from typing import Callable

import torch

from torch_impl.noise import Noise, group_size, population_of


def _over_sigma(g: torch.Tensor, sigma: float) -> torch.Tensor:
    return g / torch.tensor(sigma, dtype=g.dtype, device=g.device)


# knob bias_grad -> (bias gradient, sigma) -> the gradient the port uses
BIAS_GRADS: dict[str, Callable[[torch.Tensor, float], torch.Tensor]] = {
    "jax": lambda g, sigma: g,
    "over_sigma": _over_sigma,      # divided by sigma once more (the published OOP port)
}


def es_gradient(
    noise: Noise,
    shaped: torch.Tensor,            # (pop,) shaped fitness
    sigma: float,
    params: dict[str, torch.Tensor],
    bias_grad: str = "jax",
) -> dict[str, torch.Tensor]:
    """name -> gradient estimate shaped like the param.

    weight: sum_n f_n A_n B_n^T / N (A already carries +-sigma/sqrt(r));
    bias:   mean_n(f_n * bias_noise_n) (noise already carries +-sigma), then BIAS_GRADS[bias_grad];
            a leaf without noise gets zeros.
    Grouped noise is summed per draw: w_d = sum_j signs_j f_{d k + j} (f_2p - f_2p+1 for antithetic
    pairs), then sum_d w_d A_d B_d^T / N, half the work of the per-member sum.
    """
    pop = shaped.shape[0]
    if shaped.dim() != 1:
        raise ValueError(f"shaped fitness must have shape (pop,), got {tuple(shaped.shape)}")
    noise_pop = population_of(noise)
    if noise_pop is not None and noise_pop != pop:
        raise ValueError(f"fitness has {pop} entries but the noise is for {noise_pop} members")
    scale_bias = BIAS_GRADS[bias_grad]
    k = group_size(noise)
    weight = shaped.to(torch.float32)                                          # (pop,)
    if noise.signs is not None:
        signs = torch.tensor(noise.signs, dtype=weight.dtype, device=weight.device)
        weight = (weight.view(pop // k, k) * signs).sum(dim=1)                 # (draws,)
    grads: dict[str, torch.Tensor] = {}
    for name, p in params.items():
        if name in noise.A:
            a_f, b_f = noise.A[name], noise.B[name]                           # (draws, out, r), (draws, in, r)
            weighted = weight.to(a_f.dtype)[:, None, None] * a_f               # (draws, out, r)
            grads[name] = torch.einsum("nir,njr->ij", weighted, b_f) / pop     # (out, in)
        elif name in noise.bias:
            eps = noise.bias[name]                                             # (draws, out)
            g = (weight.to(eps.dtype)[:, None] * eps).sum(dim=0) / pop         # (out,)
            grads[name] = scale_bias(g, sigma)
        else:
            grads[name] = torch.zeros_like(p)
    return grads
