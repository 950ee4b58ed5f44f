package test

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/hastate/hastate/internal/testenv"
)

// ReloadWindow: for how long, and for how many new connections, a server
// drained through hastate is served again after a soft reload of HAProxy
// (-x <admin socket> -sf <old pid>), while a client opens connections
// through the frontend without pause, per HAProxy release and per
// configuration. Production's check intervals (check inter 2s, agent-inter
// 2s) are the baseline; each other configuration changes one thing. The
// backend has two servers; the drained one is the second unless the
// configuration says "first": HAProxy starts the checks of a configuration
// spread over the smallest inter (>= 1s) in the order of the server lines,
// a server's health check then its agent check, so a server's window
// depends on its place. Figures land in the README's HAProxy section.
//
// window_ms is from the start of the new process to the drained server's
// last new connection (0 when it took none), the mean over reloadRounds
// reloads; window_ratio is that against the same release's baseline.

// reloadRounds is how many reloads each configuration is measured over.
const reloadRounds = 3

// reloadConfig is one configuration of BenchmarkReloadWindow.
type reloadConfig struct {
	name      string
	x         hapExtras // release, server and state file are set by the benchmark
	first     bool      // the drained server is the first server line
	stateFile bool      // save `show servers state` before each reload, and load it
	mayReject bool      // a release may refuse it: measured only where `haproxy -c` accepts it
}

var reloadConfigs = []reloadConfig{
	{name: "baseline", x: hapExtras{inter: 2 * time.Second, agentInter: 2 * time.Second}},
	{name: "baseline-drained-first", x: hapExtras{inter: 2 * time.Second, agentInter: 2 * time.Second}, first: true},
	{name: "agent-inter-500ms", x: hapExtras{inter: 2 * time.Second, agentInter: 500 * time.Millisecond}},
	{name: "fastinter-200ms", x: hapExtras{inter: 2 * time.Second, agentInter: 2 * time.Second, serverOpts: " fastinter 200ms"}},
	{name: "inter-500ms-agent-inter-500ms", x: hapExtras{inter: 500 * time.Millisecond, agentInter: 500 * time.Millisecond}},
	{name: "spread-checks-50", x: hapExtras{inter: 2 * time.Second, agentInter: 2 * time.Second, global: "    spread-checks 50\n"}},
	{name: "max-spread-checks-1ms", x: hapExtras{inter: 2 * time.Second, agentInter: 2 * time.Second, global: "    max-spread-checks 1ms\n"}},
	{name: "init-state-down", x: hapExtras{inter: 2 * time.Second, agentInter: 2 * time.Second, serverOpts: " init-state down"}, mayReject: true},
	{name: "server-state-file", x: hapExtras{inter: 2 * time.Second, agentInter: 2 * time.Second}, stateFile: true},
}

func BenchmarkReloadWindow(b *testing.B) {
	consul := testenv.StartConsul(b, testenv.ConsulOptions{})
	hs := StartHastate(b, HastateOptions{ConsulAddr: consul.Addr()})
	op := hs.Operator("--force") // before HAProxy has polled both servers
	type row struct {
		release, config string
		conns, windowMs float64 // means over the reloads
		longest         time.Duration
		ratio           float64 // windowMs against the release's baseline
		rejected        string  // what `haproxy -c` said, when it refused the configuration
	}
	var rows []row
	for _, r := range haproxyReleases(b) {
		var baseline float64
		for i, c := range reloadConfigs {
			res := row{release: r.String(), config: c.name}
			if c.mayReject {
				if res.rejected = rejects(b, r, c.x); res.rejected != "" {
					rows = append(rows, res)
					continue
				}
			}
			b.Run(r.String()+"/"+c.name, func(b *testing.B) {
				for b.Loop() {
					res.conns, res.windowMs, res.longest = measureReloads(b, op, hs, r, i, c)
				}
				if c.name == "baseline" {
					baseline = res.windowMs
				}
				if baseline > 0 {
					res.ratio = res.windowMs / baseline
				}
				b.ReportMetric(res.conns, "conns/reload")
				b.ReportMetric(res.windowMs, "window_ms")
				b.ReportMetric(float64(res.longest.Milliseconds()), "max_window_ms")
				b.ReportMetric(res.ratio, "window_ratio")
			})
			rows = append(rows, res)
		}
	}
	fmt.Printf("a drained server across a soft reload (-x -sf), %d reloads per configuration, a client connecting without pause\n", reloadRounds)
	fmt.Printf("(window_ms: from the new process's start to the drained server's last new connection):\n")
	fmt.Printf("  %-12s %-30s %12s %10s %14s %12s\n", "release", "configuration", "conns/reload", "window_ms", "max_window_ms", "window_ratio")
	for _, r := range rows {
		if r.rejected != "" {
			fmt.Printf("  %-12s %-30s rejected by haproxy -c: %s\n", r.release, r.config, r.rejected)
			continue
		}
		fmt.Printf("  %-12s %-30s %12.1f %10.0f %14d %12.2f\n", r.release, r.config, r.conns, r.windowMs, r.longest.Milliseconds(), r.ratio)
	}
}

// rejects returns the first alert of release r's `haproxy -c` on a minimal
// configuration with x's global lines and server options, or "" when it
// accepts it.
func rejects(b *testing.B, r haproxyRelease, x hapExtras) string {
	b.Helper()
	cfg := fmt.Sprintf("global\n%s\ndefaults\n    mode tcp\n    timeout connect 1s\n    timeout client 1s\n    timeout server 1s\n\nbackend be\n    server s 127.0.0.1:1 check%s\n", x.global, x.serverOpts)
	path := filepath.Join(b.TempDir(), "haproxy.cfg")
	if err := os.WriteFile(path, []byte(cfg), 0o644); err != nil {
		b.Fatal(err)
	}
	out, err := exec.Command(r.Bin, "-c", "-f", path).CombinedOutput()
	if err == nil {
		return ""
	}
	// "[ALERT]    (1) : config : [<file>:10] : 'server be/s' : unknown keyword 'init-state'."
	for _, l := range strings.Split(string(out), "\n") {
		if strings.Contains(l, "ALERT") {
			parts := strings.Split(l, " : ")
			return strings.TrimSpace(parts[len(parts)-1])
		}
	}
	return strings.TrimSpace(string(out))
}

// measureReloads measures one configuration: an HAProxy of release r in
// front of two sinks, one drained through hastate, a load client, and
// reloadRounds reloads. It returns the mean connections the drained server
// took per reload, the mean window in milliseconds and the longest one.
func measureReloads(b *testing.B, op Operator, hs *Hastate, r haproxyRelease, i int, c reloadConfig) (conns, windowMs float64, longest time.Duration) {
	b.Helper()
	be := Backend{Name: fmt.Sprintf("bench_reload_%s_%d", strings.ReplaceAll(r.Series, ".", ""), i), Servers: []string{"s1", "s2"}}
	drainedName, readyName := "s2", "s1"
	if c.first {
		drainedName, readyName = readyName, drainedName
	}
	sinks := map[string]*sink{"s1": startSink(b), "s2": startSink(b)}
	x := c.x
	x.release = r
	var hap *HAProxy
	stateFile := ""
	if c.stateFile {
		hap, stateFile = startStateFileHAProxy(b, r, hs.AgentAddr, be, sinks, x)
	} else {
		x.server = func(_, s string) string { return sinks[s].Addr() }
		hap = startHAProxy(b, hs.AgentAddr, nil, "", []Backend{be}, x)
	}
	drained := be.Name + "/" + drainedName
	op.Run(b, "drain", drained)
	hap.WaitServer(b, drained, statDrainAgent, -1)
	client := startLoadClient(b, hap.Frontend)
	defer client.Stop(b)
	var total time.Duration
	for round := range reloadRounds {
		if stateFile != "" {
			hap.SaveServerState(b, stateFile)
		}
		w := measureReload(b, hap, client, sinks[drainedName], sinks[readyName], drained)
		b.Logf("%s %s reload %d: %s", r, c.name, round+1, w)
		conns += float64(w.Conns)
		if w.Conns > 0 {
			total += w.Last
			longest = max(longest, w.Last)
		}
	}
	return conns / reloadRounds, float64(total.Milliseconds()) / reloadRounds, longest
}
