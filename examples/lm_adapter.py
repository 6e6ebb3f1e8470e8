"""The worked example of the tree protocol (parity/tree/adapter.py): a torch port of the byte-level LM behind it.

    python -m parity check --task lm --port examples.lm_adapter:LMAdapter

The port here is torch_impl's tree ES (torch_impl.tree: lm, es, noise); an adapter for another port has the same
shape: declare the tree, convert at the boundary (numpy float32 in and out), and hand the suite the port's OWN
noise, products, shaping, gradient, forward and step. What a port keeps differently is mapped here, never changed:
  - its noise is stack-first with one row per antithetic pair: expanded to one row per member (`per_member`);
  - a leaf it factors transposed (tmm_layout=transposed: the (in, out) weight factored as the (out, in) mm) has
    E^T = A B^T, so at the stored shape E = B A^T: the protocol's (A, B) is its (B, A);
  - its full-rank noise is stack-first: put back at the leaf's stored shape.
`LMAdapter(cfg, knobs)` takes spec.tree_knobs.TreeKnobs, so the LM suite's self-tests check that a drifted port is
caught through the protocol too (tests/parity/tree/test_lm.py).

A port on torch's own generator (most real ports) sets `jax_compatible_rng = False` and is checked in distribution
(parity/tree/dist.py): `TorchRngLMAdapter` is this port with knob rng=torch,

    python -m parity check --task lm --port examples.lm_adapter:TorchRngLMAdapter
"""
from __future__ import annotations

import numpy as np
import torch

from spec.lm import LMConfig, lm_tree
from spec.tree_knobs import TreeKnobs
from torch_impl.tree import es as lm_es, lm
from torch_impl.tree.noise import TreeNoise, from_stack_first, per_member, sample, to_stack_first


def _np(t: torch.Tensor) -> np.ndarray:
    return t.detach().cpu().numpy().astype(np.float32, copy=False)


def _t(a: np.ndarray) -> torch.Tensor:
    """A tensor of its own (the suite's arrays may be read-only; torch wants writable memory)."""
    return torch.from_numpy(np.array(a))


def _tensors(params: dict) -> dict[str, torch.Tensor]:
    return {k: _t(np.asarray(v, np.float32)) for k, v in params.items()}


class LMAdapter:
    """torch_impl's LM ES under TreeKnobs behind the tree protocol."""

    def __init__(self, cfg: LMConfig, knobs: TreeKnobs = TreeKnobs()):
        self.cfg, self.knobs = cfg, knobs
        self.es = lm_es.make(cfg, knobs)
        self.tree = lm_tree(cfg)                  # declared whole; or leaf_classes = {path: class} and scan_axes
        self.name = "examples.lm_adapter (torch_impl)" + ("" if knobs == TreeKnobs() else f" {knobs}")
        self.jax_compatible_rng = knobs.rng == "jax"

    # ------------------------------------------------------------------ the boundary
    def _to_protocol(self, noise: TreeNoise, members: np.ndarray) -> dict:
        noise, idx = per_member(noise), torch.from_numpy(np.asarray(members, np.int64))
        out = {}
        for path, role in noise.roles.items():
            if role.kind == "lowrank":
                A, B = noise.A[path][idx], noise.B[path][idx]
                out[path] = (_np(B), _np(A)) if role.transposed else (_np(A), _np(B))
            elif role.kind == "param":
                out[path] = _np(from_stack_first(noise.eps[path][idx], self.tree.leaf(path), lead=1))
        return out

    def _from_protocol(self, noise: dict | None) -> TreeNoise | None:
        if noise is None:
            return None
        A, B, eps = {}, {}, {}
        for path, value in noise.items():
            if isinstance(value, tuple):
                a, b = (_t(v) for v in value)
                A[path], B[path] = (b, a) if self.es.plan.roles[path].transposed else (a, b)
            else:
                eps[path] = to_stack_first(_t(value), self.tree.leaf(path), lead=1).contiguous()
        return TreeNoise(A, B, eps, self.es.plan.roles, None)

    # ------------------------------------------------------------------ required
    def noise(self, seed, epoch, members, pop, sigma, rank):
        if (pop, rank) != (self.cfg.pop, self.cfg.rank):
            raise ValueError(f"this port was built for pop {self.cfg.pop}, rank {self.cfg.rank}; asked for {pop}, {rank}")
        sources = self.es.plan.generator.sources(self.tree, seed, self.knobs.leaf_order, self.knobs.stack_keys)
        with torch.inference_mode():
            return self._to_protocol(sample(self.es.plan, sources, epoch, sigma), members)

    def perturbed_mm(self, W, A, B, x):
        with torch.inference_mode():
            W, A, B, x = map(_t, (W, A, B, x))
            rows = x.reshape(x.shape[0], -1, x.shape[-1])             # (m, *rows, in): the LM's op takes (m, T, in)
            return _np((rows @ W.T + lm.Member(None, x.shape[0], "cpu").lowrank(rows, B, A)).reshape(
                *x.shape[:-1], W.shape[0]))

    def perturbed_tmm(self, W, A, B, x):
        with torch.inference_mode():
            W, A, B, x = map(_t, (W, A, B, x))
            rows = x.reshape(x.shape[0], -1, x.shape[-1])
            return _np((rows @ W + lm.Member(None, x.shape[0], "cpu").lowrank(rows, A, B)).reshape(
                *x.shape[:-1], W.shape[1]))

    def shape_fitness(self, f, group_size):
        with torch.inference_mode():
            return _np(lm_es.GROUP_FITNESS[self.knobs.group_fitness](_t(f), group_size))

    def gradient(self, noise, shaped, sigma):
        with torch.inference_mode():
            g = lm_es.leaf_gradients(self.tree, self._from_protocol(noise), _t(shaped))
        return {k: _np(v) for k, v in g.items()}

    # ------------------------------------------------------------------ optional
    def init_params(self, seed):
        return {k: _np(v) for k, v in lm_es.init(self.es, seed).params.items()}

    def forward(self, params, noise, tokens, intermediates=False):
        with torch.inference_mode():
            out = lm.forward(_tensors(params), _t(tokens), self._from_protocol(noise), intermediates)
        if not intermediates:
            return _np(out)
        return _np(out[0]), {k: _np(v) for k, v in out[1].items()}

    def update(self, params, noise, shaped, sigma, lr):
        if lr != self.cfg.lr:
            raise ValueError(f"this port steps at its config's lr {self.cfg.lr}, asked for {lr}")
        state = lm_es.init(self.es, 0, "cpu", _tensors(params))
        with torch.inference_mode():
            g = lm_es.leaf_gradients(self.tree, self._from_protocol(noise), _t(shaped))
            new, _ = lm_es.apply(self.es, state, g)
        return {k: _np(v) for k, v in new.params.items()}

    # a training run, as the port's own loop drives it (state: lm_es.LMState)
    def es_init(self, params, seed):
        return lm_es.init(self.es, seed, "cpu", _tensors(params))

    def es_ask(self, state, epoch):
        with torch.inference_mode():
            noise, _ = lm_es.ask(self.es, state._replace(epoch=epoch))
            return self._to_protocol(noise, np.arange(self.cfg.pop))

    def es_tell(self, state, noise, scores, epoch):
        with torch.inference_mode():
            new, _ = lm_es.tell(self.es, state._replace(epoch=epoch), self._from_protocol(noise),
                                _t(scores))
        return new

    def es_params(self, state):
        return {k: _np(v) for k, v in state.params.items()}


def TorchRngLMAdapter(cfg: LMConfig) -> LMAdapter:
    """The same port drawing from torch's own generator (knob rng=torch): jax_compatible_rng False, so the LM suite
    checks its draws in distribution and runs the reference on them."""
    return LMAdapter(cfg, TreeKnobs(rng="torch"))
