# Sourced by the hack/*-assets.sh scripts that build a tool from its Go module into ~/.cache/tessera: the
# parts every such build shares. The caller sets `who` (its name in messages) before sourcing.
#
#   go_assets_key DIR FILE... -- RECIPE   16 hex digits of sha256 over the files and the recipe text
#   go_assets_need_go GOMOD               puts /usr/local/go/bin on PATH if needed; fails saying what to install
#   go_assets_begin CACHE                 starts the clock for `say` and makes $work, a fresh build directory
#                                         in CACHE that is removed on exit unless go_assets_finish moves it
#   say MESSAGE                           one progress line on stderr, with the seconds since go_assets_begin
#   go_assets_build NAME PKG CGO ARGS...  go build PKG (ARGS are its flags) to $work/NAME, a heartbeat each minute
#   go_assets_finish DEST                 stamps $work complete (.complete, written last) and moves it to DEST

go_assets_key() {
  local files=() recipe
  while [[ $# -gt 0 && "$1" != "--" ]]; do files+=("$1"); shift; done
  shift
  recipe="$*"
  (cat "${files[@]}" && echo "$recipe") | sha256sum | cut -c1-16
}

go_assets_need_go() {
  # Go's own installer puts it in /usr/local/go, which a non-login shell may not have on PATH.
  if ! command -v go >/dev/null 2>&1 && [[ -x /usr/local/go/bin/go ]]; then PATH="/usr/local/go/bin:$PATH"; fi
  if ! command -v go >/dev/null 2>&1; then
    echo "$who: Go not found on PATH; install Go $(sed -n 's/^go //p' "$1") or later" >&2
    return 1
  fi
}

go_assets_begin() {
  _go_assets_start=$SECONDS
  mkdir -p "$1"
  work=$(mktemp -d "$1/.build.XXXXXX")
  chmod 755 "$work"
  trap 'rm -rf "$work"' EXIT
}

say() { printf '[%s %4ds] %s\n' "${who%.sh}" "$((SECONDS - _go_assets_start))" "$*" >&2; }

go_assets_build() {
  local name=$1 pkg=$2 cgo=$3 ticker
  shift 3
  say "go build $name (CGO_ENABLED=$cgo)"
  (while sleep 60; do say "  ... still compiling $name"; done) &
  ticker=$!
  if ! CGO_ENABLED=$cgo go build "$@" -o "$work/$name" "$pkg"; then
    kill "$ticker" 2>/dev/null || true
    say "go build $name failed"
    return 1
  fi
  kill "$ticker" 2>/dev/null || true
  wait "$ticker" 2>/dev/null || true
}

go_assets_finish() {
  touch "$work/.complete"
  rm -rf "$1"
  mv "$work" "$1"
  trap - EXIT
  say "done in $((SECONDS - _go_assets_start)) s"
}
