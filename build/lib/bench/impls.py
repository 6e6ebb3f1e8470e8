"""Comparison implementations of the population forward, each computing torch_impl's numbers.

All take the torch param dict (`"{l}.weight"` (out, in), `"{l}.bias"` (out,)), inputs
x (pop, in) or (pop, batch, in), and a Noise-like object with dicts `A` (pop, out, r),
`B` (pop, in, r) and `bias` (pop, out) (or {} for no bias noise), and return the
population's outputs (pop, out) or (pop, batch, out):

- `hooks`: the object-oriented style the functional design replaced: an nn.Sequential of
  nn.Linear whose forward hooks, registered by a context manager entered per call, look the
  layer's factors up in a dict and add the batched low-rank term;
- `materialized`: forms every member's W + A_i B_i^T, then one batched matmul;
- `loop`: a Python loop over members (small populations only).
"""
from __future__ import annotations

import contextlib
from typing import Callable, Iterator, Mapping

import torch
from torch import nn

from spec.layout import n_layers_of
from torch_impl.model import activation_of

def activation_fn(name: str) -> Callable[[torch.Tensor], torch.Tensor]:
    """torch_impl's own activation kernel by knob name (model.ACTIVATIONS): every implementation here uses it,
    so the ratios measure the style of the forward, not the activation's kernel."""
    return activation_of(name).fn


def n_layers(params: Mapping[str, torch.Tensor]) -> int:
    """Number of Linear layers in a torch param dict (`"{l}.weight"` and `"{l}.bias"` for l = 0..L-1)."""
    return n_layers_of(params)


def _as_batched(x: torch.Tensor) -> tuple[torch.Tensor, bool]:
    """x (pop, in) -> (pop, 1, in) and a flag to squeeze back; (pop, batch, in) unchanged."""
    if x.dim() == 2:
        return x.unsqueeze(1), True
    if x.dim() == 3:
        return x, False
    raise ValueError(f"x must be (pop, in) or (pop, batch, in), got shape {tuple(x.shape)}")


def _check_pop(x: torch.Tensor, noise) -> None:
    a0 = noise.A["0.weight"]
    if x.shape[0] != a0.shape[0]:
        raise ValueError(f"x has population {x.shape[0]} but the noise has {a0.shape[0]} members")


# --- hooks: nn.Sequential of nn.Linear, low-rank term added by forward hooks ------------------

class _Activation(nn.Module):
    """torch_impl's own activation code, so that the hooks ratio measures the style, not the activation."""

    def __init__(self, name: str):
        super().__init__()
        self.fn = activation_fn(name)   # rejects unknown names

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return self.fn(h)


def build_module(params: Mapping[str, torch.Tensor], activation: str) -> nn.Sequential:
    """nn.Sequential(Linear, act, Linear, act, ..., Linear) sharing the param dict's storage."""
    layers: list[nn.Module] = []
    n = n_layers(params)
    for l in range(n):
        w = params[f"{l}.weight"]
        lin = nn.Linear(w.shape[1], w.shape[0], bias=f"{l}.bias" in params, device=w.device, dtype=w.dtype)
        lin.weight = nn.Parameter(w.detach(), requires_grad=False)
        if f"{l}.bias" in params:
            lin.bias = nn.Parameter(params[f"{l}.bias"].detach(), requires_grad=False)
        layers.append(lin)
        if l < n - 1:
            layers.append(_Activation(activation))
    return nn.Sequential(*layers)


def _linear_names(module: nn.Sequential) -> dict[nn.Linear, int]:
    """Each nn.Linear of the Sequential -> its layer index l (the key of its factors)."""
    return {m: l for l, m in enumerate(m for m in module if isinstance(m, nn.Linear))}


@contextlib.contextmanager
def perturbed(module: nn.Sequential, noise) -> Iterator[nn.Sequential]:
    """Register, for the duration of the block, a hook per nn.Linear adding its member noise."""
    index = _linear_names(module)

    def hook(lin: nn.Linear, inputs: tuple[torch.Tensor, ...], out: torch.Tensor) -> torch.Tensor:
        l = index[lin]
        A, B = noise.A[f"{l}.weight"], noise.B[f"{l}.weight"]   # (pop, out, r), (pop, in, r)
        x3, _ = _as_batched(inputs[0])                            # (pop, batch, in)
        out3 = out.view(x3.shape[0], x3.shape[1], -1)             # the Linear's fresh output, (pop, batch, out)
        out3.baddbmm_(torch.bmm(x3, B), A.transpose(1, 2))        # += (x B) A^T, in place
        bias = noise.bias.get(f"{l}.bias")
        if bias is not None:
            out3 += bias.unsqueeze(1)
        return out

    handles = [lin.register_forward_hook(hook) for lin in index]
    try:
        yield module
    finally:
        for h in handles:
            h.remove()


def hooks_forward(module: nn.Sequential, x: torch.Tensor, noise) -> torch.Tensor:
    """One population forward in the hooks style: enter the context, call the module."""
    _check_pop(x, noise)
    with perturbed(module, noise):
        return module(x)


# --- materialized: W + A_i B_i^T per member -----------------------------------------------------

def materialized_forward(params: Mapping[str, torch.Tensor], x: torch.Tensor, noise,
                         activation: str) -> torch.Tensor:
    """Form each member's perturbed weight (pop, out, in), then one bmm per layer."""
    _check_pop(x, noise)
    act = activation_fn(activation)
    h, squeeze = _as_batched(x)                                   # (pop, batch, in)
    n = n_layers(params)
    for l in range(n):
        A, B = noise.A[f"{l}.weight"], noise.B[f"{l}.weight"]
        w = params[f"{l}.weight"] + torch.bmm(A, B.transpose(1, 2))   # (pop, out, in)
        h = torch.bmm(h, w.transpose(1, 2))                           # (pop, batch, out)
        if f"{l}.bias" in params:
            h = h + params[f"{l}.bias"]
        if f"{l}.bias" in noise.bias:
            h = h + noise.bias[f"{l}.bias"].unsqueeze(1)
        if l < n - 1:
            h = act(h)
    return h.squeeze(1) if squeeze else h


# --- loop: one member at a time ----------------------------------------------------------------

def loop_forward(params: Mapping[str, torch.Tensor], x: torch.Tensor, noise,
                 activation: str) -> torch.Tensor:
    """A Python loop over members, each through x W^T + (x B_i) A_i^T + b + bias_i."""
    _check_pop(x, noise)
    act = activation_fn(activation)
    n = n_layers(params)
    outs = []
    for i in range(x.shape[0]):
        h = x[i]                                                  # (in,) or (batch, in)
        for l in range(n):
            A, B = noise.A[f"{l}.weight"][i], noise.B[f"{l}.weight"][i]   # (out, r), (in, r)
            h = h @ params[f"{l}.weight"].T + (h @ B) @ A.T
            if f"{l}.bias" in params:
                h = h + params[f"{l}.bias"]
            if f"{l}.bias" in noise.bias:
                h = h + noise.bias[f"{l}.bias"][i]
            if l < n - 1:
                h = act(h)
        outs.append(h)
    return torch.stack(outs)
