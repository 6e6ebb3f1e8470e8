"""The LM's conformance vectors (parity.tree_vectors): a check replayed from a bundle reaches the live check's
verdicts and named knobs row by row, in both modes and through the tree protocol, runs where `import jax` fails, and
refuses a bundle it cannot use (exit 2, before any work, nothing written)."""
from __future__ import annotations

import os
import re
import shutil
from pathlib import Path

import pytest

from parity.tree import check as tree_check
from parity.__main__ import main
from parity.core.tape import Bundle, Recording, Replay, Store, write_bundle
from parity.tree.adapter import CheckedTreePort, PortSide
from parity.tree.vectors import RECORDED, config_record, open_bundle, replay_reference
from spec.tree_knobs import TreeKnobs
from tests import fresh_process
from tests.helpers import NO_JAX

ROOT = Path(__file__).resolve().parents[3]
SIZE, SEED = "selftest", 6
COMMITTED = ROOT / "vectors" / "lm-quick"
LIVE_METHODS = ("init", "draws", "dense_noise", "factors_abs_product", "shape", "grads", "product", "scores",
                "scores_dense", "update", "epoch_step")


@pytest.fixture(scope="module")
def bundle(tmp_path_factory) -> Path:
    """`python -m parity record --task lm` at the selftest size."""
    out = tmp_path_factory.mktemp("vectors") / "lm-selftest"
    assert main(["record", "--task", "lm", "--size", SIZE, "--seed", str(SEED), "--out", str(out), "--quiet"]) == 0
    return out


def test_record_refuses_a_size_the_lm_suite_does_not_have(tmp_path, capsys):
    assert main(["record", "--task", "lm", "--size", "full", "--out", str(tmp_path / "b")]) == 2
    assert "the LM suite's sizes: quick, selftest" in capsys.readouterr().err
    assert not (tmp_path / "b").exists()


def test_the_bundle_says_what_it_holds(bundle):
    m = open_bundle(bundle, None, None).manifest
    assert (m["task"], m["size"], m["seed"]) == ("lm", SIZE, SEED)
    assert m["config"] == config_record(tree_check.sizes()[SIZE]) and m["versions"]["jax"] != "not installed"
    assert {c["method"] for c in m["calls"]} == set(RECORDED)
    assert m["command"] == f"python -m parity record --task lm --size {SIZE} --seed {SEED} --out {bundle}"


@pytest.fixture(scope="module")
def live():
    """The live JAX reference, each answer kept by its inputs' bytes (the functions are deterministic), so the
    sides below share its compile time: every call is still JAX's."""
    from parity.tree import reference as tree_reference
    store = Store()
    return Replay(store, LIVE_METHODS, fallback=Recording(tree_reference, LIVE_METHODS, store))


def knobs_named(rows) -> set[str]:
    return {k for r in rows if r.verdict == "fail" for k in re.findall(r"knob `(\w+)`", r.cause)}


def outline(rows) -> list[tuple[str, str, str]]:
    return [(r.check, r.quantity, r.verdict) for r in rows]


def lm_adapter(knobs: TreeKnobs):
    from examples.lm_adapter import LMAdapter
    cfg = tree_check.sizes()[SIZE]
    return PortSide(CheckedTreePort(LMAdapter(cfg, knobs), cfg), cfg)


class NoUpdate:
    """examples.lm_adapter without `update` (trajectory through es_*): the updates check is skipped, so the seeded
    stream reaches the forward elsewhere than when recorded, and numpy answers the reference's forward."""

    def __init__(self, cfg):
        from examples.lm_adapter import LMAdapter
        self._port = LMAdapter(cfg)

    def __getattr__(self, name):
        if name == "update":
            raise AttributeError(name)
        return getattr(self._port, name)


# (label, knobs of the torch side or a PortSide factory, the knobs the verdict must name)
SIDES = [
    ("torch faithful", TreeKnobs(), set()),
    ("torch stack_keys=shared", TreeKnobs(stack_keys="shared"), {"stack_keys"}),
    ("torch rng=torch", TreeKnobs(rng="torch"), set()),
    ("torch rng=torch frozen_leaves=perturbed", TreeKnobs(rng="torch", frozen_leaves="perturbed"), {"frozen_leaves"}),
    ("examples.lm_adapter", lambda: lm_adapter(TreeKnobs()), set()),
    ("examples.lm_adapter on torch's generator", lambda: lm_adapter(TreeKnobs(rng="torch")), set()),
    ("a port without update", lambda: PortSide(CheckedTreePort(NoUpdate(tree_check.sizes()[SIZE]),
                                                               tree_check.sizes()[SIZE]), tree_check.sizes()[SIZE]),
     set()),
]


@pytest.mark.parametrize("label, side, named", SIDES, ids=[s[0] for s in SIDES])
def test_against_the_bundle_reaches_the_live_checks_verdicts_and_knobs(bundle, live, label, side, named):
    cfg = tree_check.sizes()[SIZE]
    knobs = side if isinstance(side, TreeKnobs) else TreeKnobs()
    make = (lambda: None) if isinstance(side, TreeKnobs) else side
    quiet = lambda line: None                                               # noqa: E731
    live_rows = tree_check.run(cfg, knobs, SEED, quiet, side=make(), reference=live)
    replay = replay_reference(open_bundle(bundle, SIZE, SEED))
    rows = tree_check.run(cfg, knobs, SEED, quiet, side=make(), reference=replay)
    assert outline(rows) == outline(live_rows)
    assert knobs_named(rows) == knobs_named(live_rows) == named
    assert any(r.verdict == "fail" for r in rows) == bool(named)
    assert not any("the bundle cannot answer" in r.cause for r in rows)
    if label == "a port without update":
        assert "scores" in replay.misses and {r.check for r in rows if r.verdict == "skip"} == {"updates"}


def test_a_check_the_bundle_cannot_answer_is_skipped_with_the_reason(bundle):
    whole = open_bundle(bundle, SIZE, SEED)
    store = Store()
    for key, out in whole.store.outputs.items():
        if whole.store.methods[key] != "draws":
            store.put(whole.store.methods[key], key, out)
    rows = tree_check.run(tree_check.sizes()[SIZE], TreeKnobs(), SEED, lambda line: None,
                          reference=replay_reference(Bundle(whole.folder, whole.manifest, store)))
    noise = [r for r in rows if r.check == "noise"]
    assert [r.verdict for r in noise] == ["skip"]
    assert "`draws`" in noise[0].cause and "no numpy reference" in noise[0].cause
    assert {r.check for r in rows if r.verdict == "pass"} >= {"init", "products", "fitness"}


def test_the_cli_checks_against_a_bundle(bundle, tmp_path, capsys):
    out = tmp_path / "faithful"
    assert main(["check", "--task", "lm", "--against", str(bundle), "--out", str(out), "--quiet"]) == 0
    summary = (out / "summary.md").read_text()
    assert f"- reference: the bundle {bundle}" in summary and f"- size: {SIZE}" in summary
    assert f"- seed: {SEED}" in summary and "PASS" in summary
    assert main(["check", "--task", "lm", "--against", str(bundle), "--torch", "stack_keys=shared", "--out",
                 str(tmp_path / "drifted"), "--quiet"]) == 1
    assert "knob `stack_keys`" in capsys.readouterr().out
    assert main(["check", "--task", "lm", "--against", str(bundle), "--port", "examples.lm_adapter:TorchRngLMAdapter",
                 "--out", str(tmp_path / "port"), "--quiet"]) == 0


@pytest.mark.parametrize("extra, code, says", [([], 0, "PASS"),
                                               (["--torch", "rng=torch", "--torch", "embedding=lowrank"], 1,
                                                "knob `embedding`")])
def test_against_runs_where_import_jax_fails(bundle, tmp_path, extra, code, says):
    # A process of its own, forked from tests/fresh_process's server (torch loaded, jax not): torch's import saved.
    done = fresh_process.run(["-c", NO_JAX, "check", "--task", "lm", "--against", str(bundle), "--out",
                              str(tmp_path / "out"), "--quiet", *extra], ROOT, dict(os.environ), timeout=300)
    assert done.returncode == code, done.stderr
    assert says in done.stdout


def _damaged(bundle: Path, tmp: Path) -> Path:
    copy = tmp / "damaged"
    shutil.copytree(bundle, copy)
    data = bytearray((copy / "arrays.npz").read_bytes())
    data[len(data) // 2] ^= 0xFF
    (copy / "arrays.npz").write_bytes(bytes(data))
    return copy


def _cartpole(bundle: Path, tmp: Path) -> Path:
    return write_bundle(tmp / "cartpole", Store(), {"task": "cartpole", "size": "quick", "seed": 0})


def _stale(bundle: Path, tmp: Path) -> Path:
    """The bundle as if recorded when the size had another d_model: a whole bundle (its hash holds)."""
    whole = open_bundle(bundle, None, None)
    manifest = {k: v for k, v in whole.manifest.items() if k not in ("format_version", "calls", "arrays_bytes",
                                                                      "content_hash")}
    manifest["config"] = {**manifest["config"], "d_model": manifest["config"]["d_model"] + 1}
    return write_bundle(tmp / "stale", whole.store, manifest)


@pytest.mark.parametrize("make, extra, says", [
    (_cartpole, [], "holds task 'cartpole', not lm"),
    (lambda b, t: b, ["--size", "quick"], f"holds size '{SIZE}', not 'quick'"),
    (lambda b, t: b, ["--seed", str(SEED + 1)], f"holds seed {SEED}, not {SEED + 1}"),
    (_damaged, [], "the content hash does not match"),
    (lambda b, t: t / "nowhere", [], "no such folder"),
    (_stale, [], "which this version's LM sizes"),
], ids=["other task", "other size", "other seed", "failed hash", "missing", "stale configuration"])
def test_a_bundle_that_cannot_be_used_exits_2_before_any_work(bundle, tmp_path, capsys, make, extra, says):
    out = tmp_path / "out"
    assert main(["check", "--task", "lm", "--against", str(make(bundle, tmp_path)), "--out", str(out), *extra]) == 2
    err = capsys.readouterr().err
    assert says in err and "python -m parity record" in err, err
    assert not out.exists()


from parity.tree.dist import INVISIBLE                                 # noqa: E402
from spec.tree_knobs import TREE_CHOICES                               # noqa: E402

COMMITTED_SIDES = [(rng, None) for rng in ("jax", "torch")] + [
    (rng, (k, v[1])) for rng in ("jax", "torch") for k, v in TREE_CHOICES.items()
    if k != "rng" and not (rng == "torch" and k in INVISIBLE)]


@pytest.mark.skipif(not COMMITTED.is_dir(), reason="vectors/lm-quick is not in this checkout")
@pytest.mark.parametrize("rng, drift", COMMITTED_SIDES,
                         ids=[f"rng={r} " + (f"{d[0]}={d[1]}" if d else "faithful") for r, d in COMMITTED_SIDES])
def test_the_committed_quick_bundle_names_each_drift_the_live_check_names(rng, drift):
    """From vectors/lm-quick alone, each tree knob is caught and named first, and no other knob is named, as the
    live check does (tests/parity/tree/test_lm.py): draw by draw (rng=jax) and in distribution (rng=torch, the knobs
    that only relabel i.i.d. draws left out, as there)."""
    bundle = open_bundle(COMMITTED, None, None)
    assert (bundle.manifest["task"], bundle.manifest["size"], bundle.manifest["seed"]) == ("lm", "quick", 0)
    knobs = TreeKnobs(rng=rng).replace(**dict([drift] if drift else []))
    replay = replay_reference(bundle)
    rows = tree_check.run(tree_check.sizes()["quick"], knobs, 0, lambda line: None, reference=replay)
    causes = [r.cause for r in rows if r.verdict == "fail"]
    if drift is None:
        assert causes == [] and not any(r.verdict == "skip" and "bundle" in r.cause for r in rows)
        if rng == "jax":        # every reference call the check makes is in the bundle: it is not stale
            assert replay.misses == []
    else:
        assert causes and f"(knob `{drift[0]}`)" in causes[0], causes
        assert knobs_named(rows) == {drift[0]}


@pytest.mark.skipif(not COMMITTED.is_dir(), reason="vectors/lm-quick is not in this checkout")
def test_a_failed_check_against_the_bundle_writes_its_repro(tmp_path):
    """A repro (parity.core.repro) from a replayed reference: its script, run alone, still fails on the drifted side."""
    out = tmp_path / "report"
    assert main(["check", "--task", "lm", "--against", str(COMMITTED), "--torch", "group_fitness=group_var",
                 "--out", str(out), "--quiet"]) == 1
    script = out / "repro" / "fitness" / "repro.py"
    assert script.is_file() and f"`{script.parent}/`" in (out / "summary.md").read_text()
    done = fresh_process.run([str(script)], tmp_path, {"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"},
                             timeout=120)          # its own process, forked with torch loaded (tests/fresh_process)
    assert done.returncode == 1 and "FAIL: the port still differs" in done.stdout, done.stdout + done.stderr


def test_the_port_authors_assert_takes_the_lm_bundle(bundle):
    """parity.testing.assert_port_parity(task="lm", against=BUNDLE): the faithful example passes, a drifted one fails
    naming its knob, and a bundle of another size is refused before any work."""
    from examples.lm_adapter import LMAdapter
    from parity.core.port import UsageError
    from parity.testing import assert_port_parity
    outcomes = assert_port_parity(LMAdapter, task="lm", size=SIZE, against=bundle, seed=SEED)
    assert {o.verdict for o in outcomes} <= {"pass", "skip"} and any(o.verdict == "pass" for o in outcomes)
    drifted = lambda cfg: LMAdapter(cfg, TreeKnobs(group_fitness="group_var"))     # noqa: E731
    with pytest.raises(AssertionError, match="group_fitness"):
        assert_port_parity(drifted, task="lm", size=SIZE, against=bundle, seed=SEED)
    assert_port_parity(drifted, task="lm", size=SIZE, against=bundle, seed=SEED, expect={"group_fitness": "group_var"})
    with pytest.raises(UsageError, match="not this run's configuration"):
        assert_port_parity(LMAdapter, task="lm", size="quick", against=bundle, seed=SEED)
