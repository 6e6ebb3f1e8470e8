"""EGGROLL on a parameter tree (the byte-level LM) as an evosax-style ask/tell over plain data.

    es = make(cfg, knobs)                 # every tree knob resolved through its table, once
    state = init(es, seed)                # params, optimizer state, epoch, ES key sources
    noise, state = ask(es, state)         # the population's TreeNoise for state.epoch
    state, info = tell(es, state, noise, scores)   # shape (group means), estimate per leaf, optimizer step

The estimate per leaf, batched over the stack and the population (N members, member sign s, shaped f):
    lowrank  g = einsum('n...ir,n...jr->...ij', f * A, B) / N   (on the factored shape; back to the stored)
    param    g = mean_n(f * eps)
    none     g = 0 (frozen params, embeddings, excluded leaves)
and the step is the reference's optax one: params += lr * sqrt(N) * g (the solver gets -(g sqrt(N))).
"""
from __future__ import annotations

from typing import Any, Callable, Mapping, NamedTuple

import torch

from spec.lm import LMConfig, lm_tree
from spec.tree import Tree
from spec.tree_knobs import TreeKnobs
from torch_impl.fitness import JAX_EPS, check_fitness, shape_jax
from torch_impl.optim import Optimizer, apply_updates, make_optimizer
from torch_impl.tree.keys import init_lm
from torch_impl.tree.noise import (NoisePlan, TreeNoise, from_stack_first, make_plan, per_member,
                                   sample, unmatrix)

Params = dict[str, torch.Tensor]


def shape_group_var(f: torch.Tensor, group_size: int) -> torch.Tensor:
    """Each group centred by its mean and divided by its own spread sqrt(var(group) + 1e-5) (a port's mistake)."""
    if not group_size:
        return shape_jax(f, 0)
    groups = f.reshape(-1, group_size)
    centred = groups - groups.mean(dim=1, keepdim=True)
    return (centred / torch.sqrt(groups.var(dim=1, correction=0, keepdim=True) + JAX_EPS)).reshape(-1)


# knob group_fitness -> (f (pop,), group_size) -> shaped (pop,)
GROUP_FITNESS: dict[str, Callable[[torch.Tensor, int], torch.Tensor]] = {
    "global_var": shape_jax,           # the reference's convert_fitnesses: group means, the global variance
    "group_var": shape_group_var,
}


class LMES(NamedTuple):
    """One configuration of the strategy: the LM's config and tree knobs, resolved."""

    cfg: LMConfig
    knobs: TreeKnobs
    tree: Tree
    plan: NoisePlan                                   # roles per leaf (tmm_layout, frozen_leaves, embedding), rng
    shaping: Callable[[torch.Tensor], torch.Tensor]   # knob group_fitness (with cfg.group_size)
    optimizer: Optimizer


class LMState(NamedTuple):
    params: Params
    opt_state: Any
    epoch: int
    sources: Mapping[str, object]     # per leaf: its slice keys (*stack, 2) (rng=jax) or a TorchSource


def make(cfg: LMConfig, knobs: TreeKnobs = TreeKnobs()) -> LMES:
    """Resolve every knob once: nothing inside ask or tell branches on a knob's name."""
    tree = lm_tree(cfg)
    plan = make_plan(tree, knobs, cfg.pop, cfg.rank, cfg.noise_reuse, cfg.freeze_nonlora)
    return LMES(cfg, knobs, tree, plan, lambda f: GROUP_FITNESS[knobs.group_fitness](f, cfg.group_size),
                make_optimizer(cfg.optimizer))


def init(es: LMES, seed: int, device: str | torch.device = "cpu", params: Params | None = None) -> LMState:
    """Epoch 0: initial params (spec.lm.init_plan, or the given ones), a fresh optimizer state, the key sources."""
    if params is None:
        params = init_lm(es.cfg, seed, es.knobs.rng, device)
    sources = es.plan.generator.sources(es.tree, seed, es.knobs.leaf_order, es.knobs.stack_keys)
    return LMState(params, es.optimizer.init(params), 0, sources)


def _device(state: LMState) -> torch.device:
    return next(iter(state.params.values())).device


def ask(es: LMES, state: LMState) -> tuple[TreeNoise, LMState]:
    """The population's noise for state.epoch (sigma constant: the LM has no schedule)."""
    return sample(es.plan, state.sources, state.epoch, es.cfg.sigma, _device(state)), state


def member_weights(noise: TreeNoise, shaped: torch.Tensor) -> torch.Tensor:
    """(rows, k) weights f_i * s_i of each row's k members (k = 1 for per-member noise)."""
    k = 1 if noise.signs is None else len(noise.signs)
    signs = torch.ones(1) if noise.signs is None else torch.tensor(noise.signs)
    return shaped.view(-1, k) * signs.to(shaped)


def _expand_members(t: torch.Tensor, k: int) -> torch.Tensor:
    """(rows, ...) -> (rows k, ...) repeated (no sign)."""
    return t.unsqueeze(1).expand(t.shape[0], k, *t.shape[1:]).flatten(0, 1)


def leaf_gradients(tree: Tree, noise: TreeNoise, shaped: torch.Tensor) -> Params:
    """path -> g at the leaf's stored shape, one batched einsum or mean per leaf over its stack and the members."""
    w = member_weights(noise, shaped)                                                  # (rows, k)
    k, n = w.shape[1], shaped.shape[0]
    grads = {}
    for leaf in tree.leaves:
        role = noise.roles[leaf.path]
        if role.kind == "lowrank":
            A, B = noise.A[leaf.path], noise.B[leaf.path]                               # (rows, *stack, a|b, r)
            fA = (w.view(*w.shape, *[1] * (A.dim() - 1)) * A.unsqueeze(1)).flatten(0, 1)
            g = torch.einsum("n...ir,n...jr->...ij", fA, _expand_members(B, k)) / n
            g = unmatrix(g.transpose(-1, -2) if role.transposed else g, leaf)        # an N-D slice from its matrix
            grads[leaf.path] = from_stack_first(g, leaf).contiguous()
        elif role.kind == "param":
            eps = noise.eps[leaf.path]
            fe = (w.view(*w.shape, *[1] * (eps.dim() - 1)) * eps.unsqueeze(1)).flatten(0, 1)
            grads[leaf.path] = from_stack_first(fe.mean(dim=0), leaf).contiguous()
        else:
            grads[leaf.path] = torch.zeros(leaf.shape, dtype=shaped.dtype, device=shaped.device)
    return grads


def gradient(es: LMES, state: LMState, noise: TreeNoise, scores: torch.Tensor) -> tuple[torch.Tensor, Params]:
    """(shaped fitness, per-leaf gradient) from the members' raw scores (pop,): the estimate half of tell."""
    scores = torch.as_tensor(scores)
    check_fitness(scores, es.cfg.pop)
    shaped = es.shaping(scores.to(device=_device(state), dtype=torch.float32))
    return shaped, leaf_gradients(es.tree, noise, shaped)


def apply(es: LMES, state: LMState, grads: Params) -> tuple[LMState, Params]:
    """-(g * sqrt(N)) to the optimizer at lr, applied; the next epoch's state."""
    root_n = torch.sqrt(torch.tensor(float(es.cfg.pop), dtype=torch.float32, device=_device(state)))
    descent = {k: -(g * root_n) for k, g in grads.items()}
    updates, opt_state = es.optimizer.update(descent, state.opt_state, state.params, es.cfg.lr)
    return state._replace(params=apply_updates(state.params, updates), opt_state=opt_state,
                          epoch=state.epoch + 1), updates


def tell(es: LMES, state: LMState, noise: TreeNoise, scores: torch.Tensor) -> tuple[LMState, dict]:
    """One ES step from the members' raw scores (pop,) (higher is better): shape, estimate, optimizer step."""
    shaped, grads = gradient(es, state, noise, scores)
    new_state, updates = apply(es, state, grads)
    info = {"shaped": shaped, "grads": grads, "updates": updates,
            "grad_norm": {k: float(torch.linalg.vector_norm(g)) for k, g in grads.items()}}
    return new_state, info


__all__ = ["GROUP_FITNESS", "LMES", "LMState", "make", "init", "ask", "gradient", "apply", "tell",
           "leaf_gradients", "shape_group_var", "per_member"]
