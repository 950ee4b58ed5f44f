package history

// The linearizability check: the whole history of a run, judged by
// porcupine (github.com/anishathalye/porcupine, the checker of etcd's
// robustness tests) against a register per server key.
//
//   - A write is an operation from when its writer began it (Write.Began)
//     until it was known to be served (Write.Ended: the harness saw the
//     cluster hold it, or the writer's call returned after the cluster
//     served it). A write whose end is not known (timed out, or never seen
//     served) is pending until the end of the history: it may or may not
//     have taken effect, at any time after it began.
//   - Each answered agent check is a read of the answer it got, from when
//     the check was sent until its answer arrived. An empty answer (refused,
//     closed, timed out: HAProxy keeps its state) is no operation.
//   - Every key starts absent (Absent, "ready 100%").
//
// Ramps are not modelled: a ramp's weight is the leader's raft entry, and
// the tests that use this check run with ramps off.

import (
	"cmp"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"time"

	"github.com/anishathalye/porcupine"
)

// regInput is one operation on one server's register.
type regInput struct {
	server string
	write  bool
	value  string // written, or read
	by     string
}

// registerModel is a register per server, partitioned by server.
var registerModel = porcupine.Model{
	Partition: func(ops []porcupine.Operation) [][]porcupine.Operation {
		by := map[string][]porcupine.Operation{}
		for _, op := range ops {
			s := op.Input.(regInput).server
			by[s] = append(by[s], op)
		}
		out := make([][]porcupine.Operation, 0, len(by))
		for _, s := range slices.Sorted(maps.Keys(by)) {
			out = append(out, by[s])
		}
		return out
	},
	Init: func() any { return Absent },
	Step: func(state, input, _ any) (bool, any) {
		in := input.(regInput)
		if in.write {
			return true, in.value
		}
		return in.value == state.(string), state
	},
	DescribeOperation: func(input, _ any) string {
		in := input.(regInput)
		if in.write {
			return fmt.Sprintf("%s: write %q (%s)", in.server, in.value, in.by)
		}
		return fmt.Sprintf("%s: read %q (%s)", in.server, in.value, in.by)
	},
	DescribeState: func(state any) string { return fmt.Sprintf("%q", state) },
}

// LinearResult is the verdict of Linearizable.
type LinearResult struct {
	// Result is porcupine's: Ok, Illegal (not linearizable) or Unknown
	// (the check ran out of time).
	Result porcupine.CheckResult
	// Reads, Writes and Pending count the operations checked: answered
	// checks, writes, and writes among them whose end is unknown.
	Reads, Writes, Pending int
	// Servers is how many registers were checked; Failing the servers whose
	// history is not linearizable (when Result is Illegal).
	Servers int
	Failing []string
	Took    time.Duration

	info porcupine.LinearizationInfo
}

// Ok reports whether the history is linearizable.
func (r LinearResult) Ok() bool { return r.Result == porcupine.Ok }

func (r LinearResult) String() string {
	s := fmt.Sprintf("%s: %d reads and %d writes (%d of them pending: end unknown) of %d servers, checked in %s",
		r.Result, r.Reads, r.Writes, r.Pending, r.Servers, r.Took.Round(time.Millisecond))
	if len(r.Failing) > 0 {
		s += fmt.Sprintf("; not linearizable: %v", r.Failing)
	}
	return s
}

// Visualize writes porcupine's HTML visualisation of the history (the
// longest linearizable prefix of each server and where it fails) to path.
func (r LinearResult) Visualize(path string) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return fmt.Errorf("visualisation directory: %w", err)
	}
	if err := porcupine.VisualizePath(registerModel, r.info, path); err != nil {
		return fmt.Errorf("write the visualisation %s: %w", path, err)
	}
	return nil
}

// Linearizable checks writes and answers as one history (see the file
// comment), within timeout (0: no limit).
func Linearizable(writes []Write, answers []Answer, timeout time.Duration) LinearResult {
	var r LinearResult
	var last time.Time
	for _, a := range answers {
		last = maxTime(last, a.Ended)
	}
	for _, w := range writes {
		last = maxTime(last, maxTime(w.Began, w.Ended))
	}
	end := last.Add(time.Second) // a pending write's return: after everything
	clients := map[string]int{}
	client := func(name string) int {
		if id, ok := clients[name]; ok {
			return id
		}
		clients[name] = len(clients)
		return clients[name]
	}
	var ops []porcupine.Operation
	servers := map[string]bool{}
	for _, w := range writes {
		ret := w.Ended
		if ret.IsZero() {
			ret = end
			r.Pending++
		}
		r.Writes++
		servers[w.Server] = true
		ops = append(ops, porcupine.Operation{ClientId: client("writer " + cmp.Or(w.By, "?")),
			Input: regInput{server: w.Server, write: true, value: w.Answer, by: cmp.Or(w.By, "?")},
			Call:  w.Began.UnixNano(), Return: ret.UnixNano()})
	}
	for _, a := range answers {
		if a.Line == "" {
			continue
		}
		r.Reads++
		servers[a.Server] = true
		ops = append(ops, porcupine.Operation{ClientId: client(a.Poller),
			Input: regInput{server: a.Server, value: a.Line, by: a.Poller},
			Call:  a.Began.UnixNano(), Return: a.Ended.UnixNano()})
	}
	r.Servers = len(servers)
	began := time.Now()
	r.Result, r.info = porcupine.CheckOperationsVerbose(registerModel, ops, timeout)
	r.Took = time.Since(began)
	if r.Result == porcupine.Illegal {
		// Name the failing servers: each register alone.
		for _, part := range registerModel.Partition(ops) {
			if porcupine.CheckOperationsTimeout(registerModel, part, timeout) == porcupine.Illegal {
				r.Failing = append(r.Failing, part[0].Input.(regInput).server)
			}
		}
	}
	return r
}

func maxTime(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
}

// ArtifactsDir is where a test writes the visualisation of a failing
// history: $HASTATE_ARTIFACTS, else artifacts/ in the test's package
// directory (git-ignored), created if needed.
func ArtifactsDir() (string, error) {
	dir := cmp.Or(os.Getenv("HASTATE_ARTIFACTS"), "artifacts")
	dir, err := filepath.Abs(dir)
	if err == nil {
		err = os.MkdirAll(dir, 0o755)
	}
	if err != nil {
		return "", fmt.Errorf("artifacts directory: %w", err)
	}
	return dir, nil
}
