"""Fake GPU nodes on the real control plane: kwok plays their kubelets and node agents (harness.py)."""
