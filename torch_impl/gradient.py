"""The ES gradient estimate from shaped fitness and the population's noise, in the reference's convention.

Ascent direction, before the sqrt(N) factor: the optimizer later receives -(g * sqrt(N)).
"""
from __future__ import annotations

import torch

from torch_impl.knobs import Knobs
from torch_impl.noise import Noise


def es_gradient(
    noise: Noise,
    shaped: torch.Tensor,            # (pop,) shaped fitness
    sigma: float,
    knobs: Knobs,
    params: dict[str, torch.Tensor],
) -> dict[str, torch.Tensor]:
    """name -> gradient estimate shaped like the param.

    weight: einsum('nir,njr->ij', f * A, B) / N (A already carries +-sigma/sqrt(r));
    bias:   mean_n(f_n * bias_noise_n) (noise already carries +-sigma), divided once more by sigma
            when bias_grad=over_sigma; a leaf without noise gets zeros.
    """
    pop = shaped.shape[0]
    if shaped.dim() != 1:
        raise ValueError(f"shaped fitness must have shape (pop,), got {tuple(shaped.shape)}")
    grads: dict[str, torch.Tensor] = {}
    for name, p in params.items():
        if name in noise.A:
            a_f, b_f = noise.A[name], noise.B[name]                           # (pop, out, r), (pop, in, r)
            if a_f.shape[0] != pop:
                raise ValueError(f"fitness has {pop} entries but the noise of {name} is for {a_f.shape[0]} members")
            weighted = shaped.to(a_f.dtype)[:, None, None] * a_f               # (pop, out, r)
            grads[name] = torch.einsum("nir,njr->ij", weighted, b_f) / pop     # (out, in)
        elif name in noise.bias:
            eps = noise.bias[name]                                             # (pop, out)
            if eps.shape[0] != pop:
                raise ValueError(f"fitness has {pop} entries but the noise of {name} is for {eps.shape[0]} members")
            g = (shaped.to(eps.dtype)[:, None] * eps).mean(dim=0)              # (out,)
            if knobs.bias_grad == "over_sigma":
                g = g / torch.tensor(sigma, dtype=g.dtype, device=g.device)
            grads[name] = g
        else:
            grads[name] = torch.zeros_like(p)
    return grads
