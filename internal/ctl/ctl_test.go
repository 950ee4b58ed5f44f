package ctl

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	consulapi "github.com/hashicorp/consul/api"
	"github.com/hastate/hastate/api"
	"github.com/hastate/hastate/internal/testenv"
	"github.com/hastate/hastate/kvsync"
	"github.com/hastate/hastate/state"
)

func TestParseSelectors(t *testing.T) {
	for _, tt := range []struct {
		args []string
		want string // joined selectors, or the error substring after "ERR:"
	}{
		{[]string{"web/a", "web/*", "web/a"}, "web/a web/*"},
		{[]string{"web"}, "web/*"},
		{[]string{"canary_web/web 3"}, "canary_web/web 3"},
		{[]string{"a/b\tc"}, "ERR:consul kv delete '<kv-prefix>state/a/b\tc'"},
		{[]string{"canary_*/*", "*/gke-cny-web", "*/*-us-east1-b"}, "canary_*/* */gke-cny-web */*-us-east1-b"},
		{nil, "ERR:at least one"},
		{[]string{"web/"}, "ERR:not <backend>/<server>"},
		{[]string{"/a"}, "ERR:not <backend>/<server>"},
		{[]string{"a/b/c"}, "ERR:more than one '/'; if it is a key in KV, no agent request can name it: remove it with `consul kv delete '<kv-prefix>state/a/b/c'`"},
		{[]string{"web/[a"}, "ERR:bad glob"},
	} {
		got, err := ParseSelectors(tt.args)
		if strings.HasPrefix(tt.want, "ERR:") {
			if !errors.Is(err, ErrUsage) || !strings.Contains(err.Error(), tt.want[4:]) {
				t.Errorf("ParseSelectors(%q) err = %v, want usage error with %q", tt.args, err, tt.want[4:])
			}
			continue
		}
		var s []string
		for _, x := range got {
			s = append(s, x.String())
		}
		if err != nil || strings.Join(s, " ") != tt.want {
			t.Errorf("ParseSelectors(%q) = %v, %v", tt.args, s, err)
		}
	}
}

func TestValue(t *testing.T) {
	now := time.Date(2026, 12, 1, 3, 0, 0, 0, time.UTC)
	v, err := Value("drain", ValueOptions{Reason: "zonal maintenance", By: "alice", Ramp: "10m", For: 2 * time.Hour, Now: now})
	if err != nil {
		t.Fatal(err)
	}
	p, err := state.ParseValue(v)
	if err != nil || p.Admin != state.Drain || p.Reason != "zonal maintenance" || p.By != "alice" || !p.RampSet ||
		!p.Until.Equal(now.Add(2*time.Hour)) || !p.At.Equal(now) {
		t.Fatalf("Value round trip: %q -> %+v, %v", v, p, err)
	}
	for _, bad := range []struct {
		st   string
		o    ValueOptions
		want string
	}{
		{"drian", ValueOptions{}, `state "drian": want ready, drain, maint`},
		{"drain", ValueOptions{Ramp: "ten minutes"}, `--ramp: ramp "ten minutes"`},
		{"drain", ValueOptions{For: -time.Hour}, "--for -1h0m0s: want a positive duration"},
	} {
		_, err := Value(bad.st, bad.o)
		if !errors.Is(err, ErrUsage) || !strings.Contains(err.Error(), bad.want) || strings.Contains(err.Error(), "{") {
			t.Errorf("Value(%q, %+v) = %v, want a usage error %q without JSON", bad.st, bad.o, err, bad.want)
		}
	}
}

func TestParseWeight(t *testing.T) {
	for in, want := range map[string]string{"25%": "25%", "25": "25%", "0%": "0%", "256%": "256%",
		"300%": "ERR:weight 300% is above 256%", "-5%": "ERR:weight -5% is below 0%", "lots": "ERR:want a whole percentage", "2.5%": "ERR:want a whole"} {
		got, err := ParseWeight(in)
		if strings.HasPrefix(want, "ERR:") {
			if !errors.Is(err, ErrUsage) || !strings.Contains(err.Error(), want[4:]) {
				t.Errorf("ParseWeight(%q) = %q, %v; want usage error %q", in, got, err, want[4:])
			}
		} else if got != want || err != nil {
			t.Errorf("ParseWeight(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
}

// fleet is a cluster view for planning tests: backends canary_web (web-1,
// web-2 polled; web-2 keeps 50% of its own), canary_api (api-1 polled, a
// drained wildcard), main_web (m-1, m-2 polled, m-3 known only by its key),
// and gke-cny-web in two backends.
func fleet() *api.StateView {
	row := func(b, s, answer string, polled int, key string) api.ServerState {
		r := api.ServerState{Backend: b, Server: s, Answer: answer, Polled: polled, Told: polled, Source: "absent"}
		r.Kind, r.Weight = kindOf(answer)
		if key != "" {
			r.Key, r.Source, r.Desired = "state/"+b+"/"+key, "state/"+b+"/"+key, answer
		}
		return r
	}
	return &api.StateView{HoldsState: true, KV: api.KVStatus{KVView: api.KVView{Synced: true}}, Replicas: []api.ReplicaAnswer{{ID: "n1", Answered: true}, {ID: "n2", Answered: true}},
		Servers: []api.ServerState{
			row("canary_api", "*", "drain", 0, "*"),
			row("canary_api", "api-1", "drain", 2, "*"),
			row("canary_web", "web-1", "ready 100%", 2, ""),
			row("canary_web", "web-2", "ready 50%", 2, "web-2"),
			row("main_api", "gke-cny-web", "ready 100%", 2, ""),
			row("main_api", "x-us-east1-b", "ready 100%", 1, ""),
			row("main_api", "y-us-east1-c", "ready 100%", 1, ""),
			row("main_web", "gke-cny-web", "ready 100%", 2, ""),
			row("main_web", "m-1", "ready 100%", 2, ""),
			row("main_web", "m-2", "ready 100%", 2, ""),
			row("main_web", "m-3", "maint", 0, "m-3"),
		}}
}

// kindOf is the kind and weight a replica gives a row with answer (no ramp).
func kindOf(answer string) (api.Kind, int) {
	switch answer {
	case "drain":
		return api.KindDrain, 0
	case "maint":
		return api.KindMaint, 0
	case "ready 100%":
		return api.KindReady, 100
	}
	w, _ := strconv.Atoi(strings.TrimSuffix(strings.TrimPrefix(answer, "ready "), "%"))
	return api.KindWeight, w
}

func planKeys(p Plan) string {
	var s []string
	for _, o := range p.Ops {
		k := strings.TrimPrefix(o.Key, "hastate/state/")
		if o.Delete {
			k = "-" + k
		}
		s = append(s, k)
	}
	return strings.Join(s, " ")
}

func TestPlanWrite(t *testing.T) {
	for _, tt := range []struct {
		name, cmd string
		args      []string
		o         WriteOptions
		want      string // keys ("-" for a delete), or "ERR:" and the error text
		note      string // in the plan's notes
		noFleet   bool
		value     string // the value written ("": {"state":"<cmd>"})
		edit      func(*api.StateView)
		kv        map[string]string // Consul's keys that differ from the view ("": absent)
		lifted    string            // in the plan's lifted guards
	}{
		{name: "one server", cmd: "drain", args: []string{"canary_web/web-1"}, want: "canary_web/web-1"},
		{name: "backend-wide drain that a server would escape is refused", cmd: "drain", args: []string{"canary_web/*"},
			want: "ERR:refused, nothing was written: canary_web/* would not reach servers with their own key: web-2 keeps 50%; add --override to clear their keys in the same transaction, or --keep-own"},
		{name: "backend-wide with keep-own names who keeps its own key", cmd: "drain", args: []string{"canary_web/*"}, want: "canary_web/*",
			o: WriteOptions{KeepOwn: true}, note: "canary_web/* does not reach servers with their own key: web-2 keeps 50% (--keep-own)"},
		{name: "backend-wide maint escaped by a drained own key", cmd: "maint", args: []string{"canary_api/*", "main_web"},
			o: WriteOptions{Override: true}, want: "canary_api/* main_web/* -main_web/m-3"},
		{name: "backend-wide drain: a server in maint does not escape it", cmd: "drain", args: []string{"main_web"}, want: "main_web/*",
			note: "main_web/* does not reach servers with their own key: m-3 keeps maint; add --override"},
		{name: "backend-wide weight 0% is a drain", cmd: "weight", value: "0%", args: []string{"canary_web"}, want: "ERR:web-2 keeps 50%"},
		{name: "backend-wide weight 50% only notes", cmd: "weight", value: "50%", args: []string{"canary_web"}, want: "canary_web/*",
			note: "web-2 keeps 50%"},
		{name: "backend-wide with override clears them in the same transaction", cmd: "drain", args: []string{"canary_web/*"},
			o: WriteOptions{Override: true}, want: "canary_web/* -canary_web/web-2"},
		{name: "canary drain: one wildcard per known backend", cmd: "drain", args: []string{"canary_*/*"}, o: WriteOptions{KeepOwn: true},
			want: "canary_api/* canary_web/*"},
		{name: "canary drain that a canary escapes is refused", cmd: "drain", args: []string{"canary_*/*"}, want: "ERR:canary_web/* would not reach"},
		{name: "one server across backends", cmd: "drain", args: []string{"*/gke-cny-web"}, want: "main_api/gke-cny-web main_web/gke-cny-web"},
		{name: "zonal drain", cmd: "drain", args: []string{"*/*-us-east1-b"}, want: "main_api/x-us-east1-b"},
		{name: "a glob that matches nothing", cmd: "drain", args: []string{"canary_wbe*/*"}, want: "ERR:no server matches 'canary_wbe*/*'; known backends: canary_api, canary_web, main_api, main_web"},
		{name: "a server glob that matches nothing", cmd: "drain", args: []string{"*/nope-*"}, want: "ERR:no server matches '*/nope-*'"},
		{name: "a server the cluster does not know", cmd: "drain", args: []string{"canary_web/web1"},
			want: "ERR:no server matches 'canary_web/web1': no HAProxy has polled canary_web/web1 in the last 1m0s and it has no key (a typo?); known servers of canary_web: web-1, web-2; add --allow-unknown"},
		{name: "a server no HAProxy polls", cmd: "drain", args: []string{"main_web/m-3"},
			want: "ERR:no HAProxy has polled main_web/m-3 in the last 1m0s (a typo?); known servers of main_web: gke-cny-web, m-1, m-2, m-3; add --allow-unknown"},
		{name: "a server of a backend the cluster does not know", cmd: "drain", args: []string{"canery_web/web-1"},
			want: "ERR:no server matches 'canery_web/web-1'; known backends: canary_api, canary_web, main_api, main_web; add --allow-unknown"},
		{name: "the backend alone", cmd: "drain", args: []string{"canary_api"}, want: "canary_api/*"},
		{name: "weight 0% of the last ready servers is refused", cmd: "weight", value: "0%", args: []string{"canary_web/web-1", "canary_web/web-2"},
			want: "ERR:canary_web would have 0 ready of the servers HAProxy polls (now 2), fewer than --min-ready 1 (a server at 0% is not ready"},
		{name: "weight 25% is not refused for min-ready", cmd: "weight", value: "25%", args: []string{"canary_web/web-1", "canary_web/web-2"},
			want: "canary_web/web-1 canary_web/web-2"},
		{name: "a server at 0% is not ready for min-ready", cmd: "drain", args: []string{"canary_web/web-1"}, want: "ERR:canary_web would have 0 ready",
			edit: func(v *api.StateView) {
				v.Servers[3].Kind, v.Servers[3].Weight, v.Servers[3].Answer = api.KindWeight, 0, "ready 0%"
			}},
		{name: "ready deletes a key no backend-wide key covers", cmd: "ready", args: []string{"canary_web/web-2"}, want: "-canary_web/web-2"},
		{name: "ready that deletes says the reason is not kept", cmd: "ready", value: `{"state":"ready","reason":"done"}`, args: []string{"canary_web/web-2"},
			want: "-canary_web/web-2", note: "--reason and --for are not kept"},
		{name: "ready with a ramp keeps the key", cmd: "ready", value: `{"state":"ready","ramp":"10m"}`, args: []string{"canary_web/web-2"},
			want: "canary_web/web-2", note: "--ramp lives in its key"},
		{name: "ready under a backend-wide key writes ready and says so", cmd: "ready", args: []string{"canary_api/api-1"}, want: "canary_api/api-1",
			note: "canary_api/api-1: written as ready under canary_api/* (drain), so it now stays out of backend-wide drains and maints"},
		{name: "ready of a backend deletes its backend-wide key", cmd: "ready", args: []string{"canary_api"}, want: "-canary_api/*"},
		{name: "unknown allowed", cmd: "drain", args: []string{"canary_web/web1"}, o: WriteOptions{Allow: Allow{Unknown: true}}, want: "canary_web/web1"},
		{name: "forced", cmd: "drain", args: []string{"canary_web/web1"}, o: WriteOptions{Allow: AllowForce()}, want: "canary_web/web1"},
		{name: "--allow-unknown does not lift min-ready", cmd: "drain", args: []string{"main_web/m-1", "main_web/m-2", "main_web/gke-cny-web"},
			o: WriteOptions{Allow: Allow{Unknown: true}}, want: "ERR:add --allow-below-min-ready"},
		{name: "the last ready server", cmd: "drain", args: []string{"main_web/m-1", "main_web/m-2", "main_web/gke-cny-web"},
			want: "ERR:main_web would have 0 ready of the servers HAProxy polls (now 3), fewer than --min-ready 1"},
		{name: "the last ready server, forced", cmd: "maint", args: []string{"main_web/m-1", "main_web/m-2", "main_web/gke-cny-web"},
			o: WriteOptions{Allow: AllowForce()}, want: "main_web/m-1 main_web/m-2 main_web/gke-cny-web", lifted: "capacity (--force); it would have said: main_web would have 0 ready"},
		{name: "the last ready server, allowed", cmd: "maint", args: []string{"main_web/m-1", "main_web/m-2", "main_web/gke-cny-web"},
			o: WriteOptions{Allow: Allow{BelowMinReady: true}}, want: "main_web/m-1 main_web/m-2 main_web/gke-cny-web", lifted: "capacity (--allow-below-min-ready)"},
		{name: "--force does not lift the partial-backend refusal", cmd: "drain", args: []string{"canary_web/*"}, o: WriteOptions{Allow: AllowForce()},
			want: "ERR:--force does not choose for you"},
		{name: "an unknown backend", cmd: "drain", args: []string{"canary_wbe/*"}, want: "ERR:no server matches 'canary_wbe/*'"},
		{name: "min-ready 3", cmd: "drain", args: []string{"main_web/m-1"}, o: WriteOptions{MinReady: 3},
			want: "ERR:main_web would have 2 ready"},
		{name: "a backend-wide drain may empty the backend", cmd: "drain", args: []string{"main_web/*"}, want: "main_web/* -main_web/m-3",
			o: WriteOptions{Override: true}},
		{name: "ready is never refused for min-ready", cmd: "ready", args: []string{"canary_api/api-1", "main_web/m-1"}, want: "canary_api/api-1",
			note: "already ready: hastate/state/main_web/m-1 does not exist"},
		{name: "clear expands against keys only", cmd: "clear", args: []string{"main_web/*", "*/m-*"}, want: "-main_web/m-3",
			note: "nothing to clear: hastate/state/main_web/* does not exist"},
		{name: "no replica: literal keys", cmd: "drain", args: []string{"web/a"}, o: WriteOptions{Allow: Allow{NoReplica: true}}, noFleet: true, want: "web/a"},
		{name: "no replica: no globs", cmd: "drain", args: []string{"web/a-*"}, o: WriteOptions{Allow: AllowForce()}, noFleet: true, want: "ERR:needs the servers the cluster knows"},
		// Issue 22.2: Consul decides coverage, not the replica's view.
		{name: "ready under a backend-wide key only Consul holds writes ready", cmd: "ready", args: []string{"canary_web/web-2"}, want: "canary_web/web-2",
			kv: map[string]string{"canary_web/*": "drain"}, note: "written as ready under canary_web/* (drain)"},
		{name: "a backend-wide drain refused for an own key only Consul holds", cmd: "drain", args: []string{"main_api/*"},
			kv: map[string]string{"main_api/x-us-east1-b": "50%"}, want: "ERR:main_api/* would not reach servers with their own key: x-us-east1-b keeps 50%"},
		{name: "clear of a key the view shows but Consul no longer holds", cmd: "clear", args: []string{"canary_web/web-2"}, want: "",
			kv: map[string]string{"canary_web/web-2": ""}, note: "nothing to clear: hastate/state/canary_web/web-2 does not exist"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			sels, err := ParseSelectors(tt.args)
			if err != nil {
				t.Fatal(err)
			}
			o := tt.o
			o.Command, o.Value, o.Prefix = tt.cmd, cmp.Or(tt.value, `{"state":"`+tt.cmd+`"}`), "hastate/"
			if o.MinReady == 0 {
				o.MinReady = 1
			}
			f := fleet()
			if tt.edit != nil {
				tt.edit(f)
			}
			if tt.noFleet {
				f = nil
			}
			p, err := planAll(t, f, kvOf(fleet(), tt.kv), sels, o)
			if want, ok := strings.CutPrefix(tt.want, "ERR:"); ok {
				if err == nil || !strings.Contains(err.Error(), want) {
					t.Fatalf("err = %v, want %q", err, want)
				}
				// Issue 15.5: matching nothing is exit 3 in every command.
				if noMatch := strings.Contains(want, "no server matches"); errors.Is(err, ErrNoMatch) != noMatch {
					t.Fatalf("err = %v: ErrNoMatch %v, want %v", err, errors.Is(err, ErrNoMatch), noMatch)
				}
				return
			}
			if err != nil || planKeys(p) != tt.want {
				t.Fatalf("plan %q, %v; want %q", planKeys(p), err, tt.want)
			}
			if tt.note != "" && !strings.Contains(strings.Join(p.Notes, "\n"), tt.note) {
				t.Errorf("notes %q, want %q", p.Notes, tt.note)
			}
			if tt.lifted != "" && !strings.Contains(strings.Join(p.liftedNames(), "\n"), tt.lifted) {
				t.Errorf("lifted %q, want %q", p.liftedNames(), tt.lifted)
			}
			for _, op := range p.Ops {
				if strings.ContainsAny(strings.TrimSuffix(op.Key, "/*"), "*?[") {
					t.Errorf("a literal key with glob characters: %s", op.Key)
				}
			}
		})
	}
	// Past one transaction: refused whole, with advice.
	f := fleet()
	for i := range MaxTxnKeys / 2 { // each key is written with its meta key
		f.Servers = append(f.Servers, api.ServerState{Backend: "big", Server: "s" + string(rune('a'+i%26)) + string(rune('a'+i/26)), Polled: 1, Answer: "ready 100%"})
	}
	sels, _ := ParseSelectors([]string{"big/s*", "canary_web/web-1"})
	if _, err := planAll(t, f, kvOf(f, nil), sels, WriteOptions{Command: "drain", Value: "drain", Prefix: "hastate/", MinReady: 1}); err == nil || !strings.Contains(err.Error(), "use backend-wide keys") {
		t.Errorf("%d keys: %v, want a refusal with advice", MaxTxnKeys/2+1, err)
	}
	// A replica did not answer: refused unless --force.
	f = fleet()
	f.Replicas[1] = api.ReplicaAnswer{ID: "n2", Error: "connection refused"}
	sels, _ = ParseSelectors([]string{"canary_*/*"})
	if _, err := planAll(t, f, kvOf(f, nil), sels, WriteOptions{Command: "drain", Value: "drain", Prefix: "hastate/", KeepOwn: true}); !errors.Is(err, ErrCannotConfirm) ||
		!strings.Contains(err.Error(), "replica n2 unreachable") || !strings.Contains(err.Error(), "--allow-no-replica") {
		t.Errorf("with n2 unreachable: %v, want cannot confirm naming n2 and --allow-no-replica", err)
	}
	p, err := planAll(t, f, kvOf(f, nil), sels, WriteOptions{Command: "drain", Value: "drain", Prefix: "hastate/", KeepOwn: true, Allow: Allow{NoReplica: true}})
	if err != nil || !strings.Contains(strings.Join(p.liftedNames(), ""), "no replica to ask (--allow-no-replica); it would have said: cannot confirm: replica n2 unreachable") {
		t.Errorf("with n2 unreachable, --allow-no-replica: %v, lifted %q", err, p.liftedNames())
	}
}

// kvOf is what Consul holds for the fleet's own keys (every backend of it
// read whole), with edits (backend/server -> value, "" deletes).
func kvOf(f *api.StateView, edits map[string]string) *KVRead {
	kv := NewKVRead("hastate/")
	for _, r := range f.Servers {
		kv.full[r.Backend] = true
		if r.Key != "" && strings.HasSuffix(r.Key, "state/"+r.Backend+"/"+r.Server) {
			k := Key("hastate/", r.Backend, r.Server)
			kv.keys[k] = KVKey{Key: k, Present: true, Value: strings.TrimPrefix(r.Desired, "ready "), Index: 7}
		}
	}
	for bs, v := range edits {
		b, s, _ := strings.Cut(bs, "/")
		k := Key("hastate/", b, s)
		if v == "" {
			delete(kv.keys, k)
			continue
		}
		kv.keys[k] = KVKey{Key: k, Present: true, Value: v, Index: 9}
	}
	for b := range kv.full {
		kv.backends = append(kv.backends, b)
	}
	slices.Sort(kv.backends)
	kv.wasListed = true
	return kv
}

// planAll plans until the plan needs nothing more: a key kv lacks is
// absent.
func planAll(t testing.TB, f *api.StateView, kv *KVRead, sels []Selector, o WriteOptions) (Plan, error) {
	t.Helper()
	for range 3 {
		p, needs, err := PlanWrite(f, kv, sels, o)
		if err != nil || !needs.any() {
			return p, err
		}
		for k := range needs.keys {
			kv.keys[k] = KVKey{Key: k}
		}
		for b := range needs.backends {
			kv.full[b] = true
		}
		kv.wasListed = kv.wasListed || needs.list
	}
	t.Fatal("the plan kept needing reads")
	return Plan{}, nil
}

// fakeGate is a Consul whose prefix is at index 5 and a replica that has
// applied it and serves v as /v1/state.
func fakeGate(t *testing.T, v *api.StateView, sels []Selector) GateOptions {
	t.Helper()
	replica := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/v1/cluster" {
			_ = json.NewEncoder(w).Encode(api.ClusterInfo{NodeID: "n1", KV: api.KVView{SyncedIndex: 5}, KVPrefix: "hastate/", Consul: &fakeIdentity})
			return
		}
		_ = json.NewEncoder(w).Encode(v)
	}))
	t.Cleanup(replica.Close)
	c := fakeConsul(t, 5)
	return GateOptions{Consul: c.Client, ConsulAddr: c.Addr, Prefix: "hastate/", Replica: replicaAt(t, replica.URL), Selectors: sels}
}

// fakeConsul answers every KV read with no keys at index.
func fakeConsul(t *testing.T, index int) Writer {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("X-Consul-Index", strconv.Itoa(index))
		switch r.URL.Path {
		case "/v1/status/peers":
			_ = json.NewEncoder(w).Encode(strings.Split(fakeIdentity.Cluster, ","))
			return
		case "/v1/agent/self":
			_ = json.NewEncoder(w).Encode(map[string]any{"Config": map[string]string{"Datacenter": fakeIdentity.Datacenter}})
			return
		}
		w.WriteHeader(http.StatusNotFound)
	}))
	t.Cleanup(srv.Close)
	w, err := NewWriter(strings.TrimPrefix(srv.URL, "http://"), "hastate/")
	if err != nil {
		t.Fatal(err)
	}
	return w
}

func TestPrecheckFollowsTheDeployContract(t *testing.T) {
	ctx := context.Background()
	for _, tt := range []struct {
		name string
		sel  string
		edit func(*api.StateView)
		want string // "ok", "block:<text>", "ERR:<text>"
	}{
		{"all ready", "canary_web/*", nil, "ok"},
		{"maint passes", "main_web/m-3", nil, "ok"},
		{"one drained", "canary_*/*", nil, "block:canary_api/api-1 is drained"},
		{"one ramping", "canary_web/*", func(v *api.StateView) {
			v.Servers[2].Ramping, v.Servers[2].Kind, v.Servers[2].Weight = &api.RampProgress{WeightPercent: 40}, api.KindRamping, 40
		}, "block:canary_web/web-1 is ramping: 40%"},
		{"an invalid key with no valid value", "canary_web/web-1", func(v *api.StateView) {
			v.Servers[2].Withheld, v.Servers[2].Error, v.Servers[2].Kind = true, "invalid value", api.KindWithheld
		}, "block:cannot confirm"},
		// Issue 15.3: 0% is DRAIN in HAProxy.
		{"one at 0%", "canary_web", func(v *api.StateView) {
			v.Servers[3].Answer, v.Servers[3].Kind, v.Servers[3].Weight = "ready 0%", api.KindWeight, 0
		}, "block:canary_web/web-2 is at 0% (HAProxy shows it as DRAIN)"},
		{"a weight above 0% passes", "canary_web", nil, "ok"},
		// Issue 15.6: a backend-wide key is not a server.
		{"a drained backend-wide key is not counted", "canary_api", nil, "count:1 block:canary_api/api-1 is drained"},
		{"a backend with only a backend-wide key matches no server", "canary_api", func(v *api.StateView) { v.Servers = v.Servers[:1] },
			"ERR:no server matches 'canary_api/*'"},
		{"nothing matched", "canary_wbe/web-1", nil, "ERR:no server matches 'canary_wbe/web-1'; known backends: canary_api, canary_web"},
		{"a replica down", "canary_web/*", func(v *api.StateView) {
			v.Replicas[1] = api.ReplicaAnswer{ID: "n2", Error: "i/o timeout"}
		}, "ERR:cannot confirm: replica n2 unreachable"},
		{"Consul not in sync", "canary_web/*", func(v *api.StateView) {
			v.KV.Warning = "Consul not synced for 42s"
		}, "ERR:cannot confirm: Consul not synced for 42s"},
		{"no state", "canary_web/*", func(v *api.StateView) { v.HoldsState = false }, "ERR:holds no state"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			v := fleet()
			if tt.edit != nil {
				tt.edit(v)
			}
			sels, _ := ParseSelectors([]string{tt.sel})
			ctx, cancel := context.WithTimeout(ctx, time.Second)
			defer cancel()
			n, blocking, err := Precheck(ctx, fakeGate(t, v, sels))
			want := tt.want
			if c, rest, ok := strings.Cut(want, " "); ok && strings.HasPrefix(c, "count:") {
				if got := fmt.Sprint(n); got != strings.TrimPrefix(c, "count:") {
					t.Fatalf("precheck checked %d servers, want %s (%v)", n, c, blocking)
				}
				want = rest
			}
			switch kind, text, _ := strings.Cut(want, ":"); kind {
			case "ok":
				if err != nil || len(blocking) > 0 || n == 0 {
					t.Fatalf("precheck = %d %v %v, want ok", n, blocking, err)
				}
			case "block":
				if err != nil || !strings.Contains(strings.Join(blocking, "\n"), text) {
					t.Fatalf("precheck = %v %v, want blocked by %q", blocking, err, text)
				}
			default:
				if err == nil || !strings.Contains(err.Error(), text) {
					t.Fatalf("precheck = %v %v, want error %q", blocking, err, text)
				}
			}
		})
	}
}

func TestWriterTransactions(t *testing.T) {
	consul := testenv.StartConsul(t, testenv.ConsulOptions{})
	cl := consul.Client(t)
	w, err := NewWriter(consul.Addr(), "gitlab-haproxy-agent/")
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	drain, err := Value("drain", ValueOptions{Reason: "contract", By: "alice", Ramp: "2m", For: time.Hour, Now: time.Now()})
	if err != nil {
		t.Fatal(err)
	}
	set := Plan{Ops: []Op{{Key: "gitlab-haproxy-agent/state/web/a", Value: drain}, {Key: "gitlab-haproxy-agent/state/web/*", Value: drain}}}
	if err := w.Apply(ctx, set); err != nil {
		t.Fatal(err)
	}
	// The runbook's contract: the state key holds the word; the meta key
	// beside it holds what hastate adds.
	for _, o := range set.Ops {
		p, _, err := cl.KV().Get(o.Key, nil)
		if err != nil || p == nil || string(p.Value) != "drain" {
			t.Fatalf("%s = %v, %v, want the word drain", o.Key, p, err)
		}
		mk, _ := state.MetaKeyOf(o.Key)
		p, _, err = cl.KV().Get(mk, nil)
		if err != nil || p == nil {
			t.Fatalf("meta key %s: %v, %v", mk, p, err)
		}
		m, err := state.ParseMeta(string(p.Value))
		if err != nil || m.String() != "drain" || m.Reason != "contract" || m.By != "alice" || m.Until.IsZero() || m.At.IsZero() || !m.RampSet || m.Ramp != 2*time.Minute {
			t.Fatalf("meta key %s = %s (%+v, %v)", mk, p.Value, m, err)
		}
	}
	// Issue 22.2: the transaction is conditional on what the plan read.
	a, _, err := cl.KV().Get("gitlab-haproxy-agent/state/web/a", nil)
	if err != nil || a == nil {
		t.Fatal(a, err)
	}
	read := KVKey{Key: a.Key, Present: true, Value: "drain", Index: a.ModifyIndex}
	absent := KVKey{Key: "gitlab-haproxy-agent/state/web/b"}
	stale := Plan{Ops: []Op{{Delete: true, Key: a.Key}}, Deps: []KVKey{{Key: a.Key, Present: true, Index: a.ModifyIndex - 1}, absent}}
	var conflict *ConflictError
	if err := w.Apply(ctx, stale); !errors.As(err, &conflict) || !errors.Is(err, errCAS) || len(conflict.Keys) != 1 || conflict.Keys[0] != a.Key {
		t.Fatalf("delete at a stale index: %v, want a ConflictError on %s", err, a.Key)
	}
	created := Plan{Ops: []Op{{Key: absent.Key, Value: "drain"}}, Deps: []KVKey{absent, {Key: "gitlab-haproxy-agent/state/web/*", Present: true, Index: 1}}}
	if err := w.Apply(ctx, created); !errors.As(err, &conflict) || conflict.Keys[0] != "gitlab-haproxy-agent/state/web/*" {
		t.Fatalf("a check of a key that changed: %v", err)
	}
	if p, _, _ := cl.KV().Get(absent.Key, nil); p != nil {
		t.Fatalf("a rolled-back transaction wrote %s", absent.Key)
	}
	clear := Plan{Ops: []Op{{Delete: true, Key: a.Key}}, Deps: []KVKey{read, absent}}
	if err := w.Apply(ctx, clear); err != nil {
		t.Fatal(err)
	}
	// Consul down: a clear error that says nothing was written and what to check.
	consul.Kill()
	err = w.Apply(ctx, set)
	if err == nil || !strings.Contains(err.Error(), "nothing was written") || !strings.Contains(err.Error(), "CONSUL_HTTP_ADDR") ||
		!strings.Contains(err.Error(), consul.Addr()) {
		t.Fatalf("write with Consul down: %v", err)
	}
}

// A replica that has not applied the writes made before precheck started
// cannot confirm anything: precheck fails closed when its time is up.
func TestPrecheckWaitsForTheReplicaToCatchUp(t *testing.T) {
	g := fakeGate(t, fleet(), []Selector{{"canary_web", "*"}})
	g.Consul = fakeConsul(t, 9).Client // the replica holds index 5
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	_, _, err := Precheck(ctx, g)
	if !errors.Is(err, ErrCannotConfirm) || !strings.Contains(err.Error(), `has applied Consul index 5 of prefix "hastate/", not yet 9`) {
		t.Fatalf("precheck against a replica behind Consul: %v, want cannot confirm", err)
	}
}

// wait exits 3 on a selector that matches nothing, and times out naming
// the HAProxy that was not told the current answer.
func TestWaitNamesWhatLags(t *testing.T) {
	ctx := context.Background()
	g := fakeGate(t, fleet(), []Selector{{"canary_wbe", "*"}})
	if err := Wait(ctx, g); !errors.Is(err, ErrNoMatch) {
		t.Errorf("wait on a typo: %v, want ErrNoMatch", err)
	}
	polls := `{"pollers":[{"haproxy":"127.0.0.9","backend":"canary_web","server":"web-1","answer":"drain","last_asked":"` +
		time.Now().UTC().Format(time.RFC3339Nano) + `","replica":"n2"}],"replicas":[{"id":"n1","answered":true}]}`
	replica := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/v1/cluster":
			_ = json.NewEncoder(w).Encode(api.ClusterInfo{NodeID: "n1", KV: api.KVView{SyncedIndex: 5}, KVPrefix: "hastate/", Consul: &fakeIdentity})
		case "/v1/pollers":
			_, _ = w.Write([]byte(polls))
		default:
			_ = json.NewEncoder(w).Encode(fleet())
		}
	}))
	defer replica.Close()
	g.Replica, g.Selectors, g.Interval = replicaAt(t, replica.URL), []Selector{{"canary_web", "web-1"}}, 50*time.Millisecond
	ctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	defer cancel()
	err := Wait(ctx, g)
	if !errors.Is(err, ErrNotDone) || !strings.Contains(err.Error(), `HAProxy 127.0.0.9 for canary_web/web-1: last told "drain" by n2`) {
		t.Errorf("wait with a lagging HAProxy: %v", err)
	}
}

// Issue 15.2: a source that asked once, longer than api.ProbeGrace ago (a
// person's nc), is not waited for; an HAProxy that spread two checks over
// two replicas is, and so is a source whose one ask is fresh (an HAProxy
// that just started).
func TestWaitIgnoresAManualProbe(t *testing.T) {
	now := time.Now()
	poll := func(haproxy, answer, replica string, ago time.Duration, count uint64) api.Poll {
		return api.Poll{HAProxy: haproxy, Backend: "canary_web", Server: "web-1", Answer: answer, Replica: replica,
			LastAsked: now.Add(-ago), Count: count}
	}
	probe := poll("127.0.0.9", "drain", "n1", 20*time.Second, 1)
	current := poll("127.0.0.10", "ready 100%", "n1", time.Second, 40)
	for _, tt := range []struct {
		name  string
		polls []api.Poll
		lag   string // "" : done
	}{
		{"a probe once, 20s ago", []api.Poll{probe, current}, ""},
		{"an HAProxy over two replicas", []api.Poll{probe, current, poll("127.0.0.11", "drain", "n1", 20*time.Second, 1),
			poll("127.0.0.11", "drain", "n2", 10*time.Second, 1)}, `HAProxy 127.0.0.11 for canary_web/web-1: last told "drain" by n2`},
		{"a new HAProxy's first check", []api.Poll{current, poll("127.0.0.12", "drain", "n2", time.Second, 1)}, "HAProxy 127.0.0.12"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			g := fakeGate(t, fleet(), []Selector{{"canary_web", "web-1"}})
			g.Replica, g.Interval = pollsReplica(t, tt.polls), 50*time.Millisecond
			ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
			defer cancel()
			err := Wait(ctx, g)
			switch {
			case tt.lag == "" && err != nil:
				t.Fatalf("wait: %v, want done", err)
			case tt.lag != "" && (!errors.Is(err, ErrNotDone) || !strings.Contains(err.Error(), tt.lag)):
				t.Fatalf("wait: %v, want it to wait for %q", err, tt.lag)
			}
		})
	}
}

// scriptedReplica is a replica that has applied Consul index synced,
// whose /v1/state is view(n) at its n-th read (from 0) and whose
// /v1/pollers is polls.
func scriptedReplica(t *testing.T, synced uint64, polls []api.Poll, view func(n int) *api.StateView) *Replica {
	t.Helper()
	return scriptedReplicaOf(t, fakeIdentity, synced, polls, view)
}

// fakeIdentity is the Consul cluster fakeConsul and the fake replicas
// name.
var fakeIdentity = api.ConsulIdentity{Datacenter: "dc1", Cluster: "127.0.0.1:8300"}

// identityOf is the identity of the Consul w writes to, as a replica
// reports it.
func identityOf(t *testing.T, w Writer) api.ConsulIdentity {
	t.Helper()
	id, err := kvsync.ReadIdentity(context.Background(), w.Client)
	if err != nil {
		t.Fatal(err)
	}
	return api.ConsulIdentity{Datacenter: id.Datacenter, Cluster: id.Cluster}
}

// scriptedReplicaOf is scriptedReplica reading the Consul cluster id.
func scriptedReplicaOf(t *testing.T, id api.ConsulIdentity, synced uint64, polls []api.Poll, view func(n int) *api.StateView) *Replica {
	t.Helper()
	var (
		mu sync.Mutex
		n  int
	)
	if polls == nil {
		polls = []api.Poll{}
	}
	replica := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/v1/cluster":
			_ = json.NewEncoder(w).Encode(api.ClusterInfo{NodeID: "n1", KV: api.KVView{SyncedIndex: synced}, KVPrefix: "hastate/", Consul: &id})
		case "/v1/pollers":
			_ = json.NewEncoder(w).Encode(api.PollersView{Pollers: polls,
				Replicas: []api.ReplicaAnswer{{ID: "n1", Answered: true}, {ID: "n2", Answered: true}}})
		default:
			mu.Lock()
			v := view(n)
			n++
			mu.Unlock()
			_ = json.NewEncoder(w).Encode(v)
		}
	}))
	t.Cleanup(replica.Close)
	return replicaAt(t, replica.URL)
}

// pollsReplica is a replica at Consul index 5 that serves fleet() and polls.
func pollsReplica(t *testing.T, polls []api.Poll) *Replica {
	return scriptedReplica(t, 5, polls, func(int) *api.StateView { return fleet() })
}

// Issue 15.8: right after a replica starts (it has applied the current
// index, but no leader has reported a KV sync to it yet), precheck waits
// within --timeout instead of failing; a Consul that is really out of
// sync still fails at once.
func TestPrecheckWaitsOutAReplicasStartUp(t *testing.T) {
	starting := func(n int) *api.StateView {
		v := fleet()
		if n < 3 {
			v.KV = api.KVStatus{KVView: api.KVView{Warning: "Consul not synced: no leader has mirrored KV in the 1s since this replica started"}}
		}
		return v
	}
	g := fakeGate(t, fleet(), []Selector{{"canary_web", "*"}})
	g.Replica = scriptedReplica(t, 5, nil, starting)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if n, blocking, err := Precheck(ctx, g); err != nil || len(blocking) != 0 || n != 2 {
		t.Fatalf("precheck during a replica's start-up: %d %v %v, want ok for 2 servers", n, blocking, err)
	}

	g.Replica = scriptedReplica(t, 5, nil, func(int) *api.StateView {
		v := fleet()
		v.KV.Warning = "Consul not synced for 42s: the leader n2 cannot read it"
		return v
	})
	start := time.Now()
	if _, _, err := Precheck(ctx, g); !errors.Is(err, ErrCannotConfirm) || !strings.Contains(err.Error(), "cannot read it") {
		t.Fatalf("precheck with Consul out of sync: %v, want cannot confirm", err)
	}
	if took := time.Since(start); took > 2*time.Second {
		t.Errorf("precheck with Consul out of sync took %s; it is not a start-up state to wait out", took)
	}
}

// Issue 15.7: wait --settled also waits until no selected server is
// ramping or expires before the timeout; without it wait returns once
// every HAProxy was told.
func TestWaitSettled(t *testing.T) {
	ramping := func(n int) *api.StateView {
		v := fleet()
		if n < 4 {
			r := &v.Servers[2] // canary_web/web-1
			r.Ramping, r.Kind, r.Weight, r.Answer = &api.RampProgress{WeightPercent: 10 * (n + 1)}, api.KindRamping, 10*(n+1), fmt.Sprintf("ready %d%%", 10*(n+1))
		}
		return v
	}
	soon := time.Now().Add(500 * time.Millisecond)
	for _, tt := range []struct {
		name    string
		settled bool
		view    func(int) *api.StateView
		want    string // "" done, else what it still waits for
	}{
		{"not settled", false, ramping, ""},
		{"settled waits for the ramp", true, ramping, ""},
		{"settled and a ramp that does not end", true, func(int) *api.StateView { return ramping(0) }, "canary_web/web-1 is ramping: 10%"},
		{"settled and an expiry before the timeout", true, func(int) *api.StateView {
			v := fleet()
			v.Servers[2].Until = &soon
			return v
		}, "canary_web/web-1 expire"}, // expires at, then expired at (the leader never applies it here)
		{"settled and an expiry after the timeout", true, func(int) *api.StateView {
			v := fleet()
			until := time.Now().Add(time.Hour)
			v.Servers[2].Until = &until
			return v
		}, ""},
	} {
		t.Run(tt.name, func(t *testing.T) {
			g := fakeGate(t, fleet(), []Selector{{"canary_web", "web-1"}})
			g.Replica, g.Settled, g.Interval = scriptedReplica(t, 5, nil, tt.view), tt.settled, 20*time.Millisecond
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			defer cancel()
			var out strings.Builder
			g.Out = &out
			err := Wait(ctx, g)
			switch {
			case tt.want == "" && err != nil:
				t.Fatalf("wait: %v, want done", err)
			case tt.want != "" && (!errors.Is(err, ErrNotDone) || !strings.Contains(err.Error(), tt.want)):
				t.Fatalf("wait: %v, want it to wait for %q", err, tt.want)
			case tt.settled && tt.name == "settled waits for the ramp" && !strings.Contains(out.String(), "is ramping"):
				t.Fatalf("wait --settled returned without waiting for the ramp; progress: %q", out.String())
			}
		})
	}
}

// Issue 15.9: with Consul unreachable a write says nothing was written and
// does not suggest --force, which cannot help; the "replica unreachable"
// hint does not send the operator to the raft address.
func TestHintsThatDoNotMislead(t *testing.T) {
	dead := fmt.Sprintf("127.0.0.1:%d", testenv.FreePort(t))
	wr, err := NewWriter(dead, "hastate/")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_, err = Write(ctx, WriteRequest{WriteOptions: WriteOptions{Command: "drain", Value: "drain", MinReady: 1},
		Selectors: []Selector{{"canary_web", "web-1"}}, Writer: wr, Replica: pollsReplica(t, nil)})
	if err == nil || strings.Contains(err.Error(), "--force") || !strings.Contains(err.Error(), "nothing was written") || !strings.Contains(err.Error(), dead) {
		t.Fatalf("write with Consul unreachable: %v; want it to name Consul, say nothing was written, and not suggest --force", err)
	}
	err = Missing([]api.ReplicaAnswer{{ID: "n1", Answered: true}, {ID: "n3", Error: "dial tcp 127.0.0.1:9779: connect: connection refused"}})
	if !errors.Is(err, ErrCannotConfirm) || strings.Contains(err.Error(), "--addr <it>") || !strings.Contains(err.Error(), "HTTP address") || !strings.Contains(err.Error(), "9778") {
		t.Fatalf("Missing: %v; want a hint at the replica's HTTP address, not the raft one in the error", err)
	}
}

// realConsul starts a Consul and returns its KV and a Writer for prefix
// hastate/.
func realConsul(t *testing.T) (*consulapi.KV, Writer) {
	t.Helper()
	consul := testenv.StartConsul(t, testenv.ConsulOptions{})
	w, err := NewWriter(consul.Addr(), "hastate/")
	if err != nil {
		t.Fatal(err)
	}
	return consul.Client(t).KV(), w
}

// Issue 18.5: the gates read Consul's index of the prefix without listing
// it, and the index is the one a recursive read of the prefix (the
// leader's watch) reports: writes and deletes under the prefix raise it,
// writes elsewhere do not.
func TestConsulIndexIsThePrefixIndex(t *testing.T) {
	kv, w := realConsul(t)
	g := GateOptions{Consul: w.Client, ConsulAddr: w.Addr, Prefix: "hastate/"}
	ctx := context.Background()
	check := func(step string) uint64 {
		t.Helper()
		got, err := g.consulIndex(ctx)
		if err != nil {
			t.Fatal(err)
		}
		_, meta, err := kv.List("hastate/", nil)
		if err != nil {
			t.Fatal(err)
		}
		if got != meta.LastIndex {
			t.Fatalf("%s: consulIndex %d, a recursive read of the prefix %d", step, got, meta.LastIndex)
		}
		return got
	}
	put := func(k string) {
		if _, err := kv.Put(&consulapi.KVPair{Key: k, Value: []byte("drain")}, nil); err != nil {
			t.Fatal(err)
		}
	}
	put("hastate/state/web/a")
	i1 := check("one key")
	put("other/x")
	if i := check("a write outside the prefix"); i != i1 {
		t.Errorf("a write outside the prefix moved the index %d -> %d", i1, i)
	}
	put("hastate/state/web/b")
	if _, err := kv.Delete("hastate/state/web/b", nil); err != nil {
		t.Fatal(err)
	}
	if i := check("a delete under the prefix"); i <= i1 {
		t.Errorf("a delete under the prefix left the index at %d", i)
	}
}

// Issue 18.3: a write command runs without cobra: wait for the sync, read
// the fleet, plan, drop deletes of absent keys, apply; a dry run writes
// nothing. Against a real Consul.
func TestWriteOrchestration(t *testing.T) {
	kv, wr := realConsul(t)
	ctx := context.Background()
	if _, err := kv.Put(&consulapi.KVPair{Key: "hastate/state/canary_web/web-2", Value: []byte("50%")}, nil); err != nil {
		t.Fatal(err)
	}
	write := func(cmd, value string, dry bool, args ...string) (Plan, error) {
		t.Helper()
		sels, err := ParseSelectors(args)
		if err != nil {
			t.Fatal(err)
		}
		return Write(ctx, WriteRequest{WriteOptions: WriteOptions{Command: cmd, Value: value, MinReady: 1},
			Selectors: sels, DryRun: dry, Writer: wr, Replica: scriptedReplicaOf(t, identityOf(t, wr), 1<<50, nil, func(int) *api.StateView { return fleet() })})
	}
	keys := func() string {
		ks, _, err := kv.Keys("hastate/state/", "", nil)
		if err != nil {
			t.Fatal(err)
		}
		return strings.Join(ks, " ")
	}
	p, err := write("drain", "drain", true, "canary_web/web-1")
	if err != nil || p.Written || planKeys(p) != "canary_web/web-1" || keys() != "hastate/state/canary_web/web-2" {
		t.Fatalf("dry run: %+v %v, keys %q", p, err, keys())
	}
	var out strings.Builder
	p.Report(&out)
	if !strings.Contains(out.String(), "dry run, nothing written") {
		t.Errorf("dry run report: %q", out.String())
	}
	if p, err = write("drain", "drain", false, "canary_web/web-1"); err != nil || !p.Written || keys() != "hastate/state/canary_web/web-1 hastate/state/canary_web/web-2" {
		t.Fatalf("drain: %+v %v, keys %q", p, err, keys())
	}
	// ready of a server with its own key and no backend-wide key: deleted.
	if p, err = write("ready", "ready", false, "canary_web/web-2"); err != nil || !p.Written || keys() != "hastate/state/canary_web/web-1" {
		t.Fatalf("ready: %+v %v, keys %q", p, err, keys())
	}
	// ready of a server without a key: nothing to write, and it says so.
	p, err = write("ready", "ready", false, "main_web/m-1")
	out.Reset()
	p.Report(&out)
	if err != nil || p.Written || !strings.Contains(out.String(), "nothing to write") || !strings.Contains(out.String(), "already ready") {
		t.Fatalf("ready of a server without a key: %v %q", err, out.String())
	}
	// A backend-wide drain in Consul that the replica's view does not show
	// yet: ready writes the server's key, never silently nothing.
	if _, err := kv.Put(&consulapi.KVPair{Key: "hastate/state/main_web/*", Value: []byte("drain")}, nil); err != nil {
		t.Fatal(err)
	}
	p, err = write("ready", "ready", false, "main_web/m-1")
	if err != nil || !p.Written || !strings.Contains(keys(), "hastate/state/main_web/m-1") {
		t.Fatalf("ready under a backend-wide key the replica did not show: %+v %v, keys %q", p, err, keys())
	}
}

// Issue 22.2: a write that a concurrent write overtakes between its read
// and its transaction is read and planned again, never applied on what it
// read: ready of a server with its own drain would delete the key, but a
// backend-wide drain written meanwhile makes it write ready.
func TestWriteReplansAfterAConcurrentWrite(t *testing.T) {
	kv, wr := realConsul(t)
	ctx := context.Background()
	if _, err := kv.Put(&consulapi.KVPair{Key: "hastate/state/main_web/m-1", Value: []byte("drain")}, nil); err != nil {
		t.Fatal(err)
	}
	var concurrent int
	p, err := Write(ctx, WriteRequest{WriteOptions: WriteOptions{Command: "ready", Value: "ready", MinReady: 1},
		Selectors: []Selector{{"main_web", "m-1"}}, Writer: wr,
		Replica: scriptedReplicaOf(t, identityOf(t, wr), 1<<50, nil, func(int) *api.StateView { return fleet() }),
		beforeApply: func(attempt int) {
			if attempt == 0 {
				concurrent++
				if _, err := kv.Put(&consulapi.KVPair{Key: "hastate/state/main_web/*", Value: []byte("drain")}, nil); err != nil {
					t.Fatal(err)
				}
			}
		}})
	if err != nil || !p.Written || p.Retried != 1 || concurrent != 1 {
		t.Fatalf("ready overtaken by a backend-wide drain: %+v %v", p, err)
	}
	if got, _, _ := kv.Get("hastate/state/main_web/m-1", nil); got == nil || string(got.Value) != "ready" {
		t.Fatalf("main_web/m-1 = %v after ready under a backend-wide drain written meanwhile; want ready (a delete leaves it drained)", got)
	}
	var out strings.Builder
	p.Report(&out)
	if !strings.Contains(out.String(), "read Consul and planned again once") || !strings.Contains(out.String(), "written as ready under main_web/* (drain)") {
		t.Errorf("report: %s", out.String())
	}
}
