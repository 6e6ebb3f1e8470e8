"""The C side in egg.c mode reproduces the portable egg.c itself (ljubomirj/egg.c `full_trained_egg-cpumulti.c`).

egg.c's file is taken from a git mirror (EGG_C_GIT, default /work/.mirror/ljubomirj+egg.c/repo; skipped with the
reason when absent) at COMMIT, copied into a scratch folder outside the repository and patched there only: a
stand-in `egg_config.h` of tiny sizes (vocab 256, d 16, 2 layers, seq 8, pop 8), a fixed seed base in place of
time(NULL), a fixed number of steps, and dumps (the model after init and after every step, every member's loss).
It is built with the system C compiler and run on the first bytes of the project's corpus. The project's side:
`c_int8.Int8C(..., knobs="egg.c-cpumulti")` (the seven departures and egg.c's two structural switches), egg.c's
xorshift init (`c_int8.egg_c_init`) and its data layout (`rollout.int8_data.egg_c_tokens`). Every member's loss,
every pair's fitness and every weight after every step are equal.
"""
from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

import c_int8
from rollout.corpus import CORPUS_PATH
from rollout.int8_data import egg_c_tokens
from spec.int8 import EGG_C_ORIGINAL, Int8Config

MIRROR = Path(os.environ.get("EGG_C_GIT", "/work/.mirror/ljubomirj+egg.c/repo"))
_, SOURCE, COMMIT = EGG_C_ORIGINAL
ROOT = Path(__file__).resolve().parent.parent
D, L, SEQ, POP, STEPS, BASE, DATA_BYTES = 16, 2, 8, 8, 6, 0x2468ACE1, 3000

CONFIG_H = f"""#ifndef EGG_CONFIG_H
#define EGG_CONFIG_H
#define VOCAB_SIZE 256
#define HIDDEN_DIM {D}
#define N_LAYERS {L}
#define SEQ_LEN {SEQ}
#define POPULATION_SIZE {POP}
#define BATCH_SIZE 8
#define FIXED_POINT 4
#define SIGMA_SHIFT 4
#define UPDATE_THRESHOLD 160
#define MAX_VAL 127
#define MIN_VAL -127
#define MAX_MATRIX_DIM 256   /* max(4 d, vocab): the head has vocab rows (egg.c sizes it for d 512) */
#define MAX_POP_PAIRS (POPULATION_SIZE / 2)
#endif
"""
# (anchor in egg.c's source, what the scratch copy gets in its place): each anchor must occur exactly once
PATCHES = [
    ("int32_t EXP2_TABLE[256];", "int32_t EXP2_TABLE[256];\nint32_t egg_losses[POPULATION_SIZE];\n"
     "static void egg_dump(const void *m, size_t n, long step) { char name[64]; FILE *f;\n"
     "  snprintf(name, sizeof name, \"model_%ld.bin\", step); f = fopen(name, \"wb\"); fwrite(m, 1, n, f); "
     "fclose(f); }"),
    ("    if (loss_pos < loss_neg) pair_fitnesses[p_idx] = 1;",
     "    egg_losses[p_idx * 2] = loss_pos; egg_losses[p_idx * 2 + 1] = loss_neg;\n"
     "    if (loss_pos < loss_neg) pair_fitnesses[p_idx] = 1;"),
    ("uint32_t step_seed = (uint32_t)time(NULL) ^ (step * 0x9e3779b9);",
     "uint32_t step_seed = (uint32_t)EGG_BASE ^ (step * 0x9e3779b9);"),
    ("long max_steps = (ds.length - 1) / SEQ_LEN;",
     "long max_steps = EGG_STEPS; egg_dump(model, sizeof(EggModel), -1);"),
    ("        total_tokens += SEQ_LEN;",
     "        egg_dump(model, sizeof(EggModel), step); printf(\"EGGSTEP %ld\", step);\n"
     "        for (int m = 0; m < POPULATION_SIZE; m++) printf(\" %d\", egg_losses[m]);\n"
     "        for (int p = 0; p < POPULATION_SIZE / 2; p++) printf(\" f%d\", pair_fitnesses[p]);\n"
     "        printf(\"\\n\");\n        total_tokens += SEQ_LEN;"),
]


def _source() -> str:
    if not (MIRROR / "HEAD").exists() and not (MIRROR / ".git").exists():
        pytest.skip(f"egg.c's git mirror is absent ({MIRROR}; set EGG_C_GIT to a clone of ljubomirj/egg.c at "
                    f"{COMMIT[:7]})")
    done = subprocess.run(["git", "--git-dir", str(MIRROR), "show", f"{COMMIT}:{SOURCE}"], capture_output=True,
                          text=True)
    if done.returncode != 0:
        pytest.skip(f"{MIRROR} holds no {SOURCE} at {COMMIT[:7]}: {done.stderr.strip()}")
    return done.stdout


def _unpack(raw: bytes) -> dict:
    """egg.c's EggModel (int8 arrays, no padding) as {path: int8} in the project's tree."""
    v = np.frombuffer(raw, np.int8)
    sizes = [("emb", 256 * D), ("gru", L * 4 * D * D), ("bias", L * 2 * D), ("mlp", L * 2 * 4 * D * D),
             ("head", D * 256), ("ln", L * 2 * D), ("ln_out", D)]
    parts, at = {}, 0
    for name, n in sizes:
        parts[name], at = v[at:at + n], at + n
    assert at == v.size, (at, v.size)
    gru, mlp = parts["gru"].reshape(L, 4, D, D), parts["mlp"].reshape(L, 2, 4 * D * D)
    bias, ln = parts["bias"].reshape(L, 2, D), parts["ln"].reshape(L, 2, D)
    out = {f"blocks.att.{n}": gru[:, g] for g, n in enumerate(("Wf", "Uf", "Wh", "Uh"))}
    out.update({"blocks.mlp.0.weight": mlp[:, 0].reshape(L, 4 * D, D), "blocks.mlp.1.weight": mlp[:, 1].reshape(L, D, 4 * D),
                "blocks.att.bf": bias[:, 0], "blocks.att.bh": bias[:, 1], "blocks.ln1.weight": ln[:, 0],
                "blocks.ln2.weight": ln[:, 1], "emb": parts["emb"].reshape(256, D),
                "head": parts["head"].reshape(256, D), "ln_out.weight": parts["ln_out"]})
    return out


@pytest.fixture(scope="module")
def egg_c_run(tmp_path_factory):
    """egg.c built and run in a scratch folder: (the data it read, model dumps by step, losses and fitness by step)."""
    reason = c_int8.unavailable_reason()
    if reason is not None:
        pytest.skip(reason)
    cc = shutil.which(os.environ.get("CC") or "cc") or shutil.which("gcc") or shutil.which("clang")
    if cc is None:
        pytest.skip("no C compiler to build egg.c with")
    text = _source()
    work = tmp_path_factory.mktemp("egg_c")
    if ROOT in work.resolve().parents:
        pytest.skip("the scratch folder must lie outside the repository")
    for anchor, replacement in PATCHES:
        assert text.count(anchor) == 1, f"egg.c at {COMMIT[:7]} no longer holds {anchor!r} once"
        text = text.replace(anchor, replacement)
    (work / SOURCE).write_text(text)
    (work / "egg_config.h").write_text(CONFIG_H)
    data = np.frombuffer(Path(CORPUS_PATH).read_bytes()[:DATA_BYTES], np.uint8)
    (work / "input.txt").write_bytes(data.tobytes())
    build = subprocess.run([cc, "-O1", "-std=gnu11", "-DEGG_FORCE_SCALAR", f"-DEGG_BASE={BASE}u",
                            f"-DEGG_STEPS={STEPS}", "-o", "egg", SOURCE, "-lm"], cwd=work, capture_output=True,
                           text=True)
    assert build.returncode == 0, f"egg.c at {COMMIT[:7]} did not build:\n{build.stderr[-3000:]}"
    run = subprocess.run(["./egg"], cwd=work, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, f"egg.c at {COMMIT[:7]} failed:\n{run.stdout[-2000:]}\n{run.stderr[-2000:]}"
    steps = {}
    for line in run.stdout.splitlines():
        if line.startswith("EGGSTEP "):
            fields = line.split()
            steps[int(fields[1])] = (np.array([int(x) for x in fields[2:2 + POP]], np.int64),
                                     np.array([int(x[1:]) for x in fields[2 + POP:]], np.int64))
    models = {s: _unpack((work / f"model_{s}.bin").read_bytes()) for s in range(-1, STEPS)}
    return data, models, steps


def test_egg_c_init_is_reproduced(egg_c_run):
    _, models, _ = egg_c_run
    cfg = Int8Config(n_embd=D, n_layer=L, pop=POP, tokens_per_update=SEQ)
    ours = c_int8.egg_c_init(cfg)
    for path, value in models[-1].items():
        assert np.array_equal(ours[path], value), f"{path} (egg.c at {COMMIT[:7]})"


def test_every_loss_fitness_and_weight_of_every_step_is_reproduced(egg_c_run):
    from torch_impl.int8_noise import normal_lut     # only handed to the C side (egg.c mode reads no table noise)
    data, models, steps = egg_c_run
    cfg = Int8Config(n_embd=D, n_layer=L, pop=POP, tokens_per_update=SEQ)
    side = c_int8.Int8C(cfg, BASE, normal_lut().numpy(), knobs="egg.c-cpumulti")
    params = c_int8.egg_c_init(cfg)
    states = np.zeros((POP, L, D), np.int8)
    assert sorted(steps) == list(range(STEPS))
    moved = 0
    for step in range(STEPS):
        tokens = egg_c_tokens(data, step, POP, SEQ)
        result = side.epoch(params, step, 0, tokens, states)
        losses, fitness = steps[step]
        assert np.array_equal(-result.scores.astype(np.int64), losses), f"step {step} (egg.c at {COMMIT[:7]})"
        assert np.array_equal(result.fitness.astype(np.int64), fitness), f"step {step}"
        for path, value in models[step].items():
            assert np.array_equal(result.params[path], value), f"step {step}: {path} (egg.c at {COMMIT[:7]})"
        moved += sum(int(np.sum(result.params[p] != params[p])) for p in params)
        params, states = result.params, result.states
    assert moved > 0 and len({tuple(v) for v, _ in steps.values()}) == STEPS        # it trains: not a fixed point


def test_the_torch_port_in_egg_c_mode_reproduces_egg_c_too(egg_c_run):
    import torch
    from spec.int8_knobs import int8_profile
    from torch_impl import int8_es
    from torch_impl.int8_model import scores as model_scores
    from torch_impl.int8_noise import member_view
    data, models, steps = egg_c_run
    cfg = Int8Config(n_embd=D, n_layer=L, pop=POP, tokens_per_update=SEQ)
    es = int8_es.make(cfg, int8_profile("egg.c-cpumulti"))
    state = int8_es.init(es, BASE, params={p: torch.from_numpy(v) for p, v in c_int8.egg_c_init(cfg).items()})
    states = torch.zeros((POP, L, D), dtype=torch.int8)
    for step in range(STEPS):
        tokens = torch.from_numpy(egg_c_tokens(data, step, POP, SEQ).astype(np.int64))
        noise, state = int8_es.ask(es, state)
        scores, states = model_scores(state.params, member_view(noise, POP), tokens, states, cfg.sigma_shift,
                                      knobs=es.knobs)
        state, _ = int8_es.tell(es, state, noise, scores)
        assert np.array_equal(-scores.numpy().astype(np.int64), steps[step][0]), f"step {step}"
        for path, value in models[step].items():
            assert np.array_equal(state.params[path].numpy(), value), f"step {step}: {path}"
