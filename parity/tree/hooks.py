"""Forward hooks on a port's torch module (its adapter's `module`, an nn.Module whose named_parameters are the tree's
paths): the calls of the modules that own the tree's leaves during a population forward, in call order. The forward
check (parity.tree.forward) reads the order the model first uses its leaves and the first layer whose input differs
between two calls on the same inputs; the layers check (parity.tree.layers) each mm/tmm leaf's calls.
"""
from __future__ import annotations

import contextlib
from typing import Any, Callable

import numpy as np


def module_of(side) -> Any:
    """The port's torch module (its `module` attribute, an nn.Module), or None."""
    module = getattr(side.port.port, "module", None)
    if module is None:
        return None
    import torch
    return module if isinstance(module, torch.nn.Module) else None


def owner_name(module, path: str) -> str | None:
    """The name of the submodule that registers the parameter at `path` ('' for the root), or None."""
    prefix, _, name = path.rpartition(".")
    try:
        owner = module.get_submodule(prefix) if prefix else module
    except AttributeError:
        return None
    return prefix if name in dict(owner.named_parameters(recurse=False)) else None


@contextlib.contextmanager
def capturing(module, names, keep: bool = True):
    """Forward hooks on the submodules `names`: yields the calls [(name, x, y)] in call order (x and y float64 numpy;
    None when keep is False, or where a call's input or output is no plain tensor: none, or batched by vmap)."""
    calls: list = []

    def hook_for(name: str) -> Callable:
        def hook(_, args, output):
            x = args[0] if args else None
            if not keep:
                calls.append((name, None, None))
                return
            try:
                calls.append((name, x.detach().cpu().double().numpy(), output.detach().cpu().double().numpy()))
            except (AttributeError, RuntimeError, TypeError):   # no tensor, or one without storage (under vmap)
                calls.append((name, None, None))
        return hook

    handles = [module.get_submodule(n).register_forward_hook(hook_for(n)) for n in dict.fromkeys(names)]
    try:
        yield calls
    finally:
        for h in handles:
            h.remove()


def population(side, params: dict, noise: dict, batch) -> np.ndarray:
    """The port's population forward for the members of `noise` (their count read from its arrays)."""
    m = next(iter(noise.values()))
    return side.port.population_forward(params, noise, batch, (m[0] if isinstance(m, tuple) else m).shape[0])


def forward_order(side, params: dict, noise: dict, batch) -> list[str] | None:
    """The paths of `noise`'s leaves in the order the module first calls their owners, or None without a module."""
    module = module_of(side)
    if module is None:
        return None
    owners = {p: owner_name(module, p) for p in noise}
    with capturing(module, [o for o in owners.values() if o is not None], keep=False) as calls:
        population(side, params, noise, batch)
    first = list(dict.fromkeys(name for name, _, _ in calls))
    return sorted((p for p, o in owners.items() if o in first), key=lambda p: first.index(owners[p]))


def first_nondeterministic(side, params: dict, noise: dict, batch) -> str:
    """Where two population forwards on the same inputs part, in words ('' when the hooks see nothing: no module):
    the dropout modules called in training mode, and the first module owning a leaf (in call order) whose input
    differs between the two calls."""
    module = module_of(side)
    if module is None:
        return ""
    owners = {p: owner_name(module, p) for p in side.port.cfg.tree.declared}
    leaf_of: dict[str, str] = {}
    for path, owner in owners.items():
        if owner is not None:
            leaf_of.setdefault(owner, path)
    runs, dropouts = [], []

    def training(name):
        def pre(mod, _):
            if mod.training and getattr(mod, "p", 0) and name not in dropouts:
                dropouts.append(name)
        return pre

    import torch
    handles = [mod.register_forward_pre_hook(training(name)) for name, mod in module.named_modules()
               if isinstance(mod, (torch.nn.Dropout, torch.nn.Dropout1d, torch.nn.Dropout2d, torch.nn.Dropout3d,
                                   torch.nn.AlphaDropout, torch.nn.FeatureAlphaDropout))]
    try:
        for _ in range(2):
            with capturing(module, list(leaf_of)) as calls:
                population(side, params, noise, batch)
            runs.append(calls)
    finally:
        for h in handles:
            h.remove()
    words = []
    if dropouts:
        words.append(f"dropout in training mode during the population forward: {', '.join(dropouts[:4])}"
                     + (f" and {len(dropouts) - 4} more" if len(dropouts) > 4 else ""))
    for (name, x0, _), (_, x1, _) in zip(*runs):
        if x0 is not None and (x0.shape != x1.shape or not np.array_equal(x0, x1)):
            words.append(f"the first layer whose input differs between the two calls is {name or 'the model'} "
                         f"(leaf {leaf_of[name]}): the randomness enters before it")
            break
    return "; ".join(words)


def conv2d_of(owner) -> Any:
    """The owner as an nn.Conv2d (its kernel, stride, padding, dilation, groups), or None when it is none."""
    import torch
    return owner if isinstance(owner, torch.nn.Conv2d) else None


def im2col(conv, x: np.ndarray) -> np.ndarray:
    """x (n, in, H, W) -> the conv's patches (n, L, in * kh * kw), float64, a patch's entries in (in, kh, kw) order
    (F.unfold with the conv's kernel, dilation, padding and stride)."""
    import torch
    cols = torch.nn.functional.unfold(torch.from_numpy(np.asarray(x, np.float64)), conv.kernel_size,
                                      dilation=conv.dilation, padding=conv.padding, stride=conv.stride)
    return np.swapaxes(cols.numpy(), 1, 2)
