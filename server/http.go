package server

import (
	"cmp"
	"encoding/json"
	"fmt"
	"github.com/hastate/hastate/api"
	"iter"
	"maps"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/hastate/hastate/state"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"go.uber.org/zap"
)

// Replica is what the HTTP API reads from the running replica. The wiring
// implements it over the raft node and the KV watcher.
type Replica interface {
	SnapshotSource
	// Ready reports readiness per DESIGN.md with a human-readable detail.
	Ready() (bool, string)
	// ClusterInfo is the replica's view of the raft cluster.
	ClusterInfo() api.ClusterInfo
	// KVStatus is the cluster's view of the Consul sync and, on the
	// leader, its watch.
	KVStatus() api.KVStatus
	// PeerPollers returns the other replicas' polls that q selects (each
	// at most q.Limit, 0: all), each Poll naming its replica, how many
	// they hold in all, and which replicas answered (for ?scope=cluster).
	PeerPollers(q PollsArg) (polls []api.Poll, total int, answers []api.ReplicaAnswer)
	// PeerSummaries returns the other replicas' summaries of the polls
	// q selects (every poll of them; see PollSummary), and which
	// replicas answered (for /v1/state?scope=cluster).
	PeerSummaries(q SummaryArg) (sums []PollSummary, answers []api.ReplicaAnswer)
	// Recorded is the cluster's record of which HAProxy nodes exist, and
	// whether the feature level in force keeps it.
	Recorded() (state.HAProxies, bool)
	// PeerSightings returns, for each other replica that answered, the
	// HAProxy sources it saw and when each last polled it, and which
	// replicas answered.
	PeerSightings() (map[string]map[string]time.Time, []api.ReplicaAnswer)
}

// HTTPOptions configure the HTTP handler. Replica is required.
type HTTPOptions struct {
	Replica  Replica
	Gatherer prometheus.Gatherer // nil: /-/metrics answers 404
	Logger   *zap.Logger         // nil: no logs
	// Pollers is this replica's record of probes (nil: none) and NodeID
	// the name its polls carry in /v1/pollers.
	Pollers *Pollers
	NodeID  string
	// Raw reads one mirrored KV key (relative to the prefix) that is not a
	// state key, such as the migration marker; nil: none.
	Raw func(key string) (string, bool)
	// now is the status page's clock (nil: time.Now); tests set it.
	now func() time.Time
}

// NewHTTPHandler returns the handler for --http-addr: /-/liveness,
// /-/readiness, /-/metrics, /v1/state[/<backend>/<server>], /v1/cluster,
// /v1/pollers and the status page at /. The lists (/v1/state, /v1/pollers,
// /) carry at most ?limit= rows (default api.DefaultLimit, at most api.MaxLimit)
// and say how many there are in all.
func NewHTTPHandler(o HTTPOptions) http.Handler {
	if o.Logger == nil {
		o.Logger = zap.NewNop()
	}
	h := &httpAPI{o: o}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /-/liveness", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		_, _ = w.Write([]byte("ok\n"))
	})
	mux.HandleFunc("GET /-/readiness", h.readiness)
	if o.Gatherer != nil {
		mux.Handle("GET /-/metrics", promhttp.HandlerFor(o.Gatherer, promhttp.HandlerOpts{}))
	}
	mux.HandleFunc("GET /v1/state", h.stateAll)
	mux.HandleFunc("GET /v1/state/{backend}/{server}", h.stateOne)
	mux.HandleFunc("GET /v1/pollers", h.pollers)
	mux.HandleFunc("GET /v1/haproxies", h.haproxies)
	mux.HandleFunc("GET /v1/cluster", func(w http.ResponseWriter, _ *http.Request) {
		writeJSON(w, http.StatusOK, o.Replica.ClusterInfo())
	})
	// No request adopts a Consul (the adoption marker does); an older
	// CLI is told so.
	mux.HandleFunc("POST /v1/consul/adopt", adoptGoneHandler)
	mux.HandleFunc("GET /{$}", h.page)
	registerDebug(mux)
	return mux
}

type httpAPI struct{ o HTTPOptions }

func (h *httpAPI) readiness(w http.ResponseWriter, _ *http.Request) {
	ok, detail := h.o.Replica.Ready()
	code := http.StatusOK
	if !ok {
		code = http.StatusServiceUnavailable
	}
	writeJSON(w, code, api.Readiness{Ready: ok, Detail: detail, KV: h.o.Replica.KVStatus()})
}

// parseLimit reads ?limit; the error says what to send.
func parseLimit(r *http.Request) (int, error) {
	q := r.URL.Query().Get("limit")
	if q == "" {
		return api.DefaultLimit, nil
	}
	n, err := strconv.Atoi(q)
	if err != nil || n < 1 || n > api.MaxLimit {
		return 0, fmt.Errorf("limit %q: send ?limit=N with N a whole number from 1 to %d (default %d); "+
			"the answer's total says how many rows there are", q, api.MaxLimit, api.DefaultLimit)
	}
	return n, nil
}

// limitOf reads ?limit for a JSON list; when it is bad it answers 400
// with what to send and returns false.
func limitOf(w http.ResponseWriter, r *http.Request) (int, bool) {
	n, err := parseLimit(r)
	if err != nil {
		writeJSON(w, http.StatusBadRequest, map[string]string{"error": err.Error()})
		return 0, false
	}
	return n, true
}

// cut returns the first limit rows of rows, and whether it cut any.
func cut[T any](rows []T, limit int) ([]T, bool) {
	if len(rows) <= limit {
		return rows, false
	}
	return rows[:limit:limit], true
}

func rowFor(r state.Resolution) api.ServerState { return rowIn(r, nil) }

// rowIn is rowFor with the row's Since, when it has one, appended to
// *sinces (nil: allocated alone): a view's rows share one array instead
// of an allocation each. An append that moves the array leaves the rows
// before it pointing into the old one, which holds their times still.
func rowIn(r state.Resolution, sinces *[]time.Time) api.ServerState {
	row := api.ServerState{Backend: r.Backend, Server: r.Server, Source: string(r.Source),
		Answer: r.Answer.String(), Withheld: r.Answer.Withheld, Valid: true, Kind: api.Kind(r.Kind())}
	if !r.Answer.Withheld && r.Answer.Admin == state.Ready {
		row.Weight = r.Answer.Weight
	}
	if since := r.Since(); !since.IsZero() {
		if sinces == nil {
			row.Since = new(time.Time)
			*row.Since = since
		} else {
			*sinces = append(*sinces, since)
			row.Since = &(*sinces)[len(*sinces)-1]
		}
	}
	if rp := r.Ramp; rp != nil {
		row.Ramping = &api.RampProgress{Target: rp.Target, WeightPercent: rp.Weight, Started: rp.Started, ETA: rp.ETA(),
			Duration: rp.Policy.Duration.String(), Interval: rp.Policy.Interval.String()}
	}
	if e := r.Expired; e != nil {
		row.Expired = e.Key
		if until := e.Last().Until; !until.IsZero() {
			row.ExpiredAt = &until
		}
	}
	if e := r.Entry; e != nil {
		last := e.Last()
		if until := last.Until; !until.IsZero() {
			row.Until = &until
		}
		row.Key, row.Value, row.Valid, row.Error, row.Note = e.Key, e.Raw, e.Valid(), e.Err, e.Note
		if e.HasLast {
			row.Desired, row.Reason, row.By = last.String(), last.Reason, last.By
			if last.RampSet {
				row.Ramp = last.Ramp.String()
			}
		}
	}
	return row
}

// listQuery is what a list request asks for: ?selector= (repeated),
// ?after= and ?limit=.
type listQuery struct {
	filter api.Filter
	sels   []string // as sent, for PollsArg
	after  string
	limit  int
}

// queryOf reads a list request's parameters; when they are bad it answers
// 400 with what to send and returns false.
func queryOf(w http.ResponseWriter, r *http.Request) (listQuery, bool) {
	limit, ok := limitOf(w, r)
	if !ok {
		return listQuery{}, false
	}
	sels := r.URL.Query()["selector"]
	f, err := api.ParseFilter(sels)
	if err != nil {
		writeJSON(w, http.StatusBadRequest, map[string]string{"error": err.Error() + "; send ?selector=backend/server (repeat it for more)"})
		return listQuery{}, false
	}
	return listQuery{filter: f, sels: f.Strings(), after: r.URL.Query().Get("after"), limit: limit}, true
}

// view is /v1/state with at most q.limit servers (those q.filter selects,
// after q.after) and q.limit invalid keys. Rows are resolved only for the
// servers answered. A cluster view also counts the servers and polls the
// other replicas saw (of the selected servers only). rowTold, when not
// nil, is handed each ramping server's row with the last answers the
// HAProxy nodes polling it were told, and how many were told each (the
// status page tells a ramp step on its way from an HAProxy that was told
// something else).
func (h *httpAPI) view(q listQuery, cluster bool, rowTold func(row api.ServerState, told map[string]int)) api.StateView {
	return h.viewAt(time.Now(), q, cluster, rowTold)
}

// viewAt is view with the polls counted at now.
func (h *httpAPI) viewAt(now time.Time, q listQuery, cluster bool, rowTold func(row api.ServerState, told map[string]int)) api.StateView {
	v, rows := h.viewRowsAt(now, q, cluster, rowTold)
	return rows.all(v)
}

// viewRowsAt is viewAt without its rows (v.Servers empty): rows makes
// them, one at a time in their order. /v1/state writes each as it is
// made (writeStateRows) instead of holding every row of the view (about
// 400 bytes each) before it writes the first.
func (h *httpAPI) viewRowsAt(now time.Time, q listQuery, cluster bool, rowTold func(row api.ServerState, told map[string]int)) (api.StateView, *viewRows) {
	snap := h.o.Replica.Snapshot()
	v := api.StateView{Scope: "replica", HoldsState: snap != nil, Servers: []api.ServerState{}, InvalidKeys: []api.ServerState{}, KV: h.o.Replica.KVStatus(),
		Migration: h.migration()}
	if !q.filter.All() {
		v.Selectors = q.sels
	}
	nowMs := now.UnixMilli()
	// This replica's polls are read in place (Pollers.own), the peers'
	// as counts per server, and as polls only where a source polled a
	// server through two replicas (polls.overlaps).
	own := h.o.Pollers.own(now.Add(-PollerWindow), nowMs, q.filter)
	var sums []PollSummary
	var answers []api.ReplicaAnswer
	if cluster {
		sums, answers = h.o.Replica.PeerSummaries(SummaryArg{Selectors: q.sels, Counts: true})
	}
	polls := indexSummaries(sums, own)
	if cluster {
		v.Scope = "cluster"
		if over := polls.overlaps(); len(over) > 0 {
			arg := SummaryArg{Selectors: q.sels}
			if names := exactSelectors(over); names != nil {
				arg.Selectors = names
			}
			detail, more := h.o.Replica.PeerSummaries(arg)
			polls.detail(over, detail)
			answers = failedToo(answers, more)
		}
		v.Replicas = withSelf(answers, h.o.NodeID)
	}
	var invalid []state.Entry
	for _, e := range snap.Entries() {
		if e.Backend == "" || (!e.Valid() && q.filter.Match(e.Backend, e.Server)) {
			invalid = append(invalid, e)
		}
	}
	if c := v.KV.RampPolicy; c != nil {
		// The ramp policy is no state key, but as invalid: every list
		// of invalid keys shows it, first.
		v.InvalidKeys = append(v.InvalidKeys, api.ServerState{Key: c.Key, Value: c.Value, Source: c.Key, Error: c.Error, Note: c.Effect})
		v.InvalidTotal++
	}
	v.InvalidTotal += len(invalid)
	invalid, cutInvalid := cut(invalid, q.limit)
	for _, e := range invalid {
		if e.Backend == "" {
			v.InvalidKeys = append(v.InvalidKeys, api.ServerState{Key: e.Key, Value: e.Raw, Error: e.Err, Source: e.Key})
		} else {
			v.InvalidKeys = append(v.InvalidKeys, rowFor(snap.Resolve(e.Backend, e.Server)))
		}
	}
	// Every server or backend wildcard with a key or a ramp, and every
	// server an HAProxy asked about. For a wildcard, Resolve(backend, "*")
	// finds the wildcard key itself.
	var targets []state.Target
	backends := map[string]bool{}
	for _, t := range snap.Targets() {
		backends[t.Backend] = true
		if q.filter.Match(t.Backend, t.Server) {
			targets = append(targets, t)
		}
	}
	// Targets are sorted by "backend/server", their cursors; mergeTargets
	// needs them so.
	if !slices.IsSortedFunc(targets, compareCursors) {
		slices.SortFunc(targets, compareCursors)
	}
	if snap != nil {
		// A manual probe does not make a server known.
		targets = mergeTargets(targets, polls.polled(nowMs))
	}
	if !q.filter.All() {
		for b := range h.o.Pollers.Backends(now.Add(-PollerWindow)) {
			backends[b] = true
		}
		v.Backends = slices.Sorted(maps.Keys(backends))
	}
	v.Total = len(targets)
	if q.after != "" {
		i, _ := slices.BinarySearchFunc(targets, q.after, func(t state.Target, after string) int {
			if api.ServerCursor(t.Backend, t.Server) <= after {
				return -1
			}
			return 1
		})
		targets = targets[i:]
	}
	targets, cutServers := cut(targets, q.limit)
	if cutServers {
		last := targets[len(targets)-1]
		v.Next = api.ServerCursor(last.Backend, last.Server)
	}
	v.Truncated = cutServers || cutInvalid
	return v, &viewRows{snap: snap, targets: targets, polls: polls, nowMs: nowMs, rowTold: rowTold}
}

// viewRows makes a view's rows in their order: each resolved in the
// view's snapshot and counted over its polls (countRow), the index read
// in step with the rows (both in cursor order).
type viewRows struct {
	snap    *state.Snapshot
	targets []state.Target // the rows' servers; next makes targets[done]
	done    int
	polls   summaryIndex
	seen    int // polls.list[seen] is the first server not before the next row's
	nowMs   int64
	rowTold func(row api.ServerState, told map[string]int)
}

// len is how many rows the view has.
func (r *viewRows) len() int { return len(r.targets) }

// all is v with the rows that are left made, yielding (yield.go): their
// since times in one array.
func (r *viewRows) all(v api.StateView) api.StateView {
	v.Servers = slices.Grow(v.Servers, r.len()-r.done)
	sinces := make([]time.Time, 0, r.len()-r.done)
	var yield yielder
	for r.done < r.len() {
		yield.step()
		v.Servers = append(v.Servers, r.next(&sinces))
	}
	return v
}

// next makes the next row (rowIn: its since appended to *sinces).
func (r *viewRows) next(sinces *[]time.Time) api.ServerState {
	t := r.targets[r.done]
	r.done++
	row := rowIn(r.snap.Resolve(t.Backend, t.Server), sinces)
	seen := r.polls.list
	for r.seen < len(seen) && seen[r.seen].t != t && compareCursors(seen[r.seen].t, t) < 0 {
		r.seen++
	}
	var e *seenServer
	if r.seen < len(seen) && seen[r.seen].t == t {
		e = &seen[r.seen]
	}
	r.polls.countRow(&row, e, r.nowMs, r.rowTold)
	return row
}

// polled returns, in cursor order, the servers some replica saw that an
// HAProxy polls (a manual probe does not count: mergedPoll.fromHAProxy):
// the index's list, in its order. A server of this replica's list that
// no peer saw takes what own read of it; the others are merged only
// where two replicas saw a source in common (fromHAProxy).
func (x *summaryIndex) polled(nowMs int64) []state.Target {
	out := make([]state.Target, 0, len(x.list))
	for i := range x.list {
		e := &x.list[i]
		from := e.n == 0 && e.sp != nil && e.fromHAProxy
		if e.n > 0 {
			from = x.fromHAProxy(e, nowMs)
		}
		if from {
			out = append(out, e.t)
		}
	}
	return out
}

// mergeTargets returns the union of a and b, each in cursor order and
// without duplicates, in cursor order. The shorter is placed in the
// longer by binary search: a few keyed servers among thousands polled
// cost a few searches and copies, not a comparison per server.
func mergeTargets(a, b []state.Target) []state.Target {
	if len(a) > len(b) {
		a, b = b, a
	}
	if len(a) == 0 {
		return b
	}
	out := make([]state.Target, 0, len(a)+len(b))
	for _, t := range a {
		i, found := slices.BinarySearchFunc(b, t, compareCursors)
		out = append(out, b[:i]...)
		if found {
			i++
		}
		out, b = append(out, t), b[i:]
	}
	return append(out, b...)
}

// countRow sets row's polled and told counts, and when withheld what its
// HAProxy nodes keep, and hands a ramping row to rowTold. e is the row's
// server in the index (nil: no replica saw it). A server no peer saw is
// counted from its kept counts under its lock, without a map; one a peer
// saw as toldOf over the replicas (summaryIndex.told).
func (x *summaryIndex) countRow(row *api.ServerState, e *seenServer, nowMs int64, rowTold func(api.ServerState, map[string]int)) {
	var told, kept tally
	var toldBuf, keptBuf [4]textCount
	told, kept = toldBuf[:0], keptBuf[:0]
	var refs []sumRef
	var mine *serverPolls // this replica's records of it
	if e != nil {
		refs, mine = x.places(e), e.sp
	}
	if c := x.onlyCounts(refs, mine); c != nil {
		// One peer saw it and answered its counts: they are the row's.
		s := &x.sums[refs[0].sum]
		row.Polled = int(c.Polled)
		for _, a := range c.Told {
			told = told.add(s.Answers[a.Answer], int(a.N))
		}
		for _, a := range c.Kept {
			kept = kept.add(s.Answers[a.Answer], int(a.N))
		}
	} else if len(refs) == 0 {
		if mine != nil {
			var toldIDs, keptIDs [4]AnswerCount
			sp := mine
			sp.mu.Lock()
			c := sp.toldCounts(x.own.since, nowMs)
			row.Polled = int(c.polled)
			byAnswer, keptBy := append(toldIDs[:0], c.answers...), append(keptIDs[:0], c.kept...)
			sp.mu.Unlock()
			for _, a := range byAnswer {
				told = told.add(x.own.text(uint16(a.Answer)), int(a.N))
			}
			for _, a := range keptBy {
				kept = kept.add(x.own.text(uint16(a.Answer)), int(a.N))
			}
		}
	} else {
		all, byAnswer := x.told(e, nowMs)
		row.Polled = all.polled
		for answer, n := range all.answers {
			told = told.add(answer, n)
		}
		for answer, n := range byAnswer {
			kept = kept.add(answer, n)
		}
	}
	row.Told = told.of(row.Answer)
	if row.Withheld {
		keepsOf(row, kept)
	}
	if rowTold != nil && row.Kind == api.KindRamping {
		rowTold(*row, told.counts())
	}
}

// onlyCounts is the counts a peer answered for a server that it alone
// saw (refs, and mine: this replica's records, nil when none), nil when
// the server is not such.
func (x *summaryIndex) onlyCounts(refs []sumRef, mine *serverPolls) *ServerCounts {
	if mine != nil || len(refs) != 1 {
		return nil
	}
	return x.sums[refs[0].sum].Servers[refs[0].server].Counts
}

// tally is how many HAProxy nodes were told (or keep) each answer, by
// its text, one entry an answer: a server's were told one or two.
type tally []textCount

type textCount struct {
	answer string
	n      int
}

// add adds n to answer's count.
func (c tally) add(answer string, n int) tally {
	for i := range c {
		if c[i].answer == answer {
			c[i].n += n
			return c
		}
	}
	return append(c, textCount{answer, n})
}

// of is answer's count.
func (c tally) of(answer string) int {
	for _, a := range c {
		if a.answer == answer {
			return a.n
		}
	}
	return 0
}

// counts is c as a map.
func (c tally) counts() map[string]int {
	m := make(map[string]int, len(c))
	for _, a := range c {
		m[a.answer] += a.n
	}
	return m
}

// compareCursors orders targets as their api.ServerCursor, without
// building it (a backend holds no "/").
func compareCursors(a, b state.Target) int {
	if a.Backend == b.Backend {
		return strings.Compare(a.Server, b.Server)
	}
	n := min(len(a.Backend), len(b.Backend))
	if c := strings.Compare(a.Backend[:n], b.Backend[:n]); c != 0 {
		return c
	}
	if len(a.Backend) == n { // a's "/" against b's next byte
		return cmp.Compare('/', b.Backend[n])
	}
	return cmp.Compare(a.Backend[n], '/')
}

// toldAnswers are the answers the HAProxy nodes polling one server were
// last told: how many poll it, how many were told each answer ("":
// withheld) and, when asked for (byHAProxy), the answer by HAProxy.
type toldAnswers struct {
	polled  int
	answers map[string]int
	by      map[string]string
}

func (t toldAnswers) told(answer string) int { return t.answers[answer] }

// toldOf counts, for one server, the last answer each HAProxy polling it
// at now was told, over the polls of every replica merged (an HAProxy asks
// every replica behind the load balancer; the latest answer counts), and,
// for those withheld, how many keep each earlier answer. A manual probe is
// no HAProxy (api.Poll.FromHAProxy).
func toldOf(polls iter.Seq[mergedPoll], nowMs int64, byHAProxy bool) (told toldAnswers, kept map[string]int) {
	told.answers, kept = map[string]int{}, map[string]int{}
	if byHAProxy {
		told.by = map[string]string{}
	}
	for p := range polls {
		if !p.polling(nowMs) {
			continue
		}
		answer := p.Answer
		if p.Withheld {
			answer = ""
			if p.Kept != "" {
				kept[p.Kept]++
			}
		}
		told.polled++
		told.answers[answer]++
		if byHAProxy {
			told.by[p.Source] = answer
		}
	}
	return told, kept
}

// keepsOf sets a withheld row's Keeps, what HAProxy keeps, to the answer
// most of its HAProxy nodes were last told (the first by name on a tie),
// and its Weight to that answer's.
func keepsOf(row *api.ServerState, kept tally) {
	for _, a := range kept {
		if n := kept.of(row.Keeps); a.n > n || (a.n == n && (row.Keeps == "" || a.answer < row.Keeps)) {
			row.Keeps = a.answer
		}
	}
	_, row.Weight = row.KeptKind()
}

// peerPolls returns the other replicas' polls that q selects, how many
// they hold, and, sorted, which replicas answered (this one included).
func (h *httpAPI) peerPolls(q PollsArg) ([]api.Poll, int, []api.ReplicaAnswer) {
	polls, total, answers := h.o.Replica.PeerPollers(q)
	return polls, total, withSelf(answers, h.o.NodeID)
}

// exactSelectors returns selectors that name ts exactly (their glob
// characters escaped), or nil when they are too many for one peer
// query's argument: the peers are then asked for every selected server.
func exactSelectors(ts []state.Target) []string {
	const most = 32 << 10 // bytes, half of a peer query's argument line
	out := make([]string, 0, len(ts))
	n := 0
	for _, t := range ts {
		sel := escapeGlob(t.Backend) + "/" + escapeGlob(t.Server)
		if n += len(sel) + 3; n > most {
			return nil
		}
		out = append(out, sel)
	}
	return out
}

// escapeGlob escapes path.Match's special characters in name.
func escapeGlob(name string) string {
	const special = `*?[\`
	if !strings.ContainsAny(name, special) {
		return name
	}
	var b strings.Builder
	for _, r := range name {
		if strings.ContainsRune(special, r) {
			b.WriteByte('\\')
		}
		b.WriteRune(r)
	}
	return b.String()
}

// failedToo marks, in answers, the replicas that failed in more (a second
// question to the same peers).
func failedToo(answers, more []api.ReplicaAnswer) []api.ReplicaAnswer {
	for _, m := range more {
		if m.Answered {
			continue
		}
		for i := range answers {
			if answers[i].ID == m.ID && answers[i].Answered {
				answers[i] = m
			}
		}
	}
	return answers
}

// withSelf adds this replica (id) to the peers' answers, sorted.
func withSelf(answers []api.ReplicaAnswer, id string) []api.ReplicaAnswer {
	answers = append(answers, api.ReplicaAnswer{ID: id, Answered: true})
	slices.SortFunc(answers, func(a, b api.ReplicaAnswer) int { return strings.Compare(a.ID, b.ID) })
	return answers
}

// PollerWindow is how far back /v1/pollers looks: an HAProxy that has not
// asked for this long is forgotten. (Counting as polling takes asking
// within api.PollerTTL.)
const PollerWindow = 10 * time.Minute

func (h *httpAPI) localSelect(q PollsArg) ([]api.Poll, int) {
	if h.o.Pollers == nil {
		return nil, 0
	}
	return h.o.Pollers.Select(time.Now().Add(-PollerWindow), q, h.o.NodeID)
}

// pollers is /v1/pollers: the polls of the selected servers, a page of at
// most ?limit= after ?after=; with scope=cluster, every replica's, each
// asked for one page more than the limit so that the merged page knows
// whether more follow.
func (h *httpAPI) pollers(w http.ResponseWriter, r *http.Request) {
	q, ok := queryOf(w, r)
	if !ok {
		return
	}
	cluster, ok := scopeOf(w, r)
	if !ok {
		return
	}
	arg := PollsArg{Selectors: q.sels, After: q.after, Limit: q.limit + 1}
	v := api.PollersView{Scope: "replica"}
	if !q.filter.All() {
		v.Selectors = q.sels
	}
	v.Pollers, v.Total = h.localSelect(arg)
	if cluster {
		v.Scope = "cluster"
		peers, total, answers := h.peerPolls(arg)
		v.Pollers, v.Replicas = append(v.Pollers, peers...), answers
		v.Total += total
		SortPolls(v.Pollers)
	}
	if v.Pollers == nil {
		v.Pollers = []api.Poll{}
	}
	v.Pollers, v.Truncated = cut(v.Pollers, q.limit)
	if v.Truncated {
		v.Next = api.PollCursor(v.Pollers[len(v.Pollers)-1])
	}
	writePollersView(w, v)
}

// haproxies is /v1/haproxies: the cluster's record of which HAProxy nodes
// exist, and when each replica that answered last saw each of them (this
// one and, over the raft port, the others). Before the record is kept
// (a rolling upgrade from 0.14.0), it lists what the replicas saw.
func (h *httpAPI) haproxies(w http.ResponseWriter, _ *http.Request) {
	rec, recorded := h.o.Replica.Recorded()
	now := time.Now()
	seen, answers := h.o.Replica.PeerSightings()
	if seen == nil {
		seen = map[string]map[string]time.Time{}
	}
	if h.o.Pollers != nil {
		seen[h.o.NodeID] = h.o.Pollers.Sightings(now.Add(-PollerWindow), now)
	}
	answers = withSelf(answers, h.o.NodeID)
	nodes := map[string]*api.HAProxyNode{}
	node := func(src string) *api.HAProxyNode {
		n := nodes[src]
		if n == nil {
			n = &api.HAProxyNode{HAProxy: src}
			nodes[src] = n
		}
		return n
	}
	for src, s := range rec {
		n := node(src)
		n.FirstSeen, n.LastSeen = s.First, s.Last
	}
	for id, m := range seen {
		for src, at := range m {
			n := node(src)
			if n.SeenBy == nil {
				n.SeenBy = map[string]time.Time{}
			}
			n.SeenBy[id] = at
			if !recorded && at.After(n.LastSeen) {
				n.LastSeen = at
			}
		}
	}
	v := api.HAProxiesView{Recorded: recorded, HAProxies: []api.HAProxyNode{}, Replicas: answers}
	for _, src := range slices.Sorted(maps.Keys(nodes)) {
		v.HAProxies = append(v.HAProxies, *nodes[src])
	}
	writeJSON(w, http.StatusOK, v)
}

func (h *httpAPI) stateAll(w http.ResponseWriter, r *http.Request) {
	q, ok := queryOf(w, r)
	if !ok {
		return
	}
	cluster, ok := scopeOf(w, r)
	if ok {
		v, rows := h.viewRowsAt(time.Now(), q, cluster, nil)
		writeStateRows(w, v, rows)
	}
}

// scopeOf reads ?scope (replica, the default, or cluster); when it is bad
// it answers 400 with what to send and returns false.
func scopeOf(w http.ResponseWriter, r *http.Request) (cluster, ok bool) {
	switch r.URL.Query().Get("scope") {
	case "", "replica":
		return false, true
	case "cluster":
		return true, true
	}
	writeJSON(w, http.StatusBadRequest, map[string]string{"error": "scope must be replica or cluster"})
	return false, false
}

func (h *httpAPI) stateOne(w http.ResponseWriter, r *http.Request) {
	b, s := r.PathValue("backend"), r.PathValue("server")
	writeJSON(w, http.StatusOK, rowFor(h.o.Replica.Snapshot().Resolve(b, s)))
}

// thousands writes n (not negative) with commas between groups of three
// digits: 52,000.
func thousands(n int) string {
	s := strconv.Itoa(n)
	var b strings.Builder
	for i, c := range s {
		if i > 0 && (len(s)-i)%3 == 0 {
			b.WriteByte(',')
		}
		b.WriteRune(c)
	}
	return b.String()
}

func writeJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	_ = enc.Encode(v)
}

// migration is the migration marker the replica mirrors, nil when none.
func (h *httpAPI) migration() *api.Migration {
	if h.o.Raw == nil {
		return nil
	}
	raw, ok := h.o.Raw(state.MigrationKey)
	if !ok {
		return nil
	}
	m, err := state.ParseMigration(raw)
	if err != nil {
		return &api.Migration{Error: err.Error()}
	}
	out := &api.Migration{By: m.By, Reason: m.Reason}
	if !m.Started.IsZero() {
		out.Started = &m.Started
	}
	return out
}
