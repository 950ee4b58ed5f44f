#!/usr/bin/env bash
# Makes sure HAProxy (Debian's package, 2.6) is installed for the end-to-end
# tests and the demo. Installs it when running as root on Debian; otherwise
# stops with the command to run.
set -euo pipefail
if [ -n "${HAPROXY_BIN:-}" ] && [ -x "$HAPROXY_BIN" ]; then exit 0; fi
if command -v haproxy >/dev/null 2>&1 || [ -x /usr/sbin/haproxy ]; then exit 0; fi
if [ "$(id -u)" = 0 ] && [ -f /etc/debian_version ]; then
  echo "ensure-haproxy: installing Debian's haproxy" >&2
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq >&2
  apt-get install -y -qq --no-install-recommends haproxy >&2
  exit 0
fi
echo "ensure-haproxy: HAProxy is missing. Install it with:  sudo apt-get install -y haproxy   (or set HAPROXY_BIN)" >&2
exit 1
