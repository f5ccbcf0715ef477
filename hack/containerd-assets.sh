#!/usr/bin/env bash
# Build containerd and its runc shim (containerd-shim-runc-v2) from their Go module (hack/containerd/go.mod
# pins github.com/containerd/containerd/v2 as tools) and print the directory that holds them as the last line:
#
#   CONTAINERD_BIN_DIR=$(bash hack/containerd-assets.sh | tail -n1)
#
# Debian bookworm's containerd is 1.6, which has no Container Device Interface; DRA drivers hand their devices
# to containers as CDI devices, so the node harness runs this build when a test needs them. The directory is
# ~/.cache/tessera/containerd/<version>-<hash of go.mod, go.sum and the build recipe>: a warm cache answers at
# once, without calling Go; a cold build prints its progress on stderr. Static (CGO_ENABLED=0, as upstream's
# static release): the cgo-only snapshotters (btrfs) drop out, the harness uses overlayfs.
# Environment: TESSERA_CACHE_DIR (default ~/.cache/tessera), GOFLAGS/GOPROXY as for any Go build.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
mod="$here/containerd"
pkg=github.com/containerd/containerd/v2
binaries=(containerd containerd-shim-runc-v2)

version=$(awk -v p="$pkg" '$1 == p && $2 ~ /^v[0-9]/ {print $2; exit}' "$mod/go.mod")
if [[ -z "$version" ]]; then
  echo "hack/containerd-assets.sh: no '$pkg vX.Y.Z' requirement in $mod/go.mod" >&2
  exit 1
fi
# containerd stamps its version here (`containerd --version`); the proxy's zip carries no commit.
ldflags="-s -w -X $pkg/version.Version=$version -X $pkg/version.Revision="
tags="no_btrfs no_devmapper no_zfs"
buildflags=(-trimpath -buildvcs=false -tags "$tags" -ldflags "$ldflags")
recipe="${binaries[*]} CGO_ENABLED=0 ${buildflags[*]}"
key=$( (cat "$mod/go.mod" "$mod/go.sum" && echo "$recipe") | sha256sum | cut -c1-16)
cache="${TESSERA_CACHE_DIR:-$HOME/.cache/tessera}/containerd"
dest="$cache/$version-$key"

# Warm: the stamp is written last, after every binary is in place.
if [[ -f "$dest/.complete" ]]; then
  echo "$dest"
  exit 0
fi

if ! command -v go >/dev/null 2>&1 && [[ -x /usr/local/go/bin/go ]]; then PATH="/usr/local/go/bin:$PATH"; fi
if ! command -v go >/dev/null 2>&1; then
  echo "hack/containerd-assets.sh: Go not found on PATH; install Go $(sed -n 's/^go //p' "$mod/go.mod") or later" >&2
  exit 1
fi

start=$SECONDS
say() { printf '[containerd-assets %4ds] %s\n' "$((SECONDS - start))" "$*" >&2; }
say "building containerd $version from Go modules into $dest"
mkdir -p "$cache"
work=$(mktemp -d "$cache/.build.XXXXXX")
chmod 755 "$work"
trap 'rm -rf "$work"' EXIT

cd "$mod"
say "downloading modules (go mod download)"
go mod download
say "modules ready"
n=0
for b in "${binaries[@]}"; do
  n=$((n + 1))
  say "($n/${#binaries[@]}) go build $b"
  (while sleep 60; do say "  ... still compiling $b"; done) &
  ticker=$!
  if ! CGO_ENABLED=0 go build "${buildflags[@]}" -o "$work/$b" "$pkg/cmd/$b"; then
    kill "$ticker" 2>/dev/null || true
    say "go build $b failed"
    exit 1
  fi
  kill "$ticker" 2>/dev/null || true
  wait "$ticker" 2>/dev/null || true
done
say "containerd: $("$work/containerd" --version 2>&1 | head -n1)"

echo "$version" >"$work/VERSION"
touch "$work/.complete"
rm -rf "$dest"
mv "$work" "$dest"
trap - EXIT
say "done in $((SECONDS - start)) s"
echo "$dest"
