"""Conformance: jax_reference.int8 reproduces nano-egg's own run.py, epoch by epoch, bit for bit.

nano-egg (ESHyperscale/nano-egg, GPL-3.0) is never copied into the repository: the test reads run.py from a local
git mirror (NANO_EGG_GIT, a clone or mirror of ESHyperscale/nano-egg; skipped with the reason when absent),
writes it into a scratch folder outside the repository and runs it there, unchanged except for:
- stand-ins for the imports it needs only for the hub, logging and the CLI: huggingface_hub.constants (HF_HOME in
  the scratch folder), tqdm (plain range), tyro (Args from a JSON in the environment), wandb (a run whose log()
  pickles each epoch's stats), datasets (never called: the data files are already there);
- chunked tables: BIG_RAND_MATRIX is built 2^24 entries at a time from threefry counters and the 8 MiB look-up
  (jax_reference.int8, whose windows tests/jax_reference/test_int8.py checks against jax.random.normal), LOG2TABLE by
  nano-egg's own float64 formula 2^24 entries at a time; so the run needs about 4 GB, not 20;
- one logging line: each epoch's stats also carry the raw scores and the updated parameters.
Its data files are the project's int8 streams ([0] + each part of the shipped corpus).
Compared per epoch: every member's raw score, every parameter after the update, the validation score.
"""
from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys
from pathlib import Path

import jax
import numpy as np
import pytest

from spec.int8 import NANO_EGG_ORIGINAL
from tests.helpers import upstream_files

ROOT = Path(__file__).resolve().parents[2]
MIRROR = Path(os.environ['NANO_EGG_GIT']) if os.environ.get('NANO_EGG_GIT') else None
COMMIT = NANO_EGG_ORIGINAL[2]    # the commit spec/int8.py was read from

STANDINS = {
    "huggingface_hub/__init__.py": "",
    "huggingface_hub/constants.py": "import os\nHF_HOME = os.path.join(os.getcwd(), 'hf_home')\n",
    "tqdm.py": "def trange(n, *a, **k):\n    return range(n)\n\n\ndef tqdm(x, *a, **k):\n    return x\n",
    "tyro.py": "import json, os\n\n\ndef cli(cls):\n    return cls(**json.loads(os.environ['NANO_EGG_ARGS']))\n",
    "wandb.py": ("import os, pickle\n\n\nclass _Run:\n    def log(self, stats):\n"
                 "        with open(os.environ['NANO_EGG_LOG'], 'ab') as f:\n"
                 "            pickle.dump(stats, f)\n\n\ndef init(*a, **k):\n    return _Run()\n"),
    "datasets.py": "def load_dataset(*a, **k):\n    raise RuntimeError('the data files should already exist')\n",
    "egg_tables.py": '''import jax, jax.numpy as jnp, numpy as np
from jax_reference.int8.model import normal_lut, table_entries, table_key

STEP = 2 ** 24


def big_table(seed):
    """int8(normal(key(seed), 2^30) * 16), 2^24 entries at a time (entry j from threefry counter j)."""
    lut, key = normal_lut(), table_key(seed)
    part = jax.jit(lambda c0: table_entries(lut, key, c0 + jnp.arange(STEP, dtype=jnp.uint32)))
    out = np.empty(2 ** 30, np.int8)
    for c in range(0, 2 ** 30, STEP):
        out[c:c + STEP] = np.asarray(part(jnp.uint32(c)))
    return jnp.asarray(out)


def log2_table():
    """nano-egg's LOG2TABLE formula, 2^24 entries at a time."""
    out = np.empty(2 ** 28, np.int32)
    for c in range(0, 2 ** 28, STEP):
        k = np.arange(c, c + STEP)
        out[c:c + STEP] = (np.log2((k + 1) / (2 ** 4)) * (2 ** 4)).astype(np.int32)
    return jnp.array(out)
''',
}
PATCHES = [   # (text in run.py, replacement): each must occur exactly once
    ("(jax.random.normal(jax.random.key(noise_seed), 2**30) * (2 ** FIXED_POINT)).astype(dtype)",
     "__import__('egg_tables').big_table(noise_seed)"),
    ("jnp.array((np.log2((np.arange(2**28) + 1) / (2 ** FBIT)) * (2 ** FBIT)).astype(np.int32))",
     "__import__('egg_tables').log2_table()"),
    ("        if args.validate_every != 0 and epoch % args.validate_every == args.validate_every - 1:\n",
     "        stats['raw_scores'] = np.asarray(raw_scores).tolist(); "
     "stats['params'] = jax.tree.map(np.asarray, new_params)\n"
     "        if args.validate_every != 0 and epoch % args.validate_every == args.validate_every - 1:\n"),
]
# nano-egg's Args for two tiny runs (the second: two stacked layers, noise kept two epochs, the sign vote
# without the CLT scaling, a constant alpha, groups of 4); each is checked against the same run as an Int8Config
RUNS = {
    "default": dict(seed=0, parallel_generations_per_gpu=8, num_epochs=12, alpha=4.0, sigma_shift=4, use_clt=True,
                    alpha_decay_timestep=5, n_layer=1, n_embd=16, noise_reuse=1, tokens_per_update=8, group_size=2,
                    validate_every=4, validation_batch_size=4),
    "variants": dict(seed=5, parallel_generations_per_gpu=8, num_epochs=8, alpha=0.5, sigma_shift=2, use_clt=False,
                     alpha_decay_timestep=5, n_layer=2, n_embd=4, noise_reuse=2, tokens_per_update=6, group_size=4,
                     validate_every=3, validation_batch_size=2),
}


def _config(args: dict):
    """The Int8Config of a nano-egg Args dict."""
    from spec.int8 import Int8Config
    return Int8Config(n_embd=args["n_embd"], n_layer=args["n_layer"], pop=args["parallel_generations_per_gpu"],
                      group_size=args["group_size"], tokens_per_update=args["tokens_per_update"],
                      sigma_shift=args["sigma_shift"], alpha=args["alpha"],
                      alpha_decay_timestep=args["alpha_decay_timestep"], noise_reuse=args["noise_reuse"],
                      use_clt=args["use_clt"], epochs=args["num_epochs"], validate_every=args["validate_every"],
                      val_rows=args["validation_batch_size"])


def _run_py() -> tuple[str, str]:
    """(run.py's text, the commit read): COMMIT if the mirror has it, else HEAD."""
    (text,), commit = upstream_files(MIRROR, "NANO_EGG_GIT", "ESHyperscale/nano-egg", COMMIT, ("run.py",))
    return text, commit


def _patched(text: str) -> str:
    for old, new in PATCHES:
        assert text.count(old) == 1, f"nano-egg's run.py no longer holds {old!r} once: the conformance patch is stale"
        text = text.replace(old, new)
    return text


def _nano_egg_history(scratch: Path, args: dict) -> list[dict]:
    """Run the patched run.py in `scratch` with Args `args`; its per-epoch stats."""
    from rollout.corpus import load_corpus
    from rollout.int8_data import int8_streams
    text, commit = _run_py()
    for rel, content in STANDINS.items():
        (scratch / rel).parent.mkdir(parents=True, exist_ok=True)
        (scratch / rel).write_text(content)
    (scratch / "run.py").write_text(_patched(text))
    data = scratch / "cached_files"
    data.mkdir()
    train, val = int8_streams(load_corpus())
    np.save(data / "minipile_train.npy", train)
    np.save(data / "minipile_valid.npy", val)
    log = scratch / "stats.pkl"
    env = dict(os.environ, JAX_PLATFORMS="cpu", NANO_EGG_LOG=str(log),
               NANO_EGG_ARGS=json.dumps(args | {"dir_path": str(data), "track": True}),
               PYTHONPATH=os.pathsep.join([str(scratch), str(ROOT)]))
    done = subprocess.run([sys.executable, "run.py"], cwd=scratch, env=env, capture_output=True, text=True,
                          timeout=900)
    assert done.returncode == 0, f"nano-egg {commit} failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    history = []
    with open(log, "rb") as f:
        while True:
            try:
                history.append(pickle.load(f))
            except EOFError:
                return history


def _flat(tree) -> dict:
    leaves = jax.tree_util.tree_flatten_with_path(tree)[0]
    return {jax.tree_util.keystr(path): np.asarray(leaf) for path, leaf in leaves}


def _available_gb() -> float:
    """MemAvailable from /proc/meminfo in GB (inf where there is none to read)."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) / 1e6
    except OSError:
        pass
    return float("inf")


@pytest.mark.slow
@pytest.mark.parametrize("run", sorted(RUNS))
def test_reference_reproduces_nano_eggs_run_py(tmp_path, run):
    from jax_reference.int8.train import train_int8
    if str(tmp_path.resolve()).startswith(str(ROOT)):
        pytest.skip("the scratch folder must lie outside the repository")
    if _available_gb() < 6:
        pytest.skip(f"nano-egg's run needs about 4 GB (its 1 GiB noise table and 1 GiB LOG2TABLE, each held twice); "
                    f"{_available_gb():.1f} GB are available")
    args = RUNS[run]
    theirs = _nano_egg_history(tmp_path, args)
    cfg = _config(args)
    ours = []
    result = train_int8(cfg, args["seed"], progress=False,
                        observe=lambda e, scores, params: ours.append((np.asarray(scores), _flat(params))))
    assert len(theirs) == len(ours) == cfg.epochs
    for epoch, (stats, (scores, params)) in enumerate(zip(theirs, ours)):
        assert np.array_equal(np.asarray(stats["raw_scores"]), scores), f"epoch {epoch}: raw scores"
        their_params = _flat(stats["params"])
        assert their_params.keys() == params.keys()
        for name in params:
            assert np.array_equal(their_params[name], params[name]), f"epoch {epoch}: {name}"
        row = result.history[epoch]
        assert row["changed_lowrank"] == pytest.approx(float(stats["lora_differences"]), abs=1e-6)
        assert row["changed_fullrank"] == pytest.approx(float(stats["nonlora_differences"]), abs=1e-6)
        if "validation_score" in stats:
            assert row["val_bpb"] == pytest.approx(float(stats["validation_score"]), rel=1e-6), f"epoch {epoch}"
        else:                                   # ours also validates after the last epoch; nano-egg need not
            assert np.isnan(row["val_bpb"]) or epoch == cfg.epochs - 1
    assert len(set(map(tuple, (np.asarray(s["raw_scores"]) for s in theirs)))) == cfg.epochs   # the runs move
