"""policy/baselines."""
