"""torch_impl's tree ES (the byte-level LM) as numpy, configured by TreeKnobs: what the LM suite compares."""
from __future__ import annotations

import numpy as np
import torch

from spec.lm import LMConfig
from spec.tree import Leaf
from spec.tree_knobs import TreeKnobs
from torch_impl.tree import es as lm_es, lm
from torch_impl.tree.noise import LeafRole, TreeNoise, dense, from_stack_first, per_member, sample


def _np(t: torch.Tensor) -> np.ndarray:
    """A tensor as numpy, from whatever device it is on."""
    return t.detach().cpu().numpy()


def protocol_noise(noise: TreeNoise, tree) -> dict:
    """The tree protocol's noise dict (parity/tree/adapter.py) of every member: low-rank leaves as (A, B) on the
    stored slice (a leaf factored transposed gives (B, A)), stack axes first; param leaves eps at the stored shape."""
    noise, out = per_member(noise), {}
    for path, role in noise.roles.items():
        if role.kind == "lowrank":
            A, B = _np(noise.A[path]), _np(noise.B[path])
            out[path] = (B, A) if role.transposed else (A, B)
        elif role.kind == "param":
            out[path] = _np(from_stack_first(noise.eps[path], tree.leaf(path), lead=1))
    return out


def _grouped(t: torch.Tensor, leaf: Leaf) -> torch.Tensor:
    """(m, *stack, *rest) stack-first -> (m, S, *rest) (a scalar slice gets a unit row axis)."""
    rest = t.shape[1 + len(leaf.stack_shape):]
    return t.reshape(t.shape[0], leaf.n_slices, *(rest or (1,)))


def _dense_block(noise: TreeNoise, leaf: Leaf, role: LeafRole, block) -> torch.Tensor:
    """One block of the per-member noise's perturbation at the stored slice layout (lowrank_dense's product, on the
    block's rows: A's rows, or B's where the role factors the slice transposed), or eps."""
    m, s, rows = block
    if role.kind == "param":
        return _grouped(noise.eps[leaf.path], leaf)[m, s][:, :, rows]
    A, B = (_grouped(t, leaf)[m, s] for t in (noise.A[leaf.path], noise.B[leaf.path]))
    if role.transposed:                                  # stored = (A @ B^T)^T: the stored rows are B's
        return (A @ B[:, :, rows].transpose(-1, -2)).transpose(-1, -2)
    return A[:, :, rows] @ B.transpose(-1, -2)


class TorchTree:
    """One configured torch side: init, dense noise per leaf, shaping, scores and gradients."""

    def __init__(self, cfg: LMConfig, knobs: TreeKnobs, device: str = "cpu"):
        self.cfg, self.knobs, self.device = cfg, knobs, torch.device(device)
        self.es = lm_es.make(cfg, knobs)
        self._protocol: dict = {}
        self.name = "torch_impl" + ("" if knobs == TreeKnobs() else " (" + ", ".join(
            f"{k}={getattr(knobs, k)}" for k in vars(knobs) if getattr(knobs, k) != getattr(TreeKnobs(), k)) + ")")

    def has(self, method: str) -> bool:
        return True

    def _state(self, seed: int, params: dict | None = None):
        tparams = None if params is None else {k: self._t(v) for k, v in params.items()}
        return lm_es.init(self.es, seed, self.device, tparams)

    def _t(self, a) -> torch.Tensor:
        """A numpy array as a tensor on this side's device (a copy: the suite's arrays stay the suite's)."""
        return torch.from_numpy(np.array(a)).to(self.device)

    def init(self, seed: int) -> dict[str, np.ndarray]:
        return {k: _np(v) for k, v in self._state(seed).params.items()}

    def noise(self, seed: int, epoch: int):
        state = self._state(seed)
        return sample(self.es.plan, state.sources, epoch, self.cfg.sigma, self.device)

    def protocol(self, seed: int, epoch: int) -> dict:
        """Every member's noise at epoch in the tree protocol's form (drawn once per (seed, epoch))."""
        if (seed, epoch) not in self._protocol:
            with torch.inference_mode():
                self._protocol[(seed, epoch)] = protocol_noise(self.noise(seed, epoch), self.es.tree)
        return self._protocol[(seed, epoch)]

    def leaf_noise(self, seed: int, epoch: int, leaf: Leaf):
        """One leaf's noise in the protocol's form ((A, B) or eps), or None when this side does not perturb it."""
        return self.protocol(seed, epoch).get(leaf.path)

    def dense_noise(self, seed: int, epoch: int, leaf: Leaf, block=None) -> np.ndarray | None:
        """(pop, *shape) perturbation of one leaf, or None when this side does not perturb it; `block` (a
        parity.tree.blocks.Block): only that block, (members, slices, rows, *rest), from the block's factors."""
        noise = self.noise(seed, epoch)
        role = noise.roles[leaf.path]
        if role.kind == "none":
            return None
        with torch.inference_mode():
            if block is None:
                return _np(dense(noise, leaf))
            return _np(_dense_block(per_member(noise), leaf, role, block))

    def shape(self, f: np.ndarray) -> np.ndarray:
        return _np(self.es.shaping(self._t(np.asarray(f, np.float32))))

    def scores(self, seed: int, params: dict, epoch: int, tokens: np.ndarray, noise: bool):
        state = self._state(seed, params)
        n = sample(self.es.plan, state.sources, epoch, self.cfg.sigma, self.device) if noise else None
        with torch.inference_mode():
            s, inter = lm.forward(state.params, self._t(tokens.astype(np.int64)), n, intermediates=True)
        return _np(s), {k: _np(v) for k, v in inter.items()}

    def grads(self, seed: int, epoch: int, shaped: np.ndarray) -> dict[str, np.ndarray]:
        noise = self.noise(seed, epoch)
        with torch.inference_mode():
            g = lm_es.leaf_gradients(self.es.tree, noise, self._t(np.array(shaped, np.float32)))
        return {k: _np(v) for k, v in g.items()}

    def products(self, W, A, B, x, form: str) -> np.ndarray:
        """torch_impl.tree.lm's perturbed mm / tmm (`_linear`) on given per-member factors of one slice."""
        a, b = W.shape
        noise = TreeNoise({"w": self._t(A)}, {"w": self._t(B)}, {}, {"w": LeafRole("lowrank", form, (a, b))}, None)
        with torch.inference_mode():
            member = lm.Member(noise, x.shape[0], self.device)
            return _np(lm._linear(member, "w", self._t(W), self._t(x), None, form))

    def update(self, seed: int, epoch: int, params: dict, shaped: np.ndarray) -> tuple[dict, dict]:
        """(new params, the gradient the step used): lm_es.apply on its own gradient at epoch from params."""
        state = self._state(seed, params)._replace(epoch=epoch)
        noise = sample(self.es.plan, state.sources, epoch, self.cfg.sigma, self.device)
        with torch.inference_mode():
            g = lm_es.leaf_gradients(self.es.tree, noise, self._t(np.array(shaped, np.float32)))
            new, _ = lm_es.apply(self.es, state, g)
        return {k: _np(v) for k, v in new.params.items()}, {k: _np(v) for k, v in g.items()}

    def epoch_step(self, seed: int, params: dict, epoch: int, tokens: np.ndarray) -> dict:
        """One training epoch from params, as torch_impl's trainer runs it: ask, score, tell."""
        state = self._state(seed, params)._replace(epoch=epoch)
        with torch.inference_mode():
            noise, state = lm_es.ask(self.es, state)
            scores = lm.forward(state.params, self._t(tokens.astype(np.int64)), noise)
            new, info = lm_es.tell(self.es, state, noise, scores)
        return {"scores": _np(scores), "shaped": _np(info["shaped"]),
                "noise": protocol_noise(noise, self.es.tree),
                "grads": {k: _np(v) for k, v in info["grads"].items()},
                "params": {k: _np(v) for k, v in new.params.items()}}
