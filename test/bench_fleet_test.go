package test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/hastate/hastate/api"
	"github.com/hastate/hastate/internal/testenv"
)

// The operator path at fleet size (issue 34): 100 HAProxy sources, each on
// its own loopback address (127.0.0.10 up), poll 2,000 servers (200
// backends of 10) on replica n1 of three: 200,000 (HAProxy, server) pairs.
// The operator commands ask replica n2, which merges n1's polls over the
// raft port, as a CLI behind the load balancer would. Reported, per point:
//
//   - reg_checks/s: registration (two polls of every pair, so that each
//     counts as an HAProxy, not a manual probe);
//   - bytes/pair: n1's Go heap in use after registration minus before,
//     per pair;
//   - wait_after_told_ms: `hastate wait fs000/*` (10 servers) after a
//     drain, from the last of the 1,000 polls that told the drain to wait's
//     exit;
//   - status_backend_ms: `hastate status fs005`; status_json_ms:
//     `hastate status -o json` (every server); medians of 3;
//   - agent_p99_ms: agent checks against n1 beside the full table while
//     `status -o json` runs (back to back);
//   - agent_p99_ratio_reads1s, agent_p50_ratio_reads1s: the same load
//     while `status -o json`, a page of /v1/pollers and the status page
//     (asking n2, cluster scope) each read once a second, against the
//     same load on a second cluster's empty table in the same round
//     (issue 46: <= 1.2 and <= 1.1), medians over fleetReadRounds rounds;
//     agent_p99_ratio_reads1s_quiet, agent_p50_ratio_reads1s_quiet: the
//     same against the load on the full table without the reads, in the
//     same round (agent_p99_ratio_quiet: that one against the empty
//     table's); the _start ratios divide by the empty table measured once,
//     before registration (agent_p99_ratio's baseline, as before issue
//     46's last step);
//   - reads_alone_{cli,n1,n2}_cpu_ms: the CPU time one second's reads
//     take in the CLI's process and on n1 and n2 beyond their idle, with
//     no agent load; reads_{cli,n1,n2}_cpu_ms: the same during the rounds
//     (n1's and n2's beyond what the same checks took without the reads).
//
// Targets (issue 34): wait <= 1 s after the last told, status BACKEND <=
// 0.5 s, status -o json <= 3 s, agent p99 <= 20 ms, <= 250 bytes a pair.
// A second point holds 1,000,000 pairs (100 sources x 10,000 servers,
// --pollers-max raised). The benchmark reports; what it asserts is
// behaviour: every check is answered right, every command exits 0 and
// shows what it must.
//
//	go test -run '^$' -bench FleetOperator -benchtime 1x -timeout 30m ./test/
func BenchmarkFleetOperator(b *testing.B) {
	for _, pt := range []struct {
		name             string
		sources, servers int
		max              int // --pollers-max; 0: the default
	}{
		// The baseline's 2,000 pairs (from 127.0.0.1) share the table:
		// the default bound (200,000) would drop as many of the fleet's.
		{"pairs=200k", 100, 2000, 205_000},
		{"pairs=1M", 100, 10000, 1_100_000},
	} {
		b.Run(pt.name, func(b *testing.B) {
			for range b.N {
				benchFleet(b, pt.sources, pt.servers, pt.max)
			}
		})
	}
}

// fleetReadRounds is the rounds of the agent's load on the empty table, on
// the full one, and on the full one with the reads once a second (about
// 5 s a round).
const fleetReadRounds = 9

func fleetServer(i int) string { return fmt.Sprintf("fs%03d/srv%02d", i/10, i%10) }

// fleetSource is the loopback address of source i (at most 240 sources).
func fleetSource(i int) string { return fmt.Sprintf("127.0.0.%d", 10+i) }

func benchFleet(b *testing.B, sources, servers, max int) {
	consul := testenv.StartConsul(b, testenv.ConsulOptions{})
	var args []string
	if max > 0 {
		args = append(args, "--pollers-max", strconv.Itoa(max))
	}
	hs := StartCluster(b, 3, HastateOptions{ConsulAddr: consul.Addr(), Args: args})
	// A second cluster, the same but for its KV prefix, keeps an empty
	// poller table: each round of the reads below measures its baseline
	// there, between the loads on the full table, so that the ratios
	// compare loads a few seconds apart, not minutes (the machine's load
	// moves the baseline by 3x within one run).
	empty := StartCluster(b, 3, HastateOptions{ConsulAddr: consul.Addr(), KVPrefix: "hastate-empty/", Args: args})
	n1, n2 := hs[0], hs[1]
	op := n2.Operator()
	// Ready is not yet answering: until a leader mirrored Consul every
	// answer is withheld (an empty reply).
	for _, h := range []*Hastate{n1, empty[0]} {
		testenv.Eventually(b, 30*time.Second, func() error {
			var v api.StateView
			h.GetJSON(b, "/v1/state", &v)
			return testenv.Expect(v.HoldsState && v.KV.Synced, "%s holds no mirrored state yet", h.HTTPAddr)
		})
	}

	// The baseline: the same agent load on n1 with an empty poller table
	// and nothing else running (agent_p99_ratio divides by it).
	reqs, answers := make([][]byte, 0, 2000), make([][]byte, 0, 2000)
	for i := range 2000 {
		// Not fs000 to fs005, which wait and status below look at:
		// these checks come from 127.0.0.1, which would count as one
		// more HAProxy there.
		reqs = append(reqs, []byte(fleetServer(60+i*(servers-60)/2000)+"\n"))
		answers = append(answers, []byte("ready 100%\n"))
	}
	// An empty reply (a confirmation round that failed on the loaded
	// machine: HAProxy keeps its state) is counted, not fatal.
	base := runAgentLoadOf(b, n1.AgentAddr, 20000, reqs, answers, true)

	// Registration: every source polls every server twice, through n1.
	entriesBefore := n1.Metric(b, "hastate_pollers_entries")
	heapBefore := n1.Metric(b, "go_memstats_heap_inuse_bytes")
	pairs := sources * servers
	start := time.Now()
	checks, empties := pollFleet(b, n1.AgentAddr, sources, servers, 2, "ready 100%\n")
	reg := time.Since(start)
	if got := n1.Metric(b, "hastate_pollers_entries") - entriesBefore; int(got) != pairs {
		b.Fatalf("n1 remembers %v pairs, want %d (hastate_pollers_dropped_total %v)", got, pairs, n1.Metric(b, "hastate_pollers_dropped_total"))
	}
	heapAfter := n1.Metric(b, "go_memstats_heap_inuse_bytes")
	b.ReportMetric(float64(checks)/reg.Seconds(), "reg_checks/s")
	b.ReportMetric(float64(empties), "reg_empty_replies")
	b.ReportMetric((heapAfter-heapBefore)/float64(pairs), "bytes/pair")

	// status of one backend (10 servers), and of everything. At 1,000,000
	// pairs registration outlasts api.PollerTTL: fs005's sources poll it
	// again first, as HAProxy would have every agent-inter.
	pollRange(b, n1.AgentAddr, sources, 50, 10, "ready 100%\n")
	statusBackend := medianRun(b, 3, func() {
		out := op.Run(b, "status", "fs005")
		if !strings.Contains(out, "srv09") || strings.Contains(out, "fs006") || !strings.Contains(out, "100/100") {
			b.Fatalf("status fs005:\n%s", out)
		}
	})
	var jsonOut string
	statusJSON := medianRun(b, 3, func() { jsonOut = op.Run(b, "status", "-o", "json") })
	var rows []api.ServerState
	if err := json.Unmarshal([]byte(jsonOut), &rows); err != nil {
		b.Fatalf("status -o json: %v: %.300s", err, jsonOut)
	}
	if len(rows) != servers {
		b.Fatalf("status -o json: %d rows, want %d", len(rows), servers)
	}
	// Every server is shown, told its answer by every HAProxy that polls
	// it. Polled counts the sources that asked within api.PollerTTL: on a
	// loaded machine the registration of the first pairs can be older.
	// The baseline's 127.0.0.1 is one more source of the servers it asked
	// for, until its polls are older than the TTL.
	polled := 0
	for _, r := range rows {
		if r.Polled > sources+1 || r.Told != r.Polled {
			b.Fatalf("status -o json: %s/%s polled by %d, told %d, of %d sources (and 127.0.0.1)", r.Backend, r.Server, r.Polled, r.Told, sources)
		}
		polled += min(r.Polled, sources)
	}
	b.ReportMetric(float64(polled)/float64(pairs), "polled_within_ttl_fraction")
	b.ReportMetric(ms(statusBackend), "status_backend_ms")
	b.ReportMetric(ms(statusJSON), "status_json_ms")

	// The agent beside the full table, while status -o json runs.
	var agent loadResult
	var wg sync.WaitGroup
	stop := make(chan struct{})
	wg.Go(func() {
		for {
			select {
			case <-stop:
				return
			default:
			}
			op.Run(b, "status", "-o", "json")
		}
	})
	profiled := profileReplicas(b, map[string]*Hastate{"n1": n1, "n2": n2}, 6*time.Second)
	agent = runAgentLoadOf(b, n1.AgentAddr, 20000, reqs, answers, true)
	profiled()
	close(stop)
	wg.Wait()
	b.ReportMetric(ms(agent.quantile(0.99)), "agent_p99_ms")
	b.ReportMetric(ms(base.quantile(0.99)), "agent_p99_base_ms")
	b.ReportMetric(float64(agent.quantile(0.99))/float64(base.quantile(0.99)), "agent_p99_ratio")
	b.ReportMetric(float64(base.unanswered+agent.unanswered), "agent_empty_replies")

	// The agent beside the full table while `status -o json`, a page of
	// /v1/pollers and the status page (cluster scope, asking n2, as a
	// dashboard behind the load balancer would) each read once a second
	// (issue 46: p99 <= 1.2x and p50 <= 1.1x the empty table's). Each of
	// fleetReadRounds rounds runs the same load three times, one after
	// another: on the empty cluster's n1 (the round's baseline), on the
	// full table without the reads (quiet), then with them. Reported are
	// the medians over the rounds of the ratios against the round's
	// baseline, against the quiet run of the same round (what the reads
	// cost), and (_start) against the baseline taken once at the start.
	// What a read costs is also counted in CPU time: the CLI's own (its
	// process's user and system time), and n1's and n2's beyond what the
	// same checks took in the quiet run, over every read of every round.
	var toBase99, toBase50, toQuiet99, toQuiet50, quietBase99, toStart99, toStart50 []float64
	replicas := []benchProc{{"n1", n1.Pid()}, {"n2", n2.Pid()}}
	// reads is one second's reads; it returns the CLI's CPU time.
	reads := func() time.Duration {
		cpu := runCPU(b, op, "status", "-o", "json")
		for _, p := range []string{"/v1/pollers?scope=cluster", "/"} {
			if code, body, err := n2.get(p); err != nil || code != http.StatusOK {
				b.Errorf("GET %s: %d %v %.200s", p, code, err, body)
			}
		}
		return cpu
	}
	// The reads alone first, without the agent's load: what they cost
	// each process beyond its idle CPU (the same time just before).
	const aloneCycles = 5
	idle0 := cpuSeconds(b, replicas)
	time.Sleep(aloneCycles * time.Second)
	idle1 := cpuSeconds(b, replicas)
	var aloneCLI time.Duration
	tick := time.NewTicker(time.Second)
	profiledReads := profileReplicas(b, map[string]*Hastate{"n1-reads": n1, "n2-reads": n2}, aloneCycles*time.Second)
	for range aloneCycles {
		aloneCLI += reads()
		<-tick.C
	}
	tick.Stop()
	profiledReads()
	alone := cpuSeconds(b, replicas)
	aloneCPU := []string{fmt.Sprintf("status -o json %.0f ms", ms(aloneCLI)/aloneCycles)}
	b.ReportMetric(ms(aloneCLI)/aloneCycles, "reads_alone_cli_cpu_ms")
	for i, r := range replicas {
		per := ((alone[i] - idle1[i]) - (idle1[i] - idle0[i])) * 1000 / aloneCycles
		b.ReportMetric(per, "reads_alone_"+r.name+"_cpu_ms")
		aloneCPU = append(aloneCPU, fmt.Sprintf("%s %.0f ms", r.name, per))
	}
	b.Logf("CPU of one second's reads without the agent's load (%d of them), beyond idle: %s", aloneCycles, strings.Join(aloneCPU, ", "))

	var readCycles int
	var cliCPU time.Duration
	extraCPU := make([]float64, len(replicas))
	for round := range fleetReadRounds {
		roundBase := runAgentLoadOf(b, empty[0].AgentAddr, 20000, reqs, answers, true)
		cpu0 := cpuSeconds(b, replicas)
		quiet := runAgentLoadOf(b, n1.AgentAddr, 20000, reqs, answers, true)
		cpu1 := cpuSeconds(b, replicas)
		tick := time.NewTicker(time.Second)
		stopReads := make(chan struct{})
		wg.Go(func() {
			defer tick.Stop()
			for {
				cliCPU += reads()
				readCycles++
				select {
				case <-stopReads:
					return
				case <-tick.C:
				}
			}
		})
		paced := runAgentLoadOf(b, n1.AgentAddr, 20000, reqs, answers, true)
		close(stopReads)
		wg.Wait()
		cpu2 := cpuSeconds(b, replicas)
		for i := range replicas {
			// Both loads are the same checks: what the paced run used
			// beyond the quiet one is the reads' (n2 idles in both).
			extraCPU[i] += (cpu2[i] - cpu1[i]) - (cpu1[i] - cpu0[i])
		}
		toBase99 = append(toBase99, ratio(paced.quantile(0.99), roundBase.quantile(0.99)))
		toBase50 = append(toBase50, ratio(paced.quantile(0.5), roundBase.quantile(0.5)))
		toQuiet99 = append(toQuiet99, ratio(paced.quantile(0.99), quiet.quantile(0.99)))
		toQuiet50 = append(toQuiet50, ratio(paced.quantile(0.5), quiet.quantile(0.5)))
		quietBase99 = append(quietBase99, ratio(quiet.quantile(0.99), roundBase.quantile(0.99)))
		toStart99 = append(toStart99, ratio(paced.quantile(0.99), base.quantile(0.99)))
		toStart50 = append(toStart50, ratio(paced.quantile(0.5), base.quantile(0.5)))
		b.Logf("reads round %d: agent p99 / p50 empty table %s / %s, full table quiet %s / %s, with the reads %s / %s (at the start, empty: %s / %s)",
			round, roundBase.quantile(0.99), roundBase.quantile(0.5), quiet.quantile(0.99), quiet.quantile(0.5), paced.quantile(0.99), paced.quantile(0.5),
			base.quantile(0.99), base.quantile(0.5))
	}
	b.ReportMetric(medianOf(toBase99), "agent_p99_ratio_reads1s")
	b.ReportMetric(medianOf(toBase50), "agent_p50_ratio_reads1s")
	b.ReportMetric(medianOf(toQuiet99), "agent_p99_ratio_reads1s_quiet")
	b.ReportMetric(medianOf(toQuiet50), "agent_p50_ratio_reads1s_quiet")
	b.ReportMetric(medianOf(quietBase99), "agent_p99_ratio_quiet")
	b.ReportMetric(medianOf(toStart99), "agent_p99_ratio_reads1s_start")
	b.ReportMetric(medianOf(toStart50), "agent_p50_ratio_reads1s_start")
	readsCPU := []string{fmt.Sprintf("status -o json %.0f ms", ms(cliCPU)/float64(readCycles))}
	b.ReportMetric(ms(cliCPU)/float64(readCycles), "reads_cli_cpu_ms")
	for i, r := range replicas {
		per := extraCPU[i] * 1000 / float64(readCycles)
		b.ReportMetric(per, "reads_"+r.name+"_cpu_ms")
		readsCPU = append(readsCPU, fmt.Sprintf("%s %.0f ms", r.name, per))
	}
	b.Logf("CPU of one second's reads (%d of them), beyond the quiet run's: %s", readCycles, strings.Join(readsCPU, ", "))

	// wait for 10 servers after a drain: the sources poll them until
	// each was told drain; wait (started right after the drain) returns.
	// wait waits for the HAProxy nodes that polled within api.PollerTTL,
	// and registration and the rounds above outlast it: every source
	// polls fs000 again first, as HAProxy would have every agent-inter,
	// so that wait waits for all of them (without this it waited only for
	// those pollUntilTold had already asked again, and could return
	// before the last was told).
	pollRange(b, n1.AgentAddr, sources, 0, 10, "ready 100%\n")
	op.Run(b, "drain", "fs000/*", "--reason", "bench")
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	waited := make(chan time.Time, 1)
	var waitOut []byte
	var waitErr error
	go func() {
		waitOut, waitErr = op.command(ctx, "wait", "fs000/*", "--timeout", "50s").CombinedOutput()
		waited <- time.Now()
	}()
	lastTold := pollUntilTold(b, n1.AgentAddr, sources, 10, "drain\n")
	end := <-waited
	if waitErr != nil {
		b.Fatalf("wait fs000/*: %v\n%s", waitErr, waitOut)
	}
	b.ReportMetric(ms(end.Sub(lastTold)), "wait_after_told_ms")
	b.Logf("%d pairs: registration %s (%d checks), %.0f bytes/pair, status fs005 %s, status -o json %s, agent p99 %s, wait returned %s after the last poll was told",
		pairs, reg.Round(time.Millisecond), checks, (heapAfter-heapBefore)/float64(pairs), statusBackend.Round(time.Millisecond), statusJSON.Round(time.Millisecond),
		agent.quantile(0.99), end.Sub(lastTold).Round(time.Millisecond))
}

// profileReplicas, when HASTATE_BENCH_PPROF names a folder, takes a CPU
// profile of each replica for d (in the background) and returns a function
// that waits for them, written as <folder>/<name>.cpu.pprof. The replicas
// serve /debug/pprof/ only when built with HASTATE_E2E_TAGS=hastate_pprof.
// Without HASTATE_BENCH_PPROF it does nothing.
func profileReplicas(b *testing.B, hs map[string]*Hastate, d time.Duration) (wait func()) {
	dir := os.Getenv("HASTATE_BENCH_PPROF")
	if dir == "" {
		return func() {}
	}
	var wg sync.WaitGroup
	for name, h := range hs {
		wg.Go(func() {
			url := fmt.Sprintf("http://%s/debug/pprof/profile?seconds=%d", h.HTTPAddr, int(d.Seconds()))
			resp, err := http.Get(url)
			if err != nil {
				b.Errorf("profile of %s: %v", name, err)
				return
			}
			defer resp.Body.Close()
			body, err := io.ReadAll(resp.Body)
			if err == nil && resp.StatusCode != http.StatusOK {
				err = fmt.Errorf("HTTP %d (build the replicas with HASTATE_E2E_TAGS=hastate_pprof)", resp.StatusCode)
			}
			if err == nil {
				err = os.WriteFile(filepath.Join(dir, name+".cpu.pprof"), body, 0o644)
			}
			if err != nil {
				b.Errorf("profile of %s: %v", name, err)
			}
		})
	}
	return wg.Wait
}

// pollRange has every source poll servers from to from+n-1 once, each
// answer checked against want.
func pollRange(b testing.TB, addr string, sources, from, n int, want string) {
	var buf [64]byte
	for s := range sources {
		for i := from; i < from+n; i++ {
			if line, err := sourceDial(fleetSource(s), addr, []byte(fleetServer(i)+"\n"), buf[:]); err != nil || string(line) != want {
				b.Fatalf("%s asking %s: %q, %v; want %q", fleetSource(s), fleetServer(i), line, err, want)
			}
		}
	}
}

// runCPU runs `hastate args...` as op.Run does and returns the CPU time
// (user and system) its process used.
func runCPU(b *testing.B, op Operator, args ...string) time.Duration {
	b.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cmd := op.command(ctx, op.args(b, args)...)
	if out, err := cmd.CombinedOutput(); err != nil {
		b.Fatalf("hastate %s: %v:\n%.300s", strings.Join(args, " "), err, out)
	}
	return cmd.ProcessState.UserTime() + cmd.ProcessState.SystemTime()
}

// medianRun runs f n times and returns the median duration.
func medianRun(b *testing.B, n int, f func()) time.Duration {
	var d durations
	for range n {
		t0 := time.Now()
		f()
		d = append(d, time.Since(t0))
	}
	slices.Sort(d)
	return d.quantile(0.5)
}

// sourceDial is one agent check from the loopback address src.
func sourceDial(src, addr string, req []byte, buf []byte) ([]byte, error) {
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(src)}, Timeout: 5 * time.Second}
	c, err := d.Dial("tcp", addr)
	if err != nil {
		return nil, err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := c.Write(req); err != nil {
		return nil, err
	}
	n := 0
	for n < len(buf) {
		m, err := c.Read(buf[n:])
		n += m
		if i := slices.Index(buf[:n], '\n'); i >= 0 {
			return buf[:i+1], nil
		}
		if err != nil {
			return buf[:n], fmt.Errorf("read %q: %w", buf[:n], err)
		}
	}
	return buf[:n], fmt.Errorf("answer longer than the buffer")
}

// pollFleet makes rounds polls of every (source, server) pair against
// addr from benchWorkers clients, each answer checked against want. An
// empty reply (the replica could not confirm in time, on a loaded
// machine) or a reset connection (a burst beyond the agent's connection
// cap after the machine stalled) is asked again and counted in empties:
// HAProxy keeps its state and asks again next agent-inter.
func pollFleet(b testing.TB, addr string, sources, servers, rounds int, want string) (checks, empties int) {
	total := sources * servers * rounds
	var empty atomic.Int64
	var next atomic.Int64
	var wg sync.WaitGroup
	var failed atomic.Pointer[error]
	for range benchWorkers {
		wg.Go(func() {
			var buf [64]byte
			for {
				i := int(next.Add(1)) - 1
				if i >= total || failed.Load() != nil {
					return
				}
				pair := i % (sources * servers)
				src, srv := fleetSource(pair%sources), fleetServer(pair/sources)
				line, err := sourceDial(src, addr, []byte(srv+"\n"), buf[:])
				for try := 0; err != nil && len(line) == 0 && (errors.Is(err, io.EOF) || errors.Is(err, syscall.ECONNRESET)) && try < 10; try++ {
					empty.Add(1)
					line, err = sourceDial(src, addr, []byte(srv+"\n"), buf[:])
				}
				if err == nil && string(line) != want {
					err = fmt.Errorf("%s asked %s: %q, want %q", src, srv, line, want)
				}
				if err != nil {
					failed.CompareAndSwap(nil, &err)
					return
				}
			}
		})
	}
	wg.Wait()
	if p := failed.Load(); p != nil {
		b.Fatal(*p)
	}
	return total, int(empty.Load())
}

// pollUntilTold has every source poll the first n servers until each was
// told want, and returns when the last of them was.
func pollUntilTold(b *testing.B, addr string, sources, n int, want string) time.Time {
	var mu sync.Mutex
	var last time.Time
	var wg sync.WaitGroup
	var failed atomic.Pointer[error]
	work := make(chan [2]string)
	wg.Go(func() {
		defer close(work)
		for s := range sources {
			for i := range n {
				work <- [2]string{fleetSource(s), fleetServer(i)}
			}
		}
	})
	for range benchWorkers {
		wg.Go(func() {
			var buf [64]byte
			for w := range work {
				deadline := time.Now().Add(30 * time.Second)
				for {
					line, err := sourceDial(w[0], addr, []byte(w[1]+"\n"), buf[:])
					if err == nil && string(line) == want {
						mu.Lock()
						if now := time.Now(); now.After(last) {
							last = now
						}
						mu.Unlock()
						break
					}
					if time.Now().After(deadline) {
						err = fmt.Errorf("%s asking %s: %q, %v; want %q within 30s", w[0], w[1], line, err, want)
						failed.CompareAndSwap(nil, &err)
						break
					}
					time.Sleep(20 * time.Millisecond) // the drain is on its way through raft: ask again, as HAProxy would next agent-inter
				}
			}
		})
	}
	wg.Wait()
	if p := failed.Load(); p != nil {
		b.Fatal(*p)
	}
	return last
}
