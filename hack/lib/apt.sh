# Sourced by the hack/install-*.sh scripts: apt_install WHO PKG... installs Debian packages
# non-interactively without starting their services (the tests start etcd, Prometheus and containerd
# themselves, with their own state): policy-rc.d answers 101 = "action forbidden" during the install only,
# and whatever policy-rc.d was there before is restored. Needs root or sudo.
apt_install() {
  local who=$1
  shift
  local sudo=""
  if [[ "$(id -u)" != "0" ]]; then
    if command -v sudo >/dev/null 2>&1; then
      sudo="sudo"
    else
      echo "$who: need root (or sudo) to apt-get install $*" >&2
      return 1
    fi
  fi
  if ! command -v apt-get >/dev/null 2>&1; then
    echo "$who: apt-get not found; install $* by hand and put them on PATH" >&2
    return 1
  fi
  local policy=/usr/sbin/policy-rc.d backup="" rc=0
  if [[ -e "$policy" ]]; then
    backup=$(mktemp)
    $sudo cp -p "$policy" "$backup"
  fi
  printf '#!/bin/sh\nexit 101\n' | $sudo tee "$policy" >/dev/null
  $sudo chmod +x "$policy"
  echo "$who: installing $*" >&2
  $sudo env DEBIAN_FRONTEND=noninteractive apt-get update -q >&2 \
    && $sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "$@" >&2 \
    || rc=$?
  if [[ -n "$backup" ]]; then $sudo mv "$backup" "$policy"; else $sudo rm -f "$policy"; fi
  return "$rc"
}
