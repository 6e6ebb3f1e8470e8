"""The integer check (`python -m parity int8`): integer EGGROLL three ways (the JAX reference, the torch port, the
C side), every piece compared for equality."""
