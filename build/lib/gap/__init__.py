"""The learning-curve study and gap attribution: does a port learn as fast as the reference, and which drift costs how much (`python -m gap`)."""
