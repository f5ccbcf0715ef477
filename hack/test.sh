#!/usr/bin/env bash
# Set up what the tests need (.venv, etcd and Prometheus from Debian, the Kubernetes components, the node's
# containerd, the admin CLIs — Helm 4 and kubectl — kwok and Kueue, built from their Go modules), then lint,
# type-check and run the whole test suite — real control plane included.
# Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
if [[ "${CI:-}" == "true" || ! -x .venv/bin/tessera ]]; then bash hack/setup.sh; fi
bash hack/install-test-deps.sh
# Built once (progress on stderr), then answered from ~/.cache/tessera; the last line is the directory.
KUBEBUILDER_ASSETS="$(bash hack/k8s-assets.sh | tail -n1)"
export KUBEBUILDER_ASSETS
# The node harness's containerd 2.x (CDI, for the DRA tests), built here so its minutes show up front; the
# harness asks the same script, answered from the cache.
bash hack/containerd-assets.sh >/dev/null
# The Helm 4 CLI and kubectl the chart and examples tests run as an admin types them (after the Kubernetes
# build, whose compiled client-go and apimachinery packages it reuses from the Go build cache).
TESSERA_CLI_DIR="$(bash hack/cli-assets.sh | tail -n1)"
export TESSERA_CLI_DIR
# kwok, which plays the kubelets and node agents of the fake GPU nodes in tests/integration/kwok (also after
# the Kubernetes build, for the same reason).
TESSERA_KWOK_DIR="$(bash hack/kwok-assets.sh | tail -n1)"
export TESSERA_KWOK_DIR
# The real Kueue with its own CRDs and webhook manifests, which tests/integration/kueue runs beside the
# control plane on kwok nodes (Tessera's team queues are compared with it).
TESSERA_KUEUE_DIR="$(bash hack/kueue-assets.sh | tail -n1)"
export TESSERA_KUEUE_DIR
V=.venv/bin
$V/ruff check .
$V/ruff format --check .
$V/mypy -p tessera -p tessera_agent  # strict; generated protobuf modules excluded in pyproject.toml
# The slowest tests are listed at the end, to see where the suite's time goes.
$V/python -m pytest -q --durations=30 "$@"
