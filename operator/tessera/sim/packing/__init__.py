"""Trace-driven GPU packing experiment (FGD's method): `tessera simulate` kind `packing`."""
