package test

import (
	"bufio"
	"fmt"
	"net"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	consulapi "github.com/hashicorp/consul/api"
	"github.com/hastate/hastate/api"
	"github.com/hastate/hastate/internal/testenv"
)

// The migration from the runbook's per-node agent (docs/migration.md):
// three replicas and a per-node agent serve one prefix,
// gitlab-haproxy-agent/, while HAProxy nodes move from the agent to
// hastate one at a time.

// nodeAgent is the runbook's per-node agent, written here from its
// contract and nothing else: HAProxy connects, sends
// "<backend>/<server>\n"; the agent reads
// <prefix>state/<backend>/<server> from Consul KV and answers one line for
// the four words (absent or ready: "ready 100%", drain: "drain", maint:
// "maint", N%: "ready N%", N from 0 to 256), and nothing for anything else
// (a JSON value, a typo, Consul unreachable): it closes the connection.
// No backend-wide keys, no meta keys, no expiry, no ramps.
type nodeAgent struct {
	Addr     string
	kv       *consulapi.KV
	prefix   string
	override map[string]string // server -> line to answer instead ("": nothing); a broken agent
	ln       net.Listener
	wg       sync.WaitGroup
}

func startNodeAgent(t *testing.T, consul *testenv.Consul, prefix string, override map[string]string) *nodeAgent {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	a := &nodeAgent{Addr: ln.Addr().String(), kv: consul.Client(t).KV(), prefix: prefix, override: override, ln: ln}
	a.wg.Add(1)
	go func() {
		defer a.wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			a.wg.Add(1)
			go func() {
				defer a.wg.Done()
				a.serve(c)
			}()
		}
	}()
	t.Cleanup(func() { _ = ln.Close(); a.wg.Wait() })
	return a
}

func (a *nodeAgent) serve(c net.Conn) {
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(2 * time.Second))
	req, err := bufio.NewReaderSize(c, 512).ReadString('\n')
	if err != nil {
		return
	}
	req = strings.TrimRight(req, "\r\n")
	if line, ok := a.override[req]; ok {
		if line != "" {
			_, _ = c.Write([]byte(line + "\n"))
		}
		return
	}
	if line := a.answer(req); line != "" {
		_, _ = c.Write([]byte(line + "\n"))
	}
}

// answer is the agent's line for a request, "" for none.
func (a *nodeAgent) answer(req string) string {
	if b, s, ok := strings.Cut(req, "/"); !ok || b == "" || s == "" {
		return ""
	}
	pair, _, err := a.kv.Get(a.prefix+"state/"+req, nil)
	if err != nil {
		return ""
	}
	if pair == nil {
		return "ready 100%"
	}
	switch w := strings.TrimSpace(string(pair.Value)); w {
	case "ready":
		return "ready 100%"
	case "drain", "maint":
		return w
	default:
		n, ok := strings.CutSuffix(w, "%")
		if p, err := strconv.Atoi(n); ok && err == nil && p >= 0 && p <= 256 && strings.Trim(n, "0123456789") == "" {
			return "ready " + strconv.Itoa(p) + "%"
		}
		return ""
	}
}

// TestE2EMigrationRollout walks docs/migration.md with three replicas, a
// per-node agent, an HAProxy still on that agent ("unmoved") and one moved
// to hastate's load balancer: migration start, a canary drain and undrain,
// a zonal drain, compare clean at each step, a refused --for, migration
// finish. After every write both HAProxy processes show, through their
// admin sockets, the same state for every server.
func TestE2EMigrationRollout(t *testing.T) {
	const prefix = "gitlab-haproxy-agent/"
	consul := testenv.StartConsul(t, testenv.ConsulOptions{})
	kv := consul.Client(t).KV()
	// Undrain ramps on (1m), so that "undrains do not ramp during a
	// migration" is shown, not assumed.
	hs := StartCluster(t, 3, HastateOptions{ConsulAddr: consul.Addr(), KVPrefix: prefix, Args: []string{"--ramp-duration", "1m", "--ramp-interval", "1s"}})
	WaitLeader(t, 10*time.Second, hs...)
	agent := startNodeAgent(t, consul, prefix, nil)

	canaryWeb := Backend{"canary_web", []string{"gke-cny-web-us-east1-b", "gke-cny-web-us-east1-c"}}
	canaryAPI := Backend{"canary_api", []string{"gke-cny-api-us-east1-b", "gke-cny-api-us-east1-c"}}
	mainWeb := Backend{"main_web", []string{"web-01-us-east1-b", "web-02-us-east1-c", "web-03-us-east1-d"}}
	backends := []Backend{mainWeb, canaryWeb, canaryAPI}
	var servers []string
	for _, b := range backends {
		for _, s := range b.Servers {
			servers = append(servers, b.Name+"/"+s)
		}
	}
	unmoved := StartHAProxy(t, agent.Addr, backends...)

	// The operator: the replicas under test, the runbook's prefix, no
	// automatic --force.
	op := hs[0].Operator()
	put := func(key, value string) {
		t.Helper()
		if _, err := kv.Put(&consulapi.KVPair{Key: prefix + key, Value: []byte(value)}, nil); err != nil {
			t.Fatal(err)
		}
	}
	// The state before hastate, written by the runbook's scripts: a
	// server being retired (no longer in haproxy.cfg), and a
	// backend-wide key someone wrote with hastate's CLI.
	put("state/main_web/web-04-us-east1-d", "maint")
	put("state/canary_api/*", "drain")

	haps := map[string]*HAProxy{"unmoved": unmoved}
	// agree waits until every HAProxy shows want (status; weight where
	// want has one) for every server, the same in each, read through
	// their admin sockets.
	agree := func(t *testing.T, step string, want map[string]Row) {
		t.Helper()
		start := time.Now()
		var last string
		testenv.Eventually(t, 15*time.Second, func() error {
			var bad []string
			for name, h := range haps {
				st := h.Stat(t)
				for _, s := range servers {
					w, ok := want[s]
					if !ok {
						w = Row{Status: statUp, Weight: serverWeight}
					}
					r := st[s]
					if r.Status != w.Status || (w.Weight >= 0 && r.Weight != w.Weight) {
						bad = append(bad, fmt.Sprintf("%s %s: %s; want %q weight %d", name, s, r, w.Status, w.Weight))
					}
				}
			}
			last = strings.Join(bad, "\n")
			return testenv.Expect(len(bad) == 0, "%s: HAProxy does not show the wanted state yet:\n%s", step, last)
		})
		// Both the same, server by server (weights included).
		if m, ok := haps["moved"]; ok {
			a, b := unmoved.Stat(t), m.Stat(t)
			for _, s := range servers {
				if a[s].Status != b[s].Status || a[s].Weight != b[s].Weight {
					t.Fatalf("%s: %s: unmoved %s, moved %s", step, s, a[s], b[s])
				}
			}
		}
		t.Logf("%s: %d HAProxy processes agree on %d servers after %s", step, len(haps), len(servers), time.Since(start).Round(time.Millisecond))
	}
	compareClean := func(t *testing.T, step string) {
		t.Helper()
		out := op.RunExit(t, 0, "compare", "--agent", agent.Addr)
		if !regexp.MustCompile(`answer the same for (all \d+ servers|the 1 server) `).MatchString(out) {
			t.Fatalf("%s: compare: %s", step, out)
		}
		t.Logf("%s: %s", step, strings.TrimSpace(out))
	}
	drained := func(ss ...string) map[string]Row {
		m := map[string]Row{}
		for _, s := range ss {
			m[s] = Row{Status: statDrainAgent, Weight: -1}
		}
		return m
	}

	t.Run("start", func(t *testing.T) {
		// The per-node agent ignores canary_api/*: start refuses.
		out := op.RunExit(t, 1, "migration", "start", "--reason", "gstg rollout")
		if !strings.Contains(out, `canary_api/* = "drain": a backend-wide key, which the per-node agent ignores`) || !strings.Contains(out, "nothing was written") {
			t.Fatalf("migration start with a backend-wide key:\n%s", out)
		}
		op.Run(t, "clear", "canary_api/*")
		out = op.Run(t, "migration", "start", "--reason", "gstg rollout", "--by", "alice")
		if !strings.Contains(out, "config/migration written") {
			t.Fatalf("migration start:\n%s", out)
		}
		if out := op.Run(t, "migration", "start"); !strings.Contains(out, "already marked, nothing written") {
			t.Fatalf("a second start:\n%s", out)
		}
		out = op.Run(t, "migration", "status")
		if !strings.Contains(out, "migration from the per-node agent marked (gitlab-haproxy-agent/config/migration)") || !strings.Contains(out, "by alice: gstg rollout") ||
			!strings.Contains(out, "KV holds no key that the per-node agent serves differently") {
			t.Fatalf("migration status:\n%s", out)
		}
		// Every replica shows it (status, /v1/state, the page), and the
		// marker is no state key: no invalid key, no server.
		for _, h := range hs {
			testenv.Eventually(t, 10*time.Second, func() error {
				var v api.StateView
				h.GetJSON(t, "/v1/state", &v)
				return testenv.Expect(v.Migration != nil && v.Migration.By == "alice" && v.InvalidTotal == 0, "%s: migration %+v, %d invalid", h.NodeID, v.Migration, v.InvalidTotal)
			})
			_, page, err := h.get("/")
			if err != nil || !strings.Contains(string(page), "migration from the per-node agent marked") {
				t.Fatalf("%s: the status page does not show the migration (%v)", h.NodeID, err)
			}
		}
		if out := op.Run(t, "status"); !strings.Contains(out, "migration from the per-node agent marked since") || strings.Contains(out, "config/migration") && strings.Contains(out, "invalid") {
			t.Fatalf("status:\n%s", out)
		}
		agree(t, "before any node is moved", nil)
		compareClean(t, "before any node is moved")
	})

	t.Run("typo guard before any node is moved", func(t *testing.T) {
		// No HAProxy polls hastate yet: a server with a key in Consul is
		// accepted without --force, a typo is not.
		out := op.Run(t, "maint", "main_web/web-04-us-east1-d", "--reason", "retired")
		if !keysWritten(out, 1) {
			t.Fatalf("maint of a server with a key in Consul:\n%s", out)
		}
		out = op.RunExit(t, 3, "drain", "main_web/web-4-us-east1-d")
		if !strings.Contains(out, "no HAProxy that asks hastate has polled main_web/web-4-us-east1-d") {
			t.Fatalf("a typo:\n%s", out)
		}
		op.Run(t, "clear", "main_web/web-04-us-east1-d")
	})

	// Move one node: its agent checks go to hastate's load balancer
	// (from 127.0.0.2, so the replicas tell it from the others).
	haps["moved"] = StartHAProxyLBFrom(t, hs, "127.0.0.2", backends...)
	t.Run("move one node", func(t *testing.T) {
		// HAProxy shows UP before its first agent check: wait until the
		// moved node has asked hastate about every server (TOLD 1/1).
		testenv.Eventually(t, 15*time.Second, func() error {
			out := op.Run(t, "status")
			return testenv.Expect(strings.Count(out, " 1/1 ") == len(servers), "status: every server told by the one moved node:\n%s", out)
		})
		// Full weight on the moved node too: the ramp that clearing
		// canary_api/* started (1m) ended when the migration was marked.
		agree(t, "one node moved", nil)
		compareClean(t, "one node moved")
		// hastate against itself: a replica's agent port.
		for _, h := range hs {
			out := op.RunExit(t, 0, "compare", "--agent", h.AgentAddr)
			if !strings.Contains(out, fmt.Sprintf("answer the same for all %d servers", len(servers))) {
				t.Fatalf("compare against %s's agent port:\n%s", h.NodeID, out)
			}
		}
	})

	t.Run("canary drain and undrain", func(t *testing.T) {
		canaries := []string{"canary_api/gke-cny-api-us-east1-b", "canary_api/gke-cny-api-us-east1-c", "canary_web/gke-cny-web-us-east1-b", "canary_web/gke-cny-web-us-east1-c"}
		out := op.Run(t, "drain", "canary_*/*", "--reason", "release 16.4")
		if !keysWritten(out, 4) || !strings.Contains(out, "canary_*/* expanded to the per-server keys of canary_web (the per-node agent ignores backend-wide keys)") {
			t.Fatalf("canary drain:\n%s", out)
		}
		keys, _, err := kv.Keys(prefix+"state/", "", nil)
		if err != nil {
			t.Fatal(err)
		}
		for _, k := range keys {
			if strings.HasSuffix(k, "/*") {
				t.Fatalf("a backend-wide key during a migration: %s (keys %q)", k, keys)
			}
		}
		agree(t, "canary drained", drained(canaries...))
		compareClean(t, "canary drained")

		// --for and --ramp are refused, with the reason; nothing changes.
		out = op.RunExit(t, 1, "drain", "canary_*/*", "--for", "1h")
		if !strings.Contains(out, "--for would expire the state only on the HAProxy nodes that ask hastate") || !strings.Contains(out, "nothing was written") {
			t.Fatalf("drain --for during a migration:\n%s", out)
		}
		out = op.RunExit(t, 1, "ready", "canary_*/*", "--ramp", "10m")
		if !strings.Contains(out, "--ramp would ramp the weight only on the HAProxy nodes that ask hastate") {
			t.Fatalf("ready --ramp during a migration:\n%s", out)
		}

		out = op.Run(t, "ready", "canary_*/*")
		if !keysWritten(out, 4) || !strings.Contains(out, "deletes every key of canary_web") {
			t.Fatalf("canary undrain:\n%s", out)
		}
		// Full weight at once on both: no ramp during a migration,
		// although the replicas ramp over 1m otherwise.
		agree(t, "canary undrained", nil)
		compareClean(t, "canary undrained")
	})

	t.Run("zonal drain", func(t *testing.T) {
		zone := []string{"canary_api/gke-cny-api-us-east1-b", "canary_web/gke-cny-web-us-east1-b", "main_web/web-01-us-east1-b"}
		out := op.Run(t, "drain", "*/*-us-east1-b", "--reason", "us-east1-b maintenance")
		if !keysWritten(out, 3) {
			t.Fatalf("zonal drain:\n%s", out)
		}
		agree(t, "zone drained", drained(zone...))
		compareClean(t, "zone drained")
		op.Run(t, "weight", "50%", "main_web/web-02-us-east1-c")
		want := drained(zone...)
		want["main_web/web-02-us-east1-c"] = Row{Status: statUp, Weight: 50}
		agree(t, "zone drained, web-02 at 50%", want)
		compareClean(t, "zone drained, web-02 at 50%")
		op.Run(t, "ready", "*/*-us-east1-b", "main_web/web-02-us-east1-c")
		agree(t, "zone undrained", nil)
		compareClean(t, "zone undrained")
	})

	t.Run("compare finds an agent that differs", func(t *testing.T) {
		odd := startNodeAgent(t, consul, prefix, map[string]string{"canary_web/gke-cny-web-us-east1-c": "drain"})
		out := op.RunExit(t, 1, "compare", "--agent", odd.Addr)
		var differ []string
		for _, l := range strings.Split(out, "\n") {
			if strings.HasPrefix(l, "differs: ") {
				differ = append(differ, l)
			}
		}
		if len(differ) != 1 || !strings.Contains(differ[0], `canary_web/gke-cny-web-us-east1-c: the agent answers "drain", hastate "ready 100%"`) {
			t.Fatalf("compare against an agent that differs on one server:\n%s", out)
		}
		silent := startNodeAgent(t, consul, prefix, map[string]string{"main_web/web-02-us-east1-c": ""})
		out = op.RunExit(t, 1, "compare", "--agent", silent.Addr, "main_web")
		if !strings.Contains(out, "main_web/web-02-us-east1-c: the agent answers nothing (HAProxy keeps its state)") || !strings.Contains(out, "differ on 1 of 3 servers") {
			t.Fatalf("compare against an agent that answers nothing for one server:\n%s", out)
		}
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		dead := ln.Addr().String()
		_ = ln.Close()
		out = op.RunExit(t, 4, "compare", "--agent", dead)
		if !strings.Contains(out, "cannot confirm") {
			t.Fatalf("compare against no agent:\n%s", out)
		}
	})

	t.Run("finish", func(t *testing.T) {
		out := op.Run(t, "migration", "finish")
		if !strings.Contains(out, "1 HAProxy node polls hastate: [127.0.0.2]") || !strings.Contains(out, "config/migration deleted") {
			t.Fatalf("migration finish:\n%s", out)
		}
		// The last node moves; the per-node agent is no longer asked.
		unmoved.Stop(t)
		delete(haps, "unmoved")
		// Backend-wide keys and --for work again.
		out = op.Run(t, "drain", "canary_web", "--reason", "release 16.5", "--for", "1h")
		if !strings.Contains(out, "set    "+prefix+"state/canary_web/* = drain") || !strings.Contains(out, prefix+"meta/canary_web/*") {
			t.Fatalf("a backend-wide drain with --for after finish:\n%s", out)
		}
		m := haps["moved"]
		m.WaitServer(t, "canary_web/gke-cny-web-us-east1-b", statDrainAgent, -1)
		m.WaitServer(t, "canary_web/gke-cny-web-us-east1-c", statDrainAgent, -1)
		var v api.StateView
		hs[1].GetJSON(t, "/v1/state", &v)
		i := slices.IndexFunc(v.Servers, func(r api.ServerState) bool { return r.Backend == "canary_web" && r.Server == "*" })
		if i < 0 || v.Servers[i].Until == nil || v.Migration != nil {
			t.Fatalf("after finish: canary_web/* %+v, migration %+v", v.Servers, v.Migration)
		}
		// This is why finish waits for the last node: the per-node agent
		// ignores the backend-wide key, and compare says so.
		out = op.RunExit(t, 1, "compare", "--agent", agent.Addr, "canary_web")
		if !strings.Contains(out, "from the backend-wide key canary_web/*, which the per-node agent ignores") || !strings.Contains(out, "differ on 2 of 2 servers") {
			t.Fatalf("compare after finish:\n%s", out)
		}
	})
}

// keysWritten: the write's report says it wrote n keys ("1 key (2
// operations: with its meta key) written in one Consul transaction").
func keysWritten(out string, n int) bool {
	unit := "keys"
	if n == 1 {
		unit = "key"
	}
	return regexp.MustCompile(fmt.Sprintf(`(?m)^\w+: %d %s (\([^)]*\) )?written`, n, unit)).MatchString(out)
}
