"""What a port's code was read to do, knob by knob, and whether the suite's verdict agrees with that reading.

Each adapter module lists `READINGS`: for a knob of DESIGN.md's knob table, the value the package's code
corresponds to, in words, with the file:line of the wheel it was read from, and whether a correct suite should
name that knob; `knob=None` marks a fact outside the knobs (the protocol cannot express it, so the survey
reports it as not checked). The survey sets each reading beside the knobs the suite named.
"""
from __future__ import annotations

from typing import Any, NamedTuple

from spec.knobs import Knobs

REFERENCE = Knobs()

class Reading(NamedTuple):
    knob: str | None        # a knob of spec.knobs, or None for a fact outside the knobs
    value: Any              # the knob's value the code corresponds to (or a short label outside the knobs)
    what: str               # what the code does, in words
    where: str              # file:line in the package's wheel
    named: bool | None = None   # should a correct suite name this knob? (default: value departs from the reference)
    note: str = ""          # why today's suite cannot agree, where that was investigated (shown on a disagreement)

    @property
    def drift(self) -> bool:
        """Whether the suite should name this knob for this port."""
        if self.knob is None:
            return False
        return self.named if self.named is not None else self.value != getattr(REFERENCE, self.knob)


class Agreement(NamedTuple):
    """One reading against the suite's verdict."""

    knob: str
    code: str               # "drift (halves)" or "same (jax)"
    suite: str              # "named" / "not named" / "not judged (check skipped)"
    agrees: bool | None     # None: the check that would judge it did not run
    where: str
    note: str = ""


# knob -> the checks whose verdict can name it (a skipped or erroring check cannot agree or disagree)
JUDGED_BY = {
    "rng": ("noise", "init"), "antithetic": ("noise", "gradients"), "fitness": ("fitness", "trajectory"),
    "bias_noise": ("noise", "products", "gradients", "trajectory"), "bias_grad": ("gradients",),
    "noise_reuse": ("noise",), "activation": ("products", "trajectory"), "init": ("init",),
    "optimizer": ("updates",), "lr_decay": ("updates", "trajectory"), "sigma_decay": ("noise", "trajectory"),
    "actions": ("actions",),
}


def agreement(reading: Reading, named: set[str], ran: set[str]) -> Agreement:
    """A reading against the knobs the suite named, given which checks ran (passed or failed)."""
    code = f"{'drift' if reading.drift else 'same'} ({reading.value})"
    if not set(JUDGED_BY.get(reading.knob, ())) & ran:
        return Agreement(reading.knob, code, "not judged (its checks did not run)", None, reading.where)
    said = reading.knob in named
    agrees = said == reading.drift
    return Agreement(reading.knob, code, "named" if said else "not named", agrees, reading.where,
                     "" if agrees else reading.note)
