"""Tessera node agent: device plugin, MPS lanes, NVML telemetry."""
