"""The pytest plugin for port authors (a pytest11 entry point named by this module, so installing the project enables
it): every check of the parity suite as its own test item, one suite run per port shared by all of them.

    import pytest
    from mypkg.parity_adapter import adapter

    @pytest.mark.eggroll_parity(adapter, expect={"antithetic": "halves"})
    def test_parity(eggroll_parity):
        eggroll_parity.check()

The marker takes parity.testing.assert_port_parity's arguments (adapter, task="cartpole", size="selftest",
against=None, expect={}, seed=0); the test is parametrized over the task's checks (ids `fitness`, `noise`, ...,
and `expect` when drifts are declared). Bad marker arguments stop the collection with what would be right, before
any check runs. Importing this module imports neither jax nor torch: the suite loads when the first item runs.
"""
from __future__ import annotations

from dataclasses import dataclass

import pytest

from parity.core.port import UsageError
from parity.testing import (EXPECT_ITEM, ParityRequest, SuiteCache, check_failure, expect_failure, parity_request,
                            warn_about)

MARKER = "eggroll_parity"
SIGNATURE = "adapter, task='cartpole', size='selftest', against=None, expect={}, seed=0"
BAD_MARKERS = pytest.StashKey[list]()      # what was wrong with each test's marker, said once collection ends


def pytest_configure(config: pytest.Config) -> None:
    config.stash[BAD_MARKERS] = []
    config.addinivalue_line("markers", f"{MARKER}({SIGNATURE}): check a port of EGGROLL against the reference, one "
                                       "test item per check (the test takes the eggroll_parity fixture)")


@dataclass(frozen=True)
class _Item:
    """The parameter of one item: the validated request and the check (or `expect`) it judges."""

    request: ParityRequest
    name: str


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """Parametrize a test taking `eggroll_parity` over the checks of its marker's task; bad input is kept for
    pytest_collection_modifyitems (raised here, pytest would report it as a module's collection error)."""
    if MARKER not in metafunc.fixturenames:
        return
    where = metafunc.definition.nodeid
    marker = metafunc.definition.get_closest_marker(MARKER)
    if marker is None:
        metafunc.config.stash[BAD_MARKERS].append(f"{where}: the eggroll_parity fixture needs the port: decorate the "
                                                  f"test with @pytest.mark.{MARKER}({SIGNATURE})")
        return
    try:
        request = parity_request(*marker.args, **marker.kwargs)
    except (UsageError, TypeError) as err:       # TypeError: arguments the signature does not take
        metafunc.config.stash[BAD_MARKERS].append(f"{where}: @pytest.mark.{MARKER}(...): {err}")
        return
    items = [_Item(request, name) for name in request.item_names]
    metafunc.parametrize(MARKER, items, ids=[item.name for item in items], indirect=True)


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config) -> None:
    """Stop before any test runs when a marker was wrong: pytest's usage error (exit 4), saying what would be right."""
    if config.stash[BAD_MARKERS]:
        raise pytest.UsageError("\n".join(config.stash[BAD_MARKERS]))


@dataclass(frozen=True)
class ParityCheck:
    """What the `eggroll_parity` fixture gives a test: one check of one port; `check()` judges it."""

    request: ParityRequest
    name: str
    runs: SuiteCache

    def check(self) -> None:
        """Pass, skip (with the suite's reason) or fail with the verdict, observed and allowed values and the cause."""
        try:
            outcomes = self.runs.outcomes(self.request)
        except UsageError as err:
            pytest.fail(f"{self.request.label} cannot be checked: {err}", pytrace=False)
        if self.name == EXPECT_ITEM:
            failure = expect_failure(outcomes, self.request)
        else:
            outcome = next(o for o in outcomes if o.name == self.name)
            warn_about(outcome, self.request)
            if outcome.verdict == "skip":
                pytest.skip(f"{self.name} {outcome.observed}")
            failure = check_failure(outcome, self.request)
        if failure:
            pytest.fail(failure, pytrace=False)


@pytest.fixture(scope="session")
def eggroll_parity_runs() -> SuiteCache:
    """The session's suite runs, one per port (task, size, bundle, seed), shared by every item that checks it."""
    return SuiteCache()


@pytest.fixture
def eggroll_parity(request: pytest.FixtureRequest, eggroll_parity_runs: SuiteCache) -> ParityCheck:
    """One check of the port named by the test's @pytest.mark.eggroll_parity marker."""
    item: _Item = request.param
    return ParityCheck(item.request, item.name, eggroll_parity_runs)
