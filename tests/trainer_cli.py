"""Bad command lines both LM trainers (python -m jax_reference, python -m torch_impl) refuse alike: exit 2 before any
work, the message saying what is wrong. Each trainer's test adds the cases only it has."""
from __future__ import annotations

BAD_LM_TRAINER_ARGV = [      # (argv, what the message says)
    (["--task", "poem"], "invalid choice"),
    (["--task", "lm", "--corpus", "/nonexistent/corpus.txt"], "no such file"),
    (["--task", "lm", "--group-size", "6"], "does not divide"),
    (["--task", "lm", "--preset", "paper"], "not an LM preset"),
]
