"""The JAX byte-level LM (jax_reference.lm): its tree, init and ES keys follow spec.lm; the scanned blocks equal an
unrolled loop; noise, freeze_nonlora, group shaping and one update act on the classes they should; the trainer
runs; the CLI refuses bad input with exit 2. Two sizes (the selftest and quick presets), fresh random bytes."""
from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jax_reference import __main__ as cli
from jax_reference.lm import model as lm
from jax_reference.lm.train import make_update
from jax_reference.noiser import EggRoll
from jax_reference.population import leaf_names, params_to_flat
from spec.lm import LM_PRESETS, init_plan, intermediate_names, lm_tree
from tests.trainer_cli import BAD_LM_TRAINER_ARGV

SIZES = ["selftest", "quick"]


def setup(size, seed=0, **changes):
    """(cfg, init, es_tree_key, frozen_noiser_params, noiser_params) as the trainer builds them."""
    cfg = LM_PRESETS[size].replace(**changes)
    init = lm.init_lm(cfg, seed)
    keys = lm.es_keys(init.params, init.scan_map, seed)
    fnp, npar = EggRoll.init_noiser(init.params, cfg.sigma, cfg.lr, group_size=cfg.group_size,
                                    freeze_nonlora=cfg.freeze_nonlora, noise_reuse=cfg.noise_reuse, rank=cfg.rank)
    return cfg, init, keys, fnp, npar


def random_tokens(cfg, n, seed):
    return np.random.default_rng(seed).integers(0, 256, (n, cfg.seq_len + 1)).astype(np.uint8)


def flat_map(tree_map, params):
    """{path: value} of a map (scan_map / es_map) shaped like params."""
    treedef = jax.tree.structure(params)
    return dict(zip(leaf_names(params), treedef.flatten_up_to(tree_map)))


# ----------------------------------------------------------------------------- tree, init, keys
@pytest.mark.parametrize("size", SIZES)
def test_the_initialised_tree_is_spec_lm_tree(size):
    cfg, init, *_ = setup(size)
    tree = lm_tree(cfg)
    assert leaf_names(init.params) == tree.paths                                  # JAX flatten order
    shapes = {p: a.shape for p, a in params_to_flat(init.params).items()}
    assert shapes == tree.shapes
    scan, es = flat_map(init.scan_map, init.params), flat_map(init.es_map, init.params)
    for leaf in tree.leaves:
        assert scan[leaf.path] == leaf.scan_axes and es[leaf.path] == leaf.es_class, leaf
    assert all(a.dtype == jnp.float32 for a in jax.tree.leaves(init.params))


@pytest.mark.parametrize("size", SIZES)
def test_init_is_computed_once_and_each_caller_gets_its_own_containers(size):
    """init_lm is kept per (cfg, seed, dtype, emulation settings): a second call shares the arrays (immutable), not
    the dicts, so a caller's edit reaches nobody else; another seed or the GPU's normals is another init."""
    from jax_reference.emulation import emulating
    cfg = LM_PRESETS[size]
    first = lm.init_lm(cfg, 5)
    first.params["head"] = None
    again = lm.init_lm(cfg, 5)
    assert again.params["head"] is not None and again.params is not first.params
    assert all(a is b for a, b in zip(jax.tree.leaves(again.params["blocks"]), jax.tree.leaves(first.params["blocks"])))
    other = lm.init_lm(cfg, 6)
    assert not np.array_equal(other.params["blocks"]["wz"], again.params["blocks"]["wz"])
    with emulating(normals="gpu"):
        gpu = lm.init_lm(cfg, 5)
    assert not np.array_equal(gpu.params["blocks"]["wz"], again.params["blocks"]["wz"])   # a few normals differ
    eager = lm.ByteLM.rand_init(lm.run_keys(5)[0], cfg)
    assert all(np.array_equal(a, b) for a, b in zip(jax.tree.leaves(eager.params), jax.tree.leaves(again.params)))


@pytest.mark.parametrize("size", SIZES)
def test_init_values_follow_the_key_scheme(size):
    """Every leaf recomputed straight from jax.random with spec.lm.init_plan's split indices: bit for bit."""
    cfg, init, *_ = setup(size, seed=3)
    flat = params_to_flat(init.params)
    top = jax.random.split(jax.random.split(jax.random.key(3), 3)[0], 4)
    d = cfg.d_model
    for path, rule in init_plan(cfg).items():
        if rule.block is None:
            keys, got = [top[rule.top]], [flat[path]]
        else:
            keys = [jax.random.split(k, 9)[rule.block] for k in jax.random.split(top[rule.top], cfg.layers)]
            got = list(flat[path])
        for key, value in zip(keys, got):
            shape = value.shape
            if rule.kind == "normal":
                want = jax.random.normal(key, shape) * (1 / jnp.sqrt(rule.fan_in))
            elif rule.kind == "h0":
                want = jax.random.normal(key, shape) * np.float32(0.1)
            else:
                want = {"ones": np.ones(shape), "zeros": np.zeros(shape),
                        "shift": np.stack([np.ones(d), np.zeros(d)])}[rule.kind]
            np.testing.assert_array_equal(value, np.asarray(want, np.float32), err_msg=path)


@pytest.mark.parametrize("size", SIZES)
def test_es_keys_are_the_flatten_order_split_then_split_per_slice(size):
    cfg, init, keys, *_ = setup(size, seed=5)
    es_key = jax.random.split(jax.random.key(5), 3)[1]
    base = jax.random.split(es_key, len(lm_tree(cfg).leaves))
    flat_keys = dict(zip(leaf_names(init.params), jax.tree.leaves(keys)))
    for i, leaf in enumerate(lm_tree(cfg).leaves):
        want = jax.random.split(base[i], cfg.layers) if leaf.scan_axes else base[i]
        np.testing.assert_array_equal(jax.random.key_data(flat_keys[leaf.path]), jax.random.key_data(want))


# ----------------------------------------------------------------------------- forward
@pytest.mark.parametrize("size", SIZES)
def test_scanned_blocks_equal_an_unrolled_loop(size):
    """Every intermediate, noise on, within 16 float32 ulps of the entry's largest magnitude (2**-19 * max|entry|).

    The two run the same float32 ops in the same order, but XLA compiles the scan's body as one graph and the loop
    op by op: inside the graph rms's division becomes a multiply by rsqrt, and products fuse with the sums after
    them, about 1 ulp per norm or product, carried down the residual stream over a block's ~5 such steps. Measured
    at d 8-32, 2-3 blocks: at most 3 ulps of the entry's scale (the embedding and usually the score bit-equal)."""
    cfg, init, keys, fnp, npar = setup(size, freeze_nonlora=False)
    tokens = random_tokens(cfg, 1, seed=11)[0]
    _, scanned = lm.member_score(EggRoll, fnp, npar, init.params, keys, (2, 5), tokens, intermediates=True)
    _, unrolled = lm.member_score(EggRoll, fnp, npar, init.params, keys, (2, 5), tokens, intermediates=True,
                                  unroll=True)
    assert list(scanned) == list(unrolled) == intermediate_names(cfg.layers)
    for name in scanned:
        got, want = np.asarray(scanned[name]), np.asarray(unrolled[name])
        assert np.max(np.abs(got - want)) <= 2.0 ** -19 * np.max(np.abs(want)), name
    assert lm.intermediate_leaf("blocks.1.wz") == ("blocks.wz", 1)
    assert lm.intermediate_leaf("blocks.0.out") == ("blocks", 0) and lm.intermediate_leaf("head") == ("head", None)


@pytest.mark.parametrize("size", SIZES)
def test_population_scores_are_each_members_score(size):
    """The jit'd vmap against member_score one by one: the same ops, compiled differently: 1e-5 relative on a
    score of about 8 (a mean of T log-probabilities, each a sum of a few rounded ops)."""
    cfg, init, keys, fnp, npar = setup(size)
    tokens = random_tokens(cfg, cfg.pop, seed=2)
    scores = np.asarray(lm.population_scores(EggRoll, fnp, npar, init.params, keys, 4, tokens))
    assert scores.shape == (cfg.pop,) and np.all(np.isfinite(scores))
    member = jax.jit(lambda m, toks: lm.member_score(EggRoll, fnp, npar, init.params, keys, (jnp.int32(4), m), toks))
    one = [float(member(jnp.int32(m), tokens[m])) for m in range(cfg.pop)]
    np.testing.assert_allclose(scores, one, rtol=1e-5)
    # an untrained byte model is near uniform: about 8 bits per byte
    assert 6 < -scores.mean() < 11


@pytest.mark.parametrize("size", SIZES)
def test_noise_off_is_the_limit_of_tiny_sigma_and_noise_changes_scores(size):
    cfg, init, keys, fnp, npar = setup(size, freeze_nonlora=False)
    tokens = random_tokens(cfg, 1, seed=7)[0]
    off = float(lm.member_score(EggRoll, fnp, npar, init.params, keys, None, tokens))
    member = jax.jit(lambda sigma, m: lm.member_score(EggRoll, fnp, {**npar, "sigma": sigma}, init.params, keys,
                                                      (jnp.int32(0), m), tokens))
    noisy = [float(member(jnp.float32(cfg.sigma), jnp.int32(m))) for m in range(4)]
    tiny = [float(member(jnp.float32(1e-6), jnp.int32(m))) for m in range(4)]
    assert len(set(noisy)) == 4 and all(abs(s - off) > 1e-4 for s in noisy)
    # sigma 1e-6 moves a score of ~8 by ~1e-6 times O(10) (its gradient's size): well inside 1e-3
    np.testing.assert_allclose(tiny, off, atol=1e-3)
    assert lm.val_bits_per_byte(init.params, tokens[None]) == pytest.approx(-off, rel=1e-5)


@pytest.mark.parametrize("size", SIZES)
def test_freeze_nonlora_leaves_param_leaves_unperturbed(size):
    """Before the first low-rank product only the embedding, ln1 and shift act: the ln1 and shift entries equal the
    noise-off ones exactly when freeze_nonlora, and differ when not; the embedding is never perturbed."""
    tokens = random_tokens(LM_PRESETS[size], 1, seed=8)[0]
    for freeze in (True, False):
        cfg, init, keys, fnp, npar = setup(size, freeze_nonlora=freeze)
        _, off = lm.member_score(EggRoll, fnp, npar, init.params, keys, None, tokens, intermediates=True)
        _, on = lm.member_score(EggRoll, fnp, npar, init.params, keys, (1, 3), tokens, intermediates=True)
        np.testing.assert_array_equal(on["embed"], off["embed"])
        for name in ("blocks.0.ln1", "blocks.0.shift"):
            assert np.array_equal(on[name], off[name]) == freeze, (name, freeze)
        assert not np.allclose(on["blocks.0.wz"], off["blocks.0.wz"])            # low-rank noise always on


# ----------------------------------------------------------------------------- shaping and the update
@pytest.mark.parametrize("size", SIZES)
def test_group_shaping_uses_group_means_and_the_global_variance(size):
    cfg, init, keys, fnp, npar = setup(size)
    scores = jnp.asarray(np.random.default_rng(1).normal(-8, 0.3, cfg.pop).astype(np.float32))
    shaped = np.asarray(EggRoll.convert_fitnesses(fnp, npar, scores))
    groups = np.asarray(scores).reshape(-1, cfg.group_size)
    want = (groups - groups.mean(1, keepdims=True)) / np.sqrt(np.asarray(scores).var() + 1e-5)
    # float32 means and variance against float64: 1e-5 relative of values of order 1
    np.testing.assert_allclose(shaped, want.ravel(), rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(shaped.reshape(-1, cfg.group_size).sum(1), 0, atol=1e-5)


@pytest.mark.parametrize("size", SIZES)
def test_one_update_moves_exactly_the_classes_it_should(size):
    tokens_seed = 9
    for freeze in (True, False):
        cfg, init, keys, fnp, npar = setup(size, freeze_nonlora=freeze, lr=0.5)
        tokens = random_tokens(cfg, cfg.pop, tokens_seed)
        scores = lm.population_scores(EggRoll, fnp, npar, init.params, keys, 0, tokens)
        update = make_update(EggRoll, fnp, init.es_map, cfg.pop)
        _, new = update(npar, init.params, keys, scores, jnp.int32(0))
        before, after = params_to_flat(init.params), params_to_flat(new)
        for leaf in lm_tree(cfg).leaves:
            moved = [not np.array_equal(b, a) for b, a in zip(before[leaf.path].reshape((-1,) + leaf.slice_shape),
                                                               after[leaf.path].reshape((-1,) + leaf.slice_shape))]
            should = leaf.cls in ("mm", "tmm") or (leaf.cls == "param" and not freeze)
            assert all(moved) if should else not any(moved), (leaf.path, freeze, moved)


# ----------------------------------------------------------------------------- the trainer and the CLI
def test_training_the_selftest_preset_reports_finite_numbers():
    pytest.importorskip("rollout.corpus")
    from jax_reference.lm.train import train_lm

    cfg = LM_PRESETS["selftest"].replace(epochs=4, eval_every=2)
    result = train_lm(cfg, seed=1, progress=False)
    assert [row["epoch"] for row in result.history] == list(range(4))
    assert all(math.isfinite(row["train_bpb"]) and row["tokens_per_s"] > 0 for row in result.history)
    assert [math.isnan(row["val_bpb"]) for row in result.history] == [True, False, True, False]
    assert result.val_bpb == result.history[-1]["val_bpb"] and math.isfinite(result.val_bpb)
    assert result.tokens == 4 * cfg.pop * cfg.seq_len
    assert jax.tree.structure(result.params) == jax.tree.structure(lm.init_lm(cfg, 1).params)


def code_of(argv) -> int:
    try:
        return cli.main(argv)
    except SystemExit as exit_:
        return int(exit_.code or 0)


@pytest.mark.parametrize("argv,message", BAD_LM_TRAINER_ARGV + [
    (["--task", "lm", "--corpus", "EMPTY"], "is empty"),
    (["--task", "lm", "--corpus", "SHORT"], "too short"),
    (["--task", "lm", "--max-steps", "10"], "does not apply"),
    (["--epochs", "3"], "does not apply to --task cartpole"),
])
def test_the_cli_refuses_bad_input_with_exit_2_before_any_work(argv, message, tmp_path, capsys, monkeypatch):
    monkeypatch.setattr("jax_reference.lm.train.train_lm", lambda *a, **k: pytest.fail("trained on bad input"))
    monkeypatch.setattr("jax_reference.train.train", lambda *a, **k: pytest.fail("trained on bad input"))
    files = {"EMPTY": tmp_path / "empty.txt", "SHORT": tmp_path / "short.txt"}
    files["EMPTY"].write_bytes(b"")
    files["SHORT"].write_bytes(b"a few bytes")
    argv = [str(files[a]) if a in files else a for a in argv]
    assert code_of(argv) == 2
    assert message in capsys.readouterr().err


def test_the_cli_trains_the_selftest_preset_and_exits_0(capsys):
    pytest.importorskip("rollout.corpus")
    assert code_of(["--task", "lm", "--preset", "selftest", "--epochs", "2", "--quiet"]) == 0
    out = capsys.readouterr().out.strip().splitlines()
    assert len(out) == 1 and out[0].startswith("validation ") and " bits/byte after 2 epochs" in out[0], out
    assert math.isfinite(float(out[0].split()[1]))


def test_progress_lines_and_time_left():
    """spec.lm_run: one line per epoch; time left from the epochs after the compiling epoch 0."""
    import io

    from spec.lm_run import LMProgress, lm_epoch_row, lm_progress_line

    stream = io.StringIO()
    show = LMProgress(stream, epochs=5)
    rows = [lm_epoch_row(0, 8.5, math.nan, 100, 2.0, 100, 2.0), lm_epoch_row(1, 8.0, 7.9, 200, 2.5, 100, 0.5),
            lm_epoch_row(2, 7.5, math.nan, 300, 3.0, 100, 0.5)]
    for row in rows:
        show.epoch(row)
    lines = stream.getvalue().splitlines()
    assert lines[0].endswith("left ?") and "val   -   bpb" in lines[0] and "50 tok/s" in lines[0]
    assert "val 7.900 bpb" in lines[1] and "200 tok/s" in lines[1] and lines[1].endswith("left 0:02")   # 0.5 s x 3
    assert lines[2].startswith("epoch     2/5  train 7.500 bpb") and lines[2].endswith("left 0:01")      # 0.5 s x 2
    assert lm_epoch_row(3, 7.0, 7.0, 400, 4.0)["tokens_per_s"] == 100          # no step timing: tokens / wall_s
    assert lm_progress_line(lm_epoch_row(3, 7.0, 7.0, 400, 4.0), 5).endswith("left 0:01")   # 4 s / 4 epochs x 1


@pytest.mark.parametrize("size", SIZES)
def test_each_slice_is_noised_and_updated_with_its_own_key(size):
    """Slice l of a stacked leaf: the forward's low-rank noise is lowrank_factors with key slice l (the noise the
    update credits), and the stacked gradient's slice l is leaf_grad of that slice alone with that key."""
    from jax_reference.models import MM_PARAM, PARAM
    from jax_reference.noiser import es_grads, leaf_grad, lowrank_factors, lowrank_sigma
    from jax_reference.population import population_iterinfos

    cfg, init, keys, fnp, npar = setup(size, freeze_nonlora=False)
    params, member = init.params, (jnp.int32(3), jnp.int32(5))
    tokens = random_tokens(cfg, 1, seed=4)[0]
    _, inter = lm.member_score(EggRoll, fnp, npar, params, keys, member, tokens, intermediates=True)
    for l in range(cfg.layers):
        s, W = inter[f"blocks.{l}.shift"], params["blocks"]["wz"][l]
        A, B = lowrank_factors(fnp, lowrank_sigma(npar, fnp), member, W, keys["blocks"]["wz"][l])
        want = np.asarray(s @ W.T + s @ B @ A.T)
        # the forward's product ran compiled inside the scan: 16 ulps of the entry's scale, as for scan vs loop
        assert np.max(np.abs(np.asarray(inter[f"blocks.{l}.wz"]) - want)) <= 2.0 ** -19 * np.max(np.abs(want))
        other = lowrank_factors(fnp, lowrank_sigma(npar, fnp), member, W, keys["blocks"]["wz"][(l + 1) % cfg.layers])
        assert not np.allclose(np.asarray(s @ B @ A.T), np.asarray(s @ other[1] @ other[0].T))

    fitnesses = jnp.asarray(np.random.default_rng(6).standard_normal(cfg.pop).astype(np.float32))
    iterinfos = population_iterinfos(3, cfg.pop)
    grads = jax.jit(lambda p, k: es_grads(fnp, npar, p, k, fitnesses, iterinfos, init.es_map))(params, keys)
    for name, es_class in (("up", MM_PARAM), ("shift", PARAM)):
        one_slice = jax.jit(lambda p, k: leaf_grad(fnp, npar["sigma"], p, k, fitnesses, iterinfos, es_class))
        for l in range(cfg.layers):
            alone = one_slice(params["blocks"][name][l], keys["blocks"][name][l])
            # the same ops on the same slice, once inside lax.scan and once alone: 1e-6 relative of the slice's scale
            got = np.asarray(grads["blocks"][name][l])
            assert np.max(np.abs(got - np.asarray(alone))) <= 1e-6 * np.max(np.abs(np.asarray(alone))), (name, l)
