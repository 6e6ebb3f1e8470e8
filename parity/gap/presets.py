"""Presets of the gap study: torch_impl's, plus `gap`, the `cpu` preset with a smaller env-step budget.

Why `gap`: at the `cpu` preset a run solves in about 3-5 M env steps (35-50 s of one core),
but a drift that stops learning runs to the 20 M budget (3-4 minutes of one core). The
default study must fit 30 minutes on 2 cores, so `gap` caps a run at 10 M steps (twice the
slowest solving run measured, 5.0 M); a run that has not solved by then is censored, and
the statistics treat its steps as a lower bound.
"""
from __future__ import annotations

from torch_impl.config import PRESETS as TORCH_PRESETS
from torch_impl.config import Config
from torch_impl.knobs import Knobs

GAP_BUDGET = 10_000_000

PRESETS: dict[str, tuple[Config, Knobs]] = {
    **TORCH_PRESETS,
    "gap": (TORCH_PRESETS["cpu"][0].replace(max_env_steps=GAP_BUDGET), TORCH_PRESETS["cpu"][1]),
}
DEFAULT = "gap"


def describe(name: str) -> str:
    """One line for the report: where the preset comes from."""
    if name == "gap":
        return (f"`gap` = torch_impl's `cpu` preset with the budget cut to {GAP_BUDGET:,} env steps "
                f"(parity/gap/presets.py)")
    return f"`{name}` (torch_impl/config.py)"
