// Command mutate removes, one at a time, the safety rules listed in
// mutations.go from a copy of the tree, runs the tests of the rule's
// package, and says which test caught each removal. A removal no test
// notices is a rule nobody keeps: the command fails on it (and on a rule
// whose code is no longer where the table says).
//
// Run it from the repository's root: `make mutate` (or `go run
// ./test/mutate` from test/mutate, with -repo ../..). -only runs the
// mutations whose name contains the given text.
package main

import (
	"bytes"
	"flag"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"time"
)

func main() { os.Exit(run()) }

func run() int {
	repo := flag.String("repo", ".", "the repository's root")
	only := flag.String("only", "", "run only the mutations whose name contains this")
	check := flag.Bool("check", false, "only check that every rule's code is where the table says (once), running no test")
	flag.Parse()
	root, err := filepath.Abs(*repo)
	if err != nil {
		fmt.Fprintln(os.Stderr, "mutate:", err)
		return 2
	}
	if *check {
		return checkTable(root)
	}
	work, err := os.MkdirTemp("", "hastate-mutate-")
	if err != nil {
		fmt.Fprintln(os.Stderr, "mutate:", err)
		return 2
	}
	defer os.RemoveAll(work)
	if err := copyTree(root, work); err != nil {
		fmt.Fprintln(os.Stderr, "mutate: copy the tree:", err)
		return 2
	}
	start := time.Now()
	failed := 0
	fmt.Printf("%-44s %-8s %8s  %s\n", "MUTATION", "RESULT", "TIME", "CAUGHT BY")
	for _, m := range mutations {
		if *only != "" && !strings.Contains(m.Name, *only) {
			continue
		}
		res, took, by := apply(work, m)
		if res != "caught" {
			failed++
		}
		fmt.Printf("%-44s %-8s %7.1fs  %s\n", m.Name, res, took.Seconds(), by)
	}
	fmt.Printf("%d mutations not caught or not applicable; %s in all\n", failed, time.Since(start).Round(time.Second))
	if failed > 0 {
		return 1
	}
	return 0
}

var failLine = regexp.MustCompile(`(?m)^\s*--- FAIL: (\S+)`)

// checkTable reports every mutation whose code is not found exactly once
// (the table went stale with a change of the code): `make test` runs it,
// so that the table cannot rot between runs of `make mutate`.
func checkTable(root string) int {
	bad := 0
	for _, m := range mutations {
		b, err := os.ReadFile(filepath.Join(root, m.File))
		if err != nil {
			fmt.Printf("%s: %v\n", m.Name, err)
			bad++
			continue
		}
		if n := bytes.Count(b, []byte(m.From)); n != 1 {
			fmt.Printf("%s: its code is found %d times in %s (want once): update test/mutate/mutations.go, then run make mutate\n", m.Name, n, m.File)
			bad++
		}
	}
	if bad > 0 {
		return 1
	}
	fmt.Printf("mutate: the code of every one of the %d rules is where the table says\n", len(mutations))
	return 0
}

// apply makes m in work, runs its package's tests and restores the file.
func apply(work string, m mutation) (result string, took time.Duration, by string) {
	path := filepath.Join(work, m.File)
	orig, err := os.ReadFile(path)
	if err != nil {
		return "missing", 0, err.Error()
	}
	if n := bytes.Count(orig, []byte(m.From)); n != 1 {
		return "missing", 0, fmt.Sprintf("the rule's code is found %d times in %s (want once): update mutations.go", n, m.File)
	}
	defer os.WriteFile(path, orig, 0o644)
	if err := os.WriteFile(path, bytes.Replace(orig, []byte(m.From), []byte(m.To), 1), 0o644); err != nil {
		return "missing", 0, err.Error()
	}
	args := []string{"test", "-count=1", "-timeout", "10m"}
	if m.Run != "" {
		args = append(args, "-run", m.Run)
	}
	args = append(args, "./"+m.Package)
	cmd := exec.Command("go", args...)
	cmd.Dir = work
	if m.Module != "" {
		cmd.Dir = filepath.Join(work, m.Module)
	}
	cmd.Env = os.Environ()
	start := time.Now()
	out, err := cmd.CombinedOutput()
	took = time.Since(start)
	if err == nil {
		return "SURVIVED", took, "no test failed: " + m.Why
	}
	var names []string
	for _, f := range failLine.FindAllStringSubmatch(string(out), -1) {
		if !strings.Contains(f[1], "/") || len(names) == 0 {
			names = append(names, f[1])
		}
	}
	if len(names) == 0 {
		// A build failure is no test catching the rule.
		if strings.Contains(string(out), "[build failed]") || strings.Contains(string(out), "[setup failed]") {
			return "BROKEN", took, "the mutation does not compile: fix mutations.go\n" + lastLines(string(out), 5)
		}
		return "caught", took, "(the package's tests failed: " + lastLines(string(out), 1) + ")"
	}
	return "caught", took, strings.Join(names, ", ")
}

func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// copyTree copies the repository's files (not .git, build output or the
// demo's data) into dst.
func copyTree(src, dst string) error {
	return filepath.WalkDir(src, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(src, path)
		if d.IsDir() {
			switch d.Name() {
			case ".git", ".demo", "bin", "node_modules":
				return filepath.SkipDir
			}
			return os.MkdirAll(filepath.Join(dst, rel), 0o755)
		}
		if !d.Type().IsRegular() {
			return nil
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		return os.WriteFile(filepath.Join(dst, rel), b, info.Mode().Perm())
	})
}
