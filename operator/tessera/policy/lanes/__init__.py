"""policy/lanes."""
