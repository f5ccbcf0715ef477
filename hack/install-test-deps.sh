#!/usr/bin/env bash
# Install the Debian packages the test suite runs for real: `etcd-server` (the store under the real
# kube-apiserver of tests/integration/k8s), `prometheus` (metrics and dashboard queries) and `openssl`
# (test keys and certificates), then hack/install-node-deps.sh for the node harness. The Kubernetes
# binaries are built from Go modules by hack/k8s-assets.sh, the node's images by hack/images.sh.
# Non-interactive and service-free: the tests start etcd and Prometheus themselves on loopback ports, so
# the packages' own services must not start (policy-rc.d answers 101 = "action forbidden").
# Usage: bash hack/install-test-deps.sh   (needs root or sudo for apt-get; installs only what is missing)
set -euo pipefail
cd "$(dirname "$0")/.."

missing=()
command -v etcd >/dev/null 2>&1 || missing+=(etcd-server)
command -v prometheus >/dev/null 2>&1 || missing+=(prometheus)
command -v openssl >/dev/null 2>&1 || missing+=(openssl)  # the test API server's service-account key

if ((${#missing[@]})); then
  # shellcheck source=hack/lib/apt.sh
  source hack/lib/apt.sh
  apt_install hack/install-test-deps.sh "${missing[@]}"
fi
echo "etcd: $(command -v etcd) ($(etcd --version 2>&1 | head -n1))"
echo "prometheus: $(command -v prometheus) ($(prometheus --version 2>&1 | head -n1))"
# What the one-node cluster of tests/integration/node runs and builds its images with (containerd, runc, CNI
# plugins, iptables, conntrack, buildah, mmdebstrap, gcc).
bash hack/install-node-deps.sh
