"""Kernel-level simulator of one GPU shared by a high-priority client and best-effort clients (Orion §6)."""
