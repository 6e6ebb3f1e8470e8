"""The model the user runs (issue 50): each member's population forward against the port's plain forward at
theta + E_i (parity.tree.forward), each layer's product as the model calls it (parity.tree.layers), a torch module in
a few lines (parity.tree.torch_module, examples/module_adapter.py). The faithful examples are never flagged, at two
sizes and ten seeds; each forward bug of real torch ports, planted alone in either example, is caught and named with
its leaf at two sizes."""
from __future__ import annotations

import ast
import io
import re
import subprocess
import sys
import tokenize
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

import tests.ports.gpt_ports as gpt_ports
import tests.ports.module_ports as module_ports
from examples import module_port as mp
from examples.gpt_adapter import GPTAdapter
from examples.gpt_port import GPTConfig
from examples.module_adapter import Adapter
from parity.__main__ import main
from parity.tree import check as tree_check, forward, layers
from parity.tree.adapter import CheckedTreePort, PortSide, declared_run
from parity.tree.torch_module import ModuleAdapter, module_tree, numpy_of, tensors
from spec.tree import TreeError
from spec.tree_knobs import TreeKnobs

ROOT = Path(__file__).resolve().parents[3]
GPT_SIZES = {"small": dict(model=GPTConfig(vocab=32, block_size=6, n_layer=3, n_head=2, n_embd=8), pop=8),
             "example": dict(pop=16)}
FAITHFUL = {
    "module": lambda size: Adapter(**(module_ports.SMALL if size == "small" else {})),
    "module, full rank": lambda size: Adapter(**{**(module_ports.SMALL if size == "small" else {}),
                                                 "es": mp.ES(pop=8 if size == "small" else 16, freeze_nonlora=False)}),
    "gpt": lambda size: GPTAdapter(**GPT_SIZES[size]),
    "gpt, full rank": lambda size: GPTAdapter(freeze_nonlora=False, **GPT_SIZES[size]),
}


def side_of(port):
    run, _ = declared_run(port, tree_check.TREE_SIZES["quick"])
    return PortSide(CheckedTreePort(port, run), run), run


def rows_of(port, seed: int = 0):
    side, run = side_of(port)
    return tree_check.run(run, TreeKnobs(), seed, lambda line: None, side=side)


def fails(rows, check=None):
    return [r for r in rows if r.verdict == "fail" and check in (None, r.check)]


# ----------------------------------------------------------------------------- the faithful examples
@pytest.mark.parametrize("size", ["small", "example"])
@pytest.mark.parametrize("example", FAITHFUL)
def test_the_faithful_examples_forward_and_layers_pass_at_ten_seeds(example, size):
    for seed in range(10):
        side, run = side_of(FAITHFUL[example](size))
        rows = forward.check_forward(side, run, seed) + layers.check_layers(side, run, seed)
        assert fails(rows) == [], (seed, [(r.quantity, r.value) for r in fails(rows)])
        members = [r for r in rows if r.check == "forward" and "theta + E_i" in r.quantity]
        assert len(members) == 2 * (3 + 3) and all(0 < r.value <= 1 for r in members)


def test_the_worked_module_adapter_passes_and_checks_each_layer_as_the_model_calls_it():
    port = Adapter()
    rows = rows_of(port, seed=1)
    assert fails(rows) == []
    assert {r.check for r in rows if r.verdict == "pass"} >= {"noise", "products", "gradients", "updates", "forward"}
    as_called = [r for r in rows if "as the model calls it" in r.quantity]
    assert {r.quantity.split(" ")[0] for r in as_called} == set(port.es.lowrank)          # every perturbed layer
    assert all(r.verdict == "pass" for r in as_called)
    assert any("3-D, the members folded into the batch" in r.quantity for r in as_called)   # attention's q, k, v, o
    assert any("4-D, the members on the leading axis" in r.quantity for r in as_called)    # the MLP and the head


def code_lines(path: Path) -> int:
    """Lines holding code: no docstring, comment or blank line."""
    src = path.read_text()
    docs = set()
    for node in ast.walk(ast.parse(src)):
        body = getattr(node, "body", None)
        if isinstance(body, list) and body and isinstance(body[0], ast.Expr) and \
                isinstance(body[0].value, ast.Constant) and isinstance(body[0].value.value, str):
            docs.update(range(body[0].lineno, body[0].end_lineno + 1))
    skip = {tokenize.COMMENT, tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT, tokenize.ENDMARKER}
    lines = set()
    for tok in tokenize.generate_tokens(io.StringIO(src).readline):
        if tok.type not in skip:
            lines.update(range(tok.start[0], tok.end[0] + 1))
    return len(lines - docs)


def test_the_module_adapter_is_at_most_40_lines_of_code():
    assert code_lines(ROOT / "examples" / "module_adapter.py") <= 40
    assert code_lines(ROOT / "examples" / "gpt_adapter.py") > 40          # the counter counts code


# ----------------------------------------------------------------------------- the planted bugs
@pytest.mark.slow
@pytest.mark.parametrize("size", ["small", "example"])
@pytest.mark.parametrize("bug", module_ports.BUGS)
def test_each_forward_bug_in_the_module_port_is_caught_and_named_with_its_leaf(bug, size):
    expected = module_ports.BUGS[bug]
    rows = rows_of(module_ports.planted(bug, size), seed=3)
    assert {r.check for r in fails(rows)} <= {"forward", "products"}, [(r.check, r.cause) for r in fails(rows)]
    cause = fails(rows, "forward")[0].cause
    assert expected.says in cause and expected.leaf in cause, cause
    assert not re.findall(r"knob `(\w+)`", " ".join(r.cause for r in fails(rows)))         # no knob blamed
    if expected.layer:
        said = [r.cause for r in rows if r.check == "products" and r.cause.startswith(expected.layer + ":")]
        assert said and expected.layer_says in said[0], said


@pytest.mark.slow
@pytest.mark.parametrize("size", ["small", "example"])
@pytest.mark.parametrize("bug", gpt_ports.FORWARD_BUGS)
def test_each_forward_bug_in_the_gpt_port_is_caught_and_named_with_its_leaf(bug, size):
    port_class, leaf, says, full_rank = gpt_ports.FORWARD_BUGS[bug]
    side, run = side_of(gpt_ports.with_port(port_class, **GPT_SIZES[size], **({"freeze_nonlora": False}
                                                                                 if full_rank else {})))
    rows = forward.check_forward(side, run, seed=3)
    cause = fails(rows)[0].cause
    assert says in cause and leaf in cause, cause


def test_localisation_follows_the_forward_order_slice_by_slice():
    side, run = side_of(GPTAdapter(**GPT_SIZES["small"]))
    noise = side.port.noise(0, 0, np.arange(run.pop), run.pop, run.sigma, run.rank)
    units = [u.label for u in forward.units_in_order(run.tree, noise)]
    block = ["blocks.attn.q", "blocks.attn.k", "blocks.attn.v", "blocks.attn.o", "blocks.mlp.c_fc", "blocks.mlp.c_proj"]
    assert units == [f"{p}[{layer}]" for layer in range(3) for p in block] + ["lm_head"]
    restricted = forward.restrict(noise, [forward.Unit("blocks.attn.k", (1,))])
    A = restricted["blocks.attn.k"][0]
    assert np.array_equal(A[:, 1], noise["blocks.attn.k"][0][:, 1]) and not np.any(A[:, [0, 2]])
    assert not np.any(restricted["lm_head"][0]) and restricted["lm_head"][0].shape == noise["lm_head"][0].shape


def test_the_cli_names_a_forward_bug_and_its_repro_still_fails_alone(tmp_path, capsys):
    assert main(["check", "--task", "tree", "--port", "tests.ports.module_ports:HeadNoiseNotInForward",
                 "--out", str(tmp_path), "--quiet"]) == 1
    out = capsys.readouterr().out
    assert "the forward mishandles the noise of lm_head.weight (mm): the forward applies none of its noise" in out
    summary = (tmp_path / "summary.md").read_text()
    assert "| forward | fail |" in summary and "repro/forward/" in summary
    done = subprocess.run([sys.executable, str(tmp_path / "repro" / "forward" / "repro.py")], cwd=tmp_path,
                          capture_output=True, text=True, timeout=120, env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})
    assert done.returncode == 1 and "FAIL: the port still differs" in done.stdout, done.stdout + done.stderr
    assert "population_forward()[0]" in done.stdout


# ----------------------------------------------------------------------------- the check's own edges
class NoModel(GPTAdapter):
    population_forward = None


class NoisyPlainGPT(gpt_ports.DropoutGPT):
    """Dropout in the plain forward too: the oracle itself is random."""

    def _mlp(self, noise, params, x, l):
        return torch.nn.functional.dropout(super(gpt_ports.DropoutGPT, self)._mlp(noise, params, x, l), 0.1,
                                           training=True)


class WrongShape(GPTAdapter):
    def population_forward(self, params, noise, batch):
        return super().population_forward(params, noise, batch)[:1]


def WrongShapeSmall():
    return WrongShape(pop=8)


def test_a_port_without_the_model_methods_is_skipped_saying_what_to_add():
    side, run = side_of(NoModel(pop=8))
    (row,) = forward.check_forward(side, run, 0)
    assert row.verdict == "skip" and "population_forward/plain_forward/batch" in row.cause


def test_a_plain_forward_that_is_not_deterministic_is_no_oracle():
    side, run = side_of(gpt_ports.with_port(NoisyPlainGPT, pop=8))
    rows = forward.check_forward(side, run, 0)
    assert len(rows) == 1 and rows[0].verdict == "fail" and "the plain forward is not deterministic" in rows[0].cause


def test_a_population_forward_of_the_wrong_shape_breaks_the_protocol(tmp_path, capsys):
    assert main(["check", "--task", "tree", "--port", "tests.parity.tree.test_forward:WrongShapeSmall", "--out",
                 str(tmp_path), "--quiet"]) == 2
    assert "port method `population_forward`: returned shape (1," in capsys.readouterr().err


def test_the_bound_is_the_plain_forwards_own_rounding_and_catches_a_one_percent_perturbation():
    """A population forward 1% off one member's perturbation of one leaf (sigma-sized moves, not rounding) fails by
    orders of magnitude; the faithful one sits within a few of the plain forward's float32 spreads."""
    side, run = side_of(GPTAdapter(pop=8))
    judge = forward.Judge(side, run, forward.forward_params(side, run, 0))
    noise = forward.take(side.port.noise(0, 0, np.arange(8), 8, run.sigma, run.rank), [3])
    batch = side.port.batch(5)
    plain = judge.plain(noise, 0, batch)
    assert plain.exact and judge.ratio(judge.population(noise, batch)[0], plain) * forward.FORWARD_SPREAD < 8
    off = {k: ((v[0] * np.float32(1.01), v[1]) if k == "lm_head" else v) for k, v in noise.items()}
    assert judge.ratio(judge.population(off, batch)[0], plain) > 10


# ----------------------------------------------------------------------------- the layers, one at a time
def test_a_layers_members_are_found_wherever_they_sit_and_its_mistake_named():
    rng = np.random.default_rng(0)
    m, rows, d_in, d_out, r = 3, 4, 5, 6, 2
    W = rng.standard_normal((d_out, d_in))
    A, B = rng.standard_normal((m, d_out, r)) * 0.1, rng.standard_normal((m, d_in, r))
    b = rng.standard_normal(d_out)
    layer = layers.Layer("l.weight", "mm", W, A, B, np.broadcast_to(b, (m, 1, d_out)), np.broadcast_to(b, (m, 1, d_out)))
    x = rng.standard_normal((m, rows, d_in))
    y = x @ W.T + (x @ B) @ np.swapaxes(A, 1, 2) + b                          # (m, rows, out)
    batch_major = lambda t: np.moveaxis(t.reshape(m, 2, 2, t.shape[-1]), 0, 1).reshape(2 * m, 2, t.shape[-1])  # noqa
    for xs, ys in ((x, y), (x.reshape(m * 2, 2, d_in), y.reshape(m * 2, 2, d_out)), (batch_major(x), batch_major(y))):
        assert layers._judged(layer, xs, ys, m)[0] <= 1
    plain = x @ W.T + b
    assert layers._judged(layer, x, plain, m)[0] > 1
    assert layers.diagnosis(layer, x, plain, m, {}) == "leaves out the low-rank term A B^T"
    zero = np.broadcast_to((x[:1] @ W.T), y.shape) + (x @ B) @ np.swapaxes(A, 1, 2) + b
    assert "member 0's input" in layers.diagnosis(layer, batch_major(x), batch_major(zero), m, {})


def test_a_module_that_is_no_linear_layer_is_not_judged_as_one():
    class Scaled(nn.Linear):          # owns a weight, but computes 2 x W^T of its input
        def forward(self, x):
            return 2 * super().forward(x)

    port = Adapter(**module_ports.SMALL)
    port.module.lm_head.__class__ = type("ScaledEgg", (Scaled, mp.EggLinear), {})
    side, run = side_of(port)
    rows = {r.quantity.split(" ")[0]: r for r in layers.check_layers(side, run, 0)}
    assert rows["lm_head.weight"].verdict == "skip" and "not a plain linear layer" in rows["lm_head.weight"].cause
    assert rows["blocks.0.attn.q.weight"].verdict == "pass"


# ----------------------------------------------------------------------------- the torch module helper
class Conv1D(nn.Module):
    """GPT-2's (in, out) layer."""

    def __init__(self, n_in: int, n_out: int):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(n_in, n_out) * 0.1)
        self.bias = nn.Parameter(torch.zeros(n_out))

    def forward(self, x):
        return x @ self.weight + self.bias


class Tiny(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(7, 4)
        self.up = Conv1D(4, 6)
        self.norm = nn.LayerNorm(6)
        self.head = nn.Linear(6, 7)

    def forward(self, idx):
        return self.head(self.norm(self.up(self.emb(idx))))


def test_the_module_helper_reads_the_tree_and_runs_the_plain_model_in_its_parameters_dtype():
    with pytest.raises(TreeError, match=r"up.weight \(shape \(4, 6\), owned by a Conv1D\).*overrides="):
        module_tree(Tiny())
    helper = ModuleAdapter(Tiny, overrides={"Conv1D": "tmm"})
    assert {leaf.path: leaf.cls for leaf in helper.tree.leaves} == {
        "emb.weight": "embedding", "up.weight": "tmm", "up.bias": "param", "norm.weight": "param",
        "norm.bias": "param", "head.weight": "mm", "head.bias": "param"}
    a, b = helper.init_params(3), helper.init_params(3)
    assert all(np.array_equal(a[k], b[k]) for k in a) and not np.array_equal(a["up.weight"],
                                                                             helper.init_params(4)["up.weight"])
    tokens = np.array([[1, 2, 3], [4, 5, 6]])
    y32 = helper.plain_forward(a, tokens)
    y64 = helper.plain_forward({k: v.astype(np.float64) for k, v in a.items()}, tokens)
    assert y32.dtype == np.float32 and y64.dtype == np.float64 and y32.shape == (2, 3, 7)
    assert 0 < np.max(np.abs(y32 - y64)) < 1e-5
    out = numpy_of(tensors({"x": np.ones(3, np.float32)}))["x"]
    out[0] = 2.0                                                                 # writable, its own copy
    with pytest.raises(TreeError, match="unknown class"):
        module_tree(Tiny(), {"Conv1D": "lora"})


def test_the_guide_shows_the_module_adapter_as_it_is():
    """docs/ports.md's listing of examples/module_adapter.py: each of its lines, in order, is the file's."""
    guide = (ROOT / "docs" / "ports.md").read_text()
    block = guide.split("### A torch module in a few lines", 1)[1].split("```python\n", 1)[1].split("```", 1)[0]
    source = iter((ROOT / "examples" / "module_adapter.py").read_text().splitlines())
    for line in filter(None, block.splitlines()):
        assert any(line == got for got in source), f"not in examples/module_adapter.py (in order): {line!r}"
