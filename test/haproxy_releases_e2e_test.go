package test

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hastate/hastate/internal/testenv"
)

// The HAProxy behaviour hastate is built on, pinned on every HAProxy
// release the tests run (Debian's 2.6 and the 3.0 LTS; README, "HAProxy
// configuration"). Both releases parse an agent's reply with the same code
// (src/tcpcheck.c, tcpcheck_agent_expect_reply), so these tests expect the
// same of both; a release that differs fails here first.

// TestE2EHAProxyAgentWords: how HAProxy reads one agent reply, and why
// every answer of hastate carries an admin word and a weight. The agent
// here is a scripted TCP agent (answers set by the test), because the
// replies pinned are ones hastate never sends: two admin words in one line,
// a weight alone, a line without its LF.
func TestE2EHAProxyAgentWords(t *testing.T) {
	forEachRelease(t, func(t *testing.T, r haproxyRelease) {
		agent := startScriptedAgent(t)
		be := Backend{Name: "words", Servers: []string{"w1", "w2", "w3", "w4", "w5", "w6"}}
		sv := func(s string) string { return be.Name + "/" + s }
		var hap *HAProxy
		// expect waits until HAProxy applied server's current reply (the
		// agent served it twice: the second check starts after the first
		// reply was applied) and shows status and weight (-1: any). A
		// server out of MAINT shows "UP 1/3" until its health checks pass.
		expect := func(server, status string, weight int) {
			t.Helper()
			agent.WaitServed(t, sv(server), 2)
			t.Logf("%s %s: the agent replied %q", r, sv(server), agent.Current(sv(server)))
			hap.WaitServer(t, sv(server), status, weight)
		}

		// Of several admin words the last one wins; a weight and an admin
		// word apply together (DRAIN shows the weight it will come back
		// with); of several weights the last one wins.
		agent.Reply(sv("w1"), "drain 50%\n")
		agent.Reply(sv("w2"), "maint ready\n")
		agent.Reply(sv("w3"), "ready maint\n")
		agent.Reply(sv("w4"), "drain maint\n")
		agent.Reply(sv("w5"), "maint\n")
		agent.Reply(sv("w6"), "ready 50% 75%\n")
		hap = startHAProxy(t, agent.Addr(), nil, "", []Backend{be}, hapExtras{release: r, listed: true})
		expect("w1", statDrainAgent, 50)
		expect("w2", statUp, serverWeight)
		expect("w3", statMaint, -1)
		expect("w4", statMaint, -1)
		expect("w5", statMaint, -1)
		expect("w6", statUp, 75)

		// An answer leaves what it does not name: "ready" keeps the weight
		// of an earlier "drain 50%" (so hastate's ready answers always
		// carry their weight, "ready 100%"), a bare weight keeps MAINT.
		// Only the agent may undo the agent's MAINT, and it can.
		agent.Reply(sv("w1"), "ready\n")
		agent.Reply(sv("w3"), "25%\n")
		agent.Reply(sv("w5"), "ready 100%\n")
		expect("w1", statUp, 50)
		// A release difference (README): the weight column of a server in
		// MAINT (and the exporter's haproxy_server_weight) shows a weight
		// the agent sends meanwhile on 3.0, the one from before MAINT on
		// 2.6. hastate's maint answer carries no weight, so its servers
		// show the same on both.
		expect("w3", statMaint, maintWeight(t, r, 25, serverWeight))
		expect("w5", statUp, serverWeight)
		agent.Reply(sv("w3"), "ready\n")
		expect("w3", statUp, 25)

		// A reply without its line feed is ignored: the state is kept.
		agent.Reply(sv("w4"), "ready 100%")
		expect("w4", statMaint, -1)
	})
}

// maintWeight is the weight column of a server in MAINT (entered at weight
// before) after the agent sent weight: 3.0 shows the new weight, 2.6 the
// one from before (README, "HAProxy configuration").
func maintWeight(t *testing.T, r haproxyRelease, weight, before int) int {
	t.Helper()
	switch r.Series {
	case "2.6":
		return before
	case "3.0":
		return weight
	}
	t.Fatalf("%s (%s): no pinned behaviour for a weight sent in MAINT; run it by hand and add it here", r, r.Version)
	return 0
}

// TestE2EHAProxyHealthFlapKeepsTheAgentsState: a server whose health check
// fails and recovers comes back with what the agent set (DRAIN, a weight),
// on both releases, with no default-server line in the configuration. (On
// 3.3 and 3.4 such a server stays DOWN after the flap: without a
// default-server line the agent's health starts at 0 there; fixed in
// 3.5-dev. 2.6 and 3.0 copy it from the defaults' server settings.)
func TestE2EHAProxyHealthFlapKeepsTheAgentsState(t *testing.T) {
	consul := testenv.StartConsul(t, testenv.ConsulOptions{})
	hs := StartHastate(t, HastateOptions{ConsulAddr: consul.Addr()})
	be := Backend{Name: "be_flap", Servers: []string{"f1", "f2"}}
	sinks := map[string]*sink{"f1": startSink(t), "f2": startSink(t)}
	// One HAProxy per release, both in front of the same two servers.
	var fleet HAProxies
	for _, r := range haproxyReleases(t) {
		fleet = append(fleet, startHAProxy(t, hs.AgentAddr, nil, "", []Backend{be}, hapExtras{
			release: r, server: func(_, s string) string { return sinks[s].Addr() }}))
	}
	op := hs.Operator("--allow-unknown") // before every HAProxy has polled
	op.Run(t, "drain", "be_flap/f1")
	op.Run(t, "weight", "50%", "be_flap/f2")
	fleet.WaitServer(t, "be_flap/f1", statDrainAgent, -1)
	fleet.WaitServer(t, "be_flap/f2", statUp, 50)

	for _, s := range sinks {
		s.Down(t)
	}
	for _, h := range fleet {
		for _, s := range be.Servers {
			testenv.Eventually(t, 15*time.Second, func() error {
				r := h.Server(t, "be_flap/"+s)
				return testenv.Expect(strings.HasPrefix(r.Status, "DOWN"), "%s be_flap/%s never went DOWN with its server gone: %s", h.Release, s, r)
			})
		}
	}
	for _, s := range sinks {
		s.Up(t)
	}
	for _, h := range fleet {
		t.Run(h.Release.String(), func(t *testing.T) {
			h.WaitServer(t, "be_flap/f1", statDrainAgent, -1)
			h.WaitServer(t, "be_flap/f2", statUp, 50)
		})
	}
}

// TestE2EHAProxyReload: what a drained server gets across a soft reload
// (-x <admin socket> -sf <old pid>), with a client opening connections
// through the frontend without pause. The new process starts every server
// as its configuration says (UP, full weight) and learns the drain only
// from its first agent check of that server, so the drained server takes
// new connections in between; with a server state file saved just before
// the reload (server-state-file, load-server-state-from-file) it starts
// with the drain and the weight the agent set, and takes none. The same
// holds, for as long as it lasts, when the reload happens while hastate
// cannot be reached: without the state file every drain is lost until
// hastate answers again.
func TestE2EHAProxyReload(t *testing.T) {
	consul := testenv.StartConsul(t, testenv.ConsulOptions{})
	hs := StartHastate(t, HastateOptions{ConsulAddr: consul.Addr()})
	op := hs.Operator("--force") // before HAProxy has polled both servers
	forEachRelease(t, func(t *testing.T, r haproxyRelease) {
		// A backend of its own per release: hastate is shared.
		be := Backend{Name: "be_reload" + strings.ReplaceAll(r.Series, ".", ""), Servers: []string{"r1", "r2"}}
		// The drained server is the last one checked: HAProxy starts the
		// checks of a configuration spread over the smallest inter, in
		// the order of the server lines, so its window is the longest.
		drained, ready := be.Name+"/r2", be.Name+"/r1"
		sinks := map[string]*sink{"r1": startSink(t), "r2": startSink(t)}
		hap, stateFile := startStateFileHAProxy(t, r, hs.AgentAddr, be, sinks, hapExtras{})
		op.Run(t, "drain", drained)
		op.Run(t, "weight", "25%", ready)
		hap.WaitServer(t, drained, statDrainAgent, -1)
		hap.WaitServer(t, ready, statUp, 25)
		client := startLoadClient(t, hap.Frontend)

		t.Run("without a state file the drained server takes connections until its first agent check", func(t *testing.T) {
			if err := os.Remove(stateFile); err != nil && !os.IsNotExist(err) {
				t.Fatal(err)
			}
			w := measureReload(t, hap, client, sinks["r2"], sinks["r1"], drained)
			t.Logf("%s reload without a state file: %s", r, w)
			if w.Conns == 0 {
				t.Errorf("%s: the drained server took no connection across a reload without a state file (%s): "+
					"the new process no longer starts it UP; the README's HAProxy section says it does", r, w)
			}
		})

		t.Run("with a state file the drained server takes no connection", func(t *testing.T) {
			for i := range 2 {
				hap.SaveServerState(t, stateFile)
				w := measureReload(t, hap, client, sinks["r2"], sinks["r1"], drained)
				t.Logf("%s reload %d with a state file: %s", r, i+1, w)
				if w.Conns != 0 {
					t.Errorf("%s reload %d with a state file: the drained server took %s", r, i+1, w)
				}
			}
		})

		t.Run("reloaded while hastate is down", func(t *testing.T) {
			client.Stop(t)
			hap.WaitServer(t, ready, statUp, 25) // told again since the last reload
			hs.Kill()
			t.Cleanup(func() {
				if !hs.proc.Running() { // a failed step below: the next release's subtest needs it
					hs.Start(t)
					hs.WaitReady(t)
				}
			})
			for _, s := range []string{drained, ready} {
				testenv.Eventually(t, 10*time.Second, func() error {
					row := hap.Server(t, s)
					return testenv.Expect(row.AgentStatus == "L4CON", "%s %s: agent check never failed to connect: %s", r, s, row)
				})
			}
			// With the state file the new process keeps the drain and the
			// weight while its agent checks fail.
			hap.SaveServerState(t, stateFile)
			hap.Reload(t)
			kept := map[string]Row{drained: {Status: statDrainAgent, Weight: -1}, ready: {Status: statUp, Weight: 25}}
			hap.Hold(t, holdRounds*agentInter, kept)
			t.Logf("%s reloaded with a state file while hastate is down: %s %s, %s %s", r, drained, hap.Server(t, drained), ready, hap.Server(t, ready))
			// Without it, it serves both at full weight until hastate answers.
			if err := os.Remove(stateFile); err != nil {
				t.Fatal(err)
			}
			hap.Reload(t)
			// (It shows "UP 1/3" until its first health check.)
			lost := map[string]Row{drained: {Status: statUp, Weight: serverWeight}, ready: {Status: statUp, Weight: serverWeight}}
			for s := range lost {
				testenv.Eventually(t, 5*time.Second, func() error {
					row := hap.Server(t, s)
					return testenv.Expect(row.AgentStatus == "L4CON" && row.CheckStatus == "L4OK", "%s %s: the new process never ran a health check and a failed agent check: %s", r, s, row)
				})
			}
			hap.Hold(t, holdRounds*agentInter, lost)
			t.Logf("%s reloaded without a state file while hastate is down: %s %s", r, drained, hap.Server(t, drained))
			hs.Start(t)
			hs.WaitReady(t)
			hap.WaitServer(t, drained, statDrainAgent, -1)
			hap.WaitServer(t, ready, statUp, 25)
		})
	})
}

// startStateFileHAProxy starts an HAProxy of release r in front of be,
// whose servers are sinks, configured to load a server state file at
// start; it returns the file's path (absent until SaveServerState writes it).
func startStateFileHAProxy(t testing.TB, r haproxyRelease, agentAddr string, be Backend, sinks map[string]*sink, x hapExtras) (*HAProxy, string) {
	t.Helper()
	dir, err := os.MkdirTemp("", "hap-state-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	stateFile := filepath.Join(dir, "servers.state")
	x.release = r
	x.global += fmt.Sprintf("    server-state-file %s\n", stateFile)
	x.defaults += "    load-server-state-from-file global\n"
	x.server = func(_, s string) string { return sinks[s].Addr() }
	return startHAProxy(t, agentAddr, nil, "", []Backend{be}, x), stateFile
}

// reloadWindow is what a drained server took across one reload: the
// connections it accepted after the new process was started, the first
// and the last of them (after that start), and how many connections the
// client opened meanwhile.
type reloadWindow struct {
	Conns       int
	First, Last time.Duration
	Opened      int64 // by the client from the reload until the drain was back
	ReadyConns  int   // of them, to the ready server
	Failed      int64 // client connections that failed meanwhile
}

func (w reloadWindow) String() string {
	if w.Conns == 0 {
		return fmt.Sprintf("0 connections (the client opened %d meanwhile, %d to the ready server, %d failed)", w.Opened, w.ReadyConns, w.Failed)
	}
	return fmt.Sprintf("%d connections from +%s to +%s after the new process started (the client opened %d meanwhile, %d to the ready server, %d failed)",
		w.Conns, w.First.Round(time.Millisecond), w.Last.Round(time.Millisecond), w.Opened, w.ReadyConns, w.Failed)
}

// measureReload reloads hap while client runs and counts the connections
// the drained server (sink drained, "backend/server" name) accepted from
// the start of the new process until that process showed the server
// DRAIN again after an agent check of its own. It fails the test when the
// client got nothing through meanwhile (the figure would be empty).
func measureReload(t testing.TB, hap *HAProxy, client *loadClient, drained, ready *sink, name string) reloadWindow {
	t.Helper()
	opened, failed := client.Counts()
	start := hap.Reload(t)
	// The new process answers on the admin socket; its first agent check
	// of the server brings DRAIN (agent) back.
	testenv.Eventually(t, 10*time.Second, func() error {
		r := hap.Server(t, name)
		return testenv.Expect(r.Status == statDrainAgent && r.AgentStatus == "CHECKED", "%s %s after the reload: %s; want DRAIN (agent) from an agent check", hap.Release, name, r)
	})
	time.Sleep(50 * time.Millisecond) // a connection forwarded just before the answer
	w := reloadWindow{ReadyConns: len(ready.AcceptedSince(start))}
	acc := drained.AcceptedSince(start)
	if w.Conns = len(acc); w.Conns > 0 {
		w.First, w.Last = acc[0].Sub(start), acc[len(acc)-1].Sub(start)
	}
	o, f := client.Counts()
	w.Opened, w.Failed = o-opened, f-failed
	if w.ReadyConns == 0 {
		t.Fatalf("%s: no client connection reached the ready server across the reload (%s): the measurement saw no traffic", hap.Release, w)
	}
	return w
}

// loadClient opens connections to a frontend one after another, without
// pause, until Stop or the end of the test: each sends one byte and is
// closed once the server closed it. It counts what it opened and what
// failed.
type loadClient struct {
	addr           string
	stop           chan struct{}
	done           chan struct{}
	opened, failed atomic.Int64
	stopOnce       sync.Once
}

func startLoadClient(t testing.TB, addr string) *loadClient {
	t.Helper()
	c := &loadClient{addr: addr, stop: make(chan struct{}), done: make(chan struct{})}
	go c.run() // owned by c: Stop ends it
	t.Cleanup(func() { c.Stop(t) })
	return c
}

func (c *loadClient) run() {
	defer close(c.done)
	buf := make([]byte, 64)
	for {
		select {
		case <-c.stop:
			return
		default:
		}
		conn, err := net.DialTimeout("tcp", c.addr, time.Second)
		if err != nil {
			c.failed.Add(1)
			time.Sleep(time.Millisecond) // a refused dial returns at once
			continue
		}
		_ = conn.SetDeadline(time.Now().Add(2 * time.Second))
		_, err = conn.Write([]byte("x"))
		for err == nil {
			_, err = conn.Read(buf)
		}
		conn.Close()
		if err != io.EOF {
			c.failed.Add(1)
			continue
		}
		c.opened.Add(1)
	}
}

// Counts returns the connections opened (and closed by the server) and
// those that failed, so far.
func (c *loadClient) Counts() (opened, failed int64) { return c.opened.Load(), c.failed.Load() }

// Stop ends the client and waits for it.
func (c *loadClient) Stop(t testing.TB) {
	t.Helper()
	c.stopOnce.Do(func() { close(c.stop) })
	<-c.done
}

// scriptedAgent is an agent-check responder whose reply per agent-send
// string ("backend/server") the test sets; it counts what it served since
// the reply was last set. It serves nothing (closes) for a string it has
// no reply for.
type scriptedAgent struct {
	ln     net.Listener
	wg     sync.WaitGroup
	mu     sync.Mutex
	reply  map[string]string
	served map[string]int
}

func startScriptedAgent(t testing.TB) *scriptedAgent {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	a := &scriptedAgent{ln: ln, reply: map[string]string{}, served: map[string]int{}}
	a.wg.Add(1)
	go func() { // owned by a: the cleanup closes ln and waits
		defer a.wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			a.serve(c)
		}
	}()
	t.Cleanup(func() {
		ln.Close()
		a.wg.Wait()
	})
	return a
}

func (a *scriptedAgent) serve(c net.Conn) {
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(2 * time.Second))
	line, err := bufio.NewReader(c).ReadString('\n')
	if err != nil {
		return
	}
	key := strings.TrimSpace(line)
	a.mu.Lock()
	reply, ok := a.reply[key]
	if ok {
		a.served[key]++
	}
	a.mu.Unlock()
	if ok {
		_, _ = io.WriteString(c, reply)
	}
}

// Addr is the agent's host:port.
func (a *scriptedAgent) Addr() string { return a.ln.Addr().String() }

// Reply sets the reply (sent as is, LF included or not) to server's checks.
func (a *scriptedAgent) Reply(server, reply string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.reply[server], a.served[server] = reply, 0
}

// Current returns the reply set for server.
func (a *scriptedAgent) Current(server string) string {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.reply[server]
}

// WaitServed waits until the current reply for server was served n times.
func (a *scriptedAgent) WaitServed(t testing.TB, server string, n int) {
	t.Helper()
	testenv.Eventually(t, 10*time.Second, func() error {
		a.mu.Lock()
		defer a.mu.Unlock()
		return testenv.Expect(a.served[server] >= n, "the agent served %q to %s %d times, want %d", a.reply[server], server, a.served[server], n)
	})
}
