"""The integer EGGROLL port on plain tensors (nano-egg's semantics, egg.c's departures as knobs): xorshift32
(`xorshift`), the population's noise (`noise`), the integer model (`model`), ask/tell by votes (`es`) and the
training loop (`train`)."""
