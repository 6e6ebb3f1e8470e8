"""Planted drifts of examples/cnn_adapter.py's conv leaves (mm through their matrix (out, in * kh * kw)): each
overrides what a port that matricizes its conv weight otherwise gets wrong, the rest faithful.

- KhKwSwapped: the port lays A B^T over the conv weight as (out, in, kw, kh) (its forward's patches and its gradient
  read the kernel's axes swapped);
- ChannelsLast: the same with the matrix's columns in (kh, kw, in) order (an HWIO-minded port);
- TallMatrix: the port factors the conv as the (out * kh * kw, in) matrix (its factors are of another matricization);
- FullRankForward: the forward perturbs the conv weights full-rank (the port's own sigma N(0, 1) at the weight's
  shape) while handing out the low-rank factors;
- FullRankNoise: the port's noise for the convs is full-rank eps at the weight's shape;
- ConvNoiseLeftOut: the population forward leaves the convs' noise out.
"""
from __future__ import annotations

import numpy as np

from examples.cnn_adapter import SMALL, CNNAdapter
from parity.tree.torch_module import numpy_of, tensors

SIZES = {"small": SMALL, "example": {}}


def convs(tree) -> list:
    return [leaf for leaf in tree.leaves if leaf.matrix is not None]


class _Permuted(CNNAdapter):
    """A port whose matrix is laid over the weight's axes in the order PERM: its forward uses B's rows in that order
    and its gradient is the matrix reshaped to the permuted axes and moved back."""

    PERM: tuple[int, ...] = (0, 1, 2, 3)

    def _laid(self, M: np.ndarray, leaf) -> np.ndarray:
        """(..., a, b) -> (..., *slice) in the port's order."""
        lead = M.shape[:-2]
        shape = tuple(leaf.slice_shape[k] for k in self.PERM)
        n = len(lead)
        return np.moveaxis(M.reshape(lead + shape), [n + i for i in range(4)], [n + k for k in self.PERM])

    def population_forward(self, params, noise, batch):
        out = dict(noise)
        for leaf in convs(self.tree):
            if leaf.path in noise:
                A, B = noise[leaf.path]
                # the port's perturbation laid(A B^T) is A B'^T with B' = B's rows at the laid-out column indices
                idx = self._laid(np.arange(leaf.matrix[1])[None, :].repeat(leaf.matrix[0], 0), leaf)[0].ravel()
                out[leaf.path] = (A, np.ascontiguousarray(B[:, idx]))
        return super().population_forward(params, out, batch)

    def gradient(self, noise, shaped, sigma):
        g = super().gradient(noise, shaped, sigma)
        for leaf in convs(self.tree):
            g[leaf.path] = np.ascontiguousarray(self._laid(g[leaf.path].reshape(leaf.matrix), leaf)).astype(np.float32)
        return g

    def _stepped(self, params: dict, g: dict) -> dict:
        """The port's sgd step on its (permuted) gradient, numpy in and out."""
        return numpy_of(self.es.step(tensors(params), tensors(g)))

    def update(self, params, noise, shaped, sigma, lr):
        return self._stepped(params, self.gradient(noise, shaped, sigma))

    def es_tell(self, state, noise, scores, epoch):
        shaped = self.shape_fitness(np.asarray(scores, np.float32), self.group_size)
        new = self._stepped(numpy_of(state[0]), self.gradient(noise, shaped, self.sigma))
        return tensors(new), state[1]


class KhKwSwapped(_Permuted):
    PERM = (0, 1, 3, 2)


class ChannelsLast(_Permuted):
    PERM = (0, 2, 3, 1)


class TallMatrix(CNNAdapter):
    """The port factors each conv as (out * kh * kw, in): A (m, out kh kw, r), B (m, in, r)."""

    def noise(self, seed, epoch, members, pop, sigma, rank):
        out = super().noise(seed, epoch, members, pop, sigma, rank)
        rng = np.random.default_rng([seed, epoch])
        for leaf in convs(self.tree):
            o, i, kh, kw = leaf.slice_shape
            m = len(members)
            out[leaf.path] = ((rng.standard_normal((m, o * kh * kw, rank)) * sigma / np.sqrt(rank)).astype(np.float32),
                              rng.standard_normal((m, i, rank)).astype(np.float32))
        return out


class FullRankForward(CNNAdapter):
    """The forward perturbs each conv full-rank: member i's perturbation is +-sigma N(0, 1) at the weight's shape
    (the port's own draw per pair; zero where the noise it is handed is), given to its layers as rank-K factors
    (E_mat, I), while its noise hands out the low-rank factors."""

    def population_forward(self, params, noise, batch):
        out = dict(noise)
        for j, leaf in enumerate(convs(self.tree)):
            if leaf.path in noise:
                A = noise[leaf.path][0]
                m, (a, b) = A.shape[0], leaf.matrix
                z = np.random.default_rng([j, 99]).standard_normal((m // 2 + 1, a, b)).repeat(2, 0)[:m]
                on = np.any(A != 0, axis=(1, 2)).astype(np.float64)[:, None, None]       # the members it perturbs
                sign = np.where(np.arange(m) % 2 == 0, 1.0, -1.0)[:, None, None]
                out[leaf.path] = ((z * sign * on * self.sigma).astype(np.float32),
                                  np.broadcast_to(np.eye(b, dtype=np.float32), (m, b, b)).copy())
        return super().population_forward(params, out, batch)


class FullRankNoise(CNNAdapter):
    """The port's noise for each conv is full-rank eps (m, out, in, kh, kw), sigma N(0, 1)."""

    def noise(self, seed, epoch, members, pop, sigma, rank):
        out = super().noise(seed, epoch, members, pop, sigma, rank)
        rng = np.random.default_rng([seed, epoch])
        for leaf in convs(self.tree):
            out[leaf.path] = (rng.standard_normal((len(members), *leaf.shape)) * sigma).astype(np.float32)
        return out


class ConvNoiseLeftOut(CNNAdapter):
    """The population forward perturbs the head only: the convs' noise is left out."""

    def population_forward(self, params, noise, batch):
        kept = {p: v for p, v in noise.items() if p not in {leaf.path for leaf in convs(self.tree)}}
        return super().population_forward(params, kept, batch)
