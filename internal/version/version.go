// Package version says which build of hastate is running: `hastate
// version`, the hastate_build_info metric and the first log line of
// `hastate serve` read it.
package version

import (
	"fmt"
	"runtime"
	"runtime/debug"
	"strings"
)

// Version and Revision are stamped by the linker (`make build`):
//
//	-ldflags "-X github.com/hastate/hastate/internal/version.Version=v1.2.3
//	          -X github.com/hastate/hastate/internal/version.Revision=<commit>"
//
// They are the only package-level variables hastate has, and nothing
// assigns them at run time. Empty means not stamped: Get falls back to
// what the Go toolchain recorded (a `go build` in a git checkout records
// the commit).
var (
	Version  string
	Revision string
)

// Release is this tree's release number, the same as the repository's
// VERSION file (a test holds them equal; CHANGELOG.md says what each
// release changed). It is the version of a build nobody stamped: a plain
// `go build` or `go install` names its release too.
const Release = "0.15.0"

// Info is what a build says about itself.
type Info struct {
	Version   string // stamped, else a module version the toolchain recorded (go install ...@v0.14.0), else Release
	Revision  string // the git commit; "unknown" when nobody recorded it (-buildvcs=false, go run outside git)
	Modified  bool   // built from a work tree with uncommitted changes (toolchain record only)
	GoVersion string // runtime.Version()
}

// Get returns the stamped version and revision, else the toolchain's record.
func Get() Info {
	bi, _ := debug.ReadBuildInfo()
	return get(Version, Revision, bi)
}

func get(version, revision string, bi *debug.BuildInfo) Info {
	i := Info{Version: version, Revision: revision, GoVersion: runtime.Version()}
	if bi != nil {
		if i.Version == "" && tagged(bi.Main.Version) {
			i.Version = bi.Main.Version
		}
		if revision == "" {
			for _, s := range bi.Settings {
				switch s.Key {
				case "vcs.revision":
					i.Revision = s.Value
				case "vcs.modified":
					i.Modified = s.Value == "true"
				}
			}
		}
	}
	if i.Version == "" {
		i.Version = Release
	}
	if i.Revision == "" {
		i.Revision = "unknown"
	}
	return i
}

// tagged reports whether a module version the toolchain recorded names a
// release (v0.14.0), not a pseudo-version made from a commit
// (v0.0.0-20260101000000-0123456789ab+dirty, which says less than the
// revision) or "(devel)".
func tagged(v string) bool {
	if !strings.HasPrefix(v, "v") || strings.Contains(v, "+") {
		return false
	}
	// A pseudo-version has a 14-digit time stamp and a 12-hex commit.
	parts := strings.Split(v, "-")
	return len(parts) == 1 || len(parts[len(parts)-1]) != 12
}

// String is the output of `hastate version`.
func (i Info) String() string {
	rev := i.Revision
	if rev == "unknown" {
		rev += " (not stamped and not recorded: the build ran with -buildvcs=false or outside git; use make build, or go build -buildvcs=true)"
	}
	if i.Modified {
		rev += " (modified)"
	}
	return fmt.Sprintf("hastate %s\n  revision:   %s\n  go version: %s %s/%s\n", i.Version, rev, i.GoVersion, runtime.GOOS, runtime.GOARCH)
}
