"""The torch int8 port (torch_impl.int8: noise, model, es, train) against jax_reference.int8: EQUAL.

Integer arithmetic has no rounding, so every comparison is np.array_equal: window starts and entries, each op,
every per-token intermediate of member_trace, logits, per-member scores, fitness signs, votes Z, updated params and
a K-epoch trajectory, on fresh random inputs (never zeros) at two sizes; plus the edge cases of issue 21 (layer-norm
row 0, the threshold-0 decrement, window clamps near 2^30, shifts of negatives, int8 saturation, h's wrap).
"""
from __future__ import annotations

import math
import zlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch

from jax_reference.int8 import model as q
from jax_reference.models import CommonParams
from spec import int8 as s
from torch_impl.int8 import es as tes
from torch_impl.int8 import model as tm
from torch_impl.int8 import noise as tn
from tests.helpers import exit_code
from tests.int8_configs import BAD_TRAINER_ARGV, INT8_CONFIGS, INT8_IDS, QUICK

# two sizes (n_embd, n_layer, pop, T): the selftest preset (4, 1, 8, 8) and the quick preset (16, 2, 32, 16), the
# sizes of `parity int8` and the other int8 test files (tests/int8_configs.py), so the reference's programs compile once
CONFIGS, IDS = INT8_CONFIGS, INT8_IDS


def _rng(tag: str) -> np.random.Generator:
    return np.random.default_rng(zlib.crc32(tag.encode()))


def _nonzero_int8(rng, shape, lo=-127, hi=127):
    v = rng.integers(lo, hi + 1, shape)
    v[v == 0] = 1
    return v


def _jax_leaves(cfg, tree_like) -> dict:
    """A JAX pytree of the int8 model as {path: numpy}, in spec.int8_tree's order."""
    return dict(zip(s.int8_tree(cfg).paths, [np.asarray(x) for x in jax.tree.leaves(tree_like)]))


def _jax_params(cfg, flat: dict):
    """{path: numpy} -> the reference's nested params."""
    init = q.init_int8(cfg, 0)
    return jax.tree.unflatten(jax.tree.structure(init.params),
                              [jnp.asarray(flat[p]) for p in s.int8_tree(cfg).paths])


def _random_params(cfg, tag) -> dict:
    """Random int8 params over the tree, never zero (so every op's terms all show)."""
    rng = _rng(tag)
    return {leaf.path: _nonzero_int8(rng, leaf.shape).astype(np.int8) for leaf in s.int8_tree(cfg).leaves}


@pytest.fixture(scope="module")
def lut():
    return q.normal_lut()


# ----------------------------------------------------------------------------- windows: starts and entries
@pytest.mark.parametrize("cfg", CONFIGS, ids=IDS)
@pytest.mark.parametrize("seed,epoch,noise_reuse", [(0, 7, 3), (2 ** 32 - 1, 5, 1), (11, 4, 0)])
def test_window_starts_equal_the_references(cfg, seed, epoch, noise_reuse):
    init = q.init_int8(cfg, seed)
    threads = np.concatenate([np.arange(cfg.pop), _rng("thr").integers(0, 2 ** 31, 40), [2 ** 31 - 1, 2 ** 17 + 1]])
    want = _jax_leaves(cfg, q.window_starts({"noise_reuse": noise_reuse, "rank": 1}, init.params, init.es_tree_key,
                                            epoch, threads, init.es_map))
    got = tn.window_starts(s.int8_tree(cfg), tn.leaf_keys(cfg, seed), epoch, threads, noise_reuse)
    assert set(got) == set(want)
    for path in want:
        assert np.array_equal(got[path].numpy(), want[path].astype(np.int64)), path


def test_leaf_keys_equal_the_references():
    for cfg in CONFIGS:
        want = _jax_leaves(cfg, jax.tree.map(jax.random.key_data, q.init_int8(cfg, 9).es_tree_key))
        got = tn.leaf_keys(cfg, 9)
        assert all(np.array_equal(got[p].numpy(), want[p].astype(np.int64)) for p in want)


@pytest.mark.parametrize("seed", [0, 3, 2 ** 32 - 1])
def test_table_entries_equal_the_references_up_to_2_30(lut, seed):
    counters = np.concatenate([np.arange(0, 3000), np.arange(2 ** 30 - 3000, 2 ** 30),
                               _rng(f"ctr{seed}").integers(0, 2 ** 30, 5000)]).astype(np.uint32)
    want = np.asarray(q.table_entries(lut, q.table_key(seed), counters))
    assert np.array_equal(tn.table_entries(seed, torch.from_numpy(counters.astype(np.int64))).numpy(), want)


def test_lut_equals_the_references(lut):
    ours = tn.normal_lut()
    assert ours.dtype == torch.int8 and ours.shape == (2 ** 23,)
    assert np.array_equal(ours.numpy(), np.asarray(lut))


@pytest.mark.parametrize("n", [1, 320, 2 * 256])
def test_windows_clamp_near_2_30_like_dynamic_slice(lut, n):
    """Starts placed on purpose at and past 2^30 - n (word0 = target ^ h(p)) clamp to 2^30 - n, never wrap; the
    entries read are the reference's window at that start."""
    pairs = torch.tensor([0, 1, 5, 2 ** 16, 2 ** 30 - 1])
    for target in (2 ** 30 - n, 2 ** 30 - n + 1, 2 ** 30 - 1, 2 ** 30 - n - 1, 12345, 2 ** 32 - 1, 3 * 2 ** 30 + 7):
        word0 = torch.tensor(target, dtype=torch.int64) ^ tn.pair_hash(pairs)          # one key per pair
        starts = torch.diagonal(tn.clamped_starts(word0, pairs, n))
        for p, start in zip(pairs.tolist(), starts.tolist()):
            assert start == s.clamp_start(s.window_start(int(word0[pairs.tolist().index(p)]), p), n)
            assert start == min(target & (2 ** 30 - 1), 2 ** 30 - n)     # the mask keeps 30 bits, then the clamp
        key = q.table_key(4)
        want = np.asarray(q.window(lut, key, jnp.uint32(target & (2 ** 30 - 1)), n))
        got = tn.table_entries(4, starts[0] + torch.arange(n)).numpy()
        assert np.array_equal(got, want)


@pytest.mark.parametrize("cfg", CONFIGS, ids=IDS)
def test_population_noise_equals_the_references_factors(cfg, lut):
    """Every pair's A, B (low rank, the embedding included) and E (full rank), slices stacked, and the members'
    signs, against the reference's lowrank_factors / fullrank_noise per member."""
    seed, epoch = 5, 3
    init = q.init_int8(cfg, seed)
    frozen, nparams = q.QEggRoll.init_noiser(init.params, 4, 0, noise_seed=seed)
    noise = tn.member_view(tn.population_noise(s.int8_tree(cfg), tn.leaf_keys(cfg, seed), seed, epoch, cfg.pairs, 1),
                           cfg.pop)
    for m in range(cfg.pop):
        want = q.member_noise(nparams, frozen, init.params, init.es_tree_key, init.es_map, (jnp.int32(epoch),
                                                                                             jnp.int32(m)))
        flat = jax.tree.leaves(want, is_leaf=lambda x: isinstance(x, tuple))
        for leaf, value in zip(s.int8_tree(cfg).leaves, flat):
            if leaf.cls == "param":
                assert np.array_equal(noise.E[leaf.path][m].numpy(), np.asarray(value)), leaf.path
            else:
                A, B = (np.asarray(v)[..., 0] for v in value)                          # rank 1
                assert np.array_equal(noise.A[leaf.path][m].numpy(), A), leaf.path
                assert np.array_equal(noise.B[leaf.path][m].numpy(), B), leaf.path


# ----------------------------------------------------------------------------- integer corners
def test_shifts_and_floor_division_of_negatives_are_floor():
    v = torch.tensor([-1, -15, -16, -17, -255, -2 ** 31, 5, 0], dtype=torch.int32)
    assert (v >> 4).tolist() == [math.floor(x / 16) for x in v.tolist()]
    assert tm.floor_div(v, 16).tolist() == [x // 16 for x in v.tolist()]
    assert (v >> 8).tolist() == np.asarray(jnp.asarray(v.numpy()) >> 8).tolist()
    assert tm.floor_div(v, 48).tolist() == np.asarray(jnp.floor_divide(jnp.asarray(v.numpy()), 48)).tolist()


def test_int8_saturates_at_127_not_128():
    a = torch.tensor([100, -100, 127, -127, 3], dtype=torch.int8)
    b = torch.tensor([100, -100, 1, -1, -5], dtype=torch.int8)
    assert tm.clipped_add(a, b).tolist() == [127, -127, 127, -127, -2]
    assert tm.clipped_add(a, b, b).tolist() == [127, -127, 127, -127, -7]
    assert tm.clip8(torch.tensor([2 ** 31 - 1, -2 ** 31, 128, -128])).tolist() == [127, -127, 127, -127]
    P = torch.tensor([127, -127, 120], dtype=torch.int8)
    E = torch.tensor([2 ** 20, -2 ** 20, 2 ** 12], dtype=torch.int32)
    assert tm.param(P, E, 4).tolist() == np.asarray(
        q.clip8(jnp.asarray(P.numpy(), jnp.int32) + (jnp.asarray(E.numpy()) >> 8))).tolist() == [127, -127, 127]


def test_h_wraps_like_int32():
    pairs = np.concatenate([np.arange(0, 70000, 997), [2 ** 16 - 1, 2 ** 16, 2 ** 20 + 3, 2 ** 30 - 1, 2 ** 31 - 1]])
    want = np.asarray(q.pair_hash(jnp.asarray(pairs, jnp.int32))).astype(np.int64)
    assert np.array_equal(tn.pair_hash(torch.from_numpy(pairs)).numpy(), want)
    assert [s.h(int(p)) & 0xFFFFFFFF for p in pairs] == want.tolist()
    assert any(s.h(int(p)) != ((int(p) >> 16) ^ int(p)) * s.HASH_MULT for p in pairs)      # it does wrap


def test_ln_division_equals_the_reference_at_every_entry_row_0_included():
    """DIV[m][v] for every m in 0..255 and every int16 v (row 0: -1 for 0, -2 otherwise), against q.ln_divide."""
    numerators = np.arange(2 ** 16).astype(np.int16).astype(np.int32)
    want = np.asarray(q.ln_divide(jnp.asarray(numerators)[None, :], jnp.arange(256, dtype=jnp.int32)[:, None]))
    got = tm.ln_divide(torch.from_numpy(numerators)[None, :], torch.arange(256)[:, None]).numpy()
    assert np.array_equal(got, want)
    assert got[0, 0] == -1 and np.all(got[0, 1:] == -2)


def test_log2_entries_equal_the_spec_and_numpy():
    thresholds = np.array(s.LOG2_THRESHOLDS, dtype=np.int64).ravel()
    ks = np.concatenate([thresholds - 2, thresholds - 1, thresholds, np.arange(300),
                         _rng("log2").integers(0, 2 ** 28, 3000), [2 ** 28 - 1]])
    ks = np.unique(ks[(ks >= 0) & (ks < 2 ** 28)])
    got = tm.log2_entries(torch.from_numpy(ks)).numpy()
    assert np.array_equal(got, (np.log2((ks + 1) / 16) * 16).astype(np.int32))
    assert np.array_equal(got, np.asarray(q.log2_entries(jnp.asarray(ks, jnp.int32))))


@pytest.mark.parametrize("m,k,n", [(8, 4, 16), (256, 64, 256), (256, 256, 64), (12, 16, 64), (3, 1024, 5)])
def test_int8_gemm_path_is_exact_at_the_extremes_and_on_random_operands(m, k, n):
    """int_matmul on int8 operands (torch._int_mm where the probe found it exact, else int64) equals the int64
    product: all +-127, mixed signs, and random values, on the shapes the model uses and beyond."""
    rng = _rng(f"gemm{m}{k}{n}")
    cases = [(np.full((m, k), u), np.full((k, n), v)) for u, v in ((127, 127), (127, -127), (-127, -127))]
    cases += [(_nonzero_int8(rng, (m, k)), _nonzero_int8(rng, (k, n))) for _ in range(5)]
    for a, b in cases:
        a8, b8 = torch.from_numpy(a).to(torch.int8), torch.from_numpy(b).to(torch.int8)
        want = a.astype(np.int64) @ b.astype(np.int64)
        assert np.array_equal(tm.int_matmul(a8, b8).numpy(), want)
        assert np.array_equal(tm.int_matmul(a8, b8.T.contiguous().T).numpy(), want)     # W.T as mm passes it


def test_integer_products_are_exact_where_float32_would_round():
    x = torch.full((2, 1024), 127, dtype=torch.int8)
    W = torch.full((3, 1024), -127, dtype=torch.int8)
    assert tm.int_matmul(x, W.T).tolist() == [[-127 * 127 * 1024] * 3] * 2
    assert (x.float() @ W.T.float()).to(torch.int64).tolist() == [[-127 * 127 * 1024] * 3] * 2  # (exact here too)
    rng = _rng("exact")
    a = torch.from_numpy(rng.integers(-127, 128, (4, 4096))).to(torch.int8)
    b = torch.from_numpy(rng.integers(-127, 128, (4096, 5))).to(torch.int8)
    assert np.array_equal(tm.int_matmul(a, b).numpy(), (a.numpy().astype(np.int64) @ b.numpy().astype(np.int64)))


# ----------------------------------------------------------------------------- ops against the reference
def _lowrank(rng, P, a, b):
    return tm.LowRank(torch.from_numpy(_nonzero_int8(rng, (P, a), -86, 83)).to(torch.int8),
                      torch.from_numpy(_nonzero_int8(rng, (P, b), -86, 83)).to(torch.int8))


@pytest.mark.parametrize("in_dim,out_dim", [(4, 16), (16, 64), (64, 256)])
@pytest.mark.parametrize("sigma_shift", [0, 4])
def test_mm_equals_do_mm(in_dim, out_dim, sigma_shift):
    rng, P = _rng(f"mm{in_dim}{sigma_shift}"), 6
    W = torch.from_numpy(_nonzero_int8(rng, (out_dim, in_dim))).to(torch.int8)
    x = torch.from_numpy(_nonzero_int8(rng, (P, in_dim))).to(torch.int8)
    noise = _lowrank(rng, P, out_dim, in_dim)
    got, plain = tm.mm(W, x, noise, sigma_shift), tm.mm(W, x, None, sigma_shift)
    params = {"sigma_shift": jnp.int32(sigma_shift)}
    for m in range(P):
        AB = (jnp.asarray(noise.A[m].numpy())[:, None], jnp.asarray(noise.B[m].numpy())[:, None])
        want = q.CachedQEggRoll.do_mm({}, params, jnp.asarray(W.numpy()), AB, (0, m), jnp.asarray(x[m].numpy()))
        assert np.array_equal(got[m].numpy(), np.asarray(want))
        want = q.QEggRoll.do_mm({}, params, jnp.asarray(W.numpy()), None, None, jnp.asarray(x[m].numpy()))
        assert np.array_equal(plain[m].numpy(), np.asarray(want))
    assert len(set(got.flatten().tolist())) > 3


@pytest.mark.parametrize("d", [4, 16])
def test_emb_param_and_ln_equal_the_references(d):
    rng, P = _rng(f"emb{d}"), 5
    E = torch.from_numpy(_nonzero_int8(rng, (256, d))).to(torch.int8)
    noise = _lowrank(rng, P, 256, d)
    tok = torch.tensor([0, 97, 255, 13, 97])
    got = tm.emb(E, tok, noise, 4)
    params = {"sigma_shift": jnp.int32(4)}
    for m in range(P):
        AB = (jnp.asarray(noise.A[m].numpy())[:, None], jnp.asarray(noise.B[m].numpy())[:, None])
        want = q.CachedQEggRoll.do_emb({}, params, jnp.asarray(E.numpy()), AB, (0, m), int(tok[m]))
        assert np.array_equal(got[m].numpy(), np.asarray(want))
    assert np.array_equal(tm.emb(E, tok, None, 4).numpy(), E.numpy()[tok.numpy()])
    Pp = torch.from_numpy(_nonzero_int8(rng, (d,))).to(torch.int8)
    Ef = torch.from_numpy(rng.integers(-86 * 86, 86 * 86 + 1, (P, d))).to(torch.int32)
    got = tm.param(Pp, Ef, 4)
    for m in range(P):
        want = q.CachedQEggRoll.get_noisy_standard({}, params, jnp.asarray(Pp.numpy()), jnp.asarray(Ef[m].numpy()),
                                                   (0, m))
        assert np.array_equal(got[m].numpy(), np.asarray(want))
    common = lambda w: CommonParams(q.QEggRoll, {}, {}, None, {"weight": w}, {"weight": None}, None)
    for scale in (127, 1):                        # scale 1: half the entries +-1, half 0: sum |x| < d, so row 0
        x = torch.from_numpy(_nonzero_int8(rng, (P, d), -scale, scale)).to(torch.int8)
        if scale == 1:
            x[:, d // 2:] = 0
        w = torch.from_numpy(_nonzero_int8(rng, (P, d))).to(torch.int8)
        got = tm.ln(x, w)
        for m in range(P):
            want = q.EggLN._forward(common(jnp.asarray(w[m].numpy())), jnp.asarray(x[m].numpy()))
            assert np.array_equal(got[m].numpy(), np.asarray(want))
        if scale == 1:
            assert set(got.flatten().tolist()) == {-1, -2}  # row 0: -1 where x * w = 0, else -2


# ----------------------------------------------------------------------------- the model: member_trace, scores
def _trace_case(cfg, seed, tag):
    rng = _rng(tag)
    flat = _random_params(cfg, tag)
    flat["blocks.ln1.weight"] = np.abs(flat["blocks.ln1.weight"]) // 4 + 1     # keep the norms from saturating all
    flat["blocks.ln2.weight"] = np.abs(flat["blocks.ln2.weight"]) // 4 + 1
    flat["ln_out.weight"] = np.abs(flat["ln_out.weight"]) // 4 + 1
    toks = rng.integers(1, 256, (cfg.pop, cfg.tokens_per_update + 1))
    toks[:, 3] = 0                                                               # a state reset inside the window
    states = _nonzero_int8(rng, (cfg.pop, cfg.n_layer, cfg.n_embd)).astype(np.int8)
    return flat, toks, states


def _every_members_trace(frozen, nparams, params, es_tree_key, epoch, toks, states):
    """member_trace of every member m at (epoch, m) on toks[m], nano-egg's graph, stacked: one call per member of the
    program `parity int8` compiles for its traced members, at the same two sizes (a vmapped program of this file's own
    cost 6.5 s of compiling; the noiser params, sigma_shift among them, are arguments)."""
    traces = [q.member_trace(q.QEggRoll, frozen, nparams, params, es_tree_key, (jnp.int32(epoch), jnp.int32(m)),
                             jnp.asarray(toks[m, :-1].astype(np.int32)), jnp.asarray(toks[m, 1:].astype(np.int32)),
                             jnp.asarray(states[m])) for m in range(len(toks))]
    return ({name: np.stack([np.asarray(trace[name]) for trace, _ in traces]) for name in traces[0][0]},
            np.stack([np.asarray(state) for _, state in traces]))


@pytest.mark.parametrize("cfg", CONFIGS, ids=IDS)
@pytest.mark.parametrize("sigma_shift", [4, 0])
def test_member_trace_logits_scores_and_states_equal_the_references(cfg, sigma_shift):
    seed, epoch = 3, 5
    flat, toks, states = _trace_case(cfg, seed, f"trace{cfg.n_embd}{sigma_shift}")
    jparams = _jax_params(cfg, flat)
    init = q.init_int8(cfg, seed)
    frozen, nparams = q.QEggRoll.init_noiser(jparams, sigma_shift, 0, noise_seed=seed)
    noise = tn.member_view(tn.population_noise(s.int8_tree(cfg), tn.leaf_keys(cfg, seed), seed, epoch, cfg.pairs, 1),
                           cfg.pop)
    tparams = {k: torch.from_numpy(v) for k, v in flat.items()}
    scores, st, trace = tm.scores(tparams, noise, torch.from_numpy(toks), torch.from_numpy(states), sigma_shift,
                                  trace=True)
    assert list(trace) == q.trace_names(cfg.n_layer)
    want, want_state = _every_members_trace(frozen, nparams, jparams, init.es_tree_key, epoch, toks, states)
    for name in q.trace_names(cfg.n_layer):
        assert np.array_equal(trace[name].numpy(), np.asarray(want[name])), name
    assert np.array_equal(st.numpy(), np.asarray(want_state))
    jscores, jstates = q.population_scores(frozen, nparams, jparams, init.es_tree_key, init.es_map, epoch,
                                           toks.astype(np.uint8), jnp.asarray(states))
    assert np.array_equal(scores.numpy(), np.asarray(jscores))
    assert np.array_equal(st.numpy(), np.asarray(jstates))
    assert len(set(scores.tolist())) > 1
    # the no-noise path (validation)
    val = q.validation_scores(jparams, toks[:4])
    assert np.array_equal(tm.scores(tparams, None, torch.from_numpy(toks[:4]),
                                    tm.default_state(cfg, 4), sigma_shift)[0].numpy(), val)


@pytest.mark.parametrize("cfg", CONFIGS, ids=IDS)
def test_init_equals_the_references(cfg):
    want = _jax_leaves(cfg, q.init_int8(cfg, 7).params)
    got = tm.init_params(cfg, 7)
    assert list(got) == list(want)
    assert all(np.array_equal(got[p].numpy(), want[p]) for p in want)


# ----------------------------------------------------------------------------- fitness, votes, update
@pytest.mark.parametrize("cfg,use_clt", [(CONFIGS[0], True), (CONFIGS[1], True), (CONFIGS[1], False)],
                         ids=IDS + ["d16-no-clt"])
@pytest.mark.parametrize("epoch", [0, 40])
def test_fitness_votes_and_update_equal_the_references(cfg, use_clt, epoch):
    cfg = cfg.replace(alpha_decay_timestep=20, epochs=50, use_clt=use_clt)
    seed = 6
    flat = _random_params(cfg, f"upd{cfg.n_embd}{epoch}")
    jparams = _jax_params(cfg, flat)
    init = q.init_int8(cfg, seed)
    thr = s.threshold_at(epoch, cfg.alpha, cfg.alpha_decay_timestep)
    assert (thr == 0) == (epoch == 0)
    frozen, nparams = q.QEggRoll.init_noiser(jparams, 4, thr, noise_seed=seed, use_clt=use_clt)
    scores = _rng(f"sc{epoch}").integers(-3, 4, cfg.pop).astype(np.int32) - 900
    scores[3] = scores[2]                                                               # a tie: f = 0
    es = tes.make(cfg)
    state = tes.init(es, seed, params={k: torch.from_numpy(v) for k, v in flat.items()})._replace(epoch=epoch)
    noise, state = tes.ask(es, state)
    new, info = tes.tell(es, state, noise, torch.from_numpy(scores))
    f = q.QEggRoll.convert_fitnesses(frozen, nparams, jnp.asarray(scores))
    assert np.array_equal(info["fitness"].numpy(), np.asarray(f)) and 0 in info["fitness"].tolist()
    Z = _jax_leaves(cfg, q.tree_votes(frozen, nparams, jparams, init.es_tree_key, init.es_map, f, epoch))
    for path in s.int8_tree(cfg).paths:
        assert np.array_equal(info["votes"][path].numpy(), Z[path]), path
    want = _jax_leaves(cfg, q.update(frozen, nparams, jparams, init.es_tree_key, init.es_map, scores, epoch))
    moved, inside = 0, 0
    for path in want:
        assert np.array_equal(new.params[path].numpy(), want[path]), path
        moved += int((new.params[path].numpy() != flat[path]).sum())
        inside += int((np.abs(flat[path]) < 127).sum())
    assert info["threshold"] == thr and new.epoch == epoch + 1
    assert moved >= inside if thr == 0 else 0 < moved < inside      # thr 0: every entry off the clip bound moves


def test_threshold_0_moves_every_entry_and_z_0_goes_down():
    P = torch.tensor([[0, 5, -127], [127, 3, -3]], dtype=torch.int8)
    Z = torch.tensor([[0, 1, -1], [5, 0, 0]], dtype=torch.int32)
    got = tes.apply_votes(P, Z, 0, 4)
    want = q.QEggRoll.apply_votes({"use_clt": True}, {"update_threshold": jnp.int32(0)}, jnp.asarray(P.numpy()),
                                  jnp.asarray(Z.numpy()), pairs=4)
    assert got.tolist() == np.asarray(want).tolist() == [[-1, 6, -127], [127, 2, -4]]
    Z = torch.tensor([[0, 255, 256], [-256, -255, 10 ** 6]], dtype=torch.int32)
    for use_clt in (True, False):
        got = tes.apply_votes(P, Z, 8, 5, use_clt)
        want = q.QEggRoll.apply_votes({"use_clt": use_clt}, {"update_threshold": jnp.int32(8)},
                                      jnp.asarray(P.numpy()), jnp.asarray(Z.numpy()), pairs=5)
        assert got.tolist() == np.asarray(want).tolist()


def test_fitness_is_the_sign_of_pair_differences():
    scores = torch.tensor([5, 3, -2, 7, 4, 4, 0, -1], dtype=torch.int32)
    assert tes.fitness(scores).tolist() == [1, -1, 0, 1]


# ----------------------------------------------------------------------------- training: a K-epoch trajectory
def _lockstep(cfg, seed):
    from jax_reference.int8.train import train_int8 as jax_train
    from torch_impl.int8.train import train_int8 as torch_train
    seen = {"jax": [], "torch": []}
    jax_result = jax_train(cfg, seed, progress=False,
                           observe=lambda e, sc, p: seen["jax"].append((np.asarray(sc), _jax_leaves(cfg, p))))
    torch_result = torch_train(cfg, seed, progress=False,
                               observe=lambda e, sc, p, info: seen["torch"].append(
                                   (sc.numpy().copy(), {k: v.numpy().copy() for k, v in p.items()})))
    return jax_result, torch_result, seen


# val_rows 32 (the presets' 4 and 8 give rows of 1,929 and 964 bytes): the same 7,712 validation bytes compared, in
# rows of 241, which the torch side steps through byte by byte (a recurrent forward), 8 times fewer steps.
@pytest.mark.parametrize("cfg", [s.INT8_PRESETS["selftest"].replace(epochs=5, val_rows=32),
                                 QUICK.replace(epochs=4, validate_every=2, alpha_decay_timestep=2, val_rows=32)],
                         ids=["selftest-5", "d16-4"])
def test_k_epoch_trajectory_equals_the_references(cfg):
    jax_result, torch_result, seen = _lockstep(cfg, 0)
    assert len(seen["jax"]) == len(seen["torch"]) == cfg.epochs
    for epoch, ((js, jp), (ts, tp)) in enumerate(zip(seen["jax"], seen["torch"])):
        assert np.array_equal(ts, js), epoch
        assert all(np.array_equal(tp[p], jp[p]) for p in jp), epoch
    drop = ("tokens_per_s", "wall_s")
    rows = lambda r: [{k: v for k, v in row.items() if k not in drop} for row in r.history]
    assert rows(torch_result) == rows(jax_result)
    assert torch_result.val_bpb == jax_result.val_bpb
    assert [row["threshold"] for row in torch_result.history][0] == 0


# ----------------------------------------------------------------------------- the command line
def test_cli_prints_the_references_validation(capsys):
    from jax_reference.__main__ import main as jax_main
    from torch_impl.__main__ import main as torch_main
    argv = ["--task", "int8", "--preset", "selftest", "--seed", "0", "--quiet"]
    assert torch_main(argv) == 0
    ours = capsys.readouterr().out.strip().splitlines()[-1]
    assert jax_main(argv) == 0
    theirs = capsys.readouterr().out.strip().splitlines()[-1]
    assert ours.split(" (")[0] == theirs.split(" (")[0] and ours.startswith("validation ")


@pytest.mark.parametrize("argv", BAD_TRAINER_ARGV + [["--alpha", "2"], ["--task", "int8", "--torch", "rng=torch"],
                                                     ["--task", "int8", "--threads", "0"],
                                                     ["--task", "int8", "--preset", "paper"]])
def test_cli_exits_2_before_any_work(argv, capsys):
    from torch_impl.__main__ import main
    assert exit_code(main, argv) == 2
    assert "error:" in capsys.readouterr().err


@pytest.mark.parametrize("side", ["torch", "jax"])
def test_training_without_validation_moves_the_same_params_and_scores(side):
    """validate=False (the parity suite's trajectory, which reads only scores and params) skips the validation rows
    and nothing else: every epoch's scores and the final params are those of a validated run; val bits/byte NaN."""
    if side == "torch":
        from torch_impl.int8.train import train_int8
        same = lambda a, b: all(torch.equal(a[p], b[p]) for p in a)          # noqa: E731
    else:
        from jax_reference.int8.train import train_int8
        same = lambda a, b: all(np.array_equal(x, y) for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)))  # noqa: E731
    cfg = s.INT8_PRESETS["selftest"].replace(epochs=2, validate_every=1)
    validated = train_int8(cfg, 7, progress=False)
    skipped = train_int8(cfg, 7, progress=False, validate=False)
    assert same(validated.params, skipped.params)
    assert [r["score_sum"] for r in validated.history] == [r["score_sum"] for r in skipped.history]
    assert all(math.isfinite(r["val_bpb"]) for r in validated.history) and math.isfinite(validated.val_bpb)
    assert all(math.isnan(r["val_bpb"]) for r in skipped.history) and math.isnan(skipped.val_bpb)
