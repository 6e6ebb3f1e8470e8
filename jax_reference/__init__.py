"""JAX reference: the EggRoll noiser and MLP with the upstream HyperscaleES interface, plus a CartPole trainer; the
byte-level LM of spec/lm.py lives in `jax_reference.lm` and nano-egg's integer LM in `jax_reference.int8`
(each: `model`, `train`)."""
from jax_reference.models import (ACTIVATIONS, EMB_PARAM, EXCLUDED, MLP, MM, MM_PARAM, PARAM, TMM, CommonInit,
                                  CommonParams, Embedding, Linear, Model, Parameter, layer_norm, simple_es_tree_key)
from jax_reference.noiser import EggRoll, Noiser

__all__ = ["ACTIVATIONS", "EMB_PARAM", "EXCLUDED", "MLP", "MM", "MM_PARAM", "PARAM", "TMM", "CommonInit",
           "CommonParams", "Embedding", "Linear", "Model", "Parameter", "layer_norm", "simple_es_tree_key",
           "EggRoll", "Noiser"]
