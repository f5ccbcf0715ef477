#!/usr/bin/env bash
# Lint, type-check and run the test suite in .venv. Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
V=.venv/bin
$V/ruff check .
$V/ruff format --check .
$V/mypy -p tessera.api -p tessera.cluster -p tessera.policy
$V/python -m pytest -q "$@"
