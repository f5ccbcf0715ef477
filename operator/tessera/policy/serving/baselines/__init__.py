"""Serving baselines compared against the serving policies."""
