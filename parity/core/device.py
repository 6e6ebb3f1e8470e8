"""The torch side's device, as every suite's --device names it (check, check --task lm, int8): refused before any
work where torch sees no CUDA device.
"""
from __future__ import annotations

import torch

from parity.core.port import UsageError
from spec.limits import cuda_missing


def check_device(device: str) -> None:
    """UsageError (exit 2, before any work) for a CUDA device on a machine where torch sees none: every suite's
    --device (check, check --task lm, int8) refuses it with spec.limits' sentence."""
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise UsageError(cuda_missing(device))
