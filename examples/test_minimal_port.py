"""A port author's test file: the parity suite as pytest items (the plugin parity/pytest_plugin.py, installed with
the project as a pytest11 entry point), for the numpy port of examples/minimal_adapter.py.

    pytest examples/test_minimal_port.py        # one item per check: test_minimal_port[fitness], ...

`test_minimal_port` is all a port needs. `test_halves_port` checks a port that pairs its antithetic members as
the two halves of the population (member i with i + N/2) on purpose: it declares that drift with `expect=`, so
the test passes while the suite names exactly that knob, and fails on any other drift or when the port stops
departing there.
"""
import pytest

from examples.minimal_adapter import MinimalAdapter, adapter


@pytest.mark.eggroll_parity(adapter)
def test_minimal_port(eggroll_parity):
    eggroll_parity.check()


class HalvesAdapter(MinimalAdapter):
    """The minimal port with member i mirrored by member i + N/2 (the knob table's antithetic=halves)."""

    name = "minimal numpy EGGROLL, halves pairing"

    def noise(self, shapes, seed, epoch, members, pop, sigma, rank):
        half = pop // 2
        # The parent's noise of members (2k, 2k + 1) is the pair (+z_k, -z_k): ask it for the members 2 (i mod N/2)
        # and 2 (i mod N/2) + 1, so member i gets +z_(i mod N/2) in the first half and -z_(i mod N/2) in the second.
        return super().noise(shapes, seed, epoch, 2 * (members % half) + (members >= half), pop, sigma, rank)


@pytest.mark.eggroll_parity(HalvesAdapter(), expect={"antithetic": "halves"})
def test_halves_port(eggroll_parity):
    eggroll_parity.check()
