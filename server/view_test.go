package server

import (
	"bytes"
	"fmt"
	"html/template"
	"math/rand/v2"
	"net"
	"net/http/httptest"
	"reflect"
	"slices"
	"testing"
	"time"

	"github.com/hastate/hastate/api"
	"github.com/hastate/hastate/state"
)

// TestViewIsEveryPollMerged: /v1/state's view (viewAt: this replica's
// table read in place, in step with its rows, the peers' counts, the
// polls of what overlaps) answers what merging every poll of every
// replica answers: the same servers in the same order, the same total and
// cursor, the same counts and kept answers, the same ramping rows handed
// to the status page with the same answers told; and so the same bytes of
// /v1/state and of the status page. Random snapshots (keys, wildcards,
// invalid values, a ramp) and random tables of three replicas (sources
// shared or not, single polls, ages about api.ProbeGrace, api.PollerTTL
// and PollerWindow, withheld answers), read by random queries (selectors,
// cursors, limits, replica or cluster scope, a peer down).
func TestViewIsEveryPollMerged(t *testing.T) {
	wholePage := template.Must(template.New("page").Funcs(template.FuncMap{"count": thousands}).Parse(pageHTML))
	now := time.Date(2026, 12, 7, 12, 0, 0, 0, time.UTC)
	backends := []string{"a", "b", "c", "c-d", "web"}
	answers := [][]byte{nil, []byte("ready 100%\n"), []byte("drain\n"), []byte("ready 30%\n"), []byte("maint\n"), []byte("ready 50%\n")}
	ages := []time.Duration{0, time.Second, api.ProbeGrace - time.Millisecond, api.ProbeGrace, api.PollerTTL, api.PollerTTL + time.Millisecond,
		2 * time.Minute, PollerWindow - time.Millisecond, PollerWindow + time.Millisecond}
	values := []string{"drain", "maint", "50%", "300%", `{"state":"drain","reason":"<zonal>","by":"alice"}`, "ready", "nonsense"}
	checked, ramping, overlapped, kept, chunked, shuffled, unpolled := 0, 0, 0, 0, 0, 0, 0
	for seed := range uint64(50) {
		rng := rand.New(rand.NewPCG(seed, 48))
		server := func() string { return backends[rng.IntN(len(backends))] + "/s" + fmt.Sprint(rng.IntN(6)) }
		// The snapshot: a few keys, and web/r ramping.
		m := state.NewMirror()
		policy := state.RampPolicy{Start: 10, Duration: 10 * time.Minute, Interval: 10 * time.Second, Aggression: 1}
		kv := map[string]string{"state/web/r": "drain", "state/a/w": "300%", "state/b/w": "300%"}
		for range rng.IntN(8) {
			k := server()
			if rng.IntN(4) == 0 {
				k = backends[rng.IntN(len(backends))] + "/*"
			}
			kv[state.StatePrefix+k] = values[rng.IntN(len(values))]
		}
		m.ApplyAt(state.Change{Set: kv}, now.Add(-time.Hour), policy)
		m.ApplyAt(state.Change{Delete: []string{"state/web/r"}}, now.Add(-2*time.Minute), policy)
		m.ApplySteps(state.NextSteps(m.Ramps(), now))
		snap := m.Snapshot()
		if rng.IntN(10) == 0 {
			snap = nil // holds no state yet
		}
		// Three replicas' tables: this one's, two peers'.
		apart := seed%3 == 0
		reps := make([]*Pollers, 3)
		for r := range reps {
			reps[r] = newPollers(t, PollersOptions{})
			for range rng.IntN(120) {
				src := byte(10 + rng.IntN(5))
				if apart {
					src += byte(5 * r)
				}
				req := server()
				if rng.IntN(5) == 0 {
					req = "web/r"
				}
				at := now.Add(-ages[rng.IntN(len(ages))] - time.Duration(rng.IntN(3))*time.Millisecond)
				for range 1 + rng.IntN(2) {
					reps[r].Record(&net.TCPAddr{IP: net.IPv4(127, 0, 0, src)}, []byte(req), answers[rng.IntN(len(answers))], at)
				}
			}
		}
		// a/w and b/w are withheld (an invalid value, none valid
		// before): their HAProxy nodes keep what they were told before,
		// and most keep one answer, by a count each replica adds to; b/w
		// is polled through one peer only (its counts are its row's).
		for r := range reps {
			for src := range byte(1 + rng.IntN(5)) {
				addr := &net.TCPAddr{IP: net.IPv4(127, 0, 0, 20+src+byte(5*r*b2i(apart)))}
				at := now.Add(-time.Duration(rng.IntN(5000)) * time.Millisecond)
				for _, req := range []string{"a/w", "b/w"}[:1+b2i(r == 1)] {
					reps[r].Record(addr, []byte(req), answers[1+rng.IntN(len(answers)-1)], at.Add(-time.Second))
					reps[r].Record(addr, []byte(req), nil, at)
				}
			}
		}
		if seed%4 == 3 {
			// This replica polled by none: the peers hold every poll
			// (BenchmarkFleetOperator's n2).
			reps[0] = newPollers(t, PollersOptions{})
			unpolled++
		}
		peers := &peersReplica{lonelyReplica: lonelyReplica{snap}, t: t, now: now, peers: reps[1:]}
		if rng.IntN(6) == 0 {
			peers.down = 1
		}
		// The peers answer in chunks (as PeerSummaries asks), or out
		// of cursor order, which no release sends but the view takes.
		switch rng.IntN(4) {
		case 1:
			peers.chunk = 1 + rng.IntN(8)
		case 2:
			peers.shuffle = rand.New(rand.NewPCG(seed, 7))
		}
		chunked += b2i(peers.chunk > 0)
		shuffled += b2i(peers.shuffle != nil)
		h := &httpAPI{o: HTTPOptions{Replica: peers, Pollers: reps[0], NodeID: "n1"}}
		for round := range 6 {
			q := listQuery{limit: 1 + rng.IntN(40)}
			if round == 0 {
				q.limit = api.MaxLimit
			}
			var sels []string
			for range rng.IntN(3) {
				sels = append(sels, []string{"a", "c*", "web/r", "b/s[0-2]", "c-d/*", `we?/s1`}[rng.IntN(6)])
			}
			f, err := api.ParseFilter(sels)
			if err != nil {
				t.Fatal(err)
			}
			q.filter, q.sels = f, f.Strings()
			if rng.IntN(3) == 0 {
				q.after = server()
			}
			cluster := rng.IntN(2) == 0
			type told struct {
				row  api.ServerState
				told map[string]int
			}
			var gotTold, wantTold []told
			got := h.viewAt(now, q, cluster, func(row api.ServerState, t map[string]int) { gotTold = append(gotTold, told{row, t}) })
			want := got
			var over int
			want.Servers, want.Total, want.Next, want.Truncated, over = mergedRows(t, h, now, q, cluster, func(row api.ServerState, t map[string]int) {
				wantTold = append(wantTold, told{row, t})
			})
			want.Truncated = want.Truncated || got.InvalidTotal > len(got.InvalidKeys)-b2i(got.KV.RampPolicy != nil)
			overlapped += over
			if !reflect.DeepEqual(got, want) {
				t.Fatalf("seed %d round %d (%+v, cluster %v): view\n%+v\nmerging every poll\n%+v", seed, round, q, cluster, got, want)
			}
			if !reflect.DeepEqual(gotTold, wantTold) {
				t.Fatalf("seed %d round %d: ramping rows told %+v, merging every poll %+v", seed, round, gotTold, wantTold)
			}
			ramping += len(gotTold)
			// The bytes of /v1/state and of the status page follow.
			gw, ww := httptest.NewRecorder(), httptest.NewRecorder()
			writeStateView(gw, got)
			writeStateView(ww, want)
			if !bytes.Equal(gw.Body.Bytes(), ww.Body.Bytes()) {
				t.Fatalf("seed %d round %d: /v1/state bodies differ", seed, round)
			}
			// /v1/state as the handler writes it: each row made as
			// it is written (writeStateRows), the same bytes.
			sw := httptest.NewRecorder()
			sv, rows := h.viewRowsAt(now, q, cluster, nil)
			writeStateRows(sw, sv, rows)
			if !bytes.Equal(sw.Body.Bytes(), gw.Body.Bytes()) {
				t.Fatalf("seed %d round %d: /v1/state written row by row\n%s\nwritten from the view\n%s", seed, round, sw.Body.Bytes(), gw.Body.Bytes())
			}
			page := func(v api.StateView, told []told) []byte {
				behind := map[string]int{}
				for _, rt := range told {
					if n := stepsBehind(rt.row, rt.told); n > 0 {
						behind[rt.row.Backend+"/"+rt.row.Server] = n
					}
				}
				d := buildPage(now, v, behind, peers.ClusterInfo(), true, "")
				d.Nonce = "nonce"
				var b bytes.Buffer
				if err := writePage(&b, d); err != nil {
					t.Fatal(err)
				}
				// page.html whole, its rows rendered first: the
				// same bytes as its two parts with the rows between.
				var rows, whole bytes.Buffer
				writeRows(&rows, d.Backends)
				if err := wholePage.Execute(&whole, struct {
					pageData
					Rows template.HTML
				}{d, template.HTML(rows.String())}); err != nil {
					t.Fatal(err)
				}
				if !bytes.Equal(b.Bytes(), whole.Bytes()) {
					t.Fatalf("seed %d round %d: the page in two parts\n%s\npage.html whole\n%s", seed, round, b.Bytes(), whole.Bytes())
				}
				return b.Bytes()
			}
			if !bytes.Equal(page(got, gotTold), page(want, wantTold)) {
				t.Fatalf("seed %d round %d: status pages differ", seed, round)
			}
			checked += len(got.Servers)
			for _, row := range got.Servers {
				if row.Keeps != "" {
					kept++
				}
			}
		}
	}
	if checked < 1000 || ramping < 20 || overlapped == 0 || kept < 30 || chunked < 5 || shuffled < 5 {
		t.Fatalf("%d rows, %d ramping rows told, %d servers overlapped, %d withheld rows kept, %d seeds chunked, %d shuffled: the random views test too little",
			checked, ramping, overlapped, kept, chunked, shuffled)
	}
	t.Logf("%d rows, %d ramping rows told, %d servers overlapped, %d withheld rows kept, %d seeds chunked, %d shuffled, %d without polls of this replica",
		checked, ramping, overlapped, kept, chunked, shuffled, unpolled)
}

// mergedRows is what the view's servers are by merging every poll of
// every replica (MergeSummaries: this replica's summary first, then the
// peers' answers of polls): every server with a key or a ramp that q
// selects and every server polled by an HAProxy, in cursor order, each
// counted over its merged polls (toldOf), the page q asks for, its total
// and cursor; and how many servers a source polled through two replicas.
func mergedRows(t *testing.T, h *httpAPI, now time.Time, q listQuery, cluster bool,
	rowTold func(api.ServerState, map[string]int)) (rows []api.ServerState, total int, next string, truncated bool, overlapped int) {
	since, nowMs := now.Add(-PollerWindow), now.UnixMilli()
	sums := []PollSummary{roundTrip(t, h.o.Pollers.summary(since, nowMs, SummaryArg{Selectors: q.sels}))}
	if cluster {
		// Whole and in order, whatever the view was answered.
		r := *h.o.Replica.(*peersReplica)
		r.chunk, r.shuffle = 0, nil
		peers, _ := r.PeerSummaries(SummaryArg{Selectors: q.sels})
		sums = append(sums, peers...)
	}
	merged := MergeSummaries(sums)
	snap := h.o.Replica.Snapshot()
	var targets []state.Target
	for _, tg := range snap.Targets() {
		if q.filter.Match(tg.Backend, tg.Server) {
			targets = append(targets, tg)
		}
	}
	if snap != nil {
		for tg, polls := range merged {
			if !slices.Contains(targets, tg) && slices.ContainsFunc(polls, func(p mergedPoll) bool { return p.fromHAProxy(nowMs) }) {
				targets = append(targets, tg)
			}
		}
	}
	for tg := range merged {
		srcs := map[string]int{}
		for _, s := range sums {
			for _, sv := range s.Servers {
				if sv.Backend == tg.Backend && sv.Server == tg.Server {
					for _, p := range sv.Polls {
						srcs[s.Sources[p.Source]]++
					}
				}
			}
		}
		for _, n := range srcs {
			if n > 1 {
				overlapped++
				break
			}
		}
	}
	slices.SortFunc(targets, func(a, b state.Target) int {
		return cmpStrings(api.ServerCursor(a.Backend, a.Server), api.ServerCursor(b.Backend, b.Server))
	})
	total = len(targets)
	for len(targets) > 0 && q.after != "" && api.ServerCursor(targets[0].Backend, targets[0].Server) <= q.after {
		targets = targets[1:]
	}
	if len(targets) > q.limit {
		targets, truncated = targets[:q.limit], true
		next = api.ServerCursor(targets[q.limit-1].Backend, targets[q.limit-1].Server)
	}
	rows = []api.ServerState{}
	for _, tg := range targets {
		row := rowFor(snap.Resolve(tg.Backend, tg.Server))
		told, kept := toldOf(slices.Values(merged[tg]), nowMs, false)
		row.Polled, row.Told = told.polled, told.answers[row.Answer]
		if row.Withheld {
			for answer, n := range kept { // the most kept, the first by name on a tie
				if n > kept[row.Keeps] || (n == kept[row.Keeps] && (row.Keeps == "" || answer < row.Keeps)) {
					row.Keeps = answer
				}
			}
			_, row.Weight = row.KeptKind()
		}
		if row.Kind == api.KindRamping {
			rowTold(row, told.answers)
		}
		rows = append(rows, row)
	}
	return rows, total, next, truncated, overlapped
}

func cmpStrings(a, b string) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// peersReplica is lonelyReplica with peers: each answers a poll-summary
// from its table at now, through the wire form; the first down of them
// does not answer. With chunk, each answers in chunks of at most chunk
// (SummaryArg.Limit), one summary each; with shuffle, each summary's
// servers come in an order shuffle draws.
type peersReplica struct {
	lonelyReplica
	t       *testing.T
	now     time.Time
	peers   []*Pollers
	down    int // how many of the peers, from the first, do not answer
	chunk   int
	shuffle *rand.Rand
}

func (r *peersReplica) PeerSummaries(q SummaryArg) ([]PollSummary, []api.ReplicaAnswer) {
	var sums []PollSummary
	var answers []api.ReplicaAnswer
	for i, p := range r.peers {
		id := fmt.Sprint("n", i+2)
		if i < r.down {
			answers = append(answers, api.ReplicaAnswer{ID: id, Error: "connection refused"})
			continue
		}
		q := q
		q.Limit = r.chunk
		for {
			sum := roundTrip(r.t, p.summary(r.now.Add(-PollerWindow), r.now.UnixMilli(), q))
			if r.shuffle != nil {
				r.shuffle.Shuffle(len(sum.Servers), func(i, j int) { sum.Servers[i], sum.Servers[j] = sum.Servers[j], sum.Servers[i] })
			}
			sums = append(sums, sum)
			if sum.Next == "" {
				break
			}
			q.After = sum.Next
		}
		answers = append(answers, api.ReplicaAnswer{ID: id, Answered: true})
	}
	return sums, answers
}
