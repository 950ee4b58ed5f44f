// Package test holds hastate's end-to-end tests and benchmarks: real Consul,
// real HAProxy and real hastate processes, all on 127.0.0.1.
//
// The end-to-end tests (TestE2E*) read like the runbook: start Consul, start
// hastate, drain, look at HAProxy. TestMain builds the hastate binary once;
// when the tests run with -race the binary is built with -race too, and a
// data race reported by a hastate process fails the test that ran it.
package test

import (
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"
)

// hastateBin is the binary TestMain built for this run.
var hastateBin string

func TestMain(m *testing.M) {
	os.Exit(runMain(m))
}

func runMain(m *testing.M) int {
	flag.Parse()
	if f := os.Getenv(bareProcessEnv); f != "" {
		return bareProcessMain(f)
	}
	if os.Getenv(echoProcessEnv) != "" {
		return echoProcessMain()
	}
	dir, err := os.MkdirTemp("", "hastate-e2e-bin-")
	if err != nil {
		fmt.Fprintln(os.Stderr, "e2e: temp dir for the hastate binary:", err)
		return 1
	}
	defer os.RemoveAll(dir)
	bin, err := buildHastate(dir)
	if err != nil {
		fmt.Fprintln(os.Stderr, "e2e:", err)
		return 1
	}
	hastateBin = bin
	return m.Run()
}

// buildHastate runs `go build ./cmd/hastate` from the module root into dir.
func buildHastate(dir string) (string, error) {
	root, err := filepath.Abs("..")
	if err != nil {
		return "", err
	}
	if _, err := os.Stat(filepath.Join(root, "go.mod")); err != nil {
		return "", fmt.Errorf("module root not found above the test directory: %w", err)
	}
	goBin := filepath.Join(os.Getenv("GOROOT"), "bin", "go")
	if _, err := os.Stat(goBin); os.Getenv("GOROOT") == "" || err != nil {
		goBin = "go"
	}
	bin := filepath.Join(dir, "hastate")
	args := []string{"build", "-o", bin}
	if raceEnabled {
		args = append(args, "-race")
	}
	// HASTATE_E2E_TAGS builds the binary with build tags, e.g.
	// hastate_pprof for the replicas' /debug/pprof/ (a benchmark's
	// profiles; see BenchmarkFleetOperator).
	if tags := os.Getenv("HASTATE_E2E_TAGS"); tags != "" {
		args = append(args, "-tags", tags)
	}
	args = append(args, "./cmd/hastate")
	start := time.Now()
	cmd := exec.Command(goBin, args...)
	cmd.Dir = root
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("go %v: %w\n%s", args, err, out)
	}
	if testing.Verbose() {
		fmt.Fprintf(os.Stderr, "e2e: built %s (race=%v) in %s\n", bin, raceEnabled, time.Since(start).Round(time.Millisecond))
	}
	return bin, nil
}
