#!/usr/bin/env bash
# Makes sure podman (Debian's package) is installed for `make image` and the
# container end-to-end test. Installs it when running as root on Debian;
# otherwise stops with the command to run.
set -euo pipefail
# runc too: crun (podman's default) refuses hosts with cgroups in hybrid mode.
if command -v podman >/dev/null 2>&1 && command -v runc >/dev/null 2>&1; then exit 0; fi
if [ "$(id -u)" = 0 ] && [ -f /etc/debian_version ]; then
  echo "ensure-podman: installing Debian's podman" >&2
  export DEBIAN_FRONTEND=noninteractive
  if apt-get update -qq >&2 && apt-get install -y -qq --no-install-recommends podman uidmap runc >&2; then
    exit 0
  fi
  echo "ensure-podman: installing podman failed" >&2
  exit 1
fi
echo "ensure-podman: podman is missing. Install it with:  sudo apt-get install -y podman runc" >&2
exit 1
