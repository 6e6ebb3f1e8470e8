"""The C side (c_int8: nano-egg's integer EGGROLL in C) equals jax_reference.int8 exactly (np.array_equal), piece by
piece on fresh random inputs at two sizes: threefry and keys, window starts and entries (near 2^30 too), each op,
every intermediate, logits, member scores, fitness signs, votes, updated parameters and a K-epoch trajectory.
Its build: present, no compiler (the message and the skip) and a compiler error (the message names it, exit 2).
"""
from __future__ import annotations

import os
import subprocess
import sys
import zlib
from pathlib import Path

import numpy as np
import pytest

import c_int8
from c_int8.build import BuildError, NoCompiler, build
from spec import int8 as s
from spec.int8_knobs import INT8_KNOBS
from spec.tree import nest

ROOT = Path(__file__).resolve().parents[2]
REASON = c_int8.unavailable_reason()
needs_c = pytest.mark.skipif(REASON is not None, reason=REASON or "")

# two sizes: the selftest preset (d 4, 1 layer, pop 8) and d 16, 2 layers, pop 16
CONFIGS = [s.INT8_PRESETS["selftest"], s.INT8_PRESETS["selftest"].replace(n_embd=16, n_layer=2, pop=16,
                                                                          tokens_per_update=6)]
IDS = ["d4L1", "d16L2"]


def _rng(tag: str) -> np.random.Generator:
    return np.random.default_rng(zlib.crc32(tag.encode()))


# ----------------------------------------------------------------------------- the build
def test_no_compiler_says_so_and_skips(tmp_path):
    with pytest.raises(NoCompiler, match="CC=/nonexistent/cc was not found"):
        build("/nonexistent/cc", lib_dir=tmp_path)
    with pytest.raises(c_int8.CUnavailable, match="C side skipped: no C compiler"):
        c_int8.load("/nonexistent/cc", lib_dir=tmp_path)
    reason = c_int8.unavailable_reason("/nonexistent/cc", lib_dir=tmp_path)
    assert reason.startswith("C side skipped: no C compiler")
    # a test guarded as the C tests are skips with that reason
    mark = pytest.mark.skipif(reason is not None, reason=reason)
    assert mark.kwargs["reason"] == reason and mark.args == (True,)
    env = dict(os.environ, CC="/nonexistent/cc")
    done = subprocess.run([sys.executable, "-m", "c_int8.build", "--lib-dir", str(tmp_path), "--force"], cwd=ROOT,
                          env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr                 # never fails `make setup`
    assert "C side skipped: no C compiler: CC=/nonexistent/cc was not found" in done.stderr
    assert not list(tmp_path.glob("*.so"))


@needs_c
def test_compiler_error_is_named_with_exit_2(tmp_path):
    bad = tmp_path / "bad.c"
    bad.write_text("int egg_broken(void) { return undeclared_name; }\n")
    with pytest.raises(BuildError, match="undeclared_name") as exc:
        build(source=bad, lib_dir=tmp_path / "lib")
    assert "the C compiler failed" in str(exc.value) and "error" in str(exc.value)
    done = subprocess.run([sys.executable, "-m", "c_int8.build", "--source", str(bad), "--lib-dir",
                           str(tmp_path / "lib")], cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 2
    assert "error: C side not built" in done.stderr and "undeclared_name" in done.stderr
    assert not list((tmp_path / "lib").glob("*.so"))


@needs_c
def test_build_is_current_and_named_for_its_source(tmp_path):
    path = build(lib_dir=tmp_path)
    assert path.exists() and path.name.startswith("libegg_int8-") and build(lib_dir=tmp_path) == path
    done = subprocess.run([sys.executable, "-m", "c_int8.build", "--lib-dir", str(tmp_path)], cwd=ROOT,
                          capture_output=True, text=True)
    assert done.returncode == 0 and "C side built" in done.stdout


# ----------------------------------------------------------------------------- the JAX side
@pytest.fixture(scope="module")
def jq():
    if REASON is not None:
        pytest.skip(REASON)
    from jax_reference.int8 import model as q
    return q


@pytest.fixture(scope="module")
def lut(jq):
    return np.asarray(jq.normal_lut())


def _flat(tree) -> dict:
    import jax
    return {".".join(str(getattr(k, "key", k)) for k in path): np.asarray(v)
            for path, v in jax.tree_util.tree_flatten_with_path(tree)[0]}


def _nest(flat: dict):
    import jax.numpy as jnp
    return nest({p: jnp.asarray(v) for p, v in flat.items()})


def _random_params(cfg, tag):
    rng = _rng(tag)
    return {p: rng.integers(-127, 128, shape).astype(np.int8) for p, shape in s.int8_tree(cfg).shapes.items()}


class Side:
    """Both sides for one config and seed: JAX init and noiser, the C model."""

    def __init__(self, jq, lut, cfg, seed):
        self.q, self.cfg, self.seed = jq, cfg, seed
        self.init = jq.init_int8(cfg, seed)
        self.frozen, self.nparams = jq.QEggRoll.init_noiser(self.init.params, cfg.sigma_shift, 0, noise_seed=seed,
                                                            noise_reuse=cfg.noise_reuse, use_clt=cfg.use_clt)
        self.c = c_int8.Int8C(cfg, seed, lut)


@pytest.fixture(scope="module", params=list(zip(CONFIGS, IDS)), ids=IDS)
def side(request, jq, lut):
    cfg, tag = request.param
    return Side(jq, lut, cfg.replace(noise_reuse=2), 5 if tag == "d4L1" else 2 ** 32 - 3)


# ----------------------------------------------------------------------------- threefry, keys, windows
@needs_c
def test_threefry_equals_jaxs_on_random_and_high_counters(jq):
    from jax.extend.random import threefry2x32_p
    import jax.numpy as jnp
    rng = _rng("threefry")
    for _ in range(3):
        k0, k1 = (int(v) for v in rng.integers(0, 2 ** 32, 2))
        x0 = rng.integers(0, 2 ** 32, 500).astype(np.uint32)
        x1 = np.concatenate([rng.integers(0, 2 ** 32, 250), 2 ** 30 - 1 - np.arange(250)]).astype(np.uint32)
        want = threefry2x32_p.bind(jnp.uint32(k0), jnp.uint32(k1), jnp.asarray(x0), jnp.asarray(x1))
        got = c_int8.threefry2x32(k0, k1, x0, x1)
        assert np.array_equal(got[0], np.asarray(want[0])) and np.array_equal(got[1], np.asarray(want[1]))


@needs_c
@pytest.mark.parametrize("cfg", CONFIGS, ids=IDS)
def test_keys_equal_jaxs(jq, cfg):
    import jax
    for seed in (0, 123456789, 2 ** 32 - 1):
        assert np.array_equal(c_int8.table_key(seed), np.asarray(jq.table_key(seed)))
        for data in (0, 1, 7, 2 ** 31 - 1):
            want = jax.random.key_data(jax.random.fold_in(jax.random.key(seed), data))
            assert np.array_equal(c_int8.fold_in(c_int8.table_key(seed), data), np.asarray(want))
        want = np.asarray(jax.random.key_data(jax.random.split(jax.random.key(seed), 5)))
        assert np.array_equal(c_int8.split(c_int8.table_key(seed), 5), want)
        keys = _flat(jax.tree.map(jax.random.key_data, jq.init_int8(cfg, seed).es_tree_key))
        want = np.concatenate([keys[p].reshape(-1, 2) for p in s.int8_tree(cfg).paths])
        assert np.array_equal(c_int8.leaf_keys(cfg, seed), want)


@needs_c
def test_pair_hash_and_starts_equal_jaxs(jq):
    import jax
    import jax.numpy as jnp
    rng = _rng("hash")
    pairs = np.concatenate([rng.integers(0, 2 ** 31, 300), [0, 1, 2 ** 16 - 1, 2 ** 16, 2 ** 31 - 1]])
    assert np.array_equal(c_int8.pair_hash(pairs), np.asarray(jq.pair_hash(jnp.asarray(pairs, jnp.int32))))
    key = jax.random.fold_in(jax.random.key(3), 9)
    for te, pair in zip(rng.integers(0, 1000, 20), rng.integers(0, 2 ** 20, 20)):
        word0 = int(jax.random.key_data(jax.random.fold_in(key, int(te)))[0])
        assert c_int8.window_start(word0, int(pair)) == int(jq.window_start(key, jnp.int32(te), jnp.int32(pair)))
    for start, n in [(0, 5), (2 ** 30 - 5, 5), (2 ** 30 - 4, 5), (2 ** 30 - 1, 320), (2 ** 30 - 320, 320)]:
        assert c_int8.clamp_start(start, n) == s.clamp_start(start, n)


@needs_c
def test_window_entries_equal_jaxs_near_2_30(jq, lut):
    rng = _rng("entries")
    key = np.asarray(jq.table_key(77))
    counters = np.concatenate([rng.integers(0, 2 ** 30, 2000), 2 ** 30 - 1 - np.arange(500)]).astype(np.uint32)
    assert np.array_equal(c_int8.table_entries(lut, key, counters), np.asarray(jq.table_entries(lut, key, counters)))
    for start, n in [(0, 300), (int(rng.integers(0, 2 ** 30)), 1000), (2 ** 30 - 64, 64), (2 ** 30 - 10, 64),
                     (2 ** 30 - 1, 1), (2 ** 30 - 1, 320)]:
        want = np.asarray(jq.window(lut, key, np.uint32(start), n))
        assert np.array_equal(c_int8.window(lut, key, start, n), want), (start, n)


@needs_c
def test_window_starts_equal_jaxs(side):
    q = side.q
    rng = _rng("starts")
    threads = np.concatenate([rng.integers(0, 2 ** 20, 10), [0, 1, side.cfg.pop - 1]])
    for epoch in (0, 3, int(rng.integers(10, 10 ** 6))):
        want = _flat(q.window_starts(side.frozen, side.init.params, side.init.es_tree_key, epoch, threads,
                                     side.init.es_map))
        got = side.c.window_starts(epoch, threads)
        assert set(got) == set(want)
        for path in want:
            assert np.array_equal(got[path], want[path]), (epoch, path)


@needs_c
def test_member_noise_equals_jaxs(side):
    import jax.numpy as jnp
    q = side.q
    for epoch, thread in [(0, 0), (5, 3), (1234, 2 ** 19 + 1)]:
        want = q.member_noise(side.nparams, side.frozen, side.init.params, side.init.es_tree_key, side.init.es_map,
                              (jnp.int32(epoch), jnp.int32(thread)))
        got = side.c.member_noise(epoch, thread)
        for path, value in _flat_noise(want).items():
            mine = got[path]
            if isinstance(value, tuple):
                assert np.array_equal(mine[0], value[0]) and np.array_equal(mine[1], value[1]), path
            else:
                assert np.array_equal(mine, value), path


def _flat_noise(noise) -> dict:
    out = {}

    def walk(node, prefix):
        for k, v in node.items():
            path = f"{prefix}{k}"
            if isinstance(v, dict):
                walk(v, path + ".")
            else:
                out[path] = tuple(np.asarray(x) for x in v) if isinstance(v, tuple) else np.asarray(v)
    walk(noise, "")
    return out


# ----------------------------------------------------------------------------- ops
@needs_c
@pytest.mark.parametrize("in_dim,out_dim", [(4, 16), (16, 64), (64, 256)])
@pytest.mark.parametrize("sigma_shift", [0, 4])
def test_mm_emb_param_equal_jaxs(jq, in_dim, out_dim, sigma_shift):
    import jax.numpy as jnp
    rng = _rng(f"mm{in_dim}{sigma_shift}")
    np_ = {"sigma_shift": jnp.int32(sigma_shift)}
    for _ in range(5):
        W = rng.integers(-127, 128, (out_dim, in_dim)).astype(np.int8)
        x = rng.integers(-127, 128, in_dim).astype(np.int8)
        A = rng.integers(-86, 84, (out_dim, 1)).astype(np.int8)
        B = rng.integers(-86, 84, (in_dim, 1)).astype(np.int8)
        noisy = jq.CachedQEggRoll.do_mm({}, np_, jnp.asarray(W), (jnp.asarray(A), jnp.asarray(B)), (0, 0),
                                        jnp.asarray(x))
        assert np.array_equal(c_int8.mm(W, x, A, B, sigma_shift), np.asarray(noisy))
        plain = jq.QEggRoll.do_mm({}, np_, jnp.asarray(W), None, None, jnp.asarray(x))
        assert np.array_equal(c_int8.mm(W, x), np.asarray(plain))
        E = rng.integers(-127, 128, (256, in_dim)).astype(np.int8)
        Ae = rng.integers(-86, 84, (256, 1)).astype(np.int8)
        for tok in (0, int(rng.integers(256)), 255):
            want = jq.CachedQEggRoll.do_emb({}, np_, jnp.asarray(E), (jnp.asarray(Ae), jnp.asarray(B)), (0, 0), tok)
            assert np.array_equal(c_int8.emb(E, tok, Ae, B, sigma_shift), np.asarray(want))
            assert np.array_equal(c_int8.emb(E, tok), E[tok])
        P = rng.integers(-127, 128, out_dim).astype(np.int8)
        En = (rng.integers(-86, 84, out_dim) * rng.integers(-86, 84, out_dim)).astype(np.int32)
        want = jq.CachedQEggRoll.get_noisy_standard({}, np_, jnp.asarray(P), jnp.asarray(En), (0, 0))
        assert np.array_equal(c_int8.param(P, En, sigma_shift), np.asarray(want))


@needs_c
@pytest.mark.parametrize("d", [4, 16, 64])
def test_ln_division_and_clipped_adds_equal_jaxs(jq, d):
    import jax.numpy as jnp
    from jax_reference.models import CommonParams
    rng = _rng(f"ln{d}")
    numerators = np.concatenate([np.arange(-2 ** 15, 2 ** 15, 97), [0, 1, -1, 16129, -16129, 40000, -40000]])
    ms = np.arange(0, 256)
    v, m = np.meshgrid(numerators, ms, indexing="ij")
    assert np.array_equal(c_int8.ln_divide(v, m), np.asarray(jq.ln_divide(jnp.asarray(v), jnp.asarray(m))))
    for scale in (127, 1, 0):                       # 1 and 0: sum |x| < d, so DIVISION's row 0
        x = rng.integers(-scale, scale + 1, d).astype(np.int8)
        w = rng.integers(-127, 128, d).astype(np.int8)
        common = CommonParams(jq.QEggRoll, {}, {}, None, {"weight": jnp.asarray(w)}, {"weight": None}, None)
        assert np.array_equal(c_int8.ln(x, w), np.asarray(jq.EggLN._forward(common, jnp.asarray(x))))
    a, b, c = (rng.integers(-127, 128, 500).astype(np.int8) for _ in range(3))
    assert np.array_equal(c_int8.clipped_add(a, b), np.asarray(jq.clipped_add(jnp.asarray(a), jnp.asarray(b))))
    assert np.array_equal(c_int8.clipped_add(a, b, c),
                          np.asarray(jq.clipped_add(jnp.asarray(a), jnp.asarray(b), jnp.asarray(c))))


@needs_c
def test_loss_tables_and_log_likelihood_equal_jaxs(jq):
    import jax.numpy as jnp
    assert np.array_equal(c_int8.exp2_table(), jq.EXP2_TABLE)
    assert np.array_equal(c_int8.log2_thresholds(), np.array(s.LOG2_THRESHOLDS))
    thresholds = np.array(s.LOG2_THRESHOLDS, dtype=np.int64).ravel()
    rng = _rng("log2")
    ks = np.concatenate([thresholds - 2, thresholds - 1, np.arange(300), rng.integers(0, 2 ** 28, 3000),
                         [2 ** 28 - 1]])
    ks = np.unique(ks[(ks >= 0) & (ks < 2 ** 28)])
    assert np.array_equal(c_int8.log2_entries(ks), np.asarray(jq.log2_entries(jnp.asarray(ks, jnp.int32))))
    for scale in (127, 3):
        for _ in range(10):
            logits = rng.integers(-scale, scale + 1, 256).astype(np.int8)
            target = int(rng.integers(256))
            want = int(jq.int_log_likelihood(jnp.asarray(logits), target))
            assert c_int8.log_likelihood(logits, target) == want


@needs_c
def test_model_ops_with_noise_equal_jaxs(side):
    """GRU, MLP, layer norms, emb and head on random params, with a member's noise and without."""
    import jax
    import jax.numpy as jnp
    from jax_reference.models import CommonParams
    q, cfg, d = side.q, side.cfg, side.cfg.n_embd
    rng = _rng(f"modelops{d}")
    params = _random_params(cfg, f"modelops{d}")
    nested = _nest(params)
    flat = side.c.pack(params)
    it = (jnp.int32(7), jnp.int32(3))
    noise = q.member_noise(side.nparams, side.frozen, nested, side.init.es_tree_key, side.init.es_map, it)
    cnoise = side.c.noise_buffer(7, 3)
    for l in range(cfg.n_layer):
        sl = lambda tree: jax.tree.map(lambda a: a[l], tree)
        for noisy in (True, False):
            common = CommonParams(q.CachedQEggRoll if noisy else q.QEggRoll, side.frozen, side.nparams, None,
                                  sl(nested["blocks"]["att"]), sl(noise["blocks"]["att"]) if noisy else
                                  jax.tree.map(lambda _: None, sl(nested["blocks"]["att"])), it if noisy else None)
            x, st = (rng.integers(-127, 128, d).astype(np.int8) for _ in range(2))
            inter = {}
            new, _ = q.EggGRU._forward(common, jnp.asarray(x), jnp.asarray(st), inter)
            got = side.c.op_gru(flat, l, x, st, cnoise if noisy else None)
            for name in ("f", "gated", "cand", "state"):
                assert np.array_equal(got[name], np.asarray(inter[name])), (l, noisy, name)
            mlp_common = common._replace(params=sl(nested["blocks"]["mlp"]), es_tree_key=sl(noise["blocks"]["mlp"])
                                         if noisy else jax.tree.map(lambda _: None, sl(nested["blocks"]["mlp"])))
            inter = {}
            y = q.QMLP._forward(mlp_common, jnp.asarray(x), inter)
            hidden, out = side.c.op_mlp(flat, l, x, cnoise if noisy else None)
            assert np.array_equal(hidden, np.asarray(inter["mlp.0"])) and np.array_equal(out, np.asarray(y))
            for name in ("ln1", "ln2"):
                ln_common = common._replace(params=sl(nested["blocks"][name]),
                                            es_tree_key=sl(noise["blocks"][name]) if noisy else {"weight": None})
                got = side.c.op_ln(flat, f"blocks.{name}.weight", l, x, cnoise if noisy else None)
                assert np.array_equal(got, np.asarray(q.EggLN._forward(ln_common, jnp.asarray(x)))), (name, noisy)
    x = rng.integers(-127, 128, d).astype(np.int8)
    common = CommonParams(q.CachedQEggRoll, side.frozen, side.nparams, None, nested["head"], noise["head"], it)
    assert np.array_equal(side.c.op_mm(flat, "head", 0, x, cnoise), np.asarray(q.QMM._forward(common, jnp.asarray(x))))
    common = common._replace(params=nested["emb"], es_tree_key=noise["emb"])
    for tok in (0, 65, 255):
        assert np.array_equal(side.c.op_emb(flat, tok, cnoise), np.asarray(q.QEmbedding._forward(common, tok)))
    common = common._replace(params=nested["ln_out"]["weight"], es_tree_key=noise["ln_out"]["weight"])
    assert np.array_equal(side.c.op_param(flat, "ln_out.weight", 0, cnoise),
                          np.asarray(q.QParameter._forward(common)))


# ----------------------------------------------------------------------------- the forward
@needs_c
def test_member_trace_intermediates_logits_and_score_equal_jaxs(side):
    import jax.numpy as jnp
    q, cfg = side.q, side.cfg
    rng = _rng(f"trace{cfg.n_embd}")
    T = 10
    for params, thread, noisy in [(side.init.params, 5, True), (_nest(_random_params(cfg, "tr")), 2, True),
                                  (side.init.params, 0, False)]:
        tokens = rng.integers(1, 256, T + 1).astype(np.int32)
        tokens[4] = 0                                        # a state reset inside
        state = rng.integers(-127, 128, (cfg.n_layer, cfg.n_embd)).astype(np.int8)
        it = (jnp.int32(3), jnp.int32(thread)) if noisy else None
        trace, st = q.member_trace(q.QEggRoll, side.frozen, side.nparams, params, side.init.es_tree_key, it,
                                   jnp.asarray(tokens[:-1]), jnp.asarray(tokens[1:]), jnp.asarray(state))
        got, cst, score = side.c.member_trace(_flat(params), 3, thread, tokens, state, noise=noisy)
        assert list(got) == q.trace_names(cfg.n_layer)
        for name in trace:
            assert np.array_equal(got[name], np.asarray(trace[name])), name
        assert np.array_equal(cst, np.asarray(st)) and score == int(np.sum(np.asarray(trace["ll"])))


@needs_c
def test_population_scores_and_states_equal_jaxs(side):
    q, cfg = side.q, side.cfg
    rng = _rng(f"pop{cfg.n_embd}")
    for params, epoch in [(_flat(side.init.params), 0), (_random_params(cfg, "popr"), 9)]:
        tokens = rng.integers(0, 256, (cfg.pop, cfg.tokens_per_update + 1)).astype(np.uint8)
        tokens[:, 2] = 0
        states = rng.integers(-127, 128, (cfg.pop, cfg.n_layer, cfg.n_embd)).astype(np.int8)
        want, wst = q.population_scores(side.frozen, side.nparams, _nest(params), side.init.es_tree_key,
                                        side.init.es_map, epoch, tokens, states)
        got, gst = side.c.population_scores(params, epoch, tokens, states)
        assert np.array_equal(got, np.asarray(want)) and np.array_equal(gst, np.asarray(wst))
        assert len(set(got.tolist())) > 1


# ----------------------------------------------------------------------------- fitness, votes, update
@needs_c
def test_fitness_signs_equal_jaxs(jq):
    import jax.numpy as jnp
    rng = _rng("fit")
    for pop in (8, 64):
        scores = rng.integers(-3, 4, pop).astype(np.int32) * rng.integers(1, 3, pop).astype(np.int32)
        want = jq.QEggRoll.convert_fitnesses({}, {}, jnp.asarray(scores))
        assert np.array_equal(c_int8.fitness(scores), np.asarray(want))
    extremes = np.array([2 ** 31 - 1, -2 ** 31, -2 ** 31, 2 ** 31 - 1], np.int32)     # the difference wraps
    assert np.array_equal(c_int8.fitness(extremes), np.asarray(jq.QEggRoll.convert_fitnesses({}, {}, extremes)))


@needs_c
@pytest.mark.parametrize("use_clt", [True, False])
def test_votes_equal_jaxs(side, use_clt):
    import jax.numpy as jnp
    q, cfg = side.q, side.cfg
    c = c_int8.Int8C(cfg.replace(use_clt=use_clt), side.seed, side.c.lut)
    frozen = dict(side.frozen, use_clt=use_clt)
    f = _rng(f"votes{cfg.n_embd}").integers(-1, 2, cfg.pairs).astype(np.int8)
    got = c.votes(f, 4)
    want = _flat(q.tree_votes(frozen, side.nparams, side.init.params, side.init.es_tree_key, side.init.es_map,
                              jnp.asarray(f), 4))
    for path in c.paths:
        assert np.array_equal(got[path], want[path]), path


@needs_c
def test_apply_votes_threshold_and_its_0_quirk_equal_jaxs(jq):
    import jax.numpy as jnp
    rng = _rng("apply")
    for thr, pairs, use_clt in [(0, 4, True), (8, 5, True), (37, 128, True), (3, 16, False), (0, 1, False)]:
        P = rng.integers(-127, 128, 600).astype(np.int8)
        Z = np.concatenate([rng.integers(-2 ** 16, 2 ** 16, 500), np.zeros(50, int),
                            rng.integers(-300, 300, 50)]).astype(np.int32)
        P[:10], P[10:20] = 127, -127                         # saturation both ways
        want = jq.QEggRoll.apply_votes({"use_clt": use_clt}, {"update_threshold": jnp.int32(thr)}, jnp.asarray(P),
                                       jnp.asarray(Z), pairs=pairs)
        got = c_int8.apply_votes(P, Z, thr, pairs, use_clt)
        assert np.array_equal(got, np.asarray(want)), (thr, pairs)
    assert c_int8.apply_votes([5, 5, 5], [0, 1, -1], 0, 4).tolist() == [4, 6, 4]       # Z = 0 goes down at thr 0


@needs_c
def test_epoch_scores_fitness_votes_and_updated_params_equal_jaxs(side):
    import jax.numpy as jnp
    q, cfg = side.q, side.cfg
    rng = _rng(f"epoch{cfg.n_embd}")
    params = _random_params(cfg, f"ep{cfg.n_embd}")
    tokens = rng.integers(0, 256, (cfg.pop, cfg.tokens_per_update + 1)).astype(np.uint8)
    states = rng.integers(-127, 128, (cfg.pop, cfg.n_layer, cfg.n_embd)).astype(np.int8)
    for epoch, thr in [(0, 0), (6, 11)]:
        nparams = dict(side.nparams, update_threshold=jnp.int32(thr))
        scores, st = q.population_scores(side.frozen, nparams, _nest(params), side.init.es_tree_key,
                                         side.init.es_map, epoch, tokens, states)
        new = q.update(side.frozen, nparams, _nest(params), side.init.es_tree_key, side.init.es_map, scores, epoch)
        got = side.c.epoch(params, epoch, thr, tokens, states)
        assert np.array_equal(got.scores, np.asarray(scores)) and np.array_equal(got.states, np.asarray(st))
        assert np.array_equal(got.fitness, np.asarray(q.QEggRoll.convert_fitnesses({}, {}, scores)))
        want = _flat(new)
        moved = 0
        for path in side.c.paths:
            assert np.array_equal(got.params[path], want[path]), (epoch, path)
            moved += int(np.sum(got.params[path] != params[path]))
        assert moved > 0
        again = side.c.update(params, got.scores, epoch, thr)          # the same through the separate pieces
        assert all(np.array_equal(again[p], got.params[p]) for p in side.c.paths)
        assert np.array_equal(side.c.pack_votes(got.votes), side.c.pack_votes(side.c.votes(got.fitness, epoch)))


@needs_c
def test_k_epoch_trajectory_at_the_selftest_preset_equals_jaxs(lut):
    from jax_reference.int8.model import init_int8
    from jax_reference.int8.train import train_int8
    cfg, seed = s.INT8_PRESETS["selftest"], 3
    jax_rows, c_rows = [], []
    train_int8(cfg, seed, progress=False, observe=lambda e, scores, params: jax_rows.append((e, scores,
                                                                                            _flat(params))))
    final = c_int8.train_epochs(cfg, seed, lut, _flat(init_int8(cfg, seed).params),
                                observe=lambda e, r: c_rows.append((e, r.scores, r.params)))
    assert len(jax_rows) == len(c_rows) == cfg.epochs
    for (e, js, jp), (ce, cs, cp) in zip(jax_rows, c_rows):
        assert e == ce and np.array_equal(cs, js), e
        assert all(np.array_equal(cp[p], jp[p]) for p in jp), e
    assert all(np.array_equal(final[p], jax_rows[-1][2][p]) for p in final)


# ----------------------------------------------------------------------------- egg.c's departures, one switch each
# Each switch is checked against a plain statement of egg.c's formula (ljubomirj/egg.c full_trained_egg-cpumulti.c,
# read for facts) and, where the forward is concerned, against the JAX reference fed the same noise.
MATRICES = ("blocks.att.Uf", "blocks.att.Uh", "blocks.att.Wf", "blocks.att.Wh", "blocks.mlp.0.weight",
            "blocks.mlp.1.weight", "head")
EGG_K = {"blocks.att.Wf": 1, "blocks.att.Uf": 2, "blocks.att.Wh": 3, "blocks.att.Uh": 4, "blocks.mlp.0.weight": 5,
         "blocks.mlp.1.weight": 6}


def _xorshift_values(seed: int, n: int) -> list[int]:
    x, out = seed & 0xFFFFFFFF, []
    for _ in range(n):
        x ^= (x << 13) & 0xFFFFFFFF
        x ^= x >> 17
        x ^= (x << 5) & 0xFFFFFFFF
        out.append((1 if x & 1 else -1) * ((x >> 1) & 31))
    return out


def _egg_seed(base: int, epoch: int, pair: int, path: str, layer: int) -> int:
    step = (base ^ ((epoch * 0x9E3779B9) & 0xFFFFFFFF)) & 0xFFFFFFFF
    return (step + pair + (999 if path == "head" else 100 * layer + EGG_K[path])) & 0xFFFFFFFF


def _mitchell(x: int) -> int:
    if x <= 0:
        return 0
    k = x.bit_length() - 1
    frac = (x - (1 << k)) >> (k - 4) if k >= 4 else (x - (1 << k)) << (4 - k)
    return 16 * k + frac - 64


@needs_c
def test_knobs_and_the_egg_c_profile_map_to_mode_bits():
    assert c_int8.egg_mode(None) == c_int8.egg_mode({}) == 0
    assert c_int8.egg_mode("egg.c") == 127
    assert c_int8.egg_mode("egg.c-cpumulti") == 511
    assert c_int8.egg_mode({k: v.nano_egg for k, v in INT8_KNOBS.items()}) == 0
    assert sorted(INT8_KNOBS) == sorted(["int8_noise", "vote_threshold", "evolving", "out_shift",
                                         "ln_division", "log2", "state_reset"])
    assert [c_int8.egg_mode({k: v.egg_c}) for k, v in INT8_KNOBS.items()] == [1, 2, 4, 8, 16, 32, 64]
    with pytest.raises(ValueError, match="unknown int8 knob"):
        c_int8.egg_mode({"noise": "xorshift"})
    with pytest.raises(ValueError, match="use table"):
        c_int8.egg_mode({"int8_noise": "gaussian"})


@needs_c
def test_xorshift_noise_is_egg_cs_and_the_forward_reads_it_as_jax_would(side, lut):
    import jax.numpy as jnp
    q, cfg = side.q, side.cfg
    c = c_int8.Int8C(cfg, side.seed, lut, {"int8_noise": "xorshift"})
    base = side.seed & 0xFFFFFFFF
    for epoch, thread in [(0, 0), (3, 5), (77, 2 * cfg.pairs - 1)]:
        noise = c.member_noise(epoch, thread)
        nano = side.c.member_noise(epoch, thread)
        sign = 1 if thread % 2 == 0 else -1
        for path in c.paths:
            if path not in MATRICES:                          # egg.c perturbs no other leaf: the table's noise
                pair = isinstance(noise[path], tuple)
                assert all(np.array_equal(a, b) for a, b in zip(*(((n[path],) if not pair else n[path])
                                                                  for n in (noise, nano)))), path
                continue
            layers = range(cfg.n_layer) if path.startswith("blocks.") else [None]
            for layer in layers:
                A, B = noise[path] if layer is None else (noise[path][0][layer], noise[path][1][layer])
                vals = _xorshift_values(_egg_seed(base, epoch, thread >> 1, path, layer or 0), A.shape[0] + B.shape[0])
                assert A[:, 0].tolist() == [sign * v for v in vals[:A.shape[0]]], (path, layer)
                assert B[:, 0].tolist() == vals[A.shape[0]:], (path, layer)
                assert c_int8.xorshift_seed(base, epoch, thread >> 1, path, layer or 0, cfg) == _egg_seed(
                    base, epoch, thread >> 1, path, layer or 0)
    # egg.c's seeds collide across matrices: Wf of pair p + 1 is Uf of pair p
    assert np.array_equal(c.member_noise(4, 2 * 1)["blocks.att.Wf"][1][0],
                          c.member_noise(4, 2 * 0)["blocks.att.Uf"][1][0])
    # the forward with this noise equals JAX's forward fed the same noise (CachedQEggRoll)
    tokens = _rng("xs").integers(1, 256, 9).astype(np.int32)
    state = np.zeros((cfg.n_layer, cfg.n_embd), np.int8)
    trace, st = q.member_trace(q.CachedQEggRoll, side.frozen, side.nparams, side.init.params,
                               _nest_noise(c.member_noise(2, 3)), (jnp.int32(2), jnp.int32(3)),
                               jnp.asarray(tokens[:-1]), jnp.asarray(tokens[1:]), jnp.asarray(state))
    got, cst, _ = c.member_trace(_flat(side.init.params), 2, 3, tokens, state)
    assert all(np.array_equal(got[name], np.asarray(trace[name])) for name in trace)
    assert np.array_equal(cst, np.asarray(st))


def _nest_noise(flat: dict, zero=()):
    """{path: noise} as the nested tree CachedQEggRoll reads; paths in `zero` get zero noise (no perturbation)."""
    import jax.numpy as jnp
    out: dict = {}
    for path, value in flat.items():
        node = out
        *head, last = path.split(".")
        for part in head:
            node = node.setdefault(part, {})
        if isinstance(value, tuple):
            node[last] = tuple(jnp.asarray(v * (0 if path in zero else 1)) for v in value)
        else:
            node[last] = jnp.asarray(value * (0 if path in zero else 1))
    return out


@needs_c
def test_evolving_matrices_freezes_the_other_leaves(side, lut):
    import jax.numpy as jnp
    q, cfg = side.q, side.cfg
    c = c_int8.Int8C(cfg, side.seed, lut, {"evolving": "matrices"})
    frozen_paths = [p for p in c.paths if p not in MATRICES]
    tokens = _rng("frz").integers(1, 256, 9).astype(np.int32)
    state = np.zeros((cfg.n_layer, cfg.n_embd), np.int8)
    trace, _ = q.member_trace(q.CachedQEggRoll, side.frozen, side.nparams, side.init.params,
                              _nest_noise(side.c.member_noise(1, 6), zero=frozen_paths),
                              (jnp.int32(1), jnp.int32(6)), jnp.asarray(tokens[:-1]), jnp.asarray(tokens[1:]),
                              jnp.asarray(state))
    got, _, _ = c.member_trace(_flat(side.init.params), 1, 6, tokens, state)
    assert all(np.array_equal(got[name], np.asarray(trace[name])) for name in trace)
    params = _random_params(cfg, "frz")
    rng = _rng("frz-ep")
    tokens = rng.integers(0, 256, (cfg.pop, cfg.tokens_per_update + 1)).astype(np.uint8)
    result = c.epoch(params, 0, 0, tokens, np.zeros((cfg.pop, cfg.n_layer, cfg.n_embd), np.int8))
    nano_votes = side.c.votes(result.fitness, 0)
    for path in c.paths:
        if path in MATRICES:
            assert np.array_equal(result.votes[path], nano_votes[path])
            assert np.array_equal(result.params[path], c_int8.apply_votes(params[path], nano_votes[path], 0,
                                                                          cfg.pairs))
        else:
            assert not result.votes[path].any() and np.array_equal(result.params[path], params[path])


@needs_c
def test_fixed160_votes_move_beyond_160_either_way_and_never_at_0(side, lut):
    cfg = side.cfg
    c = c_int8.Int8C(cfg, side.seed, lut, {"vote_threshold": "fixed160"})
    rng = _rng("v160")
    params = _random_params(cfg, "v160")
    params["head"].reshape(-1)[:4] = [127, -127, 127, -127]
    votes = {p: rng.integers(-400, 401, v.shape).astype(np.int32) for p, v in params.items()}
    votes["head"].reshape(-1)[:6] = [161, -161, 160, -160, 0, 0]
    for thr in (0, 50):                                     # the schedule's threshold plays no part
        got = c.apply_votes(params, votes, thr, cfg.pairs)
        for path in c.paths:
            p, z = params[path].astype(int), votes[path]
            want = np.clip(np.where(z > 160, p + 1, np.where(z < -160, p - 1, p)), -127, 127)
            assert np.array_equal(got[path], want), path
        head = params["head"].reshape(-1)
        assert got["head"].reshape(-1)[:6].tolist() == [127, -127, head[2], head[3], head[4], head[5]]


@needs_c
def test_fixed_out_shift_is_8_or_9_and_agrees_with_sqrt_at_width_256(lut):
    rng = _rng("shift")
    for d in (16, 256):
        cfg = s.INT8_PRESETS["selftest"].replace(n_embd=d)
        fixed = c_int8.Int8C(cfg, 1, lut, {"out_shift": "fixed"})
        nano = c_int8.Int8C(cfg, 1, lut)
        params = _random_params(cfg, f"shift{d}")
        flat = fixed.pack(params)
        noise = fixed.noise_buffer(0, 1)
        for path, in_dim in [("head", d), ("blocks.mlp.0.weight", d), ("blocks.mlp.1.weight", 4 * d)]:
            x = rng.integers(-127, 128, in_dim).astype(np.int8)
            W = params[path][0] if path.startswith("blocks.") else params[path]
            A, B = nano.member_noise(0, 1)[path] if path == "head" else (
                nano.member_noise(0, 1)[path][0][0], nano.member_noise(0, 1)[path][1][0])
            xl, Al, Bl = x.astype(np.int64), A[:, 0].astype(np.int64), B[:, 0].astype(np.int64)
            acc = xl @ W.T.astype(np.int64) + (((xl @ Bl) * Al) >> 8)
            want = np.clip(acc >> (9 if in_dim == 4 * d else 8), -127, 127)
            got = fixed.op_mm(flat, path, 0, x, noise)
            assert np.array_equal(got, want), (d, path)
            same = np.array_equal(got, nano.op_mm(flat, path, 0, x, noise))
            assert same == (d == 256), (d, path)              # 16 * isqrt(in) is 2^8 / 2^9 only at width 256


@needs_c
def test_trunc_layer_norm_is_egg_cs():
    rng = _rng("lntrunc")
    for d in (4, 16, 64):
        for scale in (127, 3, 1, 0):
            x = rng.integers(-scale, scale + 1, d).astype(np.int8)
            w = rng.integers(-127, 128, d).astype(np.int8)
            mean = max(int(np.abs(x.astype(int)).sum()), 1) // d or 1
            want = [max(-127, min(127, int(np.trunc(int(a) * int(b) / mean)))) for a, b in zip(x, w)]
            assert c_int8.ln(x, w, trunc=True).tolist() == want, (d, scale)
    x, w = np.array([-1, 0, 0, 0], np.int8), np.array([16, 16, 16, 16], np.int8)     # mean 0: egg.c takes 1
    assert c_int8.ln(x, w, trunc=True).tolist() == [-16, 0, 0, 0]
    assert c_int8.ln(x, w).tolist() == [-2, -1, -1, -1]                                # nano-egg's row 0
    x = np.array([-37, 20, 20, 20], np.int8)                                          # mean 24: floor vs trunc
    assert c_int8.ln(x, w, trunc=True)[0] == -24 and c_int8.ln(x, w)[0] == -25


@needs_c
def test_mitchell_log2_and_loss_are_egg_cs():
    rng = _rng("mitchell")
    xs = np.concatenate([np.arange(-3, 600), rng.integers(1, 2 ** 28, 2000), [2 ** k for k in range(29)]])
    assert [c_int8.log2_mitchell(int(x)) for x in xs] == [_mitchell(int(x)) for x in xs]
    table = (np.exp2(np.arange(256) / 16) * 16).astype(np.int64)
    differs = 0
    for scale in (127, 5):
        for _ in range(20):
            logits = rng.integers(-scale, scale + 1, 256).astype(np.int8)
            target = int(rng.integers(256))
            z = logits.astype(np.int64) + 128
            want = int(z[target]) - _mitchell(int(table[z].sum()))
            assert c_int8.log_likelihood(logits, target, mitchell=True) == want
            differs += want != c_int8.log_likelihood(logits, target)
    assert differs > 0


@needs_c
def test_never_resetting_the_state_equals_jaxs_forward_stepped_without_the_reset(side, lut):
    import jax
    import jax.numpy as jnp
    q, cfg = side.q, side.cfg
    c = c_int8.Int8C(cfg, side.seed, lut, {"state_reset": "never"})
    tokens = _rng("noreset").integers(1, 256, 9).astype(np.int32)
    tokens[3] = tokens[6] = 0
    state = _rng("noreset-s").integers(-127, 128, (cfg.n_layer, cfg.n_embd)).astype(np.int8)
    it = (jnp.int32(2), jnp.int32(1))
    step = jax.jit(lambda inp, st: q.EGG.forward(q.QEggRoll, side.frozen, side.nparams, None, side.init.params,
                                                  side.init.es_tree_key, it, inp, st))
    st, logits = jnp.asarray(state), []
    for inp in tokens[:-1]:
        lg, st = step(jnp.int32(inp), st)
        logits.append(np.asarray(lg))
    got, cst, _ = c.member_trace(_flat(side.init.params), 2, 1, tokens, state)
    assert np.array_equal(got["logits"], np.stack(logits)) and np.array_equal(cst, np.asarray(st))
    reset, _, _ = side.c.member_trace(_flat(side.init.params), 2, 1, tokens, state)
    assert not np.array_equal(reset["logits"][3:], got["logits"][3:])


@needs_c
def test_egg_c_profile_trains_deterministically_and_freezes_what_egg_c_freezes(lut):
    from jax_reference.int8.model import init_int8
    cfg, seed = s.INT8_PRESETS["selftest"], 3
    init = _flat(init_int8(cfg, seed).params)
    runs = [c_int8.train_epochs(cfg, seed, lut, init, knobs="egg.c") for _ in range(2)]
    nano = c_int8.train_epochs(cfg, seed, lut, init)
    assert all(np.array_equal(runs[0][p], runs[1][p]) for p in init)
    for path in init:
        if path not in MATRICES:
            assert np.array_equal(runs[0][path], init[path]), path
    assert any(not np.array_equal(runs[0][p], nano[p]) for p in MATRICES)


@needs_c
def test_tokens_outside_a_byte_are_refused_before_the_c_forward(lut):
    cfg = s.INT8_PRESETS["selftest"]
    c = c_int8.Int8C(cfg, 0, lut)
    params = _random_params(cfg, "tok")
    with pytest.raises(ValueError, match=r"bytes in \[0, 255\]"):
        c.member_trace(params, 0, 0, [1, 2, 256], np.zeros((1, 4), np.int8))
    with pytest.raises(ValueError, match=r"bytes in \[0, 255\]"):
        c.validation_scores(params, [[1, -1, 3]])


@needs_c
@pytest.mark.parametrize("cfg", CONFIGS, ids=IDS)
def test_init_from_the_seed_equals_jaxs(jq, cfg):
    import jax
    patterns = jax.random.normal(jax.random.key(0, impl=jq._PATTERNS), (2 ** 23,))
    init_lut = np.round(np.asarray(patterns) * np.float32(16)).astype(np.int8)     # round half to even
    for seed in (0, 2 ** 32 - 1):
        got = c_int8.init_params(cfg, seed, init_lut)
        want = _flat(jq.init_int8(cfg, seed).params)
        assert list(got) == list(want)
        assert all(np.array_equal(got[p], want[p]) and got[p].dtype == np.int8 for p in want)


@needs_c
def test_validation_scores_equal_jaxs(side):
    rng = _rng(f"val{side.cfg.n_embd}")
    rows = rng.integers(0, 256, (5, 12)).astype(np.uint8)
    rows[1, 4] = 0
    for params in (_flat(side.init.params), _random_params(side.cfg, "val")):
        want = side.q.validation_scores(_nest(params), rows)
        assert np.array_equal(side.c.validation_scores(params, rows), np.asarray(want))


@needs_c
def test_cpumulti_structure_switches_nested_gate_clips_and_no_mlp(side, lut):
    cfg, d = side.cfg, side.cfg.n_embd
    assert c_int8.egg_mode("egg.c-cpumulti") == 127 | 128 | 256
    rng = _rng(f"cpumulti{d}")
    params = _random_params(cfg, "cpumulti")
    nested = c_int8.Int8C(cfg, side.seed, lut, {"gate_clip": "nested"})
    flat, noise = nested.pack(params), nested.noise_buffer(1, 2)
    x, st = (rng.integers(-127, 128, d).astype(np.int8) for _ in range(2))
    got = nested.op_gru(flat, 0, x, st, noise)
    mm = lambda path, v: side.c.op_mm(flat, path, 0, v, noise).astype(int)
    par = lambda path: side.c.op_param(flat, path, 0, noise).astype(int)
    clip = lambda v: np.clip(v, -127, 127)
    f = clip(clip(mm("blocks.att.Wf", x) + mm("blocks.att.Uf", st)) + par("blocks.att.bf"))
    gated = ((f + 127) * st) >> 8
    cand = clip(clip(mm("blocks.att.Wh", x) + mm("blocks.att.Uh", gated.astype(np.int8))) + par("blocks.att.bh"))
    assert np.array_equal(got["f"], f) and np.array_equal(got["gated"], gated) and np.array_equal(got["cand"], cand)
    assert np.array_equal(got["state"], st + (((f + 127) * (cand - st)) >> 8))
    parted = 0                                    # the two clips part where W x + U s saturates and the bias pulls back
    for _ in range(20):
        x, st = (rng.integers(-127, 128, d).astype(np.int8) for _ in range(2))
        once, twice = side.c.op_gru(flat, 0, x, st, noise), nested.op_gru(flat, 0, x, st, noise)
        parted += not np.array_equal(once["f"], twice["f"])
    assert parted > 0
    no_mlp = c_int8.Int8C(cfg, side.seed, lut, {"mlp": "off"})
    tokens = rng.integers(1, 256, 9).astype(np.int32)
    trace, _, _ = no_mlp.member_trace(params, 1, 2, tokens, np.zeros((cfg.n_layer, d), np.int8))
    for l in range(cfg.n_layer):
        assert np.array_equal(trace[f"blocks.{l}.out"], trace[f"blocks.{l}.att"])
        assert not trace[f"blocks.{l}.mlp"].any() and not trace[f"blocks.{l}.mlp.0"].any()
    full, _, _ = side.c.member_trace(params, 1, 2, tokens, np.zeros((cfg.n_layer, d), np.int8))
    assert np.array_equal(full["blocks.0.att"], trace["blocks.0.att"])        # the GRU half is unchanged
    assert not np.array_equal(full["logits"], trace["logits"])
    # the MLP matrices are still voted on with the MLP off
    f = _rng("cpumulti-f").integers(-1, 2, cfg.pairs).astype(np.int8)
    assert np.array_equal(no_mlp.votes(f, 3)["blocks.mlp.0.weight"], side.c.votes(f, 3)["blocks.mlp.0.weight"])


# ----------------------------------------------------------------------------- egg.c's init, data layout and run
# (tests/c_int8/test_egg_c_conformance.py checks them against egg.c's own program; these are the plain statements)
@needs_c
def test_xorshift_init_is_one_stream_from_42_in_egg_cs_order():
    cfg = s.INT8_PRESETS["selftest"].replace(n_embd=4, n_layer=2)
    d, L = cfg.n_embd, cfg.n_layer
    got = c_int8.xorshift_init_params(cfg)
    sizes = [256 * d, 256 * d] + [d * d] * 4 * L + [4 * d * d] * 2 * L
    vals = iter(_xorshift_values(42, sum(sizes)))
    take = lambda shape: np.array([next(vals) for _ in range(int(np.prod(shape)))], np.int8).reshape(shape)
    want = {"emb": take((256, d)), "head": take((256, d))}
    layers = [{n: take((d, d)) for n in ("Wf", "Uf", "Wh", "Uh")} | {"mlp.0": take((4 * d, d)),
                                                                     "mlp.1": take((d, 4 * d))} for _ in range(L)]
    for n in ("Wf", "Uf", "Wh", "Uh"):
        want[f"blocks.att.{n}"] = np.stack([layer[n] for layer in layers])
    for n in ("mlp.0", "mlp.1"):
        want[f"blocks.{n}.weight"] = np.stack([layer[n] for layer in layers])
    assert list(got) == list(s.int8_tree(cfg).paths)
    for path, value in got.items():
        if path in want:
            assert np.array_equal(value, want[path]), path
        else:
            assert (value == (16 if "ln" in path else 0)).all() and value.shape == s.int8_tree(cfg).shapes[path]
    assert not np.array_equal(c_int8.xorshift_init_params(cfg, 43)["emb"], got["emb"])


def test_egg_c_layout_gives_each_pair_its_own_offset():
    from rollout.int8_data import egg_c_main_tokens, egg_c_max_steps, egg_c_pair_offsets, egg_c_step_tokens
    data = np.arange(101, dtype=np.int64).astype(np.uint8)
    T, pop = 7, 8
    assert egg_c_max_steps(101, T) == 14
    for step in (0, 3, 13):
        tokens = egg_c_step_tokens(data, step, pop, T)
        assert tokens.shape == (pop, T + 1)
        for p in range(pop // 2):
            o = (step * T + p * (101 // 4)) % (101 - T)
            assert egg_c_pair_offsets(101, step, 4, T)[p] == o
            assert tokens[2 * p].tolist() == tokens[2 * p + 1].tolist() == list(range(o, o + T + 1))
        assert egg_c_main_tokens(data, step, T).tolist() == list(range(step * T, step * T + T + 1))
    with pytest.raises(ValueError, match="egg.c runs"):
        egg_c_main_tokens(data, 14, T)
    with pytest.raises(ValueError, match="odd"):
        egg_c_step_tokens(data, 0, 7, T)


@needs_c
def test_egg_c_run_needs_no_table_and_its_frozen_leaves_draw_none():
    cfg = s.INT8_PRESETS["selftest"]
    with pytest.raises(ValueError, match="normal look-up is needed"):
        c_int8.Int8C(cfg, 1, None, {"evolving": "matrices"})        # the matrices still draw table noise
    with pytest.raises(ValueError, match="normal look-up is needed"):
        c_int8.Int8C(cfg, 1, None, {"int8_noise": "xorshift"})      # the other leaves still draw table noise
    assert c_int8.table_free("egg.c") and c_int8.table_free("egg.c-cpumulti")
    side = c_int8.Int8C(cfg, 1, None, "egg.c-cpumulti")
    noise = side.member_noise(2, 3)
    for path in side.paths:
        if path not in MATRICES:
            parts = noise[path] if isinstance(noise[path], tuple) else (noise[path],)
            assert not any(np.any(part) for part in parts), path
    data = np.frombuffer(b"the quick brown fox jumps over the lazy dog, " * 4, np.uint8)
    rows = []
    final = c_int8.train_egg_c(cfg, 7, data, 3, observe=lambda st, r, m: rows.append((st, r, m)))
    assert [st for st, _, _ in rows] == [0, 1, 2] and rows[0][2] is not None and rows[1][2] is None
    assert all(np.array_equal(final[p], rows[-1][1].params[p]) for p in final)
    with pytest.raises(ValueError, match="egg.c runs"):
        c_int8.train_egg_c(cfg, 7, data, 1000)
