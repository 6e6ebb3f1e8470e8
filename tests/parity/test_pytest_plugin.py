"""The pytest plugin for port authors (parity/pytest_plugin.py) and parity.testing, run as a port author runs them.

Each scenario writes a port author's test file and runs pytest on it (pytester: its own session, in this process;
in a fresh one where the process is the point: the entry point, a blocked jax, the plugin's imports), at the
`selftest` size: a faithful port passes every check, a drifted one fails the checks that see it with the knob named,
a drift declared with `expect=` passes (and fails once the port stops having it), bad `expect=` stops the
collection before any check runs, and collection needs no jax.
"""
from __future__ import annotations

import subprocess
import sys
import textwrap
import tomllib
from pathlib import Path

import pytest
from _pytest.pytester import SysModulesSnapshot

from parity.core.port import UsageError
from parity.testing import (EXPECT_ITEM, Outcome, ParityRequest, SuiteCache, SuiteCrash,
                            assert_port_parity, check_failure, checked_expect, expect_failure, outcomes_of_rows,
                            parity_request)
from parity.tree.check import Row, forward_after_noise
from spec.knobs import CHOICES, NUMERIC

# pytester runs the port authors' files; the plugin itself registers the marker for the example imported below.
pytest_plugins = ["pytester", "parity.pytest_plugin"]
ROOT = Path(__file__).resolve().parents[2]
PLUGIN = "parity.pytest_plugin"
CARTPOLE_CHECKS = ("fitness", "products", "actions", "noise", "gradients", "updates", "init", "trajectory")


def plugin_args() -> tuple[str, ...]:
    """The plugin, named as its entry point names it: a no-op where the install already loads it, and loaded here,
    where the checkout is on the path but its entry point need not be installed."""
    return ("-p", PLUGIN)


def keep_libraries(pytester: pytest.Pytester, monkeypatch) -> None:
    """Let pytester drop only the scenario's own modules (files under pytester.path) after an in-process run and at
    the test's end, where it drops every module first imported meanwhile: torch and jaxlib cannot be imported twice
    in one process, nor jax_reference define its jax config options twice; kept, the suite's jitted functions and
    compiled programs also serve every later run of the process. (Private to pytester, 9.x: the snapshot it restores
    at the end and the one it takes around each run.)"""
    def keep(name: str) -> bool:
        file = getattr(sys.modules.get(name), "__file__", None)
        return file is None or not Path(file).is_relative_to(pytester.path)

    monkeypatch.setattr(pytester, "_sys_modules_snapshot", SysModulesSnapshot(preserve=keep))
    monkeypatch.setattr(pytester, "_Pytester__take_sys_modules_snapshot", lambda: SysModulesSnapshot(preserve=keep))


def run_file(pytester: pytest.Pytester, monkeypatch, source: str, *args: str) -> pytest.RunResult:
    """A port author's test file run by pytest in this process, with this checkout on the path.

    In-process (pytester.runpytest_inprocess): the scenarios are about the plugin's items and verdicts, not the
    process; a fresh process paid ~4 s of imports (torch, jax, scipy) and re-traced every JAX program of the suite
    each run. Each run is still its own pytest session (its own config, plugin registration, SuiteCache), and its
    test_port module is dropped after it (keep_libraries), so a scenario's file never leaks to the next. The
    process-level properties (the entry point, a blocked jax, the plugin's imports) keep their subprocesses."""
    keep_libraries(pytester, monkeypatch)
    monkeypatch.syspath_prepend(str(ROOT))
    pytester.makepyfile(test_port=textwrap.dedent(source))
    return pytester.runpytest_inprocess(*plugin_args(), "-p", "no:cacheprovider", "-rA", *args)


def outcomes_by_id(result: pytest.RunResult) -> dict[str, str]:
    """{test id: PASSED | FAILED | ERROR} from -rA's short summary (its SKIPPED lines give no id)."""
    found = {}
    for line in result.outlines:
        parts = line.split(" ")
        if len(parts) > 1 and parts[0] in ("PASSED", "FAILED", "SKIPPED", "ERROR") and "::" in parts[1]:
            found[parts[1].split("::", 1)[1]] = parts[0]
    return found


def undeclared_and_declared(setup: str, marker: str, expect: str) -> str:
    """A port author's file: after `setup` (imports, the drifted port), test_undeclared marked
    eggroll_parity(marker) and test_declared marked eggroll_parity(marker, expect=expect)."""
    return "import pytest\n" + textwrap.dedent(setup) + textwrap.dedent(f"""
        @pytest.mark.eggroll_parity({marker})
        def test_undeclared(eggroll_parity):
            eggroll_parity.check()

        @pytest.mark.eggroll_parity({marker}, expect={expect})
        def test_declared(eggroll_parity):
            eggroll_parity.check()
    """)


# ----------------------------------------------------------------------------- the plugin, run as a port author runs it
def test_the_entry_point_names_the_plugin_module():
    """pyproject.toml registers the plugin under pytest11, so installing the project enables it."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert project["entry-points"]["pytest11"] == {PLUGIN: PLUGIN}


def test_the_installed_entry_point_and_an_explicit_p_load_the_plugin_once(pytester, monkeypatch):
    """With the entry point installed (a distribution's metadata carrying pyproject's pytest11 table) pytest loads
    the plugin by itself, and `-p parity.pytest_plugin` on top of it is no second registration."""
    table = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["entry-points"]["pytest11"]
    dist = pytester.mkdir("site") / "eggroll_parity_fake-0.1.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: eggroll-parity-fake\nVersion: 0.1.0\n")
    (dist / "entry_points.txt").write_text("[pytest11]\n" + "".join(f"{k} = {v}\n" for k, v in table.items()))
    monkeypatch.setenv("PYTHONPATH", f"{dist.parent}:{ROOT}")
    pytester.makepyfile(test_port="""
        import pytest
        from examples.minimal_adapter import adapter

        @pytest.mark.eggroll_parity(adapter)
        def test_port(eggroll_parity):
            eggroll_parity.check()
    """)
    for args in ((), plugin_args()):
        result = pytester.runpytest_subprocess(*args, "-p", "no:cacheprovider", "--collect-only", "-q")
        assert result.ret == 0, result.stdout.str() + result.stderr.str()
        result.stdout.fnmatch_lines([f"test_port.py::test_port[[]{c}[]]" for c in CARTPOLE_CHECKS])


def test_the_worked_example_passes_one_item_per_check(pytester, monkeypatch):
    """examples/test_minimal_port.py: the faithful numpy port passes or skips (methods it lacks) each check, and the
    halves copy passes with its drift declared; each check is its own item."""
    result = run_file(pytester, monkeypatch, (ROOT / "examples" / "test_minimal_port.py").read_text(), "-v")
    assert result.ret == 0, result.stdout.str()
    for check in CARTPOLE_CHECKS:
        result.stdout.fnmatch_lines([f"*test_minimal_port[[]{check}[]] *", f"*test_halves_port[[]{check}[]] *"])
    result.stdout.fnmatch_lines(["*test_halves_port[[]expect[]] PASSED*"])
    result.assert_outcomes(passed=4 + 4 + 1, skipped=4 + 4)   # actions, updates, init, trajectory: no such methods


TORCH_FILE = """
    import pytest
    from parity.mlp.sizes import SELFTEST
    from parity.mlp.torch_side import TorchPort
    from spec.knobs import Knobs

    halves = TorchPort(SELFTEST.cfg, Knobs(antithetic="halves"))

    @pytest.mark.eggroll_parity(halves)
    def test_undeclared(eggroll_parity):
        eggroll_parity.check()

    @pytest.mark.eggroll_parity(halves, expect={"antithetic": "halves"})
    def test_declared(eggroll_parity):
        eggroll_parity.check()

    @pytest.mark.eggroll_parity(halves, expect={"antithetic": "halves", "fitness": "std"})
    def test_declared_one_too_many(eggroll_parity):
        eggroll_parity.check()

    def test_one_suite_run_served_them_all(eggroll_parity_runs):
        assert len(eggroll_parity_runs) == 1
"""


def test_a_drift_fails_its_checks_unless_declared_and_a_declared_drift_must_be_seen(pytester, monkeypatch):
    """torch_impl with antithetic=halves: undeclared, the noise and trajectory items fail with the verdict, observed,
    allowed and the knob; declared, every item passes; declaring one the port lacks fails the `expect` item; the
    three tests share one suite run."""
    result = run_file(pytester, monkeypatch, TORCH_FILE)
    seen = outcomes_by_id(result)
    failed = sorted(k for k, v in seen.items() if v == "FAILED")
    assert failed == ["test_declared_one_too_many[expect]", "test_undeclared[noise]", "test_undeclared[trajectory]"], \
        result.stdout.str()
    for check in CARTPOLE_CHECKS:
        assert seen[f"test_declared[{check}]"] == "PASSED"
    assert seen[f"test_declared[{EXPECT_ITEM}]"] == "PASSED"
    assert seen["test_one_suite_run_served_them_all"] == "PASSED"
    out = result.stdout.str()
    result.stdout.fnmatch_lines(["*check `noise` fail", "  observed: *", "  allowed:  *",
                                 "  cause:    antithetic pairing layout differs (knob `antithetic`)*",
                                 "  not expected: knob `antithetic`*"])
    assert "fitness=std named by no check" in out
    assert result.ret == 1


def test_a_declared_drift_on_the_lm_task_passes_and_the_undeclared_one_fails(pytester, monkeypatch):
    """task="lm" through the tree protocol (examples.lm_adapter) with stack_keys=shared: the noise and forward items
    name the knob (the forward restating the noise's cause); declared, the run passes."""
    result = run_file(pytester, monkeypatch, undeclared_and_declared("""
        from examples.lm_adapter import LMAdapter
        from spec.tree_knobs import TreeKnobs

        def shared_keys(cfg):
            return LMAdapter(cfg, TreeKnobs(stack_keys="shared"))
    """, 'shared_keys, task="lm"', '{"stack_keys": "shared"}'))
    seen = outcomes_by_id(result)
    assert sorted(k for k, v in seen.items() if v == "FAILED") == ["test_undeclared[forward]",
                                                                    "test_undeclared[noise]"], result.stdout.str()
    assert not any(v == "FAILED" for k, v in seen.items() if k.startswith("test_declared")), result.stdout.str()
    assert seen["test_declared[expect]"] == "PASSED"
    # Counted in the FAILURES section only: pytest's short summary repeats each message whole where it does not
    # truncate it (with CI set in the environment, as on the CI machine), which would double the count.
    failures = result.stdout.str().split("short test summary info")[0]
    assert failures.count("not expected: knob `stack_keys`") == 2, failures


def test_a_declared_tree_gets_one_item_per_check_and_its_declared_drift_passes(pytester, monkeypatch):
    """task="tree" (the port's own declared tree, examples.gpt_adapter) with a fitness shaped by the plain standard
    deviation: the fitness and trajectory items name knob `fitness`, the forward item (the model against its plain
    forward) passes; declared with expect=, every item passes."""
    result = run_file(pytester, monkeypatch, undeclared_and_declared("""
        from tests.ports.gpt_ports import FitnessStdSmall
    """, 'FitnessStdSmall, task="tree"', '{"fitness": "std"}'),
                      "-vv")                  # -vv: the skip's reason is not cut to the terminal's width
    seen = outcomes_by_id(result)
    assert sorted(k for k, v in seen.items() if v == "FAILED") == ["test_undeclared[fitness]",
                                                                    "test_undeclared[trajectory]"], result.stdout.str()
    assert seen["test_declared[expect]"] == "PASSED" and seen["test_declared[noise]"] == "PASSED"
    assert seen["test_undeclared[forward]"] == "PASSED", result.stdout.str()


BAD_MARKERS = {   # marker arguments -> what the refusal says would be right
    'adapter, expect={"antithetics": "halves"}':
        "unknown knob 'antithetics' for task 'cartpole'; known knobs: " + ", ".join([*CHOICES, *NUMERIC]),
    'adapter, expect={"antithetic": "reversed"}': "its drifts: 'halves', 'off'",
    'adapter, task="lm", expect={"antithetic": "halves"}': "known knobs: rng, stack_keys",
    'adapter, size="huge"': "unknown size 'huge' for task 'cartpole'; known sizes: quick, full, selftest",
    'adapter, expcet={}': "unexpected keyword argument 'expcet'",
}


def test_bad_markers_stop_the_run_before_any_check_each_saying_what_would_be_right(pytester, monkeypatch):
    """Every bad marker of the session (and a fixture without one) is reported at once, as pytest's usage error."""
    tests = "".join(f"""
        @pytest.mark.eggroll_parity({marker})
        def test_port_{i}(eggroll_parity):
            raise AssertionError("a check ran")
    """ for i, marker in enumerate(BAD_MARKERS))
    result = run_file(pytester, monkeypatch, """
        import pytest
        from examples.minimal_adapter import adapter

        def test_unmarked(eggroll_parity):
            raise AssertionError("a check ran")
    """ + tests)
    err = result.stderr.str()
    assert result.ret == pytest.ExitCode.USAGE_ERROR, result.stdout.str() + err
    for i, says in enumerate(BAD_MARKERS.values()):
        assert f"test_port.py::test_port_{i}: @pytest.mark.eggroll_parity(...): " in err and says in err, (says, err)
    assert "test_port.py::test_unmarked: the eggroll_parity fixture needs the port: decorate the test with " \
           "@pytest.mark.eggroll_parity(adapter, " in err
    assert "a check ran" not in result.stdout.str() + err and "Traceback" not in err


def test_collection_needs_no_jax(pytester, monkeypatch):
    """A port author's CI without jax: with `import jax` failing, the plugin loads and collects every item."""
    blocker = pytester.mkdir("nojax") / "jax"
    blocker.mkdir()
    (blocker / "__init__.py").write_text("raise ImportError('jax is not installed here')\n")
    monkeypatch.setenv("PYTHONPATH", f"{blocker.parent}:{ROOT}")
    pytester.makepyfile(test_port="""
        import pytest
        from examples.minimal_adapter import adapter

        @pytest.mark.eggroll_parity(adapter, expect={"antithetic": "halves"})
        def test_port(eggroll_parity):
            eggroll_parity.check()

        def test_no_jax():
            import sys
            assert "jax" not in sys.modules
            with pytest.raises(ImportError):
                import jax
    """)
    collected = pytester.runpytest_subprocess(*plugin_args(), "-p", "no:cacheprovider", "--collect-only", "-q")
    assert collected.ret == 0, collected.stdout.str() + collected.stderr.str()
    collected.stdout.fnmatch_lines([f"test_port.py::test_port[[]{c}[]]" for c in (*CARTPOLE_CHECKS, EXPECT_ITEM)])
    ran = pytester.runpytest_subprocess(*plugin_args(), "-p", "no:cacheprovider", "-k", "no_jax")
    assert ran.ret == 0, ran.stdout.str()


def test_importing_the_plugin_imports_neither_jax_nor_torch():
    code = ("import sys, parity.pytest_plugin, parity.testing; "
            "sys.exit(sorted({'jax', 'torch'} & set(sys.modules)) or 0)")
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr


# ----------------------------------------------------------------------------- parity.testing, directly
def halves_adapter():
    from examples.test_minimal_port import HalvesAdapter
    return HalvesAdapter()


@pytest.mark.parametrize("size, seed", [("selftest", 3), ("quick", 4)])
def test_assert_port_parity_passes_a_faithful_port_and_returns_every_check(size, seed):
    from examples.minimal_adapter import adapter
    outcomes = assert_port_parity(adapter, size=size, seed=seed)
    assert tuple(o.name for o in outcomes) == CARTPOLE_CHECKS
    assert {o.verdict for o in outcomes} == {"pass", "skip"}


def test_assert_port_parity_names_an_undeclared_drift_and_accepts_it_declared():
    cache, port = SuiteCache(), halves_adapter()
    with pytest.raises(AssertionError, match=r"(?s)check `noise` fail.*allowed: .*knob `antithetic`"):
        assert_port_parity(port, seed=5, cache=cache)
    outcomes = assert_port_parity(port, seed=5, expect={"antithetic": "halves"}, cache=cache)
    assert [o.name for o in outcomes if o.verdict == "fail"] == ["noise"]
    with pytest.raises(AssertionError, match=r"expected drift\(s\) not seen: noise_reuse=1"):
        assert_port_parity(port, seed=5, expect={"antithetic": "halves", "noise_reuse": 1}, cache=cache)
    assert len(cache) == 1


@pytest.mark.parametrize("expect, says", [
    ({"antithetics": "halves"}, "unknown knob 'antithetics' for task 'cartpole'; known knobs: rng, antithetic,"),
    ({"antithetic": "reversed"}, "unknown value for knob 'antithetic'; its drifts: 'halves', 'off'"),
    ({"antithetic": "interleaved"}, "'interleaved' is the reference's own value, no drift"),
    ({"sigma_decay": 0.999}, "0.999 is the reference's own value"),
    ({"noise_reuse": 1.5}, "knob 'noise_reuse' takes an integer >= 0"),
    ({"noise_reuse": True}, "knob 'noise_reuse' takes an integer >= 0"),
    ({"lr_decay": 2.0}, "knob 'lr_decay' takes a multiplicative factor per epoch in (0, 1]"),
    ({"rng": "torch"}, "the suite never names rng=torch"),
    ({"compile": "on"}, "the suite never names compile=on"),
    (["antithetic"], "expect= takes a dict {knob: value}"),
])
def test_bad_expect_is_refused_before_any_work_with_what_would_be_right(expect, says):
    ran = []
    with pytest.raises(UsageError) as err:
        assert_port_parity(object(), expect=expect, cache=SuiteCache(lambda request: ran.append(request)))
    assert says in str(err.value)
    assert ran == []


def test_lm_expect_takes_the_tree_knobs():
    assert checked_expect("lm", {"stack_keys": "shared", "embedding": "lowrank"}) == (
        ("embedding", "lowrank"), ("stack_keys", "shared"))
    with pytest.raises(UsageError, match="unknown value for knob 'stack_keys'; its drifts: 'shared'"):
        checked_expect("lm", {"stack_keys": "splits"})
    with pytest.raises(UsageError, match="the suite never names rng=torch"):
        checked_expect("lm", {"rng": "torch"})
    assert checked_expect("cartpole", {"lr_decay": "0.9995", "noise_reuse": "3"}) == (
        ("lr_decay", 0.9995), ("noise_reuse", 3))


@pytest.mark.parametrize("kwargs, says", [
    ({"task": "int8"}, "unknown task 'int8'; known tasks: cartpole, lm"),
    ({"task": "lm", "size": "full"}, "unknown size 'full' for task 'lm'; known sizes: quick, selftest"),
    ({"seed": -1}, "seed must be an integer in [0, 4,294,967,295]"),
    ({"seed": 2.0}, "seed must be an int"),
    ({"against": "/no/such/bundle"}, "against='/no/such/bundle': no such bundle folder"),
])
def test_bad_requests_are_refused_with_what_would_be_right(kwargs, says):
    with pytest.raises(UsageError) as err:
        parity_request(object(), **kwargs)
    assert says in str(err.value)


def test_a_bundle_folder_is_kept_as_given(tmp_path):
    assert parity_request(object(), against=tmp_path).against == str(tmp_path)


# ----------------------------------------------------------------------------- judging, on made-up outcomes
def request_expecting(**expect) -> ParityRequest:
    return parity_request(object(), expect=expect)


@pytest.mark.parametrize("outcome, expect, fails", [
    (Outcome("noise", "pass", "x", "y"), {}, False),
    (Outcome("noise", "skip", "skipped: no es_*", "-"), {}, False),
    (Outcome("noise", "fail", "x", "y", (("antithetic", "pairs differ (knob `antithetic`)"),)), {}, True),
    (Outcome("noise", "fail", "x", "y", (("antithetic", "a"),)), {"antithetic": "halves"}, False),
    (Outcome("noise", "fail", "x", "y", (("antithetic", "a"), ("fitness", "b"))), {"antithetic": "halves"}, True),
    (Outcome("noise", "fail", "x", "y", (("antithetic", "a"), (None, "no knob"))), {"antithetic": "halves"}, True),
    (Outcome("noise", "fail", "x", "y", (("antithetic", "a"),), uncaused=1), {"antithetic": "halves"}, True),
    (Outcome("noise", "fail", "x", "y"), {"antithetic": "halves"}, True),
    (Outcome("noise", "error", "broke the protocol", "-"), {"antithetic": "halves"}, True),
])
def test_a_failing_check_passes_only_when_every_cause_names_an_expected_knob(outcome, expect, fails):
    assert (check_failure(outcome, request_expecting(**expect)) is not None) == fails


def test_an_expected_knob_no_check_names_fails_the_run_and_says_which_checks_did_not_judge():
    outcomes = (Outcome("noise", "fail", "x", "y", (("antithetic", "a"),)), Outcome("updates", "skip", "s", "-"))
    assert expect_failure(outcomes, request_expecting(antithetic="halves")) is None
    said = expect_failure(outcomes, request_expecting(antithetic="halves", lr_decay=0.9))
    assert "lr_decay=0.9 named by no check" in said and "updates" in said


def test_the_lm_rows_become_one_outcome_per_check_with_every_knob_a_cause_names():
    rows = [Row("noise", "a", 0.5, "<= 0", "fail", "keys differ (knob `stack_keys`)"),
            Row("noise", "b", 0.0, "<= 0", "pass"),
            Row("forward", "noise on", 9.0, "<= 64", "fail", "departs; follows: (knob `stack_keys`) (knob `leaf_order`)"),
            Row("fitness", "c", 2.0, "<= 1", "fail", ""),
            Row("trajectory", "-", float("nan"), "-", "skip", "lockstep needs the same noise")]
    noise, forward, fitness, trajectory, init = outcomes_of_rows(rows, ("noise", "forward", "fitness", "trajectory",
                                                                        "init"))
    assert (noise.verdict, noise.knobs, noise.observed, noise.allowed) == ("fail", ("stack_keys",), "a = 0.5", "<= 0")
    assert forward.knobs == ("stack_keys", "leaf_order")
    assert (fitness.verdict, fitness.causes, fitness.uncaused) == ("fail", (), 1)
    assert (trajectory.verdict, trajectory.observed) == ("skip", "skipped: lockstep needs the same noise")
    assert init.verdict == "error"
    with pytest.raises(SuiteCrash, match="CHECKS lacks"):
        outcomes_of_rows(rows, ("noise",))


def test_the_lm_forward_restates_the_noise_s_cause_only_when_it_departs_with_noise_alone():
    off = Row("forward", "noise off: max ulps", 3.0, "<= 64", "pass")
    on = Row("forward", "noise on (each side its own): max ulps", 9e5, "<= 64", "fail", "departs at blocks.0.wz")
    noise = ["keys of stacked slices differs (knob `stack_keys`): ..."]
    restated = forward_after_noise([off, on], noise)
    assert restated[0] == off and restated[1].cause == f"departs at blocks.0.wz; follows from the noise check: {noise[0]}"
    broken_off = off._replace(verdict="fail", cause="departs")
    assert forward_after_noise([broken_off, on], noise) == [broken_off, on]
    assert forward_after_noise([off, on], []) == [off, on]


def test_the_cache_runs_each_port_once_and_raises_a_failed_start_afresh_to_every_test():
    calls = []

    def runner(request):
        calls.append(request.key)
        if request.seed == 1:
            raise UsageError("the port lacks noise")
        if request.seed == 2:
            raise KeyError("suite bug")
        return (Outcome("noise", "pass", "", ""),)

    cache, port = SuiteCache(runner), object()
    first = cache.outcomes(parity_request(port))
    assert cache.outcomes(parity_request(port, expect={"antithetic": "halves"})) is first   # expect: same run
    cache.outcomes(parity_request(object()))                                                 # another port: a run
    for _ in range(2):
        with pytest.raises(UsageError, match="the port lacks noise"):
            cache.outcomes(parity_request(port, seed=1))
        with pytest.raises(SuiteCrash, match="a bug of the harness, not a verdict"):
            cache.outcomes(parity_request(port, seed=2))
    assert len(calls) == len(cache) == 4
