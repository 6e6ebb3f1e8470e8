"""What every torch adapter here needs: the user's MLP in protocol names, numpy <-> torch at the boundary, dense
per-member perturbations from protocol factors, the packages' factor layout, and a recorder of their draws.

The ports take a user's `nn.Module`; none has an activation or an init of its own (hyperfunc's auto-init aside).
The adapters therefore build the user's model as the reference's network by default (`pqn` activation,
normal/sqrt(in) weights and zero biases, drawn with torch's generator), so that what the suite finds is the
package's own; `README_MODEL` is the model of the packages' READMEs (ReLU, nn.Linear's default init).
"""
from __future__ import annotations

import contextlib
import importlib.metadata
import math
from typing import Mapping, NamedTuple

import numpy as np
import torch
from torch import nn

from ports._noise import noise_shapes, same_noise, select  # noqa: F401  (the adapters' one import)


class UserModel(NamedTuple):
    """The user's network around a port: hidden activation and init (names of the knob table)."""

    activation: str = "pqn"
    init: str = "jax"

    def label(self) -> str:
        return f"{self.activation}, {'normal/sqrt(in)' if self.init == 'jax' else self.init} init"


REFERENCE_NETWORK = UserModel("pqn", "jax")
README_MODEL = UserModel("relu", "torch")


def _pqn(x: torch.Tensor) -> torch.Tensor:
    """relu(layer_norm(x)) with a parameter-free layer norm (population variance, eps 1e-5): the reference's."""
    return torch.relu(nn.functional.layer_norm(x, x.shape[-1:], eps=1e-5))


ACTIVATIONS = {"pqn": _pqn, "relu": torch.relu, "tanh": torch.tanh}


def installed(dist: str) -> str:
    """The installed version of a distribution, or 'not installed'."""
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


# ----------------------------------------------------------------------------- names and shapes
def n_layers(shapes: Mapping[str, tuple]) -> int:
    return sum(k.endswith(".weight") for k in shapes)


def layer_sizes(shapes: Mapping[str, tuple]) -> list[int]:
    """[in, h1, ..., out] from protocol shapes {"t.weight": (out, in), "t.bias": (out,)}."""
    return [int(shapes["0.weight"][1])] + [int(shapes[f"{t}.weight"][0]) for t in range(n_layers(shapes))]


def module_order(shapes: Mapping[str, tuple]) -> list[str]:
    """Parameter names in nn.Module registration order (layer by layer, weight then bias): the order the packages
    enumerate `named_parameters()` in, hence their per-leaf seed index (not JAX's sorted order)."""
    names = []
    for t in range(n_layers(shapes)):
        names += [f"{t}.weight"] + ([f"{t}.bias"] if f"{t}.bias" in shapes else [])
    return names


def shapes_of(params: Mapping[str, np.ndarray]) -> dict[str, tuple]:
    return {k: tuple(np.shape(v)) for k, v in params.items()}


# ----------------------------------------------------------------------------- the user's model
class MLP(nn.Module):
    """nn.Linear layers registered as "0", "1", ... so that state_dict names are the protocol's."""

    def __init__(self, sizes: list[int], activation: str = "pqn"):
        super().__init__()
        for i, (a, b) in enumerate(zip(sizes[:-1], sizes[1:])):
            self.add_module(str(i), nn.Linear(a, b))
        self.n = len(sizes) - 1
        self.act = ACTIVATIONS[activation]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for i in range(self.n):
            x = getattr(self, str(i))(x)
            if i < self.n - 1:
                x = self.act(x)
        return x


def user_model(shapes: Mapping[str, tuple], params: Mapping | None = None, model: UserModel = REFERENCE_NETWORK,
               seed: int | None = None) -> MLP:
    """The user's MLP, with `params` copied in, or initialised from `seed` (torch's global generator forked, so
    nothing outside is disturbed): init "torch" is nn.Linear's default, "jax" normal/sqrt(in) with zero biases."""
    with torch.random.fork_rng(devices=[]):
        if seed is not None:
            torch.manual_seed(int(seed))
        net = MLP(layer_sizes(shapes), model.activation)
        if params is None and model.init == "jax":
            with torch.no_grad():
                for k, v in net.named_parameters():
                    v.copy_(torch.randn(v.shape) / math.sqrt(v.shape[1]) if v.ndim == 2 else torch.zeros(v.shape))
    if params is not None:
        with torch.no_grad():
            for k, v in net.named_parameters():
                v.copy_(tensor(params[k]))
    return net.requires_grad_(True)


# ----------------------------------------------------------------------------- arrays at the boundary
def tensor(x, dtype=torch.float32) -> torch.Tensor:
    """A torch copy of a numpy array (the suite's arrays may be read-only views)."""
    return torch.from_numpy(np.array(x, copy=True)).to(dtype)


def to_numpy(tree: Mapping) -> dict:
    """{name: tensor or (A, B)} -> numpy float32, as the protocol wants."""
    def one(t):
        return t.detach().cpu().numpy().astype(np.float32)
    return {k: tuple(one(t) for t in v) if isinstance(v, tuple) else one(v) for k, v in tree.items()}


def dense(noise: Mapping, shapes: Mapping[str, tuple] | None = None, m: int | None = None,
          dtype=torch.float32) -> dict[str, torch.Tensor]:
    """Protocol noise -> {name: (m, *shape) perturbation}: A_i B_i^T for weights, eps for biases; with shapes and m,
    zeros for the leaves the noise leaves out (a port that perturbs every leaf gets no noise there)."""
    out = {k: (tensor(v[0], dtype) @ tensor(v[1], dtype).transpose(1, 2) if isinstance(v, tuple) else tensor(v, dtype))
           for k, v in noise.items()}
    for k, s in (shapes or {}).items():
        out.setdefault(k, torch.zeros((m,) + tuple(s), dtype=dtype))
    return out


# ----------------------------------------------------------------------------- the packages' factors
def pad_rank(x: torch.Tensor, rank: int) -> torch.Tensor:
    """(..., r_eff) -> (..., rank) with zero columns (A B^T unchanged): torcheggroll and hyperfunc clip the rank to
    min(rank, out, in), the protocol wants `rank` columns."""
    if x.shape[-1] > rank:
        raise ValueError(f"a draw has {x.shape[-1]} columns, more than rank {rank}")
    return x if x.shape[-1] == rank else torch.cat([x, x.new_zeros(x.shape[:-1] + (rank - x.shape[-1],))], dim=-1)


def factors_of_draw(z: torch.Tensor, n_in: int, sigma: float, rank: int) -> tuple[torch.Tensor, torch.Tensor]:
    """torcheggroll's draw z = randn(out + in, r_eff) per member (es.py:114-121 of torcheggroll 0.2.0):
    B = z[:in], A = z[in:] * sigma / sqrt(r_eff), both padded to `rank` columns."""
    r_eff = z.shape[-1]
    return pad_rank(z[..., n_in:, :] * (sigma / math.sqrt(r_eff)), rank), pad_rank(z[..., :n_in, :], rank)


@contextlib.contextmanager
def record_randn():
    """Record every torch.randn(..., generator=g) result made inside (the packages call torch.randn through the
    torch module, so their draws are seen unchanged); restores torch.randn on exit."""
    calls: list[torch.Tensor] = []
    original = torch.randn

    def recording(*args, **kwargs):
        out = original(*args, **kwargs)
        if kwargs.get("generator") is not None:
            calls.append(out)
        return out

    torch.randn = recording
    try:
        yield calls
    finally:
        torch.randn = original


def unit_rows(n: int, start: int, stop: int) -> torch.Tensor:
    """(n, stop - start) float64: member i's row is 1 at column i - start, else 0. As the noise of a 1-D leaf, it
    makes an ES update read back each member's shaped fitness (sum_i f_i e_i = f), exactly in float64."""
    rows = torch.zeros(n, stop - start, dtype=torch.float64)
    idx = torch.arange(start, stop)
    rows[idx, idx - start] = 1.0
    return rows


def read_back(update, n: int, chunk: int = 512) -> np.ndarray:
    """The shaped fitness a package's update used: `update(noise (n, k) float64) -> (k,) float64` returns
    sqrt(n) * mean_i(f_i * noise_i) (base 0, lr 1), so f = update * sqrt(n) over unit rows, `chunk` members at
    a time (the memory of an (n, n) identity is not needed)."""
    parts = [update(unit_rows(n, a, min(a + chunk, n))) * math.sqrt(n) for a in range(0, n, chunk)]
    return torch.cat(parts).numpy().astype(np.float32)
