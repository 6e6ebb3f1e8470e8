"""The learning-curve study and gap attribution (`python -m parity gap`)."""
