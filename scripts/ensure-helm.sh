#!/usr/bin/env bash
# Prints the path of a Helm CLI for `helm lint`.
# Order: $HELM_BIN, `helm` on PATH, the cached build, else build v3.22.0
# (Apache-2.0) from the Go module proxy with `go install`, cached outside
# the tree. The first build takes about 4 minutes on 2 cores.
set -euo pipefail
version=3.22.0
cache="${HASTATE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/hastate}"
bin="$cache/bin/helm-$version"

if [ -n "${HELM_BIN:-}" ] && [ -x "$HELM_BIN" ]; then echo "$HELM_BIN"; exit 0; fi
if p=$(command -v helm 2>/dev/null); then echo "$p"; exit 0; fi
if [ -x "$bin" ]; then echo "$bin"; exit 0; fi

echo "ensure-helm: building helm v$version into $bin (about 4 minutes the first time)" >&2
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir -p "$cache/bin"
GOBIN="$work" GOTOOLCHAIN=local GOFLAGS=-mod=mod go install "helm.sh/helm/v3/cmd/helm@v$version" >&2
mv "$work/helm" "$bin"
echo "$bin"
