"""The port adapter protocol: loading a port, and clear messages when a port breaks the protocol."""
from __future__ import annotations

import sys
import types

import numpy as np
import pytest

from parity.mlp.adapter import CheckedPort, load_port
from parity.core.port import PortError, UsageError
from parity.mlp.reference import ReferencePort
from parity.mlp.sizes import SELFTEST
from parity.mlp.suite import Context, param_shapes, run_check
from spec.config import Config

CFG = Config(pop=8, hidden=8)
SHAPES = param_shapes(CFG)


class Broken(ReferencePort):
    """The reference with one method made wrong in a chosen way."""

    def __init__(self, cfg, fault: str):
        super().__init__(cfg)
        self.fault = fault

    def perturbed_linear(self, W, A, B, x):
        out = super().perturbed_linear(W, A, B, x)
        if self.fault == "shape":
            return out[:, :, :-1]
        if self.fault == "dtype":
            return out.astype(np.float64)
        if self.fault == "raise":
            raise RuntimeError("kernel exploded")
        if self.fault == "tensor":
            return object()
        return out


def _module(name: str, **attrs) -> str:
    module = types.ModuleType(name)
    module.__dict__.update(attrs)
    sys.modules[name] = module
    return name


def test_load_port_builds_from_a_factory_and_passes_cfg():
    seen = []

    def factory(cfg):
        seen.append(cfg)
        return ReferencePort(cfg)

    name = _module("fake_port_factory", adapter=factory)
    port = load_port(f"{name}:adapter", CFG)
    assert isinstance(port, ReferencePort) and seen == [CFG]
    instance = _module("fake_port_instance", adapter=ReferencePort(CFG))
    assert isinstance(load_port(f"{instance}:adapter", CFG), ReferencePort)


@pytest.mark.parametrize("spec,needle", [
    ("no_colon_here", "package.module:attr"),
    ("surely_not_a_module_xyz:adapter", "cannot import module"),
    ("fake_port_empty:adapter", "has no attribute 'adapter'"),
])
def test_load_port_errors_say_what_is_wrong(spec, needle):
    _module("fake_port_empty")
    with pytest.raises(UsageError, match=needle):
        load_port(spec, CFG)


def test_load_port_lists_missing_methods_with_signatures():
    class Partial:
        def noise(self, *a):
            return {}

    name = _module("fake_port_partial", adapter=Partial())
    with pytest.raises(UsageError) as err:
        load_port(f"{name}:adapter", CFG)
    text = str(err.value)
    for method in ("perturbed_linear", "shape_fitness", "gradient"):
        assert method in text
    assert "(m,batch,out)" in text


def test_load_port_reports_a_failing_constructor():
    def factory(cfg):
        raise KeyError("missing weights")

    name = _module("fake_port_ctor", adapter=factory)
    with pytest.raises(UsageError, match="raised KeyError"):
        load_port(f"{name}:adapter", CFG)


@pytest.mark.parametrize("fault,needle", [
    ("shape", r"has shape \(2, 3, 7\); expected \(2, 3, 8\)"),
    ("dtype", "has dtype float64; expected float32"),
    ("raise", "raised RuntimeError: kernel exploded"),
    ("tensor", "not a numeric array"),
])
def test_checked_port_names_method_and_expectation(fault, needle):
    port = CheckedPort(Broken(CFG, fault))
    rng = np.random.default_rng(0)
    W = rng.standard_normal((8, 4)).astype(np.float32)
    A = rng.standard_normal((2, 8, 4)).astype(np.float32)
    B = rng.standard_normal((2, 4, 4)).astype(np.float32)
    x = rng.standard_normal((2, 3, 4)).astype(np.float32)
    with pytest.raises(PortError, match="port method `perturbed_linear`") as err:
        port.perturbed_linear(W, A, B, x)
    assert err.match(needle)


def test_checked_noise_validates_layout():
    class BadNoise(ReferencePort):
        def noise(self, shapes, seed, epoch, members, pop, sigma, rank):
            out = super().noise(shapes, seed, epoch, members, pop, sigma, rank)
            out["0.weight"] = out["0.weight"][1]          # B alone instead of (A, B)
            return out

    with pytest.raises(PortError, match="'0.weight' must be a pair"):
        CheckedPort(BadNoise(CFG)).noise(SHAPES, 0, 0, np.arange(4), 8, 0.2, 4)


def test_optional_methods_are_reported_missing():
    class Minimal:
        def __init__(self):
            self.ref = ReferencePort(CFG)

        def noise(self, *a):
            return self.ref.noise(*a)

        def perturbed_linear(self, *a):
            return self.ref.perturbed_linear(*a)

        def shape_fitness(self, *a):
            return self.ref.shape_fitness(*a)

        def gradient(self, *a):
            return self.ref.gradient(*a)

    port = CheckedPort(Minimal())
    assert not port.has("forward") and not port.has("es_init") and not port.has("optimizer_step")
    ref = CheckedPort(ReferencePort(CFG))
    assert ref.has("forward") and ref.has("es_tell") and ref.has("optimizer_step")


def test_a_protocol_break_inside_a_check_is_an_error_verdict():
    reference = ReferencePort(SELFTEST.cfg)
    ctx = Context(CheckedPort(Broken(SELFTEST.cfg, "dtype")), CheckedPort(reference), reference, SELFTEST, 0)
    result = run_check("products", ctx)
    assert result.verdict == "error"
    assert "perturbed_linear" in result.observed and "float64" in result.observed


def test_load_port_reports_a_module_that_fails_to_import(tmp_path, monkeypatch):
    (tmp_path / "port_raising_on_import.py").write_text("raise RuntimeError('needs a licence server')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(UsageError, match="raised RuntimeError: needs a licence server"):
        load_port("port_raising_on_import:adapter", CFG)


# ----------------------------------------------------------------------------- dense noise and the forward/update split
class Recording(ReferencePort):
    """The reference that remembers what its methods were handed (and, dense, takes E)."""

    def __init__(self, cfg, dense=False):
        super().__init__(cfg)
        self.dense_noise, self.seen = dense, {}

    def perturbed_linear(self, W, *args):
        self.seen["perturbed_linear"] = args
        if self.dense_noise:
            E, x = args
            return np.asarray(x @ np.swapaxes(W[None] + E, 1, 2), np.float32)
        return super().perturbed_linear(W, *args)

    def gradient(self, noise, shaped, sigma):
        self.seen["gradient"] = noise
        return {k: np.zeros(s, np.float32) for k, s in SHAPES.items()}

    def forward(self, params, noise, x):
        self.seen["forward"] = noise
        return np.zeros((x.shape[0], 2), np.float32)


@pytest.mark.parametrize("m", [2, 5])
def test_a_dense_port_receives_e_in_place_of_factors(m):
    """E = fl32(A B^T) for every method that takes noise, the same object for the same noise (ports cache on it)."""
    from parity.mlp.noiseform import dense_of

    rng = np.random.default_rng(m)
    port = CheckedPort(Recording(CFG, dense=True))
    noise = ReferencePort(CFG).noise(SHAPES, m, 0, np.arange(m), m, 0.2, 4)
    port.gradient(noise, rng.standard_normal(m).astype(np.float32), 0.2, SHAPES)
    given = port.port.seen["gradient"]
    for name, value in noise.items():
        expected = dense_of(*value) if name.endswith(".weight") else value
        assert given[name].dtype == np.float32 and np.array_equal(given[name], expected)
    assert given["0.weight"].shape == (m, 8, 4)
    port.forward({k: np.zeros(s, np.float32) for k, s in SHAPES.items()}, noise, np.zeros((m, 4), np.float32), 2)
    assert port.port.seen["forward"] is given
    A, B = noise["1.weight"]
    W, x = rng.standard_normal((8, 8)).astype(np.float32), rng.standard_normal((m, 3, 8)).astype(np.float32)
    port.perturbed_linear(W, A, B, x)
    E, _ = port.port.seen["perturbed_linear"]
    assert np.array_equal(E, dense_of(A, B))


def test_forward_and_update_noise_apart_go_to_their_methods():
    """{"forward": f, "update": u} from noise(): forward() gets f, gradient() gets u; the suite's one dict goes to both."""
    class Apart(Recording):
        def noise(self, shapes, seed, epoch, members, pop, sigma, rank):
            update = super().noise(shapes, seed, epoch, members, pop, sigma, rank)
            return {"forward": {k: v for k, v in update.items() if k.endswith(".weight")}, "update": update}

    port = CheckedPort(Apart(CFG))
    noise = port.noise(SHAPES, 0, 0, np.arange(4), 8, 0.2, 4)
    assert set(noise.forward) == {k for k in SHAPES if k.endswith(".weight")} and set(noise.update) == set(SHAPES)
    params = {k: np.zeros(s, np.float32) for k, s in SHAPES.items()}
    port.forward(params, noise, np.zeros((4, 4), np.float32), 2)
    port.gradient(noise, np.zeros(4, np.float32), 0.2, SHAPES)
    assert port.port.seen["forward"] is noise.forward and port.port.seen["gradient"] is noise.update
    plain = ReferencePort(CFG).noise(SHAPES, 0, 0, np.arange(4), 8, 0.2, 4)
    port.forward(params, plain, np.zeros((4, 4), np.float32), 2)
    port.gradient(plain, np.zeros(4, np.float32), 0.2, SHAPES)
    assert port.port.seen["forward"] is plain and port.port.seen["gradient"] is plain


@pytest.mark.parametrize("value, needle", [
    (lambda n: {k: (n[k][0] @ np.swapaxes(n[k][1], 1, 2)).astype(np.float32)[:, :, :-1] if k.endswith(".weight")
                else n[k] for k in n}, r"E of '0.weight' has shape \(4, 8, 3\); expected \(4, 8, 4\)"),
    (lambda n: n, "'0.weight' is a pair, but the port declares dense_noise = True; expected E of shape"),
    (lambda n: {"forward": n}, r"returned keys \['forward'\]; noise given apart is"),
])
def test_dense_noise_of_the_wrong_form_is_a_protocol_error(value, needle):
    class Dense(ReferencePort):
        dense_noise = True

        def noise(self, shapes, seed, epoch, members, pop, sigma, rank):
            return value(super().noise(shapes, seed, epoch, members, pop, sigma, rank))

    with pytest.raises(PortError, match="port method `noise`") as err:
        CheckedPort(Dense(CFG)).noise(SHAPES, 0, 0, np.arange(4), 8, 0.2, 4)
    assert err.match(needle)
