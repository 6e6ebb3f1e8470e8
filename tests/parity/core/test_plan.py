"""parity.core.plan: a suite's checks as records, run in order (skipped where a need is unmet, timed), and every
family's plan listing its checks under the names its reports and the pytest plugin use."""
from parity.core.plan import Check, Ran, run_plan


def test_run_plan_runs_in_order_skips_an_unmet_need_and_times_each():
    seen: list[str] = []
    state = {"parted": True}
    plan = (Check("first", (), lambda s: seen.append("first") or 1),
            Check("second", ("first ok",), lambda s: seen.append("second") or 2),
            Check("third", ("no need unmet",), lambda s: seen.append("third") or 3))
    unmet = lambda need, s: "the first parted" if need == "first ok" and s["parted"] else ""   # noqa: E731
    started: list[str] = []
    ran = list(run_plan(plan, state, unmet, lambda name, why: f"skip {name}: {why}", start=started.append))
    assert [r.result for r in ran] == [1, "skip second: the first parted", 3]
    assert seen == ["first", "third"] and started == ["first", "second", "third"]
    assert all(isinstance(r, Ran) and r.seconds >= 0 for r in ran)


def test_run_plan_yields_each_check_before_the_next_runs():
    """A check reads what the caller stored of the one before (CartPole's causes_of): the runner is lazy."""
    results: dict[str, int] = {}
    plan = (Check("a", (), lambda s: 1), Check("b", (), lambda s: s["a"] + 1))
    for ran in run_plan(plan, results):
        results[ran.name] = ran.result
    assert results == {"a": 1, "b": 2}


def test_an_attempt_turns_what_it_knows_into_a_result():
    def boom(state):
        raise KeyError("x")

    def attempt(check, state):
        try:
            return check.run(state)
        except KeyError:
            return "caught"

    assert [r.result for r in run_plan((Check("boom", (), boom),), None, attempt=attempt)] == ["caught"]


def test_every_family_lists_its_checks_by_the_names_its_reports_use():
    from parity.int8 import cli as int8_cli
    from parity.mlp import suite
    from parity.tree import check as tree_check

    assert tuple(c.name for c in tree_check.LM_PLAN) == tree_check.CHECKS
    assert tuple(c.name for c in tree_check.TREE_PLAN) == tree_check.CHECKS
    assert suite.CHECKS == ("fitness", "products", "actions", "noise", "gradients", "updates", "init", "trajectory")
    assert tuple(c.name for c in suite.PLAN) == suite.CHECKS
    assert tuple(c.name for c in int8_cli.SIDES) == ("reference", "torch", "C")
    for plan in (tree_check.LM_PLAN, tree_check.TREE_PLAN, suite.PLAN, int8_cli.SIDES):
        for check in plan:
            assert isinstance(check, Check) and check.run.__name__ != "<lambda>", check
    # --task tree's first check is a named function that says what it checks
    assert tree_check.TREE_PLAN[0].run is tree_check.init_on_declared_laws
    assert tree_check.init_on_declared_laws.__doc__


def test_the_lockstep_is_skipped_saying_which_earlier_check_parted():
    from parity.tree.check import TreeState, unmet

    class Side:
        def has(self, method):
            return method != "es"

    state = TreeState(None, Side(), None, 0, None, True)
    assert unmet("noise", state) == "" and unmet("forward", state) == "" and unmet("update", state) == ""
    assert unmet("es", state) == "the port has no es_init/es_ask/es_tell/es_params"
    state.parted = {"b", "a"}
    assert unmet("noise", state) == "lockstep needs the same noise and forward: the noise of a, b already differs"
    state.forward_failed = True
    assert unmet("forward", state) == "lockstep needs the same noise and forward: the forward already departs"
