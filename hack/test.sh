#!/usr/bin/env bash
# Set up what the tests need (.venv, etcd, Prometheus, the Kubernetes test binaries), then lint, type-check
# and run the whole test suite — real control plane included. Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
if [[ "${CI:-}" == "true" || ! -x .venv/bin/tessera ]]; then bash hack/setup.sh; fi
bash hack/install-test-deps.sh
V=.venv/bin
$V/ruff check .
$V/ruff format --check .
$V/mypy -p tessera -p tessera_agent  # strict; generated protobuf modules excluded in pyproject.toml
$V/python -m pytest -q "$@"
