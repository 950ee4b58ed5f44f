package layers

import (
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
)

const module = "github.com/hastate/hastate/"

// allowed is, for each package of the module (its path below the module),
// the packages of the module its non-test files may import: the dependency
// direction of docs/architecture.md. A package missing here fails the
// test, so that a new one is placed in a layer when it is made.
var allowed = map[string][]string{
	// Leaf utilities: imported by the lower layers, import none.
	"internal/accept":    {},
	"internal/lifecycle": {},
	"internal/ratelog":   {},
	"internal/jsonstr":   {},
	"internal/version":   {},
	"internal/layers":    {},
	// Test support: imported by tests only (see TestTestSupportOnlyInTests).
	"internal/testenv":         {},
	"internal/testenv/raftenv": {},
	"internal/history":         {},
	"internal/nemesis":         {},

	// The service, bottom up.
	"state":  {},
	"api":    {"state", "internal/jsonstr"},
	"kvsync": {"state", "api"},
	// cluster/ is the node and its parts. The parts import none of
	// the node and only the fsm of each other (the leader writes its
	// entries): see TestClusterPartsDoNotImportTheNode.
	"cluster/raftport": {"api", "internal/accept", "internal/ratelog"},
	"cluster/fsm":      {"state"},
	"cluster/confirm":  {"state", "api", "internal/ratelog", "internal/jsonstr"},
	"cluster/leader":   {"state", "api", "cluster/fsm"},
	"cluster": {"state", "api", "cluster/raftport", "cluster/fsm", "cluster/confirm", "cluster/leader",
		"internal/lifecycle", "internal/ratelog"},
	"server": {"state", "api", "internal/accept", "internal/ratelog", "internal/jsonstr"},

	// The top layer: the binary, its wiring and the operator library.
	"cmd/hastate/internal/app": {"state", "api", "kvsync", "cluster", "cluster/raftport", "cluster/leader", "server",
		"internal/lifecycle", "internal/version"},
	"cmd/hastate/internal/ctl": {"state", "api"},
	"cmd/hastate/internal/ctl/fleet": {"state", "api", "kvsync",
		"cmd/hastate/internal/ctl"},
	"cmd/hastate/internal/ctl/haproxy": {"state", "api",
		"cmd/hastate/internal/ctl", "cmd/hastate/internal/ctl/fleet"},
	"cmd/hastate/internal/ctl/write": {"state", "api", "kvsync",
		"cmd/hastate/internal/ctl", "cmd/hastate/internal/ctl/fleet", "cmd/hastate/internal/ctl/haproxy"},
	"cmd/hastate/internal/ctl/migration": {"state", "api",
		"cmd/hastate/internal/ctl", "cmd/hastate/internal/ctl/fleet", "cmd/hastate/internal/ctl/write"},
	"cmd/hastate/internal/ctl/adopt": {"state", "api", "kvsync",
		"cmd/hastate/internal/ctl", "cmd/hastate/internal/ctl/write"},
	"cmd/hastate/internal/ctl/status": {"state", "api",
		"cmd/hastate/internal/ctl", "cmd/hastate/internal/ctl/fleet", "cmd/hastate/internal/ctl/haproxy"},
	"cmd/hastate/internal/ctl/internal/ctltest": {"api"},
	"cmd/hastate": {"*"},
}

// imports maps each package directory of the module (below the module)
// to the module packages its files import; tests says whether to read the
// _test.go files or the others. Directories of other modules (a go.mod of
// their own) are left out.
func imports(t *testing.T, tests bool) map[string][]string {
	t.Helper()
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	out := map[string][]string{}
	fset := token.NewFileSet()
	err = filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, path)
		if d.IsDir() {
			if rel != "." && (strings.HasPrefix(d.Name(), ".") || d.Name() == "testdata") {
				return filepath.SkipDir
			}
			if _, err := os.Stat(filepath.Join(path, "go.mod")); err == nil && rel != "." {
				return filepath.SkipDir // another module
			}
			return nil
		}
		if !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") != tests {
			return nil
		}
		f, err := parser.ParseFile(fset, path, nil, parser.ImportsOnly)
		if err != nil {
			return err
		}
		pkg := filepath.ToSlash(filepath.Dir(rel))
		if _, ok := out[pkg]; !ok {
			out[pkg] = nil
		}
		for _, im := range f.Imports {
			p, _ := strconv.Unquote(im.Path.Value)
			if dep, ok := strings.CutPrefix(p, module); ok && !slices.Contains(out[pkg], dep) {
				out[pkg] = append(out[pkg], dep)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func TestDependencyDirection(t *testing.T) {
	got := imports(t, false)
	if len(got) < len(allowed)-1 {
		t.Fatalf("read %d packages, the table names %d: is the walk at the module root?", len(got), len(allowed))
	}
	for pkg, deps := range got {
		ok, known := allowed[pkg]
		if !known {
			t.Errorf("package %s is in no layer: add it to the table in internal/layers and to docs/architecture.md", pkg)
			continue
		}
		if slices.Contains(ok, "*") {
			continue
		}
		for _, dep := range deps {
			if !slices.Contains(ok, dep) {
				t.Errorf("%s imports %s, which docs/architecture.md does not allow (allowed: %s)", pkg, dep, strings.Join(ok, ", "))
			}
		}
	}
	for pkg := range allowed {
		if _, ok := got[pkg]; !ok {
			t.Errorf("the table names %s, which no longer exists: remove it here and in docs/architecture.md", pkg)
		}
	}
}

// The test support packages run real processes (Consul, hastate) and
// record histories: no package but a test may import them.
func TestTestSupportOnlyInTests(t *testing.T) {
	support := []string{"internal/testenv", "internal/testenv/raftenv", "internal/history", "internal/nemesis", "cmd/hastate/internal/ctl/internal/ctltest"}
	for pkg, deps := range imports(t, false) {
		for _, dep := range deps {
			if slices.Contains(support, dep) {
				t.Errorf("%s imports the test support package %s outside its tests", pkg, dep)
			}
		}
	}
}

// The parts of cluster/ (the raft port, the state machine, confirmed
// reads, the leader's duties) are handed to the node: none of them
// imports the node, so that each can be read, changed and tested without
// it (cluster/DESIGN.md). The table above says the same; this test names
// the rule, so that a change of the table alone cannot drop it.
func TestClusterPartsDoNotImportTheNode(t *testing.T) {
	got := imports(t, false)
	for _, part := range []string{"cluster/raftport", "cluster/fsm", "cluster/confirm", "cluster/leader"} {
		deps, ok := got[part]
		if !ok {
			t.Errorf("%s is gone: update this test, the table and cluster/DESIGN.md", part)
		}
		if slices.Contains(deps, "cluster") {
			t.Errorf("%s imports the node (cluster): hand it what it needs through an interface it declares instead", part)
		}
		for _, transportOrFSM := range []string{"cluster/raftport", "cluster/fsm"} {
			if part == transportOrFSM {
				for _, dep := range deps {
					if strings.HasPrefix(dep, "cluster") {
						t.Errorf("%s imports %s: the raft port and the state machine need no other part of cluster/", part, dep)
					}
				}
			}
		}
	}
}
