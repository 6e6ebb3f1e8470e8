"""Most of a tree adapter, read from a torch `nn.Module` (the tree protocol: parity/tree/adapter.py).

    class Adapter(ModuleAdapter):
        def __init__(self):
            super().__init__(lambda: mygpt.GPT(config), overrides={"Conv1D": "tmm"})
        ...   # what is the port's own: noise, population_forward, shape_fitness, gradient (or update), batch

`ModuleAdapter(make_module, overrides)` gives:
- `tree`: one leaf per entry of `named_parameters()` (a tied weight once), classed by the module that owns it:
  an `nn.Linear` weight (or a subclass's) `mm`, an `nn.Embedding` weight `embedding`, any 1-D parameter `param`;
  a convolution's weight (`nn.Conv1d/2d/3d`, (out, in / groups, *kernel)) `mm` through its matrix (out, in / groups
  * prod(kernel)) (spec.tree.Leaf's `matrix`: the reference's mm noise at that shape, reshaped; so is any N-D
  weight an override classes mm);
  `overrides` {path, glob pattern, or owner class name (its matrices): class} say the rest (a GPT-2 `Conv1D`
  weight is `tmm`).
  A parameter that no rule classes is refused, naming it and its owner's type;
- `module`: the module the port's population forward runs, whose layers the suite hooks to check each leaf's product
  as the model calls it (parity/tree/forward.py);
- `init_params(seed)`: a module built by `make_module` under torch's generator seeded with `seed`;
- `plain_forward(params, batch)`: `torch.func.functional_call` of a module of its own in eval mode, no population
  state, in the parameters' dtype (float64 parameters give the float64 evaluation the forward check's bound uses);
- `load(params)`: the parameters copied into `module` before the port's own population forward runs;
- `tensors` and `numpy_of`: numpy and torch at the boundary (writable copies; float32 out, float64 kept).
"""
from __future__ import annotations

import fnmatch
from typing import Any, Callable, Mapping

import numpy as np
import torch
from torch import nn

from spec.tree import CLASSES, Leaf, Tree, TreeError, make_tree, matrix_hint


def tensors(value: Any) -> Any:
    """numpy arrays (in dicts, tuples, lists) as torch tensors of their own: the suite's arrays may be read-only."""
    if isinstance(value, np.ndarray):
        return torch.from_numpy(np.array(value))
    if isinstance(value, Mapping):
        return {k: tensors(v) for k, v in value.items()}
    if isinstance(value, (tuple, list)):
        return type(value)(tensors(v) for v in value)
    return value


def numpy_of(value: Any, rows: Any = None) -> Any:
    """torch tensors (in dicts, tuples, lists) as numpy arrays, float64 kept and other floats as float32; `rows`
    (member indices) picks those rows of each array."""
    if isinstance(value, torch.Tensor):
        t = value.detach().cpu()
        t = t if rows is None else t[torch.as_tensor(np.asarray(rows, np.int64))]
        if t.is_floating_point():
            return t.numpy().astype(np.float64 if t.dtype == torch.float64 else np.float32, copy=True)
        return t.numpy().copy()
    if isinstance(value, Mapping):
        return {k: numpy_of(v, rows) for k, v in value.items()}
    if isinstance(value, (tuple, list)):
        return type(value)(numpy_of(v, rows) for v in value)
    return value


def owner_of(module: nn.Module, path: str) -> tuple[nn.Module, str]:
    """(the submodule that registers the parameter at `path`, the parameter's own name)."""
    prefix, _, name = path.rpartition(".")
    return (module.get_submodule(prefix) if prefix else module), name


def leaf_class(path: str, owner: nn.Module, param: torch.Tensor, overrides: Mapping[str, str]) -> str | None:
    """The class of one parameter: an override (its path or a glob of paths; an owner class name for the owner's
    matrices), else its owner's rule, else None."""
    for key, cls in overrides.items():
        if key == path or fnmatch.fnmatchcase(path, key) or (key == type(owner).__name__ and param.dim() >= 2):
            return cls
    if isinstance(owner, nn.Embedding) and param.dim() == 2:
        return "embedding"
    if isinstance(owner, (nn.Linear, nn.Conv1d, nn.Conv2d, nn.Conv3d)) and path.endswith("weight"):
        return "mm"
    return "param" if param.dim() == 1 else None


def module_tree(module: nn.Module, overrides: Mapping[str, str] | None = None) -> Tree:
    """The tree of a module's parameters, in named_parameters' order; TreeError naming any it cannot class."""
    overrides = dict(overrides or {})
    unknown = sorted(f"{k}: {v!r}" for k, v in overrides.items() if v not in CLASSES)
    if unknown:
        raise TreeError(f"overrides with unknown class(es) {', '.join(unknown)}; known: {', '.join(CLASSES)}")
    leaves, unclassed = [], []
    for path, param in module.named_parameters():
        owner, _ = owner_of(module, path)
        cls = leaf_class(path, owner, param, overrides)
        if cls is None:
            unclassed.append(f"{path} (shape {tuple(param.shape)}, owned by a {type(owner).__name__})")
        else:
            shape = tuple(param.shape)
            matrix = matrix_hint(shape) if cls == "mm" and len(shape) > 2 else None   # a conv's (out, in * kh * kw)
            leaves.append(Leaf(path, shape, cls, matrix=matrix))
    if unclassed:
        raise TreeError(f"no rule classes {'; '.join(unclassed)}: give overrides={{path or owner class name: class}} "
                        f"with a class of {', '.join(CLASSES)} (a GPT-2 Conv1D weight, stored (in, out), is tmm)")
    return make_tree(leaves)


class ModuleAdapter:
    """The parts of a tree adapter an nn.Module already says: the tree, init_params, plain_forward (see the module's
    docstring); a subclass adds the port's own noise, population_forward, shape_fitness, gradient and batch."""

    def __init__(self, make_module: Callable[[], nn.Module], overrides: Mapping[str, str] | None = None):
        self.make_module = make_module
        self.module = make_module()
        self.tree = module_tree(self.module, overrides)
        self._plain: dict[torch.dtype, nn.Module] = {}

    def init_params(self, seed: int) -> dict[str, np.ndarray]:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(int(seed))
            fresh = self.make_module()
        return {k: numpy_of(v) for k, v in fresh.named_parameters()}

    def load(self, params: Mapping[str, np.ndarray]) -> nn.Module:
        """`module` with `params` copied into its parameters (for the port's own population forward)."""
        with torch.no_grad():
            for path, p in self.module.named_parameters():
                p.copy_(torch.from_numpy(np.asarray(params[path])))
        return self.module

    def plain_module(self, dtype: torch.dtype) -> nn.Module:
        """A module of the adapter's own at `dtype` in eval mode: no population state, no dropout."""
        if dtype not in self._plain:
            self._plain[dtype] = self.make_module().to(dtype).eval()
        return self._plain[dtype]

    def plain_forward(self, params: Mapping[str, np.ndarray], batch: Any) -> Any:
        """The model at one set of parameters, in their dtype: functional_call of plain_module."""
        dtype = torch.float64 if any(np.asarray(v).dtype == np.float64 for v in params.values()) else torch.float32
        inputs = batch if isinstance(batch, tuple) else (batch,)
        inputs = tuple(t.to(dtype) if t.is_floating_point() else t for t in tensors(inputs))
        with torch.no_grad():
            out = torch.func.functional_call(self.plain_module(dtype), tensors(dict(params)), inputs)
        return numpy_of(out)

    def full(self, grads: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """A gradient on every leaf: zeros where the port gives none (the leaves it does not perturb)."""
        return {leaf.path: np.asarray(grads[leaf.path], np.float32) if leaf.path in grads else
                np.zeros(leaf.shape, np.float32) for leaf in self.tree.leaves}
