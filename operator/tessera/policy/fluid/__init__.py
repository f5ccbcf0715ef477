"""policy/fluid."""
