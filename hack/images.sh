#!/usr/bin/env bash
# Build the container images the one-node test cluster (tests/integration/node) runs, without a registry, and
# print the directory that holds them as the last line:
#
#   TESSERA_IMAGES=$(bash hack/images.sh [KUBERNETES_ASSETS_DIR])
#
# The directory holds one docker-archive per image (what `ctr -n k8s.io images import` reads) and
# images.env, NAME=reference lines:
#   BASE_IMAGE      docker.io/library/python:3.11.13-slim-bookworm — the Dockerfile's base, stood in for by a
#                   Debian bookworm rootfs with Python 3.11 made by mmdebstrap (not exported: only built on)
#   PAUSE_IMAGE     localhost/tessera/pause:<key> — the pod sandbox, hack/images/pause.c compiled static
#   TESSERA_IMAGE   localhost/tessera:<key> — the repository's Dockerfile, built by buildah
#   WORKER_IMAGE    localhost/tessera/worker:<key> — a model server as a user would build one for a
#                   ModelDeployment: the Tessera image plus pyproject's `serving` extra (ONNX Runtime), so
#                   `tessera worker` runs in it
#   SCHEDULER_IMAGE registry.k8s.io/kube-scheduler:<version> — the chart's kube-scheduler image: the static
#                   kube-scheduler of KUBERNETES_ASSETS_DIR (hack/k8s-assets.sh) on an empty image; only when
#                   that directory is given
# Each image is cached under ~/.cache/tessera/images by a key of what decides it (the package list, the
# source, the build context and its base's key), so a warm cache answers at once; buildah keeps its own layer
# cache in ~/.cache/tessera/images/storage (its own storage: the machine's other images are not touched).
# Only the TESSERA_IMAGES_KEEP (default 3) sets asked for last are kept, with the archives and buildah images
# they name: each source change builds a new Tessera image, and the cache would otherwise grow without end.
# Progress goes to stderr. Needs root, buildah, mmdebstrap and gcc (bash hack/install-node-deps.sh).
# Environment: TESSERA_CACHE_DIR (default ~/.cache/tessera); TESSERA_DEBIAN_MIRROR (default: the first
# deb.debian.org-style URI in /etc/apt/sources*, else http://deb.debian.org/debian).
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
assets="${1:-}"
cache="${TESSERA_CACHE_DIR:-$HOME/.cache/tessera}/images"
mkdir -p "$cache"
start=$SECONDS
say() { printf '[images %4ds] %s\n' "$((SECONDS - start))" "$*" >&2; }
sha() { sha256sum | cut -c1-16; }
B=(buildah --root "$cache/storage" --runroot "$cache/run" --storage-driver overlay)

for tool in buildah mmdebstrap gcc; do
  if ! command -v "$tool" >/dev/null 2>&1; then
    echo "hack/images.sh: $tool not found: run bash hack/install-node-deps.sh" >&2
    exit 1
  fi
done
if [[ "$(id -u)" != 0 ]]; then
  echo "hack/images.sh: needs root (buildah's storage and mmdebstrap's chroot)" >&2
  exit 1
fi

# Serialise concurrent runs (two test sessions): the second waits and then finds the cache warm.
exec 9>"$cache/.lock"
flock 9

# ---- base: Debian bookworm + Python 3.11, named as the Dockerfile's FROM -----------------------------------
BASE_IMAGE=docker.io/library/python:3.11.13-slim-bookworm
mirror="${TESSERA_DEBIAN_MIRROR:-}"
if [[ -z "$mirror" ]]; then
  mirror=$(grep -hoE '^(URIs:|deb) +https?://[^ ]+/debian( |$)' /etc/apt/sources.list /etc/apt/sources.list.d/* \
    2>/dev/null | head -n1 | awk '{print $2}' || true)
  mirror=${mirror:-http://deb.debian.org/debian}
fi
packages=python3.11,python3-venv,python-is-python3,ca-certificates,passwd
base_recipe="bookworm minbase $packages LANG=C.UTF-8"
base_key=$(echo "$base_recipe" | sha)
base_tar="$cache/base-$base_key.tar"
if [[ ! -f "$base_tar" ]]; then
  say "base: mmdebstrap bookworm ($packages) from $mirror"
  tmp="$cache/.base.$$.tar"
  mmdebstrap --quiet --variant=minbase --include="$packages" \
    --dpkgopt='path-exclude=/usr/share/{doc,man,locale,info}/*' --dpkgopt='path-include=/usr/share/doc/*/copyright' \
    --customize-hook='rm -rf "$1"/var/lib/apt/lists/* "$1"/var/cache/apt/*' \
    bookworm "$tmp" "$mirror" "deb ${mirror%/debian}/debian bookworm-updates main" \
    "deb ${mirror%/debian}/debian-security bookworm-security main" >&2
  mv "$tmp" "$base_tar"
  say "base: rootfs $(du -h "$base_tar" | cut -f1)"
fi
# Only the Tessera build reads the base, so the rootfs is imported (once per key) when that build runs.
import_base() {
  local have
  have=$("${B[@]}" inspect --type image --format '{{index .OCIv1.Config.Labels "tessera.base.key"}}' \
    "$BASE_IMAGE" 2>/dev/null || true)
  [[ "$have" == "$base_key" ]] && return
  say "base: importing the rootfs as $BASE_IMAGE"
  local c
  c=$("${B[@]}" from --pull=never scratch)
  "${B[@]}" add --quiet "$c" "$base_tar" / >/dev/null
  "${B[@]}" config --env LANG=C.UTF-8 --env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    --cmd python3 --label "tessera.base.key=$base_key" "$c"
  "${B[@]}" commit --quiet --rm "$c" "$BASE_IMAGE" >/dev/null
}

# ---- pause ---------------------------------------------------------------------------------------------------
pause_key=$( (cat "$root/hack/images/pause.c"; gcc --version | head -n1) | sha)
PAUSE_IMAGE="localhost/tessera/pause:$pause_key"
pause_tar="$cache/pause-$pause_key.tar"
if [[ ! -f "$pause_tar" ]]; then
  say "pause: gcc -static hack/images/pause.c"
  work=$(mktemp -d)
  gcc -static -O2 -s -Wall -Wextra -Werror -o "$work/pause" "$root/hack/images/pause.c"
  c=$("${B[@]}" from --pull=never scratch)
  "${B[@]}" copy --quiet --chmod 0755 "$c" "$work/pause" /pause >/dev/null
  "${B[@]}" config --entrypoint '["/pause"]' --user 65535:65535 "$c"
  "${B[@]}" commit --quiet --rm "$c" "$PAUSE_IMAGE" >/dev/null
  "${B[@]}" push --quiet "$PAUSE_IMAGE" "docker-archive:$pause_tar.tmp:$PAUSE_IMAGE" >&2
  mv "$pause_tar.tmp" "$pause_tar"
  rm -rf "$work"
fi

# ---- tessera: the repository's Dockerfile ------------------------------------------------------------------
# The build context is what .dockerignore lets through; the key hashes exactly those files.
context_files() {
  cd "$root"
  find Dockerfile .dockerignore pyproject.toml README.md operator device-plugin -type f \
    -not -path '*/__pycache__/*' -not -name '*.pyc' -not -path '*/.mypy_cache/*' \
    -not -path '*/.pytest_cache/*' -not -path '*.egg-info/*' | LC_ALL=C sort
}
tessera_key=$( (echo "$base_key"; cd "$root" && context_files | xargs sha256sum) | sha)
TESSERA_IMAGE="localhost/tessera:$tessera_key"
tessera_tar="$cache/tessera-$tessera_key.tar"
if [[ ! -f "$tessera_tar" ]]; then
  import_base
  say "tessera: buildah build -f Dockerfile (layers cached in $cache/storage)"
  t0=$SECONDS
  # pip inside the build uses this machine's pip configuration and CA bundle (a proxy's CA, if any); both are
  # mounted for RUN steps only and end up in no layer.
  mounts=()
  for f in /etc/pip.conf /etc/ssl/certs/ca-certificates.crt; do
    [[ -f "$f" ]] && mounts+=(--volume "$f:$f:ro")
  done
  envs=()
  for v in PIP_INDEX_URL PIP_EXTRA_INDEX_URL PIP_DEFAULT_TIMEOUT HTTPS_PROXY HTTP_PROXY NO_PROXY; do
    [[ -n "${!v:-}" ]] && envs+=(--build-arg "$v=${!v}")
  done
  [[ -f /etc/ssl/certs/ca-certificates.crt ]] && envs+=(--build-arg PIP_CERT=/etc/ssl/certs/ca-certificates.crt)
  (cd "$root" && "${B[@]}" build --quiet --layers --pull=never --network=host "${mounts[@]}" "${envs[@]}" \
    -t "$TESSERA_IMAGE" -f Dockerfile .) >&2
  say "tessera: built in $((SECONDS - t0))s; exporting"
  "${B[@]}" push --quiet "$TESSERA_IMAGE" "docker-archive:$tessera_tar.tmp:$TESSERA_IMAGE" >&2
  mv "$tessera_tar.tmp" "$tessera_tar"
fi

# ---- worker: the Tessera image and the `serving` extra ------------------------------------------------------
serving=$(cd "$root" && python3 -c 'import tomllib; print(" ".join(tomllib.load(open("pyproject.toml", "rb"))["project"]["optional-dependencies"]["serving"]))')
worker_key=$( (echo "$tessera_key $serving") | sha)
WORKER_IMAGE="localhost/tessera/worker:$worker_key"
worker_tar="$cache/worker-$worker_key.tar"
if [[ ! -f "$worker_tar" ]]; then
  if ! "${B[@]}" inspect --type image "$TESSERA_IMAGE" >/dev/null 2>&1; then
    "${B[@]}" pull --quiet "docker-archive:$tessera_tar" >/dev/null
  fi
  say "worker: $TESSERA_IMAGE + $serving"
  c=$("${B[@]}" from --pull=never "$TESSERA_IMAGE")
  mounts=()
  for f in /etc/pip.conf /etc/ssl/certs/ca-certificates.crt; do
    [[ -f "$f" ]] && mounts+=(--volume "$f:$f:ro")
  done
  envs=(--env PIP_NO_CACHE_DIR=1)
  for v in PIP_INDEX_URL PIP_EXTRA_INDEX_URL PIP_DEFAULT_TIMEOUT HTTPS_PROXY HTTP_PROXY NO_PROXY; do
    [[ -n "${!v:-}" ]] && envs+=(--env "$v=${!v}")
  done
  [[ -f /etc/ssl/certs/ca-certificates.crt ]] && envs+=(--env PIP_CERT=/etc/ssl/certs/ca-certificates.crt)
  # shellcheck disable=SC2086  # one requirement per word
  "${B[@]}" run --user 0:0 --network=host "${mounts[@]}" "${envs[@]}" "$c" -- \
    /opt/tessera/bin/pip install --quiet $serving >&2
  "${B[@]}" commit --quiet --rm "$c" "$WORKER_IMAGE" >/dev/null
  "${B[@]}" push --quiet "$WORKER_IMAGE" "docker-archive:$worker_tar.tmp:$WORKER_IMAGE" >&2
  mv "$worker_tar.tmp" "$worker_tar"
fi

# ---- kube-scheduler: the chart's scheduler pod --------------------------------------------------------------
SCHEDULER_IMAGE=""
scheduler_tar=""
if [[ -n "$assets" ]]; then
  bin="$assets/kube-scheduler"
  if [[ ! -x "$bin" ]]; then
    echo "hack/images.sh: $bin not found" >&2
    exit 1
  fi
  version=$("$bin" --version | awk '{print $2}')
  SCHEDULER_IMAGE="registry.k8s.io/kube-scheduler:$version"
  sched_key=$(sha256sum "$bin" | sha)
  scheduler_tar="$cache/kube-scheduler-$sched_key.tar"
  if [[ ! -f "$scheduler_tar" ]]; then
    say "kube-scheduler: $bin as $SCHEDULER_IMAGE"
    c=$("${B[@]}" from --pull=never scratch)
    "${B[@]}" copy --quiet --chmod 0755 "$c" "$bin" /usr/local/bin/kube-scheduler >/dev/null
    "${B[@]}" config --env PATH=/usr/local/bin --user 65532:65532 "$c"
    "${B[@]}" commit --quiet --rm "$c" "$SCHEDULER_IMAGE" >/dev/null
    "${B[@]}" push --quiet "$SCHEDULER_IMAGE" "docker-archive:$scheduler_tar.tmp:$SCHEDULER_IMAGE" >&2
    mv "$scheduler_tar.tmp" "$scheduler_tar"
  fi
fi

# ---- the set: a directory of links to the archives and images.env --------------------------------------------
set_key=$(echo "$pause_key $tessera_key $worker_key $scheduler_tar" | sha)
dest="$cache/set-$set_key"
if [[ ! -f "$dest/images.env" ]]; then
  mkdir -p "$dest"
  ln -sf "$pause_tar" "$dest/pause.tar"
  ln -sf "$tessera_tar" "$dest/tessera.tar"
  ln -sf "$worker_tar" "$dest/worker.tar"
  [[ -n "$scheduler_tar" ]] && ln -sf "$scheduler_tar" "$dest/kube-scheduler.tar"
  {
    echo "BASE_IMAGE=$BASE_IMAGE"
    echo "PAUSE_IMAGE=$PAUSE_IMAGE"
    echo "TESSERA_IMAGE=$TESSERA_IMAGE"
    echo "WORKER_IMAGE=$WORKER_IMAGE"
    echo "SCHEDULER_IMAGE=$SCHEDULER_IMAGE"
  } >"$dest/images.env.tmp"
  mv "$dest/images.env.tmp" "$dest/images.env"
fi
touch "$dest"  # its mtime says when a checkout last asked for it

# ---- pruning: every source change makes a new Tessera image (~1 GiB with the worker), so keep the sets
# asked for last and the archives and buildah images they name; the rest goes.
keep="${TESSERA_IMAGES_KEEP:-3}"
[[ "$keep" =~ ^[0-9]+$ && "$keep" -ge 1 ]] || keep=1  # the set just made is always kept
mapfile -t old_sets < <(ls -1dt "$cache"/set-* 2>/dev/null | tail -n +"$((keep + 1))")
if [[ ${#old_sets[@]} -gt 0 ]]; then
  rm -rf "${old_sets[@]}"
  declare -A kept=(["${base_tar##*/}"]=1)  # by file name: the links may spell the cache another way
  kept_images=" "
  for set in "$cache"/set-*; do
    for link in "$set"/*.tar; do kept["$(basename "$(readlink "$link")")"]=1; done
    kept_images+="$(grep -E '^(TESSERA|WORKER)_IMAGE=' "$set/images.env" | cut -d= -f2 | tr '\n' ' ' || true)"
  done
  freed=0
  for tar in "$cache"/*.tar; do
    [[ -n "${kept[${tar##*/}]:-}" ]] && continue
    freed=$((freed + $(stat -c %s "$tar")))
    rm -f "$tar"
  done
  while read -r name; do
    [[ "$kept_images" == *" $name "* ]] || "${B[@]}" rmi --force "$name" >/dev/null 2>&1 || true
  done < <("${B[@]}" images --format '{{.Name}}:{{.Tag}}' 2>/dev/null | grep -E '^localhost/tessera(/worker)?:' || true)
  "${B[@]}" rmi --prune >/dev/null 2>&1 || true
  say "pruned ${#old_sets[@]} older image sets ($((freed / 1048576)) MiB of archives; TESSERA_IMAGES_KEEP=$keep)"
fi
[[ $((SECONDS - start)) -gt 0 ]] && say "done"
echo "$dest"
