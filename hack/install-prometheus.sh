#!/usr/bin/env bash
# Install Debian's `prometheus` package when the binary is missing, for the metrics integration tests.
# Non-interactive and service-free: the tests start the binary themselves on a loopback port, so the
# package's own systemd/sysv service must not start (policy-rc.d answers 101 = "action forbidden").
# Usage: bash hack/install-prometheus.sh   (needs root or sudo; does nothing when prometheus is on PATH)
set -euo pipefail

if command -v prometheus >/dev/null 2>&1; then
  echo "prometheus already installed: $(command -v prometheus)"
  exit 0
fi

SUDO=""
if [[ "$(id -u)" != "0" ]]; then
  if command -v sudo >/dev/null 2>&1; then
    SUDO="sudo"
  else
    echo "hack/install-prometheus.sh: need root (or sudo) to apt-get install prometheus" >&2
    exit 1
  fi
fi
if ! command -v apt-get >/dev/null 2>&1; then
  echo "hack/install-prometheus.sh: apt-get not found; install Prometheus >= 2.x by hand and put it on PATH" >&2
  exit 1
fi

# Forbid service starts during the install only; restore whatever policy-rc.d was there before.
POLICY=/usr/sbin/policy-rc.d
BACKUP=""
if [[ -e "$POLICY" ]]; then
  BACKUP=$(mktemp)
  $SUDO cp -p "$POLICY" "$BACKUP"
fi
restore_policy() {
  if [[ -n "$BACKUP" ]]; then $SUDO mv "$BACKUP" "$POLICY"; else $SUDO rm -f "$POLICY"; fi
}
trap restore_policy EXIT
printf '#!/bin/sh\nexit 101\n' | $SUDO tee "$POLICY" >/dev/null
$SUDO chmod +x "$POLICY"

export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -q
$SUDO apt-get install -y -q --no-install-recommends prometheus
echo "installed: $(command -v prometheus) ($(prometheus --version 2>&1 | head -n1))"
