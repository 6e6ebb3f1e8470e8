"""The tree ES on plain tensors: key sources per leaf (`keys`), the population's noise (`noise`), ask/tell (`es`), the
byte-level LM's forward (`lm`) and its training loop (`train`)."""
