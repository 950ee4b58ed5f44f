#!/usr/bin/env bash
# Makes sure a headless-capable Chromium (Debian's package) is installed for
# the status page's browser test (test/browser) and prints its path.
# Installs it when running as root on Debian; otherwise stops with the
# command to run. CHROMIUM_BIN, when set to an executable, is used as is.
set -euo pipefail
if [ -n "${CHROMIUM_BIN:-}" ] && [ -x "$CHROMIUM_BIN" ]; then echo "$CHROMIUM_BIN"; exit 0; fi
find_chromium() {
  for c in chromium chromium-browser; do
    if command -v "$c" >/dev/null 2>&1; then command -v "$c"; return 0; fi
  done
  [ -x /usr/bin/chromium ] && { echo /usr/bin/chromium; return 0; }
  return 1
}
if find_chromium; then exit 0; fi
if [ "$(id -u)" = 0 ] && [ -f /etc/debian_version ]; then
  echo "ensure-chromium: installing Debian's chromium" >&2
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq >&2
  apt-get install -y -qq --no-install-recommends chromium >&2
  find_chromium && exit 0
fi
echo "ensure-chromium: Chromium is missing. Install it with:  sudo apt-get install -y chromium   (or set CHROMIUM_BIN)" >&2
exit 1
