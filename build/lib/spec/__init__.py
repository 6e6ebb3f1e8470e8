"""The experiment's vocabulary, shared by both sides and every tool: run configuration, presets, knobs and
profiles, the parameter layout, and what a training run returns. Standard library only: nothing of ours."""
