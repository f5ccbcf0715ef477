#!/usr/bin/env bash
# Install the Debian packages the one-node cluster of tests/integration/node runs: containerd (the CRI
# runtime) and runc, the CNI plugins (bridge, host-local, loopback, portmap), iptables and conntrack
# (kube-proxy), and what builds the images without a registry: buildah (the Dockerfile) and mmdebstrap (the
# Debian rootfs standing in for python:3.11-slim). The pause image is compiled from hack/images/pause.c by gcc.
# Non-interactive and service-free: the harness starts containerd itself with its own root, state and socket,
# so the package's own service must not start (policy-rc.d answers 101 = "action forbidden").
# Usage: bash hack/install-node-deps.sh   (needs root or sudo for apt-get; installs only what is missing)
set -euo pipefail
cd "$(dirname "$0")/.."

declare -A want=(
  [containerd]=containerd [runc]=runc [ctr]=containerd
  [/usr/lib/cni/bridge]=containernetworking-plugins
  [iptables]=iptables [conntrack]=conntrack [buildah]=buildah [mmdebstrap]=mmdebstrap
  [gcc]=gcc [ip]=iproute2 [mount]=mount [nsenter]=util-linux
)
missing=()
for cmd in "${!want[@]}"; do
  if [[ "$cmd" == /* ]]; then [[ -e "$cmd" ]] && continue
  else command -v "$cmd" >/dev/null 2>&1 && continue; fi
  pkg=${want[$cmd]}
  [[ " ${missing[*]} " == *" $pkg "* ]] || missing+=("$pkg")
done
# The static pause binary needs libc's static archive.
[[ -e /usr/lib/x86_64-linux-gnu/libc.a || -e /usr/lib/aarch64-linux-gnu/libc.a ]] || missing+=(libc6-dev)

if ((${#missing[@]})); then
  # shellcheck source=hack/lib/apt.sh
  source hack/lib/apt.sh
  apt_install hack/install-node-deps.sh "${missing[@]}"
fi
echo "containerd: $(containerd --version 2>&1 | head -n1)"
echo "runc: $(runc --version 2>&1 | head -n1)"
echo "buildah: $(buildah --version 2>&1 | head -n1)"
