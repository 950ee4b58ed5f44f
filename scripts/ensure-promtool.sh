#!/usr/bin/env bash
# Makes sure promtool (Debian's prometheus package) is installed for the
# alert rule checks of `make test`. Installs it when running as root on
# Debian (without starting the Prometheus service); otherwise stops with the
# command to run. Prints promtool's path.
set -euo pipefail
if [ -n "${PROMTOOL:-}" ] && [ -x "$PROMTOOL" ]; then echo "$PROMTOOL"; exit 0; fi
if command -v promtool >/dev/null 2>&1; then command -v promtool; exit 0; fi
if [ "$(id -u)" = 0 ] && [ -f /etc/debian_version ]; then
  echo "ensure-promtool: installing Debian's prometheus (for promtool)" >&2
  export DEBIAN_FRONTEND=noninteractive
  # Keep the package's service from starting: only promtool is wanted.
  cleanup=
  if [ ! -e /usr/sbin/policy-rc.d ]; then
    printf '#!/bin/sh\nexit 101\n' > /usr/sbin/policy-rc.d
    chmod +x /usr/sbin/policy-rc.d
    cleanup=1
  fi
  apt-get update -qq >&2
  apt-get install -y -qq --no-install-recommends prometheus >&2
  if [ -n "$cleanup" ]; then rm -f /usr/sbin/policy-rc.d; fi
  command -v promtool
  exit 0
fi
echo "ensure-promtool: promtool is missing. Install it with:  sudo apt-get install -y prometheus   (or set PROMTOOL)" >&2
exit 1
