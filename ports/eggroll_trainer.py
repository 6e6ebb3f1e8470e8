"""eggroll-trainer 0.1.0 (`EGGROLLTrainer`, MIT) behind the parity protocol, calling the trainer's own methods.

    python -m parity check --port ports.eggroll_trainer:adapter      # noise_reuse=0, the README's setting
    python -m parity check --port ports.eggroll_trainer:antithetic   # noise_reuse=2 ("2 = antithetic sampling")

Configured as the README shows (noise_reuse=0, group_size=0, freeze_nonlora=False) with the suite's pop, sigma,
lr and rank. Paths and lines are those of the 0.1.0 wheel (eggroll_trainer/eggroll.py). The trainer keeps the
factors, so no draw needs recording:
  noise            `_get_lora_params(W, member, epoch)` (factors, 135-186) and `_get_full_rank_params(b, member,
                   epoch)` (188-223). `seed` is not used by the noise: the key is epoch * 1e6 + member (167-168);
                   the constructor's seed only seeds torch's global generator (102-105).
  perturbed_linear, forward
                   `_apply_perturbations(member, epoch)` (W + A B^T, b + eps; 225-252) with the given noise fed
                   through the instance's `_get_lora_params` / `_get_full_rank_params`, then the user's model.
  shape_fitness    `_convert_fitnesses` (254-278), grouping included.
  gradient         `_compute_lora_update` / `_compute_full_update` (280-366) on the given noise.
  optimizer_step, es_tell
                   `step()` itself (368-454): its fitness_fn returns the given values in member order; for
                   optimizer_step `_convert_fitnesses` is the identity (the fitness is already shaped); es_tell
                   uses its own noise for the epoch, or the given noise when told another.
  init_params      the user's model (the package has no init).
  action_uniforms, actions: not part of the package.
The trainer is always built inside torch.random.fork_rng, since its seed argument reseeds torch's global generator.
"""
from __future__ import annotations

import numpy as np
import torch

from ports import _torch as T
from ports.readings import Reading

DIST, PINNED = "eggroll-trainer", "0.1.0"
WHERE = "eggroll_trainer/eggroll.py"

READINGS = (
    Reading("rng", "torch (one key per member)", "every leaf of a member reseeds the same generator with the same "
            "key: same-shape leaves get identical noise, others overlapping draws", f"{WHERE}:167-168, 213-214",
            named=True),
    Reading("antithetic", "off", "noise_reuse=0: every member its own draw, no mirrored pairs", f"{WHERE}:160-163"),
    Reading("fitness", "std_unbiased", "(f - mean) / (std(ddof 1) + 1e-8); grouped: each group's own std "
            "(the reference divides by the global one)", f"{WHERE}:254-278"),
    Reading("bias_noise", "jax", "biases drawn with the weights' key and schedule, applied in the forward",
            f"{WHERE}:188-223, 246-250", named=False),
    Reading("bias_grad", "jax", "mean(f * eps) (eps already times sigma), times lr * sqrt(N)", f"{WHERE}:364, 432-436",
            named=False),
    Reading("noise_reuse", 1, "noise_reuse=0 means the epoch enters the key: new noise every epoch",
            f"{WHERE}:160-163"),
    Reading("optimizer", "sgd", "param + lr * sqrt(N) * update, its own", f"{WHERE}:432-436", named=False),
    Reading("lr_decay", 1.0, "constant learning_rate", f"{WHERE}:435", named=False),
    Reading("sigma_decay", 1.0, "constant sigma (the reference decays it x0.999 per epoch)", f"{WHERE}:185, 223"),
    Reading(None, "seed unused", "the key is epoch * 1e6 + member: every run seed gets the same noise",
            f"{WHERE}:131-133, 167-168"),
    Reading(None, "leaves share one key", "B(0.weight) == B(1.weight)[:4] on 4-8-8-2; 0.bias == 1.bias",
            f"{WHERE}:167-168"),
    Reading(None, "best state kept", "step() keeps best_state_dict (the caller chooses which params to use)",
            f"{WHERE}:438-442"),
)
ANTITHETIC_READINGS = tuple(
    r._replace(value="interleaved", what="noise_reuse=2: pairs (2k, 2k+1), the second negated", named=False)
    if r.knob == "antithetic" else
    r._replace(value=2, what="noise_reuse=2: the key uses epoch // 2: new noise every 2 epochs")
    if r.knob == "noise_reuse" else r for r in READINGS)


def trainer(model, pop: int, sigma: float, lr: float, rank: int, noise_reuse: int, group_size: int = 0,
            fitness_fn=None, seed=None):
    """The package's trainer as its README builds it (inside fork_rng: its seed reseeds torch's global generator)."""
    from eggroll_trainer import EGGROLLTrainer

    with torch.random.fork_rng(devices=[]):
        return EGGROLLTrainer(model.parameters(), model=model, fitness_fn=fitness_fn, population_size=pop,
                              learning_rate=lr, sigma=sigma, rank=rank, noise_reuse=noise_reuse,
                              group_size=group_size, freeze_nonlora=False, seed=seed)


def feed(tr, noise: dict):
    """Make the trainer's noise methods return the given protocol noise (member = thread_id; zeros for leaves the
    noise leaves out). Returns a function that restores its own."""
    names = {id(p): k for k, p in tr.model.named_parameters()}

    def lora(param, thread_id, epoch):
        A, B = noise[names[id(param)]]
        return T.tensor(A[thread_id]), T.tensor(B[thread_id])

    def full(param, thread_id, epoch):
        name = names[id(param)]
        return T.tensor(noise[name][thread_id]) if name in noise else torch.zeros_like(param)
    tr._get_lora_params, tr._get_full_rank_params = lora, full

    def restore():
        del tr._get_lora_params, tr._get_full_rank_params
    return restore


def own_noise(tr, epoch: int, members) -> dict:
    """The trainer's own factors and bias noise for `members` at `epoch`."""
    out = {}
    for name, p in tr.model.named_parameters():
        if p.ndim == 2:
            pairs = [tr._get_lora_params(p, int(i), int(epoch)) for i in members]
            out[name] = (torch.stack([a for a, _ in pairs]), torch.stack([b for _, b in pairs]))
        else:
            out[name] = torch.stack([tr._get_full_rank_params(p, int(i), int(epoch)) for i in members])
    return T.to_numpy(out)


class EggrollTrainerAdapter:
    package = f"{DIST} {T.installed(DIST)}"
    jax_compatible_rng = False
    noise_reuse = 0

    def __init__(self, cfg, model: T.UserModel = T.REFERENCE_NETWORK):
        self.cfg, self.model = cfg, model
        self.name = f"{self.package} EGGROLLTrainer noise_reuse={self.noise_reuse} [user model: {model.label()}]"

    def _trainer(self, shapes_or_params, pop, sigma, lr, rank=None, noise_reuse=None, **kw):
        first = next(iter(shapes_or_params.values()))
        is_params = not isinstance(first, tuple)
        shapes = T.shapes_of(shapes_or_params) if is_params else shapes_or_params
        net = T.user_model(shapes, shapes_or_params if is_params else None, self.model, seed=0)
        reuse = self.noise_reuse if noise_reuse is None else noise_reuse
        return trainer(net, pop, sigma, lr, rank or self.cfg.rank, reuse, **kw)

    # ---- required
    def noise(self, shapes, seed, epoch, members, pop, sigma, rank):
        return own_noise(self._trainer(shapes, pop, sigma, self.cfg.lr, rank, seed=seed), epoch, members)

    def perturbed_linear(self, W, A, B, x):
        layer = torch.nn.Linear(W.shape[1], W.shape[0])
        with torch.no_grad():
            layer.weight.copy_(T.tensor(W))
            layer.bias.zero_()
        layer.bias.requires_grad_(False)               # only the weight is an ES parameter here
        tr = trainer(layer, x.shape[0], 1.0, 1.0, A.shape[2], 0)
        feed(tr, {"weight": (A, B)})
        with torch.no_grad():
            outs = [torch.func.functional_call(layer, {"weight": tr._apply_perturbations(i, 0)["weight"],
                                                       "bias": layer.bias}, (T.tensor(x[i]),))
                    for i in range(x.shape[0])]
        return torch.stack(outs).numpy()

    def shape_fitness(self, f, group_size=0):
        tr = trainer(torch.nn.Linear(1, 1), len(f), 1.0, 1.0, 1, 0, group_size=group_size)
        return tr._convert_fitnesses(T.tensor(f)).numpy()

    def gradient(self, noise, shaped, sigma):
        shapes = T.noise_shapes(noise)
        rank = next(v for v in noise.values() if isinstance(v, tuple))[0].shape[2]
        tr = self._trainer(shapes, len(shaped), sigma, 1.0, rank, noise_reuse=0)
        feed(tr, noise)
        f = T.tensor(shaped)
        with torch.no_grad():
            return T.to_numpy({k: tr._compute_lora_update(p, f, 0) if p.ndim == 2 else tr._compute_full_update(p, f, 0)
                               for k, p in tr.model.named_parameters()})

    # ---- optional
    def forward(self, params, noise, x):
        net = T.user_model(T.shapes_of(params), params, self.model)
        with torch.no_grad():
            if noise is None:
                return net(T.tensor(x)).numpy()
            tr = trainer(net, x.shape[0], self.cfg.sigma, self.cfg.lr, self.cfg.rank, 0)
            feed(tr, noise)
            outs = [torch.func.functional_call(net, tr._apply_perturbations(i, 0), (T.tensor(x[i:i + 1]),))[0]
                    for i in range(x.shape[0])]
            return torch.stack(outs).numpy()

    def init_params(self, shapes, seed):
        return T.to_numpy(T.user_model(shapes, None, self.model, seed=seed).state_dict())

    def optimizer_init(self, params):
        return None

    def optimizer_step(self, params, state, noise, shaped, sigma, epoch):
        values = iter(np.asarray(shaped, dtype=np.float32).tolist())
        tr = self._trainer(params, len(shaped), sigma, self.cfg.lr, noise_reuse=0, fitness_fn=lambda m: next(values))
        feed(tr, noise)
        tr._convert_fitnesses = lambda scores: scores  # the fitness is already shaped
        tr.step()                                      # the package's step(): eggroll.py:368-454
        return T.to_numpy(dict(tr.model.named_parameters())), state

    def es_init(self, params, seed):
        c = self.cfg
        box = {"values": iter(())}
        tr = self._trainer(params, c.pop, c.sigma, c.lr, group_size=c.group_size, seed=seed,
                           fitness_fn=lambda m: next(box["values"]))
        return {"tr": tr, "box": box, "asked": None}

    def es_ask(self, state, epoch):
        if state["asked"] is None or state["asked"][0] != epoch:
            state["asked"] = (epoch, own_noise(state["tr"], epoch, range(self.cfg.pop)))
        return state["asked"][1]

    def es_tell(self, state, noise, fitness, epoch):
        tr = state["tr"]
        restore = None if T.same_noise(noise, self.es_ask(state, epoch)) else feed(tr, noise)
        tr.generation = int(epoch)
        state["box"]["values"] = iter(np.asarray(fitness, dtype=np.float32).tolist())   # member i's return, in order
        try:
            tr.step()
        finally:
            if restore:
                restore()
        state["asked"] = None
        return state

    def es_params(self, state):
        return T.to_numpy(dict(state["tr"].model.named_parameters()))


class AntitheticAdapter(EggrollTrainerAdapter):
    noise_reuse = 2


adapter = EggrollTrainerAdapter
antithetic = AntitheticAdapter


def readme_model(cfg):
    """The README's user model (ReLU, nn.Linear's default init) around the same trainer."""
    return EggrollTrainerAdapter(cfg, T.README_MODEL)
