// Package version says which build of hastate is running: `hastate
// version`, the hastate_build_info metric and the first log line of
// `hastate serve` read it.
package version

import (
	"fmt"
	"runtime"
	"runtime/debug"
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

// Info is what a build says about itself.
type Info struct {
	Version   string // "dev" when neither stamped nor recorded by the toolchain
	Revision  string // the git commit; "unknown" when nobody recorded it (go test, go run outside git)
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
		if i.Version == "" && bi.Main.Version != "" && bi.Main.Version != "(devel)" {
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
		i.Version = "dev"
	}
	if i.Revision == "" {
		i.Revision = "unknown"
	}
	return i
}

// String is the output of `hastate version`.
func (i Info) String() string {
	rev := i.Revision
	if i.Modified {
		rev += " (modified)"
	}
	return fmt.Sprintf("hastate %s\n  revision:   %s\n  go version: %s %s/%s\n", i.Version, rev, i.GoVersion, runtime.GOOS, runtime.GOARCH)
}
