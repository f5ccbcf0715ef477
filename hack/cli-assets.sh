#!/usr/bin/env bash
# Build the command-line tools an admin runs against a Tessera cluster — the Helm 4 CLI (helm.sh/helm/v4,
# its own cmd/helm) and kubectl (k8s.io/kubectl, started by a main of a few lines in hack/cli/kubectl) —
# from their Go modules (hack/cli/go.mod pins both), and print the directory that holds them as the last
# line:
#
#   TESSERA_CLI_DIR=$(bash hack/cli-assets.sh | tail -n1)     # $TESSERA_CLI_DIR/helm, $TESSERA_CLI_DIR/kubectl
#
# The chart tests run these as an admin types them (helm install / upgrade / rollback / uninstall / lint,
# kubectl apply). kubectl is of the test control plane's Kubernetes release (hack/k8s), inside the
# supported version skew; it is the one Helm 4.3 itself builds against.
# The directory is ~/.cache/tessera/cli/helm-<version>-<hash of go.mod, go.sum, the main and the build
# recipe>: a warm cache answers at once, without calling Go; a cold build prints its progress on stderr.
# Built as upstream builds them: static (CGO_ENABLED=0), -trimpath, Helm's version stamped into
# helm.sh/helm/v4/internal/version (so `helm version` prints it) and kubectl's into
# k8s.io/component-base/version and k8s.io/client-go/pkg/version (so `kubectl version --client` does).
# Environment: TESSERA_CACHE_DIR (default ~/.cache/tessera), GOFLAGS/GOPROXY as for any Go build.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
mod="$here/cli"
helm_pkg=helm.sh/helm/v4

of() { awk -v p="$1" '$1 == p && $2 ~ /^v[0-9]/ {print $2; exit}' "$mod/go.mod"; }
helm_version=$(of "$helm_pkg")
kube_version=$(of k8s.io/kubectl)
if [[ -z "$helm_version" || -z "$kube_version" ]]; then
  echo "hack/cli-assets.sh: $mod/go.mod must require $helm_pkg and k8s.io/kubectl at a version" >&2
  exit 1
fi
# k8s.io/kubectl v0.N.P is Kubernetes v1.N.P.
kube_release="v1.${kube_version#v0.}"
minor=${kube_release#v1.}
minor=${minor%%.*}

# The proxy's zips carry no commit: gitCommit stays empty rather than made up.
helm_ldflags="-s -w -X $helm_pkg/internal/version.version=$helm_version"
helm_ldflags+=" -X $helm_pkg/internal/version.metadata= -X $helm_pkg/internal/version.gitTreeState=clean"
kubectl_ldflags="-s -w"
for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
  kubectl_ldflags+=" -X $pkg.gitVersion=$kube_release -X $pkg.gitMajor=1 -X $pkg.gitMinor=$minor"
  kubectl_ldflags+=" -X $pkg.gitTreeState=clean -X $pkg.gitCommit="
done
common=(-trimpath -buildvcs=false)
recipe="helm ${common[*]} $helm_ldflags; kubectl ${common[*]} $kubectl_ldflags; CGO_ENABLED=0"
key=$( (cat "$mod/go.mod" "$mod/go.sum" "$mod"/kubectl/main.go && echo "$recipe") | sha256sum | cut -c1-16)
cache="${TESSERA_CACHE_DIR:-$HOME/.cache/tessera}/cli"
dest="$cache/helm-$helm_version-$key"

# Warm: the stamp is written last, after every binary is in place.
if [[ -f "$dest/.complete" ]]; then
  echo "$dest"
  exit 0
fi

if ! command -v go >/dev/null 2>&1 && [[ -x /usr/local/go/bin/go ]]; then PATH="/usr/local/go/bin:$PATH"; fi
if ! command -v go >/dev/null 2>&1; then
  echo "hack/cli-assets.sh: Go not found on PATH; install Go $(sed -n 's/^go //p' "$mod/go.mod") or later" >&2
  exit 1
fi

start=$SECONDS
say() { printf '[cli-assets %4ds] %s\n' "$((SECONDS - start))" "$*" >&2; }
say "building Helm $helm_version and kubectl $kube_release from Go modules into $dest"
mkdir -p "$cache"
work=$(mktemp -d "$cache/.build.XXXXXX")
chmod 755 "$work"
trap 'rm -rf "$work"' EXIT

cd "$mod"
say "downloading modules (go mod download)"
go mod download
say "modules ready"

build() { # name, ldflags, package
  local name=$1 ldflags=$2 pkg=$3 ticker
  say "go build $name"
  (while sleep 60; do say "  ... still compiling $name"; done) &
  ticker=$!
  if ! CGO_ENABLED=0 go build "${common[@]}" -ldflags "$ldflags" -o "$work/$name" "$pkg"; then
    kill "$ticker" 2>/dev/null || true
    say "go build $name failed"
    exit 1
  fi
  kill "$ticker" 2>/dev/null || true
  wait "$ticker" 2>/dev/null || true
}
# Helm compiles most of client-go, apimachinery and kubectl's packages; kubectl then reuses them from the
# Go build cache.
build helm "$helm_ldflags" "$helm_pkg/cmd/helm"
say "helm: $("$work/helm" version --short 2>&1 | head -n1)"
build kubectl "$kubectl_ldflags" ./kubectl
say "kubectl: $("$work/kubectl" version --client 2>&1 | head -n1)"

printf 'helm %s\nkubectl %s\n' "$helm_version" "$kube_release" >"$work/VERSION"
touch "$work/.complete"
rm -rf "$dest"
mv "$work" "$dest"
trap - EXIT
say "done in $((SECONDS - start)) s"
echo "$dest"
