#!/usr/bin/env bash
# Prints the path of a Consul binary for tests and the demo.
# Order: $CONSUL_BIN, `consul` on PATH, the cached build, else build v1.13.9
# (MPL-2.0) from the Go module proxy through a throw-away wrapper module.
# The first build takes about 10 minutes on 2 cores; later runs reuse the cache.
set -euo pipefail
version=1.13.9
cache="${HASTATE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/hastate}"
# The "-golinegodebug" suffix names builds made as below, so a cache filled by
# an older version of this script (Go 1.26's GODEBUG defaults) is not reused.
bin="$cache/bin/consul-$version-golinegodebug"

if [ -n "${CONSUL_BIN:-}" ] && [ -x "$CONSUL_BIN" ]; then echo "$CONSUL_BIN"; exit 0; fi
if p=$(command -v consul 2>/dev/null); then echo "$p"; exit 0; fi
if [ -x "$bin" ]; then echo "$bin"; exit 0; fi

echo "ensure-consul: building consul v$version into $bin (about 10 minutes the first time)" >&2
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir -p "$cache/bin"
(
  cd "$work"
  export GOFLAGS=-mod=mod GOTOOLCHAIN=local
  go mod init consulwrapper >/dev/null 2>&1
  go get "github.com/hashicorp/consul@v$version" >&2
  # A main module's `go` line sets the GODEBUG defaults of the binary, and
  # `go get` raised the wrapper's to this toolchain's (1.26). Consul would then
  # route requests and parse URLs as no release of it does (which keys it
  # accepts, for one). Use Consul's own go line, as its release builds did.
  consul_go=$(go list -m -f '{{.GoVersion}}' "github.com/hashicorp/consul")
  go mod edit -go="$consul_go" -toolchain=none
  go build -o "$bin.tmp" github.com/hashicorp/consul >&2
)
mv "$bin.tmp" "$bin"
echo "$bin"
