package version

import (
	"runtime"
	"runtime/debug"
	"strings"
	"testing"
)

func TestGet(t *testing.T) {
	vcs := &debug.BuildInfo{
		Main:     debug.Module{Version: "v0.0.0-20260101000000-0123456789ab+dirty"},
		Settings: []debug.BuildSetting{{Key: "vcs.revision", Value: "0123456789abcdef"}, {Key: "vcs.modified", Value: "true"}},
	}
	for _, tt := range []struct {
		name              string
		version, revision string
		bi                *debug.BuildInfo
		want              Info
	}{
		{"stamped by make build", "v1.2.0-3-gabc-dirty", "abcdef", vcs,
			Info{Version: "v1.2.0-3-gabc-dirty", Revision: "abcdef"}},
		{"go build in a git checkout", "", "", vcs,
			Info{Version: "v0.0.0-20260101000000-0123456789ab+dirty", Revision: "0123456789abcdef", Modified: true}},
		{"go test, go run: nothing recorded", "", "", &debug.BuildInfo{Main: debug.Module{Version: "(devel)"}},
			Info{Version: "dev", Revision: "unknown"}},
		{"no build info", "", "", nil, Info{Version: "dev", Revision: "unknown"}},
	} {
		tt.want.GoVersion = runtime.Version()
		if got := get(tt.version, tt.revision, tt.bi); got != tt.want {
			t.Errorf("%s: get = %+v, want %+v", tt.name, got, tt.want)
		}
	}
}

func TestString(t *testing.T) {
	s := Info{Version: "v1.2.0", Revision: "abcdef", Modified: true, GoVersion: "go1.26.8"}.String()
	for _, want := range []string{"hastate v1.2.0\n", "revision:   abcdef (modified)\n", "go version: go1.26.8 " + runtime.GOOS + "/" + runtime.GOARCH + "\n"} {
		if !strings.Contains(s, want) {
			t.Errorf("String() = %q, want it to contain %q", s, want)
		}
	}
}
