package testenv

import (
	"cmp"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// haproxy3Series is the HAProxy release scripts/ensure-haproxy3.sh builds
// and caches as haproxy-<version> (e.g. haproxy-3.0.11).
const haproxy3Series = "3.0"

// HAProxy3Bin returns the HAProxy 3.0 LTS binary tests run beside Debian's
// 2.6: $HAPROXY3_BIN if set, else the newest build scripts/ensure-haproxy3.sh
// caches in ${HASTATE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/hastate}/bin.
// Without one the test fails (it is never skipped).
func HAProxy3Bin(t testing.TB) string {
	t.Helper()
	if p := os.Getenv("HAPROXY3_BIN"); p != "" {
		if _, err := os.Stat(p); err != nil {
			t.Fatalf("testenv: HAPROXY3_BIN=%s: %v; unset it or run scripts/ensure-haproxy3.sh", p, err)
		}
		return p
	}
	dir := filepath.Join(cacheDir(), "bin")
	if p := newestHAProxy3(dir); p != "" {
		return p
	}
	t.Fatalf("testenv: no HAProxy %s binary: $HAPROXY3_BIN is unset and %s holds no haproxy-%s.*; "+
		"run `make test` or `scripts/ensure-haproxy3.sh` (it builds Debian trixie's HAProxy %s once, about 2 minutes)",
		haproxy3Series, dir, haproxy3Series, haproxy3Series)
	return ""
}

// newestHAProxy3 returns the cached haproxy-3.0.<n> of dir with the highest
// <n>, or "" when there is none.
func newestHAProxy3(dir string) string {
	matches, _ := filepath.Glob(filepath.Join(dir, "haproxy-"+haproxy3Series+".*"))
	patch := func(p string) int {
		n, err := strconv.Atoi(strings.TrimPrefix(filepath.Base(p), "haproxy-"+haproxy3Series+"."))
		if err != nil {
			return -1
		}
		return n
	}
	matches = slices.DeleteFunc(matches, func(p string) bool { return patch(p) < 0 })
	if len(matches) == 0 {
		return ""
	}
	return slices.MaxFunc(matches, func(a, b string) int { return cmp.Compare(patch(a), patch(b)) })
}
