"""The byte-level LM of spec/lm.py in upstream HyperscaleES style: `model` (the LM, its ES keys and population
scores) and `train` (its trainer, `python -m jax_reference --task lm`)."""
