"""Whether a port's package is installed, for the adapter and survey tests' skip marks.

Without the package a test is skipped, saying which (`make ports-install` or `make ports` installs the pinned ports
extra). With EGGROLL_REQUIRE_PORTS=1 (what .ci/run sets after installing them) nothing is skipped for lack of a
package: the test runs and fails on its import, so a change that breaks an adapter cannot land green."""
from __future__ import annotations

import importlib.util
import os

import pytest

REQUIRED = os.environ.get("EGGROLL_REQUIRE_PORTS") == "1"


def needs(*modules: str):
    """A skip mark for the modules that are absent (none under EGGROLL_REQUIRE_PORTS=1)."""
    missing = [m for m in modules if importlib.util.find_spec(m) is None]
    return pytest.mark.skipif(bool(missing) and not REQUIRED,
                              reason=f"{', '.join(missing)} not installed (make ports-install installs the pinned "
                                     f"ports extra)")
