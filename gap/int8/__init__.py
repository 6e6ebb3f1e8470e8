"""The integer study (`python -m gap --task int8`): `study` (its fractional design and runs), `curves`, `report`,
`cli`; its runs go in the LM study's resumable store (gap.lm)."""
