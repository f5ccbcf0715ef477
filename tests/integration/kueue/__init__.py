"""The real Kueue beside the test control plane, on kwok's fake GPU nodes (harness.py)."""
