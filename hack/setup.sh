#!/usr/bin/env bash
# Create .venv (fresh when CI=true) and install Tessera with its test, serving and plots extras.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [[ "${CI:-}" == "true" ]]; then rm -rf .venv; fi
if [[ ! -x .venv/bin/python ]]; then "$PY" -m venv .venv; fi
.venv/bin/python -m pip install -q --upgrade pip
.venv/bin/python -m pip install -q -e '.[test,serving,plots]'
