#!/usr/bin/env bash
# Build kwok (Kubernetes WithOut Kubelet, sigs.k8s.io/kwok, its own cmd/kwok) from its Go module
# (hack/kwok/go.mod pins it as a `tool`), and print the directory that holds it as the last line:
#
#   TESSERA_KWOK_DIR=$(bash hack/kwok-assets.sh | tail -n1)     # $TESSERA_KWOK_DIR/kwok
#
# kwok plays the kubelets of many fake Node objects against the test control plane (tests/integration/kwok):
# node status and heartbeats, and each pod's life, from the stages the harness writes.
# The directory is ~/.cache/tessera/kwok/<version>-<hash of go.mod, go.sum and the build recipe>: a warm
# cache answers at once, without calling Go; a cold build prints its progress on stderr. Built as upstream
# releases it: static (CGO_ENABLED=0), -trimpath, the version stamped into sigs.k8s.io/kwok/pkg/consts
# (so `kwok --version` prints it).
# Environment: TESSERA_CACHE_DIR (default ~/.cache/tessera), GOFLAGS/GOPROXY as for any Go build. Builds
# of other keys are left in the cache (other checkouts may use them): rm -rf ~/.cache/tessera/kwok frees them.
set -euo pipefail
who=kwok-assets.sh
here="$(cd "$(dirname "$0")" && pwd)"
mod="$here/kwok"
pkg=sigs.k8s.io/kwok
# shellcheck source=lib/go-assets.sh
source "$here/lib/go-assets.sh"

version=$(awk -v p="$pkg" '$1 == p && $2 ~ /^v[0-9]/ {print $2; exit}' "$mod/go.mod")
if [[ -z "$version" ]]; then
  echo "hack/$who: $mod/go.mod must require $pkg at a version" >&2
  exit 1
fi
# The proxy's zip carries no commit, and kwok stamps none: only the version.
buildflags=(-trimpath -buildvcs=false -ldflags "-s -w -X $pkg/pkg/consts.Version=$version")
key=$(go_assets_key "$mod/go.mod" "$mod/go.sum" -- "kwok CGO_ENABLED=0 ${buildflags[*]}")
cache="${TESSERA_CACHE_DIR:-$HOME/.cache/tessera}/kwok"
dest="$cache/$version-$key"

# Warm: the stamp is written last, after the binary is in place.
if [[ -f "$dest/.complete" ]]; then
  echo "$dest"
  exit 0
fi

go_assets_need_go "$mod/go.mod"
go_assets_begin "$cache"
say "building kwok $version from its Go module into $dest"
cd "$mod"
say "downloading modules (go mod download)"
go mod download
say "modules ready"
go_assets_build kwok "$pkg/cmd/kwok" 0 "${buildflags[@]}"
say "kwok: $("$work/kwok" --version 2>&1 | head -n1)"
echo "$version" >"$work/VERSION"
go_assets_finish "$dest"
echo "$dest"
