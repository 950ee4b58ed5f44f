package server

import (
	"encoding/json"
	"html/template"
	"net/http"
	"slices"
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
	// ClusterInfo is the replica's view of the raft cluster, JSON-encodable.
	ClusterInfo() any
	// KVStatus is the Consul sync status as this replica sees it, JSON-encodable.
	KVStatus() any
	// PeerPollers returns the other replicas' pollers, each Poll naming
	// its replica (for /v1/pollers?scope=cluster).
	PeerPollers() []Poll
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
}

// NewHTTPHandler returns the handler for --http-addr: /-/liveness,
// /-/readiness, /-/metrics, /v1/state[/<backend>/<server>], /v1/cluster and
// the status page at /.
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
	mux.HandleFunc("GET /v1/cluster", func(w http.ResponseWriter, _ *http.Request) {
		writeJSON(w, http.StatusOK, o.Replica.ClusterInfo())
	})
	mux.HandleFunc("GET /{$}", h.page)
	return mux
}

type httpAPI struct{ o HTTPOptions }

// Readiness is the /-/readiness body.
type Readiness struct {
	Ready  bool   `json:"ready"`
	Detail string `json:"detail"`
	KV     any    `json:"kv"`
}

func (h *httpAPI) readiness(w http.ResponseWriter, _ *http.Request) {
	ok, detail := h.o.Replica.Ready()
	code := http.StatusOK
	if !ok {
		code = http.StatusServiceUnavailable
	}
	writeJSON(w, code, Readiness{Ready: ok, Detail: detail, KV: h.o.Replica.KVStatus()})
}

// ServerState is one row of /v1/state.
type ServerState struct {
	Backend  string `json:"backend"`
	Server   string `json:"server"`
	Key      string `json:"key,omitempty"`     // the KV key the answer comes from
	Source   string `json:"source"`            // the key, "absent" or "no-state"
	Value    string `json:"value,omitempty"`   // the raw KV value
	Desired  string `json:"desired,omitempty"` // the last valid value in short form
	Valid    bool   `json:"valid"`
	Error    string `json:"error,omitempty"`
	Reason   string `json:"reason,omitempty"`
	By       string `json:"by,omitempty"`
	Ramp     string `json:"ramp,omitempty"`
	Answer   string `json:"answer"`
	Withheld bool   `json:"withheld"`
	// Ramping is the undrain ramp setting this server's weight, if any.
	Ramping *RampProgress `json:"ramping,omitempty"`
}

// RampProgress is one ramp as shown to operators.
type RampProgress struct {
	Target        string    `json:"target"` // backend/server or backend/*
	WeightPercent int       `json:"weight_percent"`
	Started       time.Time `json:"started"`
	ETA           time.Time `json:"eta"`
	Duration      string    `json:"duration"`
	Interval      string    `json:"interval"`
}

// StateView is the /v1/state body.
type StateView struct {
	HoldsState  bool          `json:"holds_state"`
	Servers     []ServerState `json:"servers"`
	InvalidKeys []ServerState `json:"invalid_keys"`
	KV          any           `json:"kv"`
}

func rowFor(r state.Resolution) ServerState {
	row := ServerState{Backend: r.Backend, Server: r.Server, Source: string(r.Source),
		Answer: r.Answer.String(), Withheld: r.Answer.Withheld, Valid: true}
	if rp := r.Ramp; rp != nil {
		row.Ramping = &RampProgress{Target: rp.Target, WeightPercent: rp.Weight, Started: rp.Started, ETA: rp.ETA(),
			Duration: rp.Policy.Duration.String(), Interval: rp.Policy.Interval.String()}
	}
	if e := r.Entry; e != nil {
		row.Key, row.Value, row.Valid, row.Error = e.Key, e.Raw, e.Valid(), e.Err
		if e.HasLast {
			row.Desired, row.Reason, row.By = e.Last.String(), e.Last.Reason, e.Last.By
			if e.Last.RampSet {
				row.Ramp = e.Last.Ramp.String()
			}
		}
	}
	return row
}

func (h *httpAPI) view() StateView {
	snap := h.o.Replica.Snapshot()
	v := StateView{HoldsState: snap != nil, Servers: []ServerState{}, InvalidKeys: []ServerState{}, KV: h.o.Replica.KVStatus()}
	for _, e := range snap.Entries() {
		if e.Backend == "" {
			v.InvalidKeys = append(v.InvalidKeys, ServerState{Key: e.Key, Value: e.Raw, Error: e.Err, Source: e.Key})
		} else if !e.Valid() {
			v.InvalidKeys = append(v.InvalidKeys, rowFor(snap.Resolve(e.Backend, e.Server)))
		}
	}
	// Every server or backend wildcard with a key or a ramp, and every
	// server an HAProxy asked this replica about. For a wildcard,
	// Resolve(backend, "*") finds the wildcard key itself.
	seen := map[state.Target]bool{}
	for _, t := range snap.Targets() {
		seen[t] = true
		v.Servers = append(v.Servers, rowFor(snap.Resolve(t.Backend, t.Server)))
	}
	if snap != nil {
		for _, p := range h.localPolls() {
			if t := (state.Target{Backend: p.Backend, Server: p.Server}); !seen[t] {
				seen[t] = true
				v.Servers = append(v.Servers, rowFor(snap.Resolve(t.Backend, t.Server)))
			}
		}
	}
	slices.SortFunc(v.Servers, func(a, b ServerState) int {
		return strings.Compare(a.Backend+"/"+a.Server, b.Backend+"/"+b.Server)
	})
	return v
}

// PollerWindow is how far back /v1/pollers and /v1/state look: an HAProxy
// that has not asked for this long is no longer counted as polling.
const PollerWindow = 10 * time.Minute

func (h *httpAPI) localPolls() []Poll {
	if h.o.Pollers == nil {
		return nil
	}
	ps := h.o.Pollers.List(time.Now().Add(-PollerWindow))
	for i := range ps {
		ps[i].Replica = h.o.NodeID
	}
	return ps
}

// PollersView is the /v1/pollers body.
type PollersView struct {
	Scope   string `json:"scope"` // "replica" or "cluster"
	Pollers []Poll `json:"pollers"`
}

func (h *httpAPI) pollers(w http.ResponseWriter, r *http.Request) {
	v := PollersView{Scope: "replica", Pollers: h.localPolls()}
	switch r.URL.Query().Get("scope") {
	case "", "replica":
	case "cluster":
		v.Scope = "cluster"
		v.Pollers = append(v.Pollers, h.o.Replica.PeerPollers()...)
	default:
		writeJSON(w, http.StatusBadRequest, map[string]string{"error": "scope must be replica or cluster"})
		return
	}
	if v.Pollers == nil {
		v.Pollers = []Poll{}
	}
	writeJSON(w, http.StatusOK, v)
}

func (h *httpAPI) stateAll(w http.ResponseWriter, _ *http.Request) {
	writeJSON(w, http.StatusOK, h.view())
}

func (h *httpAPI) stateOne(w http.ResponseWriter, r *http.Request) {
	b, s := r.PathValue("backend"), r.PathValue("server")
	writeJSON(w, http.StatusOK, rowFor(h.o.Replica.Snapshot().Resolve(b, s)))
}

var pageTmpl = template.Must(template.New("page").Funcs(template.FuncMap{"now": func() string {
	return time.Now().UTC().Format(time.RFC3339)
}}).Parse(`<!doctype html><html><head><meta charset="utf-8"><title>hastate</title>
<style>body{font-family:sans-serif;margin:2em}table{border-collapse:collapse}td,th{border:1px solid #ccc;padding:4px 8px;text-align:left}.bad{color:#b00}</style></head><body>
<h1>hastate</h1><p>{{.Ready}} — generated {{now}}. JSON: <a href="/v1/state">/v1/state</a>, <a href="/v1/cluster">/v1/cluster</a>, <a href="/-/metrics">/-/metrics</a></p>
<table><tr><th>backend</th><th>server</th><th>answer</th><th>value</th><th>ramp</th><th>reason</th><th>by</th><th>error</th></tr>
{{range .View.Servers}}<tr><td>{{.Backend}}</td><td>{{.Server}}</td><td>{{if .Withheld}}(withheld){{else}}{{.Answer}}{{end}}</td><td>{{.Value}}</td><td>{{with .Ramping}}{{.WeightPercent}}% until {{.ETA.Format "15:04:05"}}{{end}}</td><td>{{.Reason}}</td><td>{{.By}}</td><td class="bad">{{.Error}}</td></tr>
{{end}}</table></body></html>`))

func (h *httpAPI) page(w http.ResponseWriter, _ *http.Request) {
	ok, detail := h.o.Replica.Ready()
	ready := "ready: " + detail
	if !ok {
		ready = "NOT READY: " + detail
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	if err := pageTmpl.Execute(w, struct {
		Ready string
		View  StateView
	}{ready, h.view()}); err != nil {
		h.o.Logger.Warn("render status page", zap.Error(err))
	}
}

func writeJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	_ = enc.Encode(v)
}
