"""A small CNN trained by EGGROLL in torch, its convolutions perturbed through their matricization: the model
`examples/cnn_adapter.py` wraps for `python -m parity check --task tree --port examples.cnn_adapter:CNNAdapter`.

The model is an `nn.Module`: two 3 x 3 convolutions (the second with stride 2) with ReLUs, a mean over the image and
a linear head to `classes` logits. A convolution's weight W (out, in, kh, kw) is perturbed as an mm leaf through its
matrix (out, in * kh * kw) (spec.tree.Leaf's `matrix`, the row-major reshape W.reshape(out, -1)): member i's
perturbation is A_i B_i^T (A (out, r), B (in * kh * kw, r)) reshaped to W's shape. The convolution is then the mm of
that matrix on im2col's patches (F.unfold orders a patch's entries (in, kh, kw), row-major as W's): `EggConv2d`
computes each member's x * (W + A_i B_i^T) as patches @ W_mat^T + (patches @ B_i) @ A_i^T, folded back to the
image; that mm is the GPT example's `linear` (examples/gpt_port.py: the adapter's perturbed_mm, so the products
check runs the conv's own code), and the run's settings its `ESConfig`.

EGGROLL is torch_impl's tree noise on JAX's keys (the tree's key scheme: the reference's mm noise at the matrix's
shape, drawn by the leaf's key index), biases frozen (freeze_nonlora), the fitness shaped with group means and the
global variance, the gradient einsum(f A, B) / N per leaf reshaped to the stored shape, and sgd on -(g sqrt(N)).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn
from torch.nn import functional as F

from examples.gpt_port import ESConfig, TreeES, linear
from spec.tree import Tree
from spec.tree_knobs import TreeKnobs


@dataclass(frozen=True)
class CNNConfig:
    """The model's size: input channels, image side, the convolutions' width, kernel and the classes."""

    in_ch: int = 3
    image: int = 8
    width: int = 8
    kernel: int = 3
    classes: int = 5
    batch: int = 2


def patches(x: torch.Tensor, conv: nn.Conv2d) -> tuple[torch.Tensor, tuple[int, int]]:
    """im2col: x (n, in, H, W) -> ((n, L, in * kh * kw), (H', W')), each patch's entries in (in, kh, kw) order."""
    cols = F.unfold(x, conv.kernel_size, dilation=conv.dilation, padding=conv.padding, stride=conv.stride)
    H, W = x.shape[-2:]
    out = [(size + 2 * p - d * (k - 1) - 1) // s + 1 for size, p, d, k, s in
           zip((H, W), conv.padding, conv.dilation, conv.kernel_size, conv.stride)]
    return cols.transpose(1, 2), (out[0], out[1])


class EggConv2d(nn.Conv2d):
    """nn.Conv2d that, with a population set (A (m, out, r), B (m, in * kh * kw, r)), computes member i's
    convolution with W + (A_i B_i^T).reshape(W.shape) on its input rows (m * batch, in, H, W), members first."""

    A: torch.Tensor | None = None
    B: torch.Tensor | None = None

    def set_population(self, A=None, B=None) -> None:
        self.A, self.B = A, B

    def matrix(self) -> torch.Tensor:
        """W as the port factors it: (out, in * kh * kw), row-major."""
        return self.weight.reshape(self.out_channels, -1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.A is None:
            return super().forward(x)
        m = self.A.shape[0]
        cols, (h, w) = patches(x, self)                                       # (m * batch, L, in kh kw)
        y = linear(cols.reshape(m, -1, *cols.shape[1:]), self.matrix(), self.A, self.B)  # (m, batch, L, out)
        y = y + self.bias
        return y.reshape(x.shape[0], h, w, self.out_channels).permute(0, 3, 1, 2)


class EggLinear(nn.Linear):
    """nn.Linear that, with a population set, gives member i x (W + A_i B_i^T)^T + b (input (m * batch, in))."""

    A: torch.Tensor | None = None
    B: torch.Tensor | None = None

    def set_population(self, A=None, B=None) -> None:
        self.A, self.B = A, B

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.A is None:
            return super().forward(x)
        m = self.A.shape[0]
        return (linear(x.reshape(m, -1, x.shape[-1]), self.weight, self.A, self.B) + self.bias).reshape(
            x.shape[0], -1)


class CNN(nn.Module):
    """conv 3x3 (padding 1), ReLU, conv 3x3 stride 2, ReLU, the mean over the image, a linear head."""

    def __init__(self, cfg: CNNConfig = CNNConfig()):
        super().__init__()
        k = cfg.kernel
        self.conv1 = EggConv2d(cfg.in_ch, cfg.width, k, padding=k // 2)
        self.conv2 = EggConv2d(cfg.width, cfg.width, k, stride=2)
        self.head = EggLinear(cfg.width, cfg.classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x (n, in, H, W) -> logits (n, classes)."""
        h = F.relu(self.conv2(F.relu(self.conv1(x))))
        return self.head(h.mean(dim=(2, 3)))


class Eggroll(TreeES):
    """The CNN's ES on its tree (parity.tree.torch_module.module_tree: the convs' weights mm through their matrix):
    the GPT example's noise, shaping, gradient and step (examples/gpt_port.py's TreeES), and the population forward
    through the model's own layers."""

    def __init__(self, model: CNN, tree: Tree, es: ESConfig = ESConfig(), knobs: TreeKnobs = TreeKnobs()):
        super().__init__(tree, es, knobs)
        self.model = model
        self.layers = {n: m for n, m in model.named_modules() if isinstance(m, (EggConv2d, EggLinear))}

    def set_population(self, noise: dict | None) -> None:
        """Hand each layer its members' factors {path: (A, B)} (None: clear them)."""
        for name, layer in self.layers.items():
            layer.set_population(*(noise.get(f"{name}.weight", (None, None)) if noise else (None, None)))

    def score(self, x: torch.Tensor, noise: dict) -> torch.Tensor:
        """The population forward: each member's logits (m, batch, classes) on the same images x (batch, ...)."""
        m = next(iter(noise.values()))[0].shape[0]
        self.set_population(noise)
        try:
            with torch.no_grad():
                return self.model(x.repeat(m, 1, 1, 1)).reshape(m, x.shape[0], -1)
        finally:
            self.set_population(None)


def images(seed: int, cfg: CNNConfig) -> torch.Tensor:
    """A batch of random images (batch, in_ch, image, image) for a seed."""
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(cfg.batch, cfg.in_ch, cfg.image, cfg.image, generator=gen)


__all__ = ["CNNConfig", "ESConfig", "CNN", "EggConv2d", "EggLinear", "Eggroll", "patches",
           "images"]
