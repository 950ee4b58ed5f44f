package status

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/hastate/hastate/api"
	"github.com/hastate/hastate/cmd/hastate/internal/ctl"
	"github.com/hastate/hastate/cmd/hastate/internal/ctl/fleet"
)

// benchView is a cluster-scope /v1/state of n servers as a replica beside
// BenchmarkFleetOperator's table answers it: most servers known by their
// polls alone (ready 100%, polled and told by 100 HAProxy nodes), one in
// eight with a key of its own (drain, maint, a weight, a ramp, an --for,
// an expired key, an invalid value), their fields drawn from rng, their
// times whole hours after at plus its nanoseconds (in one of three zones).
func benchView(rng *rand.Rand, n int, at time.Time) *api.StateView {
	v := &api.StateView{Scope: "cluster", HoldsState: true, Total: n,
		InvalidKeys: []api.ServerState{},
		KV:          api.KVStatus{Watching: true},
		Replicas:    []api.ReplicaAnswer{{ID: "n1", Answered: true}, {ID: "n2", Answered: true}, {ID: "n3", Answered: true}}}
	stamp := func() *time.Time {
		t := at.Add(time.Duration(rng.IntN(48)) * time.Hour).In(time.FixedZone("", rng.IntN(3)*3600))
		return &t
	}
	for i := range n {
		r := api.ServerState{Backend: fmt.Sprintf("fs%03d", i/100), Server: fmt.Sprintf("srv%05d", i),
			Source: "absent", Valid: true, Answer: "ready 100%", Kind: api.KindReady, Weight: 100, Polled: 100, Told: 100}
		if rng.IntN(8) == 0 {
			key := "state/" + r.Backend + "/" + r.Server
			r.Key, r.Source, r.Since = key, key, stamp()
			r.Reason, r.By = "deploy \"1.2\" <rollout>\t\u00e9", "ops@host"
			switch rng.IntN(7) {
			case 0:
				r.Value, r.Desired, r.Answer, r.Kind, r.Weight = "drain", "drain", "drain", api.KindDrain, 0
			case 1:
				r.Value, r.Desired, r.Answer, r.Kind, r.Weight = "maint", "maint", "maint", api.KindMaint, 0
				r.Until = stamp()
			case 2:
				r.Value, r.Desired, r.Answer, r.Kind, r.Weight = "40%", "ready 40%", "ready 40%", api.KindWeight, 40
			case 3:
				r.Value, r.Desired, r.Answer, r.Kind, r.Weight = "ready ramp=10m", "ready", "ready 30%", api.KindRamping, 30
				r.Ramp = "10m every 1m"
				r.Ramping = &api.RampProgress{Target: r.Backend + "/" + r.Server, WeightPercent: 30, Started: *stamp(), ETA: *stamp(), Duration: "10m0s", Interval: "1m0s"}
			case 4:
				r.Value, r.Answer, r.Kind = "ready", "ready 100%", api.KindReady
				r.Expired, r.ExpiredAt, r.Since = key+"@", stamp(), nil
			case 5:
				r.Value, r.Valid, r.Error, r.Answer, r.Kind, r.Weight = "drian", false, "invalid value \"drian\": not a known state", "", api.KindWithheld, 0
				r.Withheld, r.Keeps, r.Note = true, "drain", "set outside hastate"
			default:
				r.Value, r.Desired, r.Answer, r.Kind, r.Weight = "drain", "drain", "drain", api.KindDrain, 0
				r.Told = rng.IntN(101)
			}
		}
		v.Servers = append(v.Servers, r)
	}
	return v
}

// stateReplica serves body as every /v1/state, a leader's /v1/cluster and
// an empty record of HAProxy nodes, on 127.0.0.1.
func stateReplica(tb testing.TB, body []byte) *fleet.Replica {
	tb.Helper()
	ci, err := json.Marshal(api.ClusterInfo{NodeID: "n2", State: "follower", LeaderID: "n1", KVPrefix: "hastate/"})
	if err != nil {
		tb.Fatal(err)
	}
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		switch r.URL.Path {
		case "/v1/cluster":
			_, _ = w.Write(ci)
		case "/v1/haproxies":
			_ = json.NewEncoder(w).Encode(api.HAProxiesView{Recorded: true})
		default:
			_, _ = w.Write(body)
		}
	}))
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	srv.Listener.Close()
	srv.Listener = l
	srv.Start()
	tb.Cleanup(srv.Close)
	r, err := fleet.NewReplica(srv.URL)
	if err != nil {
		tb.Fatal(err)
	}
	return r
}

// indented is v as a replica writes /v1/state: encoding/json indented by
// two spaces (server/statejson.go writes the same bytes).
func indented(tb testing.TB, v any) []byte {
	tb.Helper()
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetIndent("", "  ")
	if err := enc.Encode(v); err != nil {
		tb.Fatal(err)
	}
	return b.Bytes()
}

// BenchmarkStatusJSON is `hastate status -o json` of 10,000 servers
// (BenchmarkFleetOperator/pairs=1M's) less the replica: Read of a
// recorded /v1/state served from 127.0.0.1, and WriteJSON into nothing.
// table is `hastate status` of the same view.
//
//	go test -run '^$' -bench StatusJSON -benchmem ./cmd/hastate/internal/ctl/status/
func BenchmarkStatusJSON(b *testing.B) {
	const servers = 10_000
	body := indented(b, benchView(rand.New(rand.NewPCG(1, 2)), servers, time.Date(2026, 12, 5, 16, 0, 0, 123456789, time.UTC)))
	r := stateReplica(b, body)
	for _, c := range []struct {
		name  string
		write func(Report, io.Writer) error
	}{
		{"json", Report.WriteJSON},
		{"table", Report.WriteTable},
	} {
		b.Run(c.name, func(b *testing.B) {
			b.SetBytes(int64(len(body)))
			for b.Loop() {
				rep, err := Read(context.Background(), Options{Replica: r, Prefix: "hastate/"})
				if err != nil {
					b.Fatal(err)
				}
				if len(rep.Rows) != servers {
					b.Fatalf("%d rows, want %d", len(rep.Rows), servers)
				}
				if err := c.write(rep, io.Discard); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// `status -o json` and `status` write, from what the replica answers,
// the bytes they wrote when the answer was decoded by encoding/json into
// api.StateView (ServerState.UnmarshalJSON), every row selected by
// ctl.Select and the rows encoded by encoding/json: random views of
// 10,000 servers (strings with quotes, tabs, HTML and non-ASCII, times
// in three zones, ramps, expired and withheld rows), one row in a
// hundred of a replica that predates kind and weight, and a view with a
// '/' in a name (which */* does not match).
func TestStatusJSONIsEncodingJSONs(t *testing.T) {
	seed := uint64(time.Now().UnixNano())
	rng := rand.New(rand.NewPCG(seed, 7))
	// Since is shown as an age: every time is 30 minutes off a whole
	// hour from now, so that no age changes while the test runs.
	at := time.Now().Add(-30*24*time.Hour - 30*time.Minute)
	for _, c := range []struct {
		name    string
		servers int
		slash   bool
	}{{"10,000 servers", 10_000, false}, {"a / in a name", 1_000, true}} {
		v := benchView(rng, c.servers, at)
		v.InvalidKeys = append(v.InvalidKeys, api.ServerState{Key: "state/web/a/b", Source: "state/web/a/b", Error: "invalid key"})
		for i := range v.Servers {
			if rng.IntN(100) == 0 {
				v.Servers[i].Kind, v.Servers[i].Weight = "", 0 // an older replica's row
			}
		}
		if c.slash {
			v.Servers[rng.IntN(len(v.Servers))].Server = "a/b"
		}
		body := indented(t, v)
		r := stateReplica(t, body)
		rep, err := Read(context.Background(), Options{Replica: r, Prefix: "hastate/"})
		if err != nil {
			t.Fatal(err)
		}
		var ref api.StateView
		if err := json.Unmarshal(body, &ref); err != nil {
			t.Fatal(err)
		}
		want := Report{Rows: ctl.Select(ref.Servers, ctl.Selector{Backend: "*", Server: "*"}), InvalidKeys: ref.InvalidKeys, Prefix: "hastate/"}
		if c.slash && len(want.Rows) != len(v.Servers)-1 {
			t.Fatalf("%s: */* selects %d of %d rows, want all but the one with a /", c.name, len(want.Rows), len(v.Servers))
		}
		var got, ref1 bytes.Buffer
		if err := rep.WriteJSON(&got); err != nil {
			t.Fatal(err)
		}
		enc := json.NewEncoder(&ref1)
		enc.SetIndent("", "  ")
		if err := enc.Encode(want.Rows); err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got.Bytes(), ref1.Bytes()) {
			t.Errorf("%s (seed %d): status -o json writes %d bytes unlike encoding/json's %d:\n%s", c.name, seed, got.Len(), ref1.Len(), firstDiff(got.Bytes(), ref1.Bytes()))
		}
		got.Reset()
		ref1.Reset()
		if err := rep.WriteTable(&got); err != nil {
			t.Fatal(err)
		}
		if err := want.WriteTable(&ref1); err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got.Bytes(), ref1.Bytes()) || got.Len() < c.servers*50 {
			t.Errorf("%s (seed %d): status writes a table of %d bytes unlike encoding/json's rows' %d:\n%s", c.name, seed, got.Len(), ref1.Len(), firstDiff(got.Bytes(), ref1.Bytes()))
		}
	}
	// No rows: an empty list, as before.
	var got bytes.Buffer
	if err := (Report{}).WriteJSON(&got); err != nil || got.String() != "[]\n" {
		t.Errorf("status -o json of no rows: %q, %v; want []", got.String(), err)
	}
}

// firstDiff shows where a and b part.
func firstDiff(a, b []byte) string {
	i := 0
	for i < len(a) && i < len(b) && a[i] == b[i] {
		i++
	}
	from := max(i-200, 0)
	return fmt.Sprintf("at byte %d:\n%s\nwant:\n%s", i, a[from:min(i+200, len(a))], b[from:min(i+200, len(b))])
}
