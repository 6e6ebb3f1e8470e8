"""nano-egg's integer EGGROLL (spec/int8.py) in upstream HyperscaleES style: `model` (the QEggRoll noiser and the
EGG model, its windows, tables and votes) and `train` (its trainer, `python -m jax_reference --task int8`)."""
