"""Tree adapters on the worked example (examples/gpt_adapter.py's GPT) that add their step in another order of
summation, or drift the weights in place: two faithful ports whose update and training loop add the step into the
weights pair by pair or member by member (float32, sequentially: a legitimate order the updates bound must allow),
and a planted one that adds each member's noise into the weights and subtracts it again before the step (float32,
as a library that perturbs in place to score each member), which the suite must name."""
from __future__ import annotations

import numpy as np
import torch

from examples.gpt_adapter import GPTAdapter, _np, _t
from parity.tree.adapter import dense_of
from torch_impl.tree.es import leaf_gradients
from torch_impl.tree.noise import TreeNoise


def sequential_step(port, params: dict, noise: TreeNoise, shaped: torch.Tensor, group: int) -> dict:
    """params + lr sqrt(N) g with g's sum over members split into groups of `group` consecutive members, each
    group's contribution lr sqrt(N) sum_{n in group} f_n E_n / N formed in float32 and added into the weights in
    turn (group 2: pair by pair; 1: member by member)."""
    n = shaped.shape[0]
    scale = torch.tensor(port.es.lr, dtype=torch.float32) * torch.sqrt(torch.tensor(float(n)))
    share = torch.tensor(group / n, dtype=torch.float32)            # a group's mean back to a share of the N-mean
    new = {k: v.clone() for k, v in params.items()}
    for start in range(0, n, group):
        rows = slice(start, start + group)
        part = TreeNoise({k: a[rows] for k, a in noise.A.items()}, {k: b[rows] for k, b in noise.B.items()},
                         {k: e[rows] for k, e in noise.eps.items()}, noise.roles, None)
        g = leaf_gradients(port.tree, part, shaped[rows])
        new = {k: v + scale * (g[k] * share) for k, v in new.items()}
    return new


class SequentialStep(GPTAdapter):
    """The worked example whose update and es_tell add the step `group` members at a time into the weights."""

    group = 2

    def update(self, params, noise, shaped, sigma, lr):
        with torch.inference_mode():
            new = sequential_step(self.port, {k: _t(v) for k, v in params.items()}, self._from_protocol(noise),
                                  _t(shaped), self.group)
        return {k: _np(v) for k, v in new.items()}

    def es_tell(self, state, noise, scores, epoch):
        with torch.inference_mode():
            shaped = self.port.shape_fitness(_t(scores))
            return sequential_step(self.port, state[0], self._from_protocol(noise), shaped, self.group), state[1]


class PerPairStep(SequentialStep):
    """Faithful: each antithetic pair's contribution added into the weights one at a time (N/2 adds)."""

    group = 2


class PerMemberStep(SequentialStep):
    """Faithful: each member's contribution added into the weights one at a time (N adds)."""

    group = 1


def perturb_and_restore(tree, params: dict, noise: dict) -> dict:
    """Each member in turn: its perturbation added into the weights and subtracted again, float32 (what a port that
    scores members by perturbing its weights in place leaves behind: the params drifted by rounding)."""
    out = {k: np.array(v, np.float32) for k, v in params.items()}
    m = len(next(iter(v[0] if isinstance(v, tuple) else v for v in noise.values())))
    for i in range(m):
        for path, value in noise.items():
            one = tuple(v[i:i + 1] for v in value) if isinstance(value, tuple) else value[i:i + 1]
            E = dense_of(tree.leaf(path), one)[0].astype(np.float32)
            out[path] = (out[path] + E).astype(np.float32)
            out[path] = (out[path] - E).astype(np.float32)
    return out


class InPlaceRestore(GPTAdapter):
    """Planted: update and es_tell perturb the weights in place per member (p += E_n, then p -= E_n, float32) before
    the step: at zero fitness its step still moves entries."""

    def update(self, params, noise, shaped, sigma, lr):
        return super().update(perturb_and_restore(self.tree, params, noise), noise, shaped, sigma, lr)

    def es_tell(self, state, noise, scores, epoch):
        drifted = perturb_and_restore(self.tree, {k: _np(v) for k, v in state[0].items()}, noise)
        return super().es_tell(({k: _t(v) for k, v in drifted.items()}, state[1]), noise, scores, epoch)



class InPlaceForward(GPTAdapter):
    """Planted: population_forward perturbs the params it is given in place per member (p += E_n, then p -= E_n,
    float32, in the suite's own arrays) around the forward."""

    def population_forward(self, params, noise, batch):
        drifted = perturb_and_restore(self.tree, params, noise)
        for k, v in drifted.items():
            params[k][...] = v
        return super().population_forward(params, noise, batch)


def keep_bits(x: np.ndarray, bits: int) -> np.ndarray:
    """float32 x rounded toward zero to `bits` mantissa bits (a step computed in a coarser format)."""
    i = np.asarray(x, np.float32).view(np.int32)
    return (i & np.int32(~((1 << (23 - bits)) - 1))).view(np.float32)


class CoarseStep(GPTAdapter):
    """Planted: update forms its step lr sqrt(N) g with 14 mantissa bits (a coarser format than float32): the step
    is the reference's sgd at c = 1 within 1e-4, yet its rounding is beyond any float32 order of summation."""

    def update(self, params, noise, shaped, sigma, lr):
        new = super().update(params, noise, shaped, sigma, lr)
        return {k: (params[k] + keep_bits(new[k] - params[k], 14)).astype(np.float32) for k in params}
