"""Tessera API: resource models and contract constants."""
