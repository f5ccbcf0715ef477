"""policy/serving."""
