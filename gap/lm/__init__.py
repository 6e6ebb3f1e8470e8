"""The LM study (`python -m gap --task lm`): `study` (its arms, plan and resumable run store), `report`, `cli`."""
