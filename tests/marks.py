"""Test marks the test modules share (no assertions here)."""
from __future__ import annotations

import pytest
import torch


def on_gpu(test):
    """Mark a test as needing CUDA: marker `gpu` (make gpu, python -m bench.gpu_check, runs `-m gpu`), skipped without a device."""
    needs = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (python -m bench.gpu_check)")
    return pytest.mark.gpu(needs(test))
