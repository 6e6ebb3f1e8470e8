"""N-D leaves: an mm leaf perturbed through a declared matrix (a conv weight (out, in, kh, kw) as (out, in * kh *
kw)): the declaration and its refusals, the reference's noise at the matrix's shape reshaped, and the CNN example
(examples/cnn_adapter.py) faithful at two sizes, its planted drifts (tests/ports/ndleaf_ports.py) each caught and
named with the leaf."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from examples.cnn_adapter import CNNAdapter
from parity.core.port import PortError, UsageError
from parity.tree import blocks
from parity.tree.adapter import CheckedTreePort, declared_run, declared_tree, dense_of
from parity.tree.check import TREE_SIZES
from parity.tree.torch_module import module_tree
from spec.limits import estimate_tree_check_bytes
from spec.tree import Leaf, TreeError, TreeRun, make_tree
from tests.ports import ndleaf_ports as P
from tests.parity.tree.test_check import rows_of

CONV = (8, 3, 3, 3)


@pytest.mark.parametrize("kwargs, says", [
    (dict(matrix=(8, 26)), "no row-major matricization of the slice"),
    (dict(matrix=(12, 18)), "one of (8, 27), (24, 9), (72, 3)"),
    (dict(matrix=(8, 27), cls="param"), "a param leaf has none"),
    (dict(), "matrix=(8, 27)"),
])
def test_a_bad_matrix_declaration_is_refused_saying_what_would_be_right(kwargs, says):
    cls = kwargs.pop("cls", "mm")
    with pytest.raises(TreeError) as err:
        Leaf("conv.weight", CONV, cls, **kwargs)
    assert says in str(err.value), str(err.value)


def test_a_2d_leaf_with_a_matrix_and_the_accepted_splits():
    with pytest.raises(TreeError, match="its own matrix"):
        Leaf("w", (4, 6), "mm", matrix=(4, 6))
    assert Leaf("w", CONV, "mm", matrix=(24, 9)).factor_dims == (24, 9)
    assert Leaf("w", CONV, "mm", matrix=[8, 27]).matrix == (8, 27)          # a list is read as the pair


class _Declared:
    """An adapter declaring its tree by maps: leaf_classes and matrices, read with init_params' shapes."""

    leaf_classes = {"conv.weight": "mm"}

    def __init__(self, matrices):
        self.matrices = matrices

    def init_params(self, seed):
        return {"conv.weight": np.zeros(CONV, np.float32)}

    noise = shape_fitness = gradient = perturbed_mm = None


def test_the_adapter_refuses_a_bad_matrix_with_exit_2_words():
    assert declared_tree(_Declared({"conv.weight": (8, 27)})).leaf("conv.weight").matrix == (8, 27)
    with pytest.raises(UsageError, match=r"matrix \(9, 24\) is no row-major"):
        declared_tree(_Declared({"conv.weight": (9, 24)}))
    with pytest.raises(UsageError, match="did you mean 'conv.weight'"):
        declared_tree(_Declared({"conv.wieght": (8, 27)}))


def test_module_tree_declares_a_conv2d_weight_through_its_matrix():
    tree = module_tree(torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3), torch.nn.Flatten(), torch.nn.Linear(8, 2)))
    assert tree.leaf("0.weight").matrix == (8, 27) and tree.leaf("0.weight").cls == "mm"
    assert tree.leaf("2.weight").matrix is None


def test_blocks_and_dense_of_reshape_the_matrix_row_major():
    leaf = Leaf("c", CONV, "mm", matrix=(8, 27))
    rng = np.random.default_rng(0)
    A, B = rng.standard_normal((4, 8, 2)), rng.standard_normal((4, 27, 2))
    want = (A @ np.swapaxes(B, 1, 2)).reshape(4, *CONV)          # row-major: entry (o, c, i, j) is column c 9 + i 3 + j
    assert np.array_equal(dense_of(leaf, (A, B)), want)
    assert np.allclose(blocks.dense_block(leaf, (A, B)), want)
    assert np.allclose(blocks.weighted_sum(leaf, (A, B), np.arange(4.0)), np.tensordot(np.arange(4.0), want, 1))
    assert blocks.grid(leaf) == (1, 8, 27)
    small = estimate_tree_check_bytes(make_tree([leaf]), 16, 2, blocks.BLOCK_ENTRIES)
    assert small.parts["noise of every perturbed leaf, two epochs (float32)"] == 2 * 16 * (8 + 27) * 2 * 4


def test_the_reference_draws_a_matricized_leaf_as_the_mm_at_its_matrix_reshaped():
    """Leaf i's noise and gradient are the reference's mm at (a, b) by its key index, reshaped: against a tree with
    the same paths whose conv leaf is that 2-D mm."""
    from parity.tree import reference as R
    from parity.tree.numpy_reference import NumpyTreeReference
    nd = make_tree([Leaf("a.weight", (4, 6), "mm"), Leaf("b.conv", (5, 2, 3, 3), "mm", matrix=(5, 18)),
                    Leaf("c.bias", (5,), "param")])
    flat = make_tree([Leaf("a.weight", (4, 6), "mm"), Leaf("b.conv", (5, 18), "mm"), Leaf("c.bias", (5,), "param")])
    run_nd, run_flat = TreeRun(nd, pop=8), TreeRun(flat, pop=8)
    conv, conv2 = nd.leaf("b.conv"), flat.leaf("b.conv")
    for epoch in (0, 1):
        got, want = R.dense_noise(run_nd, 3, epoch, conv), R.dense_noise(run_flat, 3, epoch, conv2)
        assert np.array_equal(got, want.reshape(got.shape))
    shaped = np.random.default_rng(1).standard_normal(8).astype(np.float32)
    g, g2 = R.grads(run_nd, 3, 0, shaped), R.grads(run_flat, 3, 0, shaped)
    assert g["b.conv"].shape == (5, 2, 3, 3) and np.array_equal(g["b.conv"].ravel(), g2["b.conv"].ravel())
    numpy_g = NumpyTreeReference(R.draws).grads(run_nd, 3, 0, shaped)
    assert np.allclose(numpy_g["b.conv"], g["b.conv"], rtol=1e-5, atol=1e-9)
    params = {p: np.random.default_rng(2).standard_normal(s).astype(np.float32) for p, s in nd.shapes.items()}
    new = R.update(run_nd, params, g)
    assert new["b.conv"].shape == (5, 2, 3, 3) and not np.array_equal(new["b.conv"], params["b.conv"])


def _checked(port):
    run, _ = declared_run(port, TREE_SIZES["quick"])
    return CheckedTreePort(port, run), run


@pytest.mark.parametrize("port, says", [
    (P.TallMatrix, "are of a 36 x 2 matricization: its noise is matricized in another order"),
    (P.FullRankNoise, "is a full-rank perturbation of 'conv1.weight', which the tree declares low-rank through its "
                      "matrix (4, 18)"),
])
def test_factors_of_another_matrix_or_a_full_rank_array_are_refused_naming_the_leaf(port, says):
    checked, run = _checked(port(**P.SIZES["small"]))
    with pytest.raises(PortError) as err:
        checked.noise(0, 0, np.arange(run.pop), run.pop, run.sigma, run.rank)
    assert says in str(err.value), str(err.value)


@pytest.mark.slow
@pytest.mark.parametrize("size, seed", [("small", 3), ("example", 0)])
def test_the_cnn_example_is_faithful_and_its_convs_are_checked_as_mm_at_their_matrix(size, seed):
    rows = rows_of(CNNAdapter(**P.SIZES[size]), seed)
    assert [(r.check, r.cause) for r in rows if r.verdict == "fail"] == []
    judged = {r.check for r in rows if r.verdict != "skip"}
    assert judged >= {"noise", "products", "gradients", "updates", "forward", "trajectory", "fitness"}
    q = [r.quantity for r in rows if r.verdict == "pass"]
    for conv in ("conv1.weight", "conv2.weight"):
        assert any(s.startswith(f"{conv} (mm ") and "the matrix of the stored" in s for s in q)     # synthetic mm
        assert any(s.startswith(f"{conv} (mm) as the model calls it") for s in q)                  # the conv itself
        assert any(s.startswith(f"{conv} (mm) epoch") and "port - ref" in s for s in q)            # noise
        assert any(s.startswith(f"{conv} (mm): max |port - ref| / bound") for s in q)              # gradient, update


PLANTED = [  # (port, the check failing first, what its cause says)
    ("KhKwSwapped", "products", "conv1.weight: the layer as the model calls it perturbs with A B^T matricized in "
                                "another order: the port lays the"),
    ("ChannelsLast", "products", "over the stored axes as (out, kh, kw, in)"),
    ("FullRankForward", "products", "conv1.weight: the layer as the model calls it perturbs the weight at rank"),
    ("ConvNoiseLeftOut", "products", "conv1.weight: the layer as the model calls it leaves out the low-rank term"),
]


@pytest.mark.slow
@pytest.mark.parametrize("size", ["small", "example"])
@pytest.mark.parametrize("name, check, says", PLANTED, ids=[p[0] for p in PLANTED])
def test_each_conv_drift_is_caught_and_named_with_its_leaf(name, check, says, size):
    rows = rows_of(getattr(P, name)(**P.SIZES[size]), seed=2)
    fails = [r for r in rows if r.verdict == "fail"]
    assert fails and fails[0].check == check and says in fails[0].cause, [(r.check, r.cause) for r in fails[:3]]
    forward = [r for r in fails if r.check == "forward"]
    assert forward and "conv1.weight (mm)" in forward[0].cause, [r.cause for r in forward[:1]]
    if name in ("KhKwSwapped", "ChannelsLast"):       # the gradient and the forward name the order too
        assert any(r.check == "gradients" and "matricized in another order" in r.cause for r in fails)
        assert "matricized in another order" in forward[0].cause
    if name == "ConvNoiseLeftOut":
        assert "applies none of its noise" in forward[0].cause


@pytest.mark.slow
def test_the_cnn_on_torchs_generator_is_checked_in_distribution_at_its_matrix():
    """jax_compatible_rng False: the convs' noise laws, the gradient on the port's own noise and the step, as mm."""
    from examples.cnn_adapter import TorchRng
    rows = rows_of(TorchRng(**P.SIZES["small"]), 3)
    assert [(r.check, r.cause) for r in rows if r.verdict == "fail"] == []
    q = [r.quantity for r in rows if r.verdict == "pass"]
    assert any(s.startswith("conv1.weight (mm) epoch 0: diagonal entries of E / sigma") for s in q)
    assert any(s.startswith("conv2.weight (mm): max |port - ref on the port's noise| / bound") for s in q)
