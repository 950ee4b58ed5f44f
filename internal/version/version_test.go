package version

import (
	"os"
	"os/exec"
	"path/filepath"
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
		{"go build in a git checkout: the release and the commit", "", "", vcs,
			Info{Version: Release, Revision: "0123456789abcdef", Modified: true}},
		{"go install of a tagged module", "", "", &debug.BuildInfo{Main: debug.Module{Version: "v0.14.0"}},
			Info{Version: "v0.14.0", Revision: "unknown"}},
		{"a pseudo-version without +dirty", "", "", &debug.BuildInfo{Main: debug.Module{Version: "v0.0.0-20260101000000-0123456789ab"}},
			Info{Version: Release, Revision: "unknown"}},
		{"-buildvcs=false, go run: nothing recorded", "", "", &debug.BuildInfo{Main: debug.Module{Version: "(devel)"}},
			Info{Version: Release, Revision: "unknown"}},
		{"no build info", "", "", nil, Info{Version: Release, Revision: "unknown"}},
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

// The VERSION file of the repository is the release this tree builds.
func TestReleaseIsTheVersionFile(t *testing.T) {
	b, err := os.ReadFile("../../VERSION")
	if err != nil {
		t.Fatal(err)
	}
	if got := strings.TrimSpace(string(b)); got != Release {
		t.Fatalf("VERSION says %q, version.Release %q: change both (and CHANGELOG.md)", got, Release)
	}
	cl, err := os.ReadFile("../../CHANGELOG.md")
	if err != nil || !strings.Contains(string(cl), "## "+Release) {
		t.Fatalf("CHANGELOG.md has no section for %s (%v)", Release, err)
	}
}

// A plain `go build` (no -ldflags) in a git checkout names the release and
// the commit: the toolchain's record, read when the linker stamped nothing.
// It builds a clone of this repository's HEAD: the toolchain records
// nothing in a git worktree (its .git is a file), and -buildvcs=true on the
// command line wins over a GOFLAGS=-buildvcs=false.
func TestPlainGoBuildNamesReleaseAndRevision(t *testing.T) {
	top, err := exec.Command("git", "rev-parse", "--show-toplevel").Output()
	if err != nil {
		t.Fatalf("git rev-parse: %v: this test needs the repository's git checkout (a clone, as CI has)", err)
	}
	dir := filepath.Join(t.TempDir(), "clone")
	if out, err := exec.Command("git", "clone", "-q", strings.TrimSpace(string(top)), dir).CombinedOutput(); err != nil {
		t.Fatalf("git clone: %v\n%s", err, out)
	}
	head, err := exec.Command("git", "-C", dir, "rev-parse", "HEAD").Output()
	if err != nil {
		t.Fatal(err)
	}
	release, err := os.ReadFile(filepath.Join(dir, "VERSION"))
	if err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(t.TempDir(), "hastate")
	build := exec.Command("go", "build", "-buildvcs=true", "-o", bin, "./cmd/hastate")
	build.Dir = dir
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	out, err := exec.Command(bin, "version").CombinedOutput()
	if err != nil {
		t.Fatalf("hastate version: %v\n%s", err, out)
	}
	for _, want := range []string{"hastate " + strings.TrimSpace(string(release)) + "\n", "revision:   " + strings.TrimSpace(string(head)) + "\n"} {
		if !strings.Contains(string(out), want) {
			t.Errorf("hastate version of a plain go build printed %q, want %q in it", out, want)
		}
	}
}
