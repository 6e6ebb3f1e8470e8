"""The benchmark's comparison implementations compute torch_impl's forward numbers.

Truth is torch_impl.model.forward in float64 on the same float32 inputs. Each float32
implementation must lie within a first-order rounding bound of it, propagated layer by layer
(see `error_bound`): a bound, not a fitted tolerance, so an implementation that passes cannot
be off by more than float32 rounding of some summation order allows.
"""
from __future__ import annotations

import math

import pytest
import torch

from bench import impls
from bench.ceilings import forward_work
from bench.measure import quantiles
from torch_impl.model import LN_EPS, forward
from torch_impl.noise import Noise, per_member

U = 2.0 ** -24  # float32 unit roundoff


def gamma(k: int) -> float:
    """Higham's gamma_k = k u / (1 - k u): the relative bound of a k-term float32 sum of products."""
    return k * U / (1 - k * U)


def make_case(sizes, pop, rank, seed, bias_noise=True):
    """Random float32 params (nonzero biases), Noise and nothing zero: a fresh case per seed.

    Members come in interleaved antithetic pairs as torch_impl draws them (2p and 2p+1 share B,
    A and the bias noise change sign), so `grouped` can hand torch_impl its one-entry-per-pair form.
    """
    g = torch.Generator().manual_seed(seed)
    params, A, B, bias = {}, {}, {}, {}
    for l, (d_in, d_out) in enumerate(zip(sizes[:-1], sizes[1:])):
        params[f"{l}.weight"] = torch.randn(d_out, d_in, generator=g) / math.sqrt(d_in)
        params[f"{l}.bias"] = 0.1 * torch.randn(d_out, generator=g)
        sign = torch.tensor([1.0, -1.0]).repeat(pop // 2)                      # (pop,) +, -, +, ...
        A[f"{l}.weight"] = (0.2 / math.sqrt(rank) * torch.randn(pop // 2, d_out, rank, generator=g)
                            ).repeat_interleave(2, 0) * sign[:, None, None]
        B[f"{l}.weight"] = torch.randn(pop // 2, d_in, rank, generator=g).repeat_interleave(2, 0)
        if bias_noise:
            bias[f"{l}.bias"] = 0.2 * torch.randn(pop // 2, d_out, generator=g).repeat_interleave(2, 0) * sign[:, None]
    return params, Noise(A, B, bias), g


def grouped(noise):
    """The same noise as sample_noise stores it: one entry per pair (the + member's), signs (+1, -1)."""
    return Noise({k: v[0::2] for k, v in noise.A.items()}, {k: v[0::2] for k, v in noise.B.items()},
                 {k: v[0::2] for k, v in noise.bias.items()}, signs=(1.0, -1.0))


def to64(params, noise):
    f = lambda d: {k: v.double() for k, v in d.items()}
    return f(params), Noise(f(noise.A), f(noise.B), f(noise.bias))


def error_bound(params64, noise64, x64, activation):
    """Elementwise first-order bound on |float32 forward - exact forward| for any summation order.

    Layer: |dy| <= e_h (|W|^T + |B||A|^T) + gamma_{in+r+3} (|h||W|^T + |h||B||A|^T + |b| + |beta|),
    the dot-product bound for both products plus the bias adds. pqn: the exact layer norm's
    Jacobian (I - 11^T/n - z z^T/n)/s carries dy to |dz| <= (|dy| + mean|dy| + |z| mean(|z||dy|))/s;
    its own float32 rounding (mean gamma_n mean|y|, centring u|d|, variance gamma_{n+1} and the
    mean's error, sqrt/eps/divide 3u) is added, doubled to cover one-pass/Welford variants.
    relu is 1-Lipschitz and exact; tanh is 1-Lipschitz with <= 4u relative rounding (libm ulps).
    Second-order terms (u^2 n^2 ~ 1e-9 relative at n = 256) are dropped.
    """
    h = x64 if x64.dim() == 3 else x64.unsqueeze(1)
    e = torch.zeros_like(h)
    n_layers = impls.n_layers(params64)
    for l in range(n_layers):
        W, b = params64[f"{l}.weight"], params64[f"{l}.bias"]
        A, B = noise64.A[f"{l}.weight"], noise64.B[f"{l}.weight"]
        beta = noise64.bias.get(f"{l}.bias", torch.zeros(A.shape[0], W.shape[0], dtype=W.dtype))
        d_in, r = W.shape[1], A.shape[2]
        absBA = torch.bmm(B.abs(), A.abs().transpose(1, 2))                  # (pop, in, out)
        mag = h.abs() @ W.abs().T + torch.bmm(h.abs(), absBA) + b.abs() + beta.abs().unsqueeze(1)
        e = e @ W.abs().T + torch.bmm(e, absBA) + gamma(d_in + r + 3) * mag
        y = h @ W.T + torch.bmm(torch.bmm(h, B), A.transpose(1, 2)) + b + beta.unsqueeze(1)
        if l == n_layers - 1:
            return e
        n = y.shape[-1]
        if activation == "pqn":
            mu = y.mean(-1, keepdim=True)
            d = y - mu
            var = d.square().mean(-1, keepdim=True)
            s = torch.sqrt(var + LN_EPS)
            z = d / s
            carried = (e + e.mean(-1, keepdim=True) + z.abs() * (z.abs() * e).mean(-1, keepdim=True)) / s
            mu_err = gamma(n) * y.abs().mean(-1, keepdim=True)
            d_err = mu_err + U * d.abs()
            var_err = 2 * (d.abs() * d_err).mean(-1, keepdim=True) + gamma(n + 1) * var
            s_rel = var_err / (2 * s ** 2) + 3 * U
            own = d_err / s + z.abs() * s_rel + U * z.abs()
            e = carried + 2 * own                                             # relu: 1-Lipschitz, exact
            h = torch.relu(z)
        elif activation == "relu":
            h = torch.relu(y)
        elif activation == "tanh":
            h = torch.tanh(y)
            e = e + 4 * U * h.abs()
        else:
            raise ValueError(activation)
    raise AssertionError("unreachable")


CASES = [
    # sizes, pop, rank, batch (None = one observation per member), activation, bias noise, seed
    ([4, 32, 32, 2], 8, 4, None, "pqn", True, 1),
    ([4, 32, 32, 2], 6, 4, 3, "pqn", True, 2),
    ([7, 48, 24, 5], 10, 2, None, "tanh", False, 3),
    ([7, 48, 24, 5], 4, 1, 5, "relu", True, 4),
    ([16, 64, 16], 12, 4, 2, "pqn", False, 5),
    ([12, 20], 6, 3, None, "pqn", True, 6),            # one layer: no activation, the tightest bound
]


def run_impls(params, x, noise, activation):
    """Every comparison implementation's output on the same float32 inputs."""
    with torch.no_grad():
        module = impls.build_module(params, activation)
        return {
            "torch_impl": forward(params, x, grouped(noise), activation),
            "torch_impl (per-member noise)": forward(params, x, noise, activation),
            "hooks": impls.hooks_forward(module, x, noise),
            "materialized": impls.materialized_forward(params, x, noise, activation),
            "loop": impls.loop_forward(params, x, noise, activation),
        }


@pytest.mark.parametrize("sizes,pop,rank,batch,activation,bias_noise,seed", CASES)
def test_impls_match_torch_impl_within_float32_bound(sizes, pop, rank, batch, activation, bias_noise, seed):
    params, noise, g = make_case(sizes, pop, rank, seed, bias_noise)
    expanded = per_member(grouped(noise))         # the grouped form expands back exactly
    for d1, d2 in zip(expanded[:3], noise[:3]):
        assert d1.keys() == d2.keys() and all(torch.equal(d1[k], d2[k]) for k in d1)
    shape = (pop, sizes[0]) if batch is None else (pop, batch, sizes[0])
    x = torch.randn(shape, generator=g)
    params64, noise64 = to64(params, noise)
    with torch.no_grad():
        truth = forward(params64, x.double(), noise64, activation)
        bound = error_bound(params64, noise64, x.double(), activation)
    bound = bound.squeeze(1) if batch is None else bound
    for name, out in run_impls(params, x, noise, activation).items():
        assert out.shape == truth.shape, f"{name}: shape {tuple(out.shape)}, expected {tuple(truth.shape)}"
        assert out.dtype == torch.float32, name
        err = (out.double() - truth).abs()
        worst = (err / bound).max().item()
        assert worst <= 1.0, f"{name}: error {err.max().item():.3g} exceeds the float32 bound ({worst:.2f}x)"
    # The bound is meaningful: far below the outputs' size and the O(sigma) effect of a member's noise.
    # (It is a worst case over signs, so it grows with depth: about 3e-3 of the outputs at 3 layers.)
    assert bound.max().item() < 1e-2 * truth.abs().max().item()


def test_bound_catches_a_wrong_member():
    """Swapping two members' factors (a pairing bug) is far outside the bound."""
    sizes, pop, rank = [4, 32, 2], 8, 4
    params, noise, g = make_case(sizes, pop, rank, seed=11)
    x = torch.randn(pop, sizes[0], generator=g)
    params64, noise64 = to64(params, noise)
    with torch.no_grad():
        truth = forward(params64, x.double(), noise64, "pqn")
        bound = error_bound(params64, noise64, x.double(), "pqn").squeeze(1)
        perm = torch.arange(pop)
        perm[[0, 1]] = perm[[1, 0]]
        swapped = Noise({k: v[perm] for k, v in noise.A.items()}, noise.B, noise.bias)
        out = impls.materialized_forward(params, x, swapped, "pqn")
    assert ((out.double() - truth).abs() / bound)[:2].max().item() > 10.0


def test_hooks_are_removed_after_each_call():
    params, noise, g = make_case([4, 16, 2], 4, 2, seed=7)
    x = torch.randn(4, 4, generator=g)
    module = impls.build_module(params, "relu")
    with torch.no_grad():
        impls.hooks_forward(module, x, noise)
        plain = module(x)
        expected = forward(params, x, None, "relu")
    assert all(not m._forward_hooks for m in module)
    torch.testing.assert_close(plain, expected, rtol=1e-5, atol=1e-6)  # no noise: float32 reorder only


def test_population_mismatch_is_a_clear_error():
    params, noise, g = make_case([4, 16, 2], 4, 2, seed=8)
    x = torch.randn(6, 4, generator=g)
    for fn in (lambda: impls.materialized_forward(params, x, noise, "pqn"),
               lambda: impls.loop_forward(params, x, noise, "pqn"),
               lambda: impls.hooks_forward(impls.build_module(params, "pqn"), x, noise)):
        with pytest.raises(ValueError, match="population"):
            fn()


def test_forward_work_counts_by_hand():
    # One layer 3 -> 5, rank 2, pop 4, batch 1: FLOPs 2*4*(15 + 2*8) = 248;
    # floats: weights 15 + bias 5 + factors 4*(2*8 + 5) = 84 + activations 4*(3 + 5) = 32 -> 136.
    work = forward_work([3, 5], pop=4, rank=2)
    assert work.flops == 248
    assert work.bytes == 4 * 136
    # Antithetic pairs: 2 draws -> factors 2*(2*8 + 5) = 42 floats, 52 fewer; FLOPs unchanged.
    paired = forward_work([3, 5], pop=4, rank=2, draws=2)
    assert paired.flops == 248 and paired.bytes == 4 * (136 - 42)
    with pytest.raises(ValueError, match="draws"):
        forward_work([3, 5], pop=4, rank=2, draws=5)


def test_summary_quantiles():
    s = quantiles([5.0, 1.0, 3.0, 2.0, 4.0])
    assert (s.median, s.p10, s.p90) == (3.0, 1.4, 4.6)
    with pytest.raises(ValueError):
        quantiles([])
