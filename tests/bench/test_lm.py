"""The bench's LM section: its FLOP count, its cases (both sides score the same tokens alike) and its report lines."""
from __future__ import annotations

import numpy as np
import torch

from bench import lm, names as M
from bench.report import Measurement, _lm_section


def test_forward_flops_counts_every_product_and_low_rank_term():
    cfg = lm.lm_config(16, quick=True)
    d, h, r, L, T, V = cfg.d_model, cfg.d_hidden, cfg.rank, cfg.layers, cfg.seq_len, 256
    per_token = L * (2 * (2 * d * d + 2 * r * 2 * d) + 2 * (2 * d * h + 2 * r * (d + h))) + 2 * V * d + 2 * r * (V + d)
    assert lm.forward_flops(cfg) == per_token * T * cfg.pop


def test_the_cases_score_the_same_members_on_both_sides():
    """torch_impl+noise and jax_reference time the same work: their scores agree to float32 rounding."""
    cfg = lm.lm_config(16, quick=True)
    cases = lm.torch_cases(cfg, 3, torch.device("cpu"))
    with torch.inference_mode():
        t_fixed, t_fresh = cases["torch_impl"].fn().numpy(), cases["torch_impl+noise"].fn().numpy()
    j = np.asarray(lm.jax_case(cfg, 3).fn())
    assert t_fixed.shape == j.shape == (16,)
    np.testing.assert_array_equal(t_fixed, t_fresh)
    # scores are means of log2-probabilities of magnitude <= ~10; the forward's transcendentals differ by ulps
    np.testing.assert_allclose(t_fresh, j, rtol=0, atol=1e-4)
    assert np.unique(j).size > 1                                   # members differ: the noise is in


def test_the_section_states_both_aims():
    rows = [Measurement(i, "lm", 128, M.LM_TOKENS, 1e5, 1e5, 1e5, "tokens/s", "cpu")
            for i in ("torch_impl", "torch_impl+noise", "jax_reference")]
    rows += [Measurement(i, "lm", 128, M.LM_MS, 40.0, 40.0, 40.0, "ms", "cpu") for i in ("torch_impl", "torch_impl+noise", "jax_reference")]
    rows += [Measurement("torch_impl+noise", "lm", 128, M.LM_RATIO + s, v, v, v, "x", "cpu")
             for s, v in (("", 0.5), (M.CI_LOW, 0.4), (M.CI_HIGH, 0.6))]
    rows += [Measurement("torch_impl", "lm:run", 0, M.LM_RUN_S, 30.0, 30.0, 30.0, "s", "cpu"),
             Measurement("torch_impl", "lm:run", 0, M.LM_RUN_BPB, 3.8, 3.8, 3.8, "bits/byte", "cpu")]
    text = "\n".join(_lm_section(rows))
    assert "0.50x, missed by 3.00x" in text
    assert "torch_impl 30 s" in text and ": met." in text
    assert "a cpu-preset LM run at most" in text
    quick = "\n".join(_lm_section(rows, quick=True))
    assert "a selftest-preset LM run (--quick; the aim is for the cpu preset)" in quick
    assert "a cpu-preset LM run at most" not in quick
