"""policy/themis."""
