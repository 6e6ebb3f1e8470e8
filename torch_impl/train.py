"""Train a CartPole-v1 policy with the functional torch EGGROLL: ask, roll out, tell, log. Stops when solved."""
from __future__ import annotations

import contextlib
import sys
import time
from typing import Callable, TextIO

import numpy as np
import torch
from torch.utils._pytree import tree_leaves, tree_map

from rollout import cartpole
from rollout.episodes import Compaction, greedy_actions, run_episodes, sample_actions
from spec.config import Config
from spec.knobs import Knobs
from spec.run import Progress, TrainResult, epoch_row, until_solved
from torch_impl import cuda_graphs
from torch_impl import es as es_mod
from torch_impl.noise import Noise, group_size, population_of


# knob actions -> how logits become an action (the shared uniforms are the action randomness)
ACTIONS = {"sample": sample_actions, "greedy": greedy_actions}
MIN_ROWS = 8   # a compact forward computes at least this many rows: torch's matmul takes another path below ~4
# The compact forward re-gathers its noise once fewer than this fraction of the computed groups are alive: a
# finished group costs its forward rows at every later step, a gather about a microsecond per alive group (at the
# paper preset 0.95 computes 9% fewer rows than 0.5, for about a thousand gathers per run: 0.4 s of copies)
SHRINK = 0.95


def subset_noise(noise: Noise, draws: torch.Tensor) -> Noise:
    """The noise of the given draws only (grouped or per-member rows), in the same r-major layout."""
    pick = lambda t: t.index_select(0, draws)                                    # noqa: E731
    # (rows, n, r) factors gathered as their (rows, r, n) transpose: one copy, already r-major
    pick_r_major = lambda t: pick(t.transpose(1, 2)).transpose(1, 2)             # noqa: E731
    return noise._replace(A={n: pick_r_major(v) for n, v in noise.A.items()},
                          B={n: pick_r_major(v) for n, v in noise.B.items()},
                          bias={n: pick(v) for n, v in noise.bias.items()})


class EagerForwards:
    """The compact rollout's forwards called directly: the noise of the computed groups gathered when they change."""

    def __init__(self, params: dict[str, torch.Tensor], noise: Noise, forward: Callable, device: str | torch.device):
        self.params, self.noise, self.forward, self.device = params, noise, forward, device

    def gather(self, groups: np.ndarray) -> Noise:
        return subset_noise(self.noise, torch.from_numpy(groups).to(self.device))

    def logits(self, x: np.ndarray, current: Noise | None) -> np.ndarray:
        noise = self.noise if current is None else current
        return self.forward(self.params, torch.from_numpy(x).to(self.device), noise).cpu().numpy()


def compact_policy(params: dict[str, torch.Tensor], noise: Noise, forward: Callable, device: str | torch.device,
                   graphs: PolicyGraphs | None = None):
    """policy(obs (m, 4), rows (m,)) -> logits (m, 2) computing only the draws that alive rows use (rollout's
    Compaction: whole antithetic pairs, re-gathered a few times per episode as members finish).

    A finished partner runs on a zero input; a row's logits depend only on its own input and noise, so the
    values are those of the whole-population forward. `graphs`: the same calls replayed from CUDA graphs.
    """
    k, pop = group_size(noise), population_of(noise)
    plan = Compaction(pop, k, MIN_ROWS, shrink=SHRINK)
    engine = EagerForwards(params, noise, forward, device) if graphs is None else graphs.load(params, noise)
    current = {"gathered": None}

    def policy(obs: np.ndarray, rows: np.ndarray) -> np.ndarray:
        members, position, changed = plan.update(rows)
        if changed:
            current["gathered"] = engine.gather(plan.groups)
        # every computed member alive, in order (run_episodes passes rows ascending): obs is the input as it is
        padded = position.size < members.size or not (np.diff(position) > 0).all()
        x = obs
        if padded:
            x = np.zeros((members.size, obs.shape[1]), dtype=obs.dtype)
            x[position] = obs
        logits = engine.logits(x, current["gathered"])
        return logits[position] if padded else logits

    return policy


class PolicyGraphs:
    """The population forward captured once per compacted size (torch_impl.cuda_graphs), for CUDA rollouts: what
    EagerForwards calls, replayed.

    Static full-population params, noise, inputs and group indices are refreshed in place (params and noise once per
    epoch, the groups when the compaction shrinks, the inputs every step); the graph for m rows runs the eager
    path's very call on the first m of them (subset_noise then forward), so the same kernels see the same values.
    Graphs persist across epochs: a size met again is replayed, not captured again.
    """

    def __init__(self, forward: Callable, backend):
        self.forward, self.graphs = forward, cuda_graphs.Graphs(backend)
        self.params = self.noise = self.x = self.groups = None
        self.layout: tuple = ()

    def load(self, params: dict[str, torch.Tensor], noise: Noise) -> "PolicyGraphs":
        """Copy the epoch's params and noise into the static buffers (made, and the graphs dropped, on a new layout)."""
        new = tuple(map(cuda_graphs.signature, tree_leaves((params, noise))))
        if self.params is None or new != self.layout:
            static = lambda t: cuda_graphs.static_like(t) if isinstance(t, torch.Tensor) else t   # noqa: E731
            self.params, self.noise = tree_map(static, params), tree_map(static, noise)
            pop, w = population_of(noise), params["0.weight"]
            self.x = torch.empty(pop, w.shape[1], dtype=w.dtype, device=w.device)
            self.groups = torch.empty(pop // group_size(noise), dtype=torch.int64, device=w.device)
            self.layout, self.graphs.calls = new, {}
        for dst, src in zip(tree_leaves((self.params, self.noise)), tree_leaves((params, noise))):
            if isinstance(src, torch.Tensor):
                dst.copy_(src)
        return self

    def gather(self, groups: np.ndarray) -> int:
        """The computed groups (the compaction's) into the static index; returns their count."""
        self.groups[:groups.size].copy_(torch.from_numpy(groups))
        return int(groups.size)

    def logits(self, x: np.ndarray, gathered: int | None) -> np.ndarray:
        """logits (m, 2) of inputs x (m, in) on the full noise (gathered None) or on the first `gathered` groups'."""
        m = x.shape[0]
        self.x[:m].copy_(torch.from_numpy(x))

        def call():
            noise = self.noise if gathered is None else subset_noise(self.noise, self.groups[:gathered])
            return self.forward(self.params, self.x[:m], noise)

        return self.graphs.run((m, gathered), call).cpu().numpy()


def policy_graphs(es: es_mod.ES, device: str | torch.device, backend=None) -> PolicyGraphs | None:
    """The captured rollout forwards for this run: on CUDA unless TORCH_IMPL_CUDA_GRAPHS=never, with the eager forward
    (compile=on keeps inductor's own code uncaptured); None elsewhere. `backend` (tests): capture on any device."""
    if backend is None and not (cuda_graphs.wanted(device) and es.knobs.compile == "off"):
        return None
    return PolicyGraphs(es.forward, backend or cuda_graphs.CudaBackend(device))


def evaluate(es: es_mod.ES, params: dict[str, torch.Tensor], noise: Noise, seed: int, epoch: int,
             device: str | torch.device, compact: bool = True, graphs: PolicyGraphs | None = None) -> np.ndarray:
    """Every member's return (pop,) float32: one CartPole episode each, the alive members stepped together
    (compact=False: every member computed at every step, finished or not; the same numbers, slower).
    `graphs`: the compact rollout's forwards replayed from CUDA graphs (policy_graphs), the same numbers."""
    pop = es.cfg.pop
    init_state = cartpole.reset(seed + epoch + np.arange(pop))
    uniforms = es.plan.generator.action_uniforms(seed, epoch, pop)
    choose = ACTIONS[es.knobs.actions]
    with torch.inference_mode():
        if compact:
            policy = compact_policy(params, noise, es.forward, device, graphs)
            return run_episodes(policy, init_state, uniforms, choose=choose, compact=True).returns
        policy = lambda obs: es.forward(params, torch.from_numpy(obs).to(device), noise).cpu().numpy()  # noqa: E731
        return run_episodes(policy, init_state, uniforms, choose=choose).returns


@contextlib.contextmanager
def intra_op_threads(n: int | None):
    """Run with torch's intra-op thread count set to n (None: leave it), restored afterwards."""
    if n is None:
        yield
        return
    previous = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(previous)


Instrument = Callable[[str, Callable], Callable]   # (phase name, function) -> the function as the loop calls it


def _as_is(name: str, fn: Callable) -> Callable:
    return fn


def train(cfg: Config, knobs: Knobs, seed: int, device: str | torch.device = "cpu", progress: bool = True,
          stream: TextIO | None = None, threads: int | None = 1, compact: bool = True,
          instrument: Instrument | None = None, graph_backend=None) -> TrainResult:
    """Run ES epochs until the population's mean return reaches 475 or cfg.max_env_steps are spent.

    `threads`: torch intra-op threads while training (default 1: the rollout's kernels are tens of
    microseconds, where thread hand-offs cost more than they save; None leaves torch's setting).
    `compact`: compute only the members still alive at each step (the same numbers; False computes all).
    `instrument(name, fn)`, when given, wraps each phase once before the loop: "ask", "rollout", "tell" and
    "forward" (the population forward the rollout calls every env step); bench.solve times them so.
    On CUDA the compact rollout's forwards are captured as CUDA graphs (PolicyGraphs; env TORCH_IMPL_CUDA_GRAPHS=never:
    eager), the same numbers; `graph_backend` (tests) captures on any device through cuda_graphs.Emulated.
    """
    with intra_op_threads(threads):
        return _train(cfg, knobs, seed, device, Progress(stream or sys.stdout, progress), compact,
                      instrument or _as_is, graph_backend)


def _train(cfg: Config, knobs: Knobs, seed: int, device: str | torch.device, progress: Progress,
           compact: bool = True, instrument: Instrument = _as_is, graph_backend=None) -> TrainResult:
    es = es_mod.make(cfg, knobs)
    es = es._replace(forward=instrument("forward", es.forward))
    ask, rollout, tell = instrument("ask", es_mod.ask), instrument("rollout", evaluate), instrument("tell", es_mod.tell)
    state = es_mod.init(es, seed, device)
    graphs = policy_graphs(es, device, graph_backend)

    def epochs(state):
        """The ES epochs, one epoch_row each (until_solved stops them)."""
        env_steps = 0
        while True:
            epoch = state.epoch
            noise, state = ask(es, state)
            returns = rollout(es, state.params, noise, seed, epoch, device, compact, graphs)
            env_steps += int(returns.sum())
            state, info = tell(es, state, noise, torch.from_numpy(returns))
            yield epoch_row(epoch, env_steps, returns.mean(), returns.max(), info["sigma"], info["lr"],
                            info["grad_norm"], time.perf_counter() - start)

    start = time.perf_counter()
    return until_solved(epochs(state), cfg.max_env_steps, progress, start)
