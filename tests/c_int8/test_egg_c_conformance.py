"""Conformance: the C side in egg.c mode (c_int8.train_egg_c, profile egg.c-cpumulti) reproduces egg.c's own portable
program, ljubomirj/egg.c `full_trained_egg-cpumulti.c`, step by step, bit for bit.

egg.c has no license and is never copied into the repository: the test reads the file and its `egg_config.h` from a
local git mirror (EGG_C_GIT, a clone or mirror of ljubomirj/egg.c; skipped with the reason when absent) at
COMMIT (else HEAD), writes them into a scratch folder outside the repository, builds them there with the system C
compiler (skipped when there is none) and runs the program on a stand-in data file (the first bytes of the
project's corpus as `input.txt`). The scratch copy is egg.c's own code except for:
- egg_config.h: a tiny size (HIDDEN_DIM, N_LAYERS, SEQ_LEN, POPULATION_SIZE; SIGMA_SHIFT 4 and UPDATE_THRESHOLD 160
  are kept). HIDDEN_DIM is 64 or more: egg.c's update buffers hold MAX_MATRIX_DIM = 4 * HIDDEN_DIM rows, and the
  head has VOCAB_SIZE = 256, so a smaller width overruns them;
- the step seed's base: the constant EGG_SEED_BASE in place of time(NULL);
- the step count: at most EGG_STEPS (egg.c's own bound (length - 1) / SEQ_LEN kept);
- records written to files: each step's number and seed, each pair's two losses and its fitness, the printed
  noise-off loss (raw, every 10th step), and the whole model struct after the init and after every step.
It is built with EGG_FORCE_SCALAR: the portable scalar path (what the portable `egg-cpumulti` Makefile target gives
on x86-64 without -mavx2). egg.c's AVX2 path (its Linux amd64 target, -mavx2 -DEGG_FORCE_AVX2) sums |x| in the layer
norm with _mm256_sad_epu8 / _mm_sad_epu8, i.e. as UNSIGNED bytes (a negative x counts 256 + x): that build computes
another function and is not reproduced (nor is egg.c's sampling: rand() seeded by time(NULL), printed text only).

Compared at every step: each pair's losses (egg.c's loss = -score) and fitness, every parameter after the update
(all 13 leaves, the frozen ones included), the printed noise-off loss, and the init.
"""
from __future__ import annotations

import os
import subprocess
from pathlib import Path

import numpy as np
import pytest

import c_int8
from spec.int8 import EGG_C_ORIGINAL
from tests.helpers import upstream_files

ROOT = Path(__file__).resolve().parents[2]
MIRROR = Path(os.environ['EGG_C_GIT']) if os.environ.get('EGG_C_GIT') else None
COMMIT = EGG_C_ORIGINAL[2][:7]   # ljubomirj/egg.c HEAD checked (full_trained_egg-cpumulti.c last changed at 02778b8)
SOURCE = "full_trained_egg-cpumulti.c"
REASON = c_int8.unavailable_reason()

CONFIG_PATCHES = {          # egg_config.h's default sizes (the non-EGG_TINY_DEBUG branch) -> a format for ours
    "#define HIDDEN_DIM 512 ": "#define HIDDEN_DIM {d} ",
    "#define N_LAYERS 4 ": "#define N_LAYERS {L} ",
    "#define SEQ_LEN 256 ": "#define SEQ_LEN {T} ",
    "#define POPULATION_SIZE 32 ": "#define POPULATION_SIZE {pop} ",
}
DUMP = '{ FILE *egg_dump = fopen("model.bin", "ab"); fwrite(model, sizeof(EggModel), 1, egg_dump); fclose(egg_dump); }'
SOURCE_PATCHES = [          # (text in egg.c, replacement): each must occur exactly once
    ("int32_t EXP2_TABLE[256];\n", "int32_t EXP2_TABLE[256];\nstatic FILE *egg_trace;\n"),
    ("    srand(time(NULL));\n    init_tables();\n",
     '    srand(time(NULL));\n    init_tables();\n    egg_trace = fopen("trace.txt", "w");\n'),
    ("    else pair_fitnesses[p_idx] = 0;\n}\n",
     "    else pair_fitnesses[p_idx] = 0;\n"
     '    fprintf(egg_trace, "PAIR %zu %d %d %d\\n", p_idx, (int)loss_pos, (int)loss_neg, pair_fitnesses[p_idx]);\n'
     "}\n"),
    ("    long max_steps = (ds.length - 1) / SEQ_LEN;\n",
     "    long max_steps = (ds.length - 1) / SEQ_LEN;\n    if (max_steps > EGG_STEPS) max_steps = EGG_STEPS;\n"
     f"    {DUMP}\n"),
    ("uint32_t step_seed = (uint32_t)time(NULL) ^ (step * 0x9e3779b9);",
     "uint32_t step_seed = (uint32_t)EGG_SEED_BASE ^ (step * 0x9e3779b9);"),
    ("        int start_idx = step * SEQ_LEN;\n",
     '        int start_idx = step * SEQ_LEN;\n        fprintf(egg_trace, "STEP %ld %u\\n", step, step_seed);\n'),
    ("&loss_val, step_seed, 0, &main_state);\n",
     "&loss_val, step_seed, 0, &main_state);\n"
     '            fprintf(egg_trace, "MAIN %ld %d\\n", step, (int)loss_val);\n'),
    ("        total_tokens += SEQ_LEN;\n", f"        total_tokens += SEQ_LEN;\n        {DUMP}\n"),
]
# two tiny runs: (d, n_layer, pop, T, steps, seed base, data bytes); the second crosses step 10 (a second noise-off
# loss on egg.c's carried main state) and has more pairs than the first
RUNS = {
    "d64L2": dict(d=64, L=2, pop=8, T=8, steps=4, base=0x2545F491, n_bytes=3001),
    "d64L1": dict(d=64, L=1, pop=16, T=6, steps=12, base=0xDEADBEEF, n_bytes=1500),
}


def _compiler() -> str:
    from c_int8.build import NoCompiler, find_compiler
    try:
        return find_compiler()
    except NoCompiler as exc:
        pytest.skip(f"egg.c {COMMIT} not built: {exc}")


def _egg_c_sources() -> tuple[str, str, str]:
    """(full_trained_egg-cpumulti.c, egg_config.h, the commit read): COMMIT if the mirror has it, else HEAD."""
    (text, config), commit = upstream_files(MIRROR, "EGG_C_GIT", "ljubomirj/egg.c", COMMIT, (SOURCE, "egg_config.h"))
    return text, config, commit


def _patched(text: str, patches, commit: str, name: str) -> str:
    for old, new in patches:
        assert text.count(old) == 1, (f"egg.c {commit} {name} no longer holds {old!r} once: the conformance patch "
                                      f"is stale")
        text = text.replace(old, new)
    return text


def _model_layout(d: int, L: int) -> list[tuple[str, tuple]]:
    """egg.c's EggModel fields in memory order (all int8, so no padding) with their shapes."""
    return [("embedding", (256, d)), ("gru_weights", (L, 4, d, d)), ("gru_biases", (L, 2, d)),
            ("mlp_weights", (L, 2, 4 * d * d)), ("head", (256, d)), ("ln_weights", (L, 2, d)), ("ln_out", (d,))]


def _as_tree(record: np.ndarray, d: int, L: int) -> dict:
    """One EggModel record as {path: int8} in the project's tree (gru_weights[l] = Wf, Uf, Wh, Uh by egg.c's use:
    Wf and Wh read the normed input, Uf the state, Uh the gated state)."""
    fields, at = {}, 0
    for name, shape in _model_layout(d, L):
        size = int(np.prod(shape))
        fields[name] = record[at:at + size].reshape(shape)
        at += size
    assert at == record.size
    gru, mlp = fields["gru_weights"], fields["mlp_weights"]
    return {"blocks.att.Uf": gru[:, 1], "blocks.att.Uh": gru[:, 3], "blocks.att.Wf": gru[:, 0],
            "blocks.att.Wh": gru[:, 2], "blocks.att.bf": fields["gru_biases"][:, 0],
            "blocks.att.bh": fields["gru_biases"][:, 1], "blocks.ln1.weight": fields["ln_weights"][:, 0],
            "blocks.ln2.weight": fields["ln_weights"][:, 1],
            "blocks.mlp.0.weight": mlp[:, 0].reshape(L, 4 * d, d),
            "blocks.mlp.1.weight": mlp[:, 1].reshape(L, d, 4 * d),
            "emb": fields["embedding"], "head": fields["head"], "ln_out.weight": fields["ln_out"]}


def _run_egg_c(scratch: Path, run: dict, data: np.ndarray) -> dict:
    """Build and run the patched egg.c in `scratch`; its records."""
    cc = _compiler()
    text, config, commit = _egg_c_sources()
    sizes = {k: run[k] for k in ("d", "L", "T", "pop")}
    (scratch / SOURCE).write_text(_patched(text, SOURCE_PATCHES, commit, SOURCE))
    (scratch / "egg_config.h").write_text(_patched(config, [(o, n.format(**sizes)) for o, n in CONFIG_PATCHES.items()],
                                                   commit, "egg_config.h"))
    (scratch / "input.txt").write_bytes(data.tobytes())
    command = [cc, "-O2", "-DEGG_FORCE_SCALAR", f"-DEGG_SEED_BASE={run['base']}u", f"-DEGG_STEPS={run['steps']}",
               "-o", "egg", SOURCE, "-lm"]
    built = subprocess.run(command, cwd=scratch, capture_output=True, text=True)
    assert built.returncode == 0, f"egg.c {commit} did not build ({' '.join(command)}):\n{built.stderr[-3000:]}"
    done = subprocess.run(["./egg"], cwd=scratch, capture_output=True, timeout=120)
    assert done.returncode == 0, f"egg.c {commit} failed (exit {done.returncode}):\n{done.stderr[-3000:]!r}"
    steps, pairs, main = [], {}, {}
    for line in (scratch / "trace.txt").read_text().splitlines():
        kind, *nums = line.split()
        if kind == "STEP":
            steps.append((int(nums[0]), int(nums[1])))
            pairs[int(nums[0])] = []
        elif kind == "PAIR":
            pairs[steps[-1][0]].append(tuple(int(v) for v in nums))
        else:
            main[int(nums[0])] = int(nums[1])
    d, L = run["d"], run["L"]
    size = sum(int(np.prod(shape)) for _, shape in _model_layout(d, L))
    dump = np.fromfile(scratch / "model.bin", np.int8)
    assert dump.size == size * (len(steps) + 1), f"egg.c {commit}: {dump.size} bytes of model records"
    models = [_as_tree(dump[i * size:(i + 1) * size], d, L) for i in range(len(steps) + 1)]
    return dict(commit=commit, steps=steps, pairs=pairs, main=main, models=models,
                stdout=done.stdout.decode(errors="replace"))


@pytest.mark.skipif(REASON is not None, reason=f"egg.c {COMMIT} conformance: {REASON}")
@pytest.mark.parametrize("name", sorted(RUNS))
def test_c_side_in_egg_c_mode_reproduces_egg_cs_portable_program(tmp_path, name):
    from rollout.corpus import load_corpus
    from spec.int8 import Int8Config
    if str(tmp_path.resolve()).startswith(str(ROOT)):
        pytest.skip("the scratch folder must lie outside the repository")
    run = RUNS[name]
    data = load_corpus().train[:run["n_bytes"]].astype(np.uint8)
    theirs = _run_egg_c(tmp_path, run, data)
    commit = theirs["commit"][:7]
    K = run["steps"]
    assert [s for s, _ in theirs["steps"]] == list(range(K)), f"egg.c {commit} ran {len(theirs['steps'])} steps"
    for step, seed in theirs["steps"]:
        assert seed == (run["base"] ^ (step * 0x9E3779B9)) & 0xFFFFFFFF

    cfg = Int8Config(n_embd=run["d"], n_layer=run["L"], pop=run["pop"], tokens_per_update=run["T"], sigma_shift=4,
                     epochs=K)
    init = c_int8.xorshift_init_params(cfg)
    for path, value in theirs["models"][0].items():
        assert np.array_equal(init[path], value), f"egg.c {commit} init: {path}"
    ours = []
    c_int8.train_egg_c(cfg, run["base"], data, K, observe=lambda s, r, m: ours.append((s, r, m)))
    assert len(ours) == K
    moved = 0
    for (step, result, main_loss), model in zip(ours, theirs["models"][1:]):
        got = theirs["pairs"][step]
        assert [p for p, *_ in got] == list(range(cfg.pairs)), f"egg.c {commit} step {step}: pairs"
        their_losses = np.array([[pos, neg] for _, pos, neg, _ in got]).ravel()
        assert np.array_equal(-result.scores, their_losses), f"egg.c {commit} step {step}: per-member losses"
        assert np.array_equal(result.fitness, [f for *_, f in got]), f"egg.c {commit} step {step}: fitness"
        for path, value in model.items():
            assert np.array_equal(result.params[path], value), f"egg.c {commit} step {step}: {path} after the update"
        assert main_loss == theirs["main"].get(step), f"egg.c {commit} step {step}: the noise-off loss"
        moved += sum(int((result.params[p] != prev).sum()) for p, prev in (ours[step - 1][1].params.items()
                                                                             if step else init.items()))
    assert sorted(theirs["main"]) == list(range(0, K, 10))
    assert moved > 0                                             # the runs train: weights move
    assert len({tuple(r.scores) for _, r, _ in ours}) == K        # and every step scores differently


@pytest.mark.skipif(REASON is not None, reason=f"egg.c {COMMIT} conformance: {REASON}")
def test_the_torch_port_in_egg_c_mode_reproduces_egg_cs_program_too(tmp_path):
    """The torch int8 port with profile egg.c-cpumulti, egg.c's init and data layout: every member's loss and every
    parameter of every step equal to egg.c's own run (the smaller configuration)."""
    import torch
    from rollout.corpus import load_corpus
    from rollout.int8_data import egg_c_step_tokens
    from spec.int8 import Int8Config
    from spec.int8_knobs import int8_profile
    from torch_impl.int8 import es as int8_es
    from torch_impl.int8.model import scores as model_scores
    from torch_impl.int8.noise import member_view
    if str(tmp_path.resolve()).startswith(str(ROOT)):
        pytest.skip("the scratch folder must lie outside the repository")
    run = RUNS["d64L2"]
    data = load_corpus().train[:run["n_bytes"]].astype(np.uint8)
    theirs = _run_egg_c(tmp_path, run, data)
    cfg = Int8Config(n_embd=run["d"], n_layer=run["L"], pop=run["pop"], tokens_per_update=run["T"], epochs=run["steps"])
    es = int8_es.make(cfg, int8_profile("egg.c-cpumulti"))
    init = {p: torch.from_numpy(v) for p, v in c_int8.xorshift_init_params(cfg).items()}
    state = int8_es.init(es, run["base"], params=init)
    states = torch.zeros((cfg.pop, cfg.n_layer, cfg.n_embd), dtype=torch.int8)
    for step in range(run["steps"]):
        tokens = torch.from_numpy(egg_c_step_tokens(data, step, cfg.pop, cfg.tokens_per_update).astype(np.int64))
        noise, state = int8_es.ask(es, state)
        scores, states = model_scores(state.params, member_view(noise, cfg.pop), tokens, states, cfg.sigma_shift,
                                      knobs=es.knobs)
        state, _ = int8_es.tell(es, state, noise, scores)
        losses = np.array([[pos, neg] for _, pos, neg, _ in theirs["pairs"][step]]).ravel()
        assert np.array_equal(-scores.numpy(), losses), f"egg.c {COMMIT} step {step}: per-member losses"
        for path, value in theirs["models"][step + 1].items():
            assert np.array_equal(state.params[path].numpy(), value), f"egg.c {COMMIT} step {step}: {path}"
