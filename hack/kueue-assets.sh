#!/usr/bin/env bash
# Build Kueue (sigs.k8s.io/kueue, its own cmd/kueue) from its Go module (hack/kueue/go.mod pins it as a
# `tool`), place its CRDs and webhook manifests from the same module version beside it, and print the
# directory that holds them as the last line:
#
#   TESSERA_KUEUE_DIR=$(bash hack/kueue-assets.sh | tail -n1)   # $TESSERA_KUEUE_DIR/kueue
#
# The directory holds
#   kueue        the manager (controllers, scheduler, webhooks), as upstream's image runs it
#   crd/         config/components/crd of the module: bases/*.yaml, and the kustomization and patches that
#                turn on the conversion webhooks (which of them: crd/kustomization.yaml)
#   webhook/     config/components/webhook: manifests.yaml (the Mutating/ValidatingWebhookConfigurations),
#                the kustomization that adds their namespace selectors, service.yaml
#   manager/     config/components/manager: controller_manager_config.yaml (the Configuration Kueue ships),
#                the Deployment
#   VERSION      the module version
# tests/integration/kueue/harness.py installs them on the test control plane and runs kueue beside it.
# The directory is ~/.cache/tessera/kueue/<version>-<hash of go.mod, go.sum and the build recipe>: a warm
# cache answers at once, without calling Go; a cold build prints its progress on stderr. Built as upstream
# releases it: static (CGO_ENABLED=0), -trimpath, the version stamped into sigs.k8s.io/kueue/pkg/version (the
# manager logs it at start). The module proxy's zip carries no commit and the build no date: GitCommit and
# BuildDate stay empty rather than made up.
# Environment: TESSERA_CACHE_DIR (default ~/.cache/tessera), GOFLAGS/GOPROXY as for any Go build. Builds
# of other keys are left in the cache (other checkouts may use them): rm -rf ~/.cache/tessera/kueue frees them.
set -euo pipefail
who=kueue-assets.sh
here="$(cd "$(dirname "$0")" && pwd)"
mod="$here/kueue"
pkg=sigs.k8s.io/kueue
# shellcheck source=lib/go-assets.sh
source "$here/lib/go-assets.sh"

version=$(awk -v p="$pkg" '$1 == p && $2 ~ /^v[0-9]/ {print $2; exit}' "$mod/go.mod")
if [[ -z "$version" ]]; then
  echo "hack/$who: $mod/go.mod must require $pkg at a version" >&2
  exit 1
fi
# Kueue's Makefile stamps GitVersion, GitCommit and BuildDate (LD_FLAGS); only the version is known here.
v="$pkg/pkg/version"
buildflags=(-trimpath -buildvcs=false -ldflags "-s -w -X $v.GitVersion=$version -X $v.GitCommit= -X $v.BuildDate=")
# The manifests copied below are part of the recipe: a change of what is copied is a new key.
manifests="config/components/crd config/components/webhook config/components/manager"
key=$(go_assets_key "$mod/go.mod" "$mod/go.sum" -- "kueue CGO_ENABLED=0 ${buildflags[*]} manifests: $manifests")
cache="${TESSERA_CACHE_DIR:-$HOME/.cache/tessera}/kueue"
dest="$cache/$version-$key"

# Warm: the stamp is written last, after the binary and the manifests are in place.
if [[ -f "$dest/.complete" ]]; then
  echo "$dest"
  exit 0
fi

go_assets_need_go "$mod/go.mod"
go_assets_begin "$cache"
say "building Kueue $version from its Go module into $dest"
cd "$mod"
say "downloading modules (go mod download)"
go mod download
say "modules ready"
# The module's source tree (read-only in the module cache): the manifests come from the version built.
src=$(go mod download -json "$pkg@$version" | awk -F'"' '$2 == "Dir" {print $4; exit}')
if [[ -z "$src" || ! -d "$src/config/components/crd/bases" || ! -f "$src/config/components/webhook/manifests.yaml" ]]; then
  say "no config/components/crd/bases or webhook/manifests.yaml in $pkg@$version's module (${src:-no Dir})"
  exit 1
fi
for part in $manifests; do
  cp -R "$src/$part" "$work/$(basename "$part")"
done
chmod -R u+w "$work/crd" "$work/webhook" "$work/manager"  # the module cache's files are read-only
say "manifests: $(find "$work/crd/bases" -name '*.yaml' | wc -l) CRDs, webhook/manifests.yaml"
go_assets_build kueue "$pkg/cmd/kueue" 0 "${buildflags[@]}"
say "kueue: $(go version -m "$work/kueue" | awk -v p="$pkg" '$1 == "mod" && $2 == p {print $2, $3}')"
echo "$version" >"$work/VERSION"
go_assets_finish "$dest"
echo "$dest"
