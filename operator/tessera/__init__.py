"""Tessera: fair, fractional GPU scheduling for Kubernetes."""

__version__ = "0.1.0"
