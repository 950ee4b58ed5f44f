#!/usr/bin/env bash
# Prints the path of an HAProxy 3.0 LTS binary for the end-to-end tests,
# which run the HAProxy tests against Debian's 2.6 and this 3.0.
# Order: $HAPROXY3_BIN, the cached build (~/.cache/hastate/bin/haproxy-3.0.*,
# the newest), else build the 3.0 that Debian trixie ships from its source
# package. Trixie's binary package needs glibc 2.38 and bookworm has 2.36, so
# it is built here: the upstream tarball comes through Debian's archive with
# a private apt configuration (one deb-src line for trixie, its own lists
# directory; the machine's apt sources are not touched) and is checked
# against the sha256 of trixie's signed Sources index. The build deps
# (libssl-dev, libpcre2-dev) are installed when running as root on Debian;
# otherwise the script stops with the command to run. The build takes about
# 2.5 minutes on 2 shared cores; later runs reuse the cache.
set -euo pipefail
series=3.0
cache="${HASTATE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/hastate}"

if [ -n "${HAPROXY3_BIN:-}" ]; then
  if [ -x "$HAPROXY3_BIN" ]; then echo "$HAPROXY3_BIN"; exit 0; fi
  echo "ensure-haproxy3: HAPROXY3_BIN=$HAPROXY3_BIN is not an executable file; unset it to build HAProxy $series into $cache/bin" >&2
  exit 1
fi

# cached prints the newest cached build of the series, if any.
cached() {
  local b
  b=$(ls -1 "$cache/bin/haproxy-$series".* 2>/dev/null | grep -E "/haproxy-$series\.[0-9]+$" | sort -V | tail -n1) || true
  [ -n "$b" ] && [ -x "$b" ] && echo "$b"
}
if b=$(cached); then echo "$b"; exit 0; fi

mkdir -p "$cache/bin"
# One build at a time: a second caller waits for the first, then finds it.
exec 9>"$cache/bin/.haproxy-$series.lock"
if command -v flock >/dev/null 2>&1; then
  flock 9
  if b=$(cached); then echo "$b"; exit 0; fi
fi

missing=()
[ -f /usr/include/openssl/ssl.h ] || missing+=(libssl-dev)
[ -f /usr/include/pcre2.h ] || missing+=(libpcre2-dev)
{ command -v make && command -v gcc; } >/dev/null 2>&1 || missing+=(build-essential)
if [ ${#missing[@]} -gt 0 ]; then
  if [ "$(id -u)" = 0 ] && [ -f /etc/debian_version ]; then
    echo "ensure-haproxy3: installing Debian's ${missing[*]} (to build HAProxy $series)" >&2
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq >&2
    apt-get install -y -qq --no-install-recommends "${missing[@]}" >&2
  else
    echo "ensure-haproxy3: building HAProxy $series needs ${missing[*]}. Install them with:  sudo apt-get install -y ${missing[*]}   (or set HAPROXY3_BIN to an HAProxy $series binary)" >&2
    exit 1
  fi
fi

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
start=$(date +%s)

# Trixie's source index through a private apt configuration.
mkdir -p "$work/lists/partial" "$work/src"
echo "deb-src [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] http://deb.debian.org/debian trixie main" >"$work/sources.list"
apt_opts=(-o "Dir::Etc::sourcelist=$work/sources.list" -o Dir::Etc::sourceparts=- -o "Dir::State::Lists=$work/lists"
  -o Dir::Cache::pkgcache= -o Dir::Cache::srcpkgcache= -o APT::Sandbox::User=root)
if ! apt-get "${apt_opts[@]}" update -qq >&2; then
  echo "ensure-haproxy3: could not read Debian trixie's source index from deb.debian.org; check the network (or set HAPROXY3_BIN to an HAProxy $series binary)" >&2
  exit 1
fi
srcinfo=$(apt-cache "${apt_opts[@]}" showsrc haproxy)
debversion=$(awk '/^Version:/ {print $2; exit}' <<<"$srcinfo")
upstream=${debversion%%-*}
upstream=${upstream#*:}
case "$upstream" in
  "$series".*) ;;
  *) echo "ensure-haproxy3: Debian trixie's haproxy is $debversion, not $series.x; set HAPROXY3_BIN to an HAProxy $series binary, or update this script's series" >&2; exit 1 ;;
esac
orig="haproxy_$upstream.orig.tar.gz"
sha=$(awk -v f="$orig" '/^Checksums-Sha256:/ {s=1; next} /^[^ ]/ {s=0} s && $3 == f {print $1; exit}' <<<"$srcinfo")
echo "ensure-haproxy3: building HAProxy $upstream (Debian trixie $debversion) into $cache/bin/haproxy-$upstream (about 2.5 minutes the first time)" >&2

# Only the upstream tarball is needed; the .dsc and the Debian patches of a
# security update can be missing from the mirror, so their failure is not
# fatal: the tarball is checked below.
(cd "$work/src" && apt-get "${apt_opts[@]}" source --download-only -qq haproxy >&2 2>"$work/source.err") || true
if [ ! -f "$work/src/$orig" ] || [ -z "$sha" ] || ! echo "$sha  $work/src/$orig" | sha256sum -c --quiet - >&2; then
  cat "$work/source.err" >&2
  echo "ensure-haproxy3: could not fetch $orig (sha256 ${sha:-unknown}) from Debian trixie; check the network (or set HAPROXY3_BIN to an HAProxy $series binary)" >&2
  exit 1
fi
tar -xzf "$work/src/$orig" -C "$work/src"

# Debian's options (debian/rules) that need nothing beyond libssl and
# libpcre2: OpenSSL, PCRE2 with its JIT, the Prometheus exporter (`hastate
# verify`, `wait --idle`), version and date as Debian stamps them. Left
# out: Lua, OpenTracing and systemd notification (more libraries, unused
# by the tests).
verdate=$(date -u -d "@$start" +%Y/%m/%d)
make -C "$work/src/haproxy-$upstream" -j"$(nproc 2>/dev/null || echo 2)" \
  TARGET=linux-glibc USE_OPENSSL=1 USE_PCRE2=1 USE_PCRE2_JIT=1 USE_PROMEX=1 \
  IGNOREGIT=true VERSION="$upstream" SUBVERS="-hastate-trixie-$debversion" VERDATE="$verdate" >"$work/build.log" 2>&1 || {
  tail -n 40 "$work/build.log" >&2
  echo "ensure-haproxy3: building HAProxy $upstream failed (the last 40 lines of the build are above); fix the build deps, or set HAPROXY3_BIN to an HAProxy $series binary" >&2
  exit 1
}
bin="$cache/bin/haproxy-$upstream"
"$work/src/haproxy-$upstream/haproxy" -vv | grep -q "Built with the Prometheus exporter" || {
  echo "ensure-haproxy3: the built HAProxy $upstream has no Prometheus exporter (haproxy -vv says so); the make line above this message must keep USE_PROMEX=1" >&2
  exit 1
}
cp "$work/src/haproxy-$upstream/haproxy" "$bin.tmp"
mv "$bin.tmp" "$bin"
echo "ensure-haproxy3: built $("$bin" -v | head -n1) in $(($(date +%s) - start))s" >&2
echo "$bin"
