"""A functional PyTorch EGGROLL: plain tensors, the whole population in one batched call per layer.

Importing it before torch sets OMP_WAIT_POLICY=PASSIVE unless the environment says otherwise: torch's OpenMP
threads then sleep while they wait instead of spinning. Idle, that costs little; on a machine shared with other
CPU-bound jobs, spinning threads starve the ones doing the work and the forward slowed several times
(`make bench`'s busy-machine section measures both). Set OMP_WAIT_POLICY yourself to override.
"""
import os as _os

_os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
