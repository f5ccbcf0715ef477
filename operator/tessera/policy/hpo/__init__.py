"""policy/hpo."""
