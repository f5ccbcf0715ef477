#!/usr/bin/env bash
# Build the Kubernetes components the real-cluster tests and the node harness run — kube-apiserver,
# kube-controller-manager, kube-scheduler, kubelet and kube-proxy — from their Go modules (hack/k8s/go.mod
# pins k8s.io/kubernetes and its staging modules), and print the directory that holds them as the last line:
#
#   KUBEBUILDER_ASSETS=$(bash hack/k8s-assets.sh)
#
# The directory is ~/.cache/tessera/k8s/<version>-<hash of go.mod, go.sum, the mains and the build flags>: a
# warm cache answers at once, without calling Go; a cold build prints its progress on stderr (minutes on 2
# cores, most of it compiling k8s.io/kubernetes once for all five). Built the way upstream builds them: -trimpath, the version
# stamped into k8s.io/component-base/version (so `--version` prints it), static (CGO_ENABLED=0) except the
# kubelet, which upstream links dynamically.
# Environment: TESSERA_CACHE_DIR (default ~/.cache/tessera), GOFLAGS/GOPROXY as for any Go build. Builds
# of other keys are left in the cache (other checkouts may use them): rm -rf ~/.cache/tessera/k8s frees them.
set -euo pipefail
who=k8s-assets.sh
here="$(cd "$(dirname "$0")" && pwd)"
# shellcheck source=lib/go-assets.sh
source "$here/lib/go-assets.sh"
mod="$here/k8s"
components=(kube-apiserver kube-controller-manager kube-scheduler kube-proxy kubelet)

# The version go.mod requires of k8s.io/kubernetes (go mod tidy puts it inside a require block).
version=$(awk '$1 == "k8s.io/kubernetes" && $2 ~ /^v[0-9]/ {print $2; exit}' "$mod/go.mod")
if [[ -z "$version" ]]; then
  echo "hack/k8s-assets.sh: no 'require k8s.io/kubernetes vX.Y.Z' line in $mod/go.mod" >&2
  exit 1
fi
minor=${version#v*.}
minor=${minor%%.*}
major=${version#v}
major=${major%%.*}
ldflags="-s -w"
for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
  ldflags+=" -X $pkg.gitVersion=$version -X $pkg.gitMajor=$major -X $pkg.gitMinor=$minor"
  # The module proxy's zip carries no commit: gitCommit stays empty rather than made up.
  ldflags+=" -X $pkg.gitTreeState=clean -X $pkg.gitCommit="
done
# Static (CGO_ENABLED=0) as upstream builds them, except the kubelet, which upstream links dynamically.
cgo_of() { if [[ "$1" == kubelet ]]; then echo 1; else echo 0; fi; }
buildflags=(-trimpath -buildvcs=false -ldflags "$ldflags")
recipe="${components[*]} kubelet-cgo=$(cgo_of kubelet) ${buildflags[*]}"
# Keyed by everything that decides the binaries: the module, the mains and the build recipe above.
key=$(go_assets_key "$mod/go.mod" "$mod/go.sum" "$mod"/*/main.go -- "$recipe")
cache="${TESSERA_CACHE_DIR:-$HOME/.cache/tessera}/k8s"
dest="$cache/$version-$key"

# Warm: the stamp is written last, after every binary is in place.
if [[ -f "$dest/.complete" ]]; then
  echo "$dest"
  exit 0
fi

go_assets_need_go "$mod/go.mod"
go_assets_begin "$cache"
say "building Kubernetes $version from Go modules into $dest"

cd "$mod"
say "downloading modules (go mod download)"
go mod download
say "modules ready"


# One `go build` per component; the second and later reuse the first's compiled packages from the Go build
# cache, so the first takes most of the time. A ticker shows the build is alive while the compiler works.
n=0
for c in "${components[@]}"; do
  n=$((n + 1))
  cgo=$(cgo_of "$c")
  say "($n/${#components[@]}) $c"
  go_assets_build "$c" "./$c" "$cgo" "${buildflags[@]}" || exit 1
  say "($n/${#components[@]}) $c: $("$work/$c" --version 2>&1 | head -n1)"
done

echo "$version" >"$work/VERSION"
go_assets_finish "$dest"
echo "$dest"
