package main

import (
	"bytes"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/hastate/hastate/internal/testenv"
)

// commandsAgainst lists every operator command pointed at consul (host:port),
// a replica's HTTP address and an agent port. The writes ask the replica
// at refused (nothing there) and go on with --force, so that they reach
// Consul.
func commandsAgainst(consul, replica, agent, refused string) [][]string {
	c := []string{"--consul-addr", consul}
	r := []string{"--addr", replica}
	w := append([]string{"--force", "--addr", refused}, c...)
	return [][]string{
		append([]string{"drain", "web/a"}, w...),
		append([]string{"maint", "web/a"}, w...),
		append([]string{"ready", "web/a"}, w...),
		append([]string{"weight", "50%", "web/a"}, w...),
		append([]string{"clear", "web/a"}, w...),
		append([]string{"status"}, r...),
		append(append([]string{"precheck", "web/*"}, c...), r...),
		append(append([]string{"wait", "web/*"}, c...), r...),
		{"probe", "web/a", "--addr", agent},
	}
}

// writeCmds are the commands that write to Consul.
var writeCmds = map[string]bool{"drain": true, "maint": true, "ready": true, "weight": true, "clear": true}

// A hung Consul, replica or agent port (accepts, never answers) costs an
// operator --timeout, not minutes, and the error names what hung and what
// to check.
func TestHungServerGivesUpAtTimeout(t *testing.T) {
	hungConsul, hungReplica, hungAgent := testenv.HungServer(t), testenv.HungServer(t), testenv.HungServer(t)
	// wait reads Consul first; this one answers "no keys" so that wait gets
	// to the hung replica.
	emptyConsul := httptest.NewServer(http.NotFoundHandler())
	t.Cleanup(emptyConsul.Close)
	emptyAddr := strings.TrimPrefix(emptyConsul.URL, "http://")

	refused := fmt.Sprintf("127.0.0.1:%d", testenv.FreePort(t))
	cmds := commandsAgainst(hungConsul, hungReplica, hungAgent, refused)
	cmds = append(cmds, []string{"wait", "web/*", "--consul-addr", emptyAddr, "--addr", "http://" + hungReplica},
		[]string{"precheck", "web/*", "--consul-addr", emptyAddr, "--addr", hungReplica})
	const timeout, slack = time.Second, time.Second
	for _, args := range cmds {
		args = append(args, "--timeout", timeout.String())
		named := hungConsul
		switch {
		case args[0] == "probe":
			named = hungAgent
		case args[0] == "status" || args[0] == "precheck" || args[0] == "wait":
			// The gates ask the replica first which prefix it reads.
			named = hungReplica
		}
		want := 4 // Issue 22.7: cannot confirm
		if args[0] == "probe" {
			want = 1
		}
		t.Run(strings.Join(args, " "), func(t *testing.T) {
			t.Parallel()
			var out bytes.Buffer
			start := time.Now()
			code := run(args, &out, &out)
			took := time.Since(start)
			t.Logf("exit %d after %s: %s", code, took.Round(time.Millisecond), strings.TrimSpace(out.String()))
			if code != want || took < timeout || took > timeout+slack || args[0] == "precheck" && !strings.Contains(out.String(), "cannot confirm") ||
				!strings.Contains(out.String(), named) || !strings.Contains(out.String(), "did not answer within 1s") {
				t.Errorf("exit %d after %s, output %q; want exit %d after %s..%s naming %s", code, took, out.String(), want, timeout, timeout+slack, named)
			}
			// A write reads Consul (consistently) before it writes: a hung
			// Consul stops it there, and it says that nothing was written.
			if named == hungConsul && writeCmds[args[0]] && !strings.Contains(out.String(), "nothing was written") {
				t.Errorf("%q does not say that nothing was written", out.String())
			}
		})
	}
}

// Nothing listening: every command says so at once, naming the address.
func TestRefusedConnectionFailsFast(t *testing.T) {
	addr := fmt.Sprintf("127.0.0.1:%d", testenv.FreePort(t))
	for _, args := range commandsAgainst(addr, addr, addr, addr) {
		var out bytes.Buffer
		start := time.Now()
		code := run(args, &out, &out)
		took := time.Since(start)
		want := 4 // Issue 22.7: cannot confirm
		if args[0] == "probe" {
			want = 1
		}
		if code != want || took > time.Second || !strings.Contains(out.String(), addr) || !strings.Contains(out.String(), "refused the connection") ||
			writeCmds[args[0]] && !strings.Contains(out.String(), "nothing was written") {
			t.Errorf("hastate %s: exit %d after %s, output %q; want exit %d at once, naming %s and the refusal",
				strings.Join(args, " "), code, took, out.String(), want, addr)
		}
	}
}

func TestTimeoutMustBePositive(t *testing.T) {
	var out bytes.Buffer
	if code := run([]string{"status", "--timeout", "0s"}, &out, &out); code != 2 || !strings.Contains(out.String(), "positive duration") {
		t.Fatalf("--timeout 0s: exit %d %q, want a usage error", code, out.String())
	}
}

// A write whose Consul transaction hangs (Consul answered the reads) may
// have been applied: no false comfort, and exit 4 (cannot confirm).
func TestHungTransactionMayHaveBeenApplied(t *testing.T) {
	consul := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/v1/txn" {
			// Read the body, so that the server sees the client close,
			// then hang until the client gives up.
			_, _ = io.Copy(io.Discard, r.Body)
			<-r.Context().Done()
			return
		}
		w.Header().Set("X-Consul-Index", "7")
		http.NotFound(w, r) // no key, as Consul answers a missing key
	}))
	t.Cleanup(consul.Close)
	refused := fmt.Sprintf("127.0.0.1:%d", testenv.FreePort(t))
	for _, args := range [][]string{{"drain", "web/a"}, {"maint", "web/a"}, {"weight", "50%", "web/a"}} {
		args = append(args, "--force", "--addr", refused, "--consul-addr", strings.TrimPrefix(consul.URL, "http://"), "--timeout", "1s")
		var out bytes.Buffer
		code := run(args, &out, &out)
		if code != 4 || !strings.Contains(out.String(), "may or may not have been applied") {
			t.Errorf("hastate %s: exit %d, %q; want exit 4 (cannot confirm) saying the write may have been applied", strings.Join(args, " "), code, out.String())
		}
	}
}
