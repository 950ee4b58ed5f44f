package write

import (
	"cmp"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/hastate/hastate/api"
	"github.com/hastate/hastate/cmd/hastate/internal/ctl"
	"github.com/hastate/hastate/cmd/hastate/internal/ctl/internal/ctltest"
)

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
		o         Options
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
			o: Options{KeepOwn: true}, note: "canary_web/* does not reach servers with their own key: web-2 keeps 50% (--keep-own)"},
		{name: "backend-wide maint escaped by a drained own key", cmd: "maint", args: []string{"canary_api/*", "main_web"},
			o: Options{Override: true}, want: "canary_api/* main_web/* -main_web/m-3"},
		{name: "backend-wide drain: a server in maint does not escape it", cmd: "drain", args: []string{"main_web"}, want: "main_web/*",
			note: "main_web/* does not reach servers with their own key: m-3 keeps maint; add --override"},
		{name: "backend-wide weight 0% is a drain", cmd: "weight", value: "0%", args: []string{"canary_web"}, want: "ERR:web-2 keeps 50%"},
		{name: "backend-wide weight 50% only notes", cmd: "weight", value: "50%", args: []string{"canary_web"}, want: "canary_web/*",
			note: "web-2 keeps 50%"},
		{name: "backend-wide with override clears them in the same transaction", cmd: "drain", args: []string{"canary_web/*"},
			o: Options{Override: true}, want: "canary_web/* -canary_web/web-2"},
		{name: "canary drain: one wildcard per known backend", cmd: "drain", args: []string{"canary_*/*"}, o: Options{KeepOwn: true},
			want: "canary_api/* canary_web/*"},
		{name: "canary drain that a canary escapes is refused", cmd: "drain", args: []string{"canary_*/*"}, want: "ERR:canary_web/* would not reach"},
		{name: "one server across backends", cmd: "drain", args: []string{"*/gke-cny-web"}, want: "main_api/gke-cny-web main_web/gke-cny-web"},
		{name: "zonal drain", cmd: "drain", args: []string{"*/*-us-east1-b"}, want: "main_api/x-us-east1-b"},
		{name: "a glob that matches nothing", cmd: "drain", args: []string{"canary_wbe*/*"}, want: "ERR:no server matches 'canary_wbe*/*'; known backends: canary_api, canary_web, main_api, main_web"},
		{name: "a server glob that matches nothing", cmd: "drain", args: []string{"*/nope-*"}, want: "ERR:no server matches '*/nope-*'"},
		{name: "a server the cluster does not know", cmd: "drain", args: []string{"canary_web/web1"},
			want: "ERR:no server matches 'canary_web/web1': no HAProxy has polled canary_web/web1 in the last 1m0s and it has no key (a typo?); did you mean canary_web/web-1 or canary_web/web-2?; known servers of canary_web: web-1, web-2; add --allow-unknown"},
		{name: "a server no HAProxy polls", cmd: "drain", args: []string{"main_web/m-3"},
			want: "ERR:no HAProxy has polled main_web/m-3 in the last 1m0s (a typo?); did you mean main_web/m-1 or main_web/m-2?; known servers of main_web: gke-cny-web, m-1, m-2, m-3; add --allow-unknown"},
		{name: "a server of a backend the cluster does not know", cmd: "drain", args: []string{"canery_web/web-1"},
			want: "ERR:no server matches 'canery_web/web-1'; did you mean canary_web/web-1?; known backends: canary_api, canary_web, main_api, main_web; add --allow-unknown"},
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
			want: "canary_web/web-2", note: "its --ramp lives in the meta key beside it), and it stays after the ramp"},
		{name: "ready under a backend-wide key writes ready and says so", cmd: "ready", args: []string{"canary_api/api-1"}, want: "canary_api/api-1",
			note: "canary_api/api-1: written as ready under canary_api/* (drain), so it now stays out of backend-wide drains and maints"},
		{name: "ready of a backend deletes its backend-wide key", cmd: "ready", args: []string{"canary_api"}, want: "-canary_api/*"},
		{name: "unknown allowed", cmd: "drain", args: []string{"canary_web/web1"}, o: Options{Allow: Allow{Unknown: true}}, want: "canary_web/web1"},
		{name: "forced", cmd: "drain", args: []string{"canary_web/web1"}, o: Options{Allow: AllowForce()}, want: "canary_web/web1"},
		{name: "--allow-unknown does not lift min-ready", cmd: "drain", args: []string{"main_web/m-1", "main_web/m-2", "main_web/gke-cny-web"},
			o: Options{Allow: Allow{Unknown: true}}, want: "ERR:add --allow-below-min-ready"},
		{name: "the last ready server", cmd: "drain", args: []string{"main_web/m-1", "main_web/m-2", "main_web/gke-cny-web"},
			want: "ERR:main_web would have 0 ready of the servers HAProxy polls (now 3), fewer than --min-ready 1"},
		{name: "the last ready server, forced", cmd: "maint", args: []string{"main_web/m-1", "main_web/m-2", "main_web/gke-cny-web"},
			o: Options{Allow: AllowForce()}, want: "main_web/m-1 main_web/m-2 main_web/gke-cny-web", lifted: "capacity (--force); it would have said: main_web would have 0 ready"},
		{name: "the last ready server, allowed", cmd: "maint", args: []string{"main_web/m-1", "main_web/m-2", "main_web/gke-cny-web"},
			o: Options{Allow: Allow{BelowMinReady: true}}, want: "main_web/m-1 main_web/m-2 main_web/gke-cny-web", lifted: "capacity (--allow-below-min-ready)"},
		{name: "--force does not lift the partial-backend refusal", cmd: "drain", args: []string{"canary_web/*"}, o: Options{Allow: AllowForce()},
			want: "ERR:--force does not choose for you"},
		{name: "an unknown backend", cmd: "drain", args: []string{"canary_wbe/*"}, want: "ERR:no server matches 'canary_wbe/*'"},
		{name: "min-ready 3", cmd: "drain", args: []string{"main_web/m-1"}, o: Options{MinReady: 3},
			want: "ERR:main_web would have 2 ready"},
		{name: "a backend-wide drain may empty the backend", cmd: "drain", args: []string{"main_web/*"}, want: "main_web/* -main_web/m-3",
			o: Options{Override: true}},
		{name: "ready is never refused for min-ready", cmd: "ready", args: []string{"canary_api/api-1", "main_web/m-1"}, want: "canary_api/api-1",
			note: "already ready: hastate/state/main_web/m-1 does not exist"},
		{name: "clear expands against keys only", cmd: "clear", args: []string{"main_web/*", "*/m-*"}, want: "-main_web/m-3",
			note: "nothing to clear: hastate/state/main_web/* does not exist"},
		{name: "no replica: literal keys", cmd: "drain", args: []string{"web/a"}, o: Options{Allow: Allow{NoReplica: true}}, noFleet: true, want: "web/a"},
		{name: "no replica: no globs", cmd: "drain", args: []string{"web/a-*"}, o: Options{Allow: AllowForce()}, noFleet: true, want: "ERR:needs the servers the cluster knows"},
		// Issue 22.2: Consul decides coverage, not the replica's view.
		{name: "ready under a backend-wide key only Consul holds writes ready", cmd: "ready", args: []string{"canary_web/web-2"}, want: "canary_web/web-2",
			kv: map[string]string{"canary_web/*": "drain"}, note: "written as ready under canary_web/* (drain)"},
		{name: "a backend-wide drain refused for an own key only Consul holds", cmd: "drain", args: []string{"main_api/*"},
			kv: map[string]string{"main_api/x-us-east1-b": "50%"}, want: "ERR:main_api/* would not reach servers with their own key: x-us-east1-b keeps 50%"},
		{name: "clear of a key the view shows but Consul no longer holds", cmd: "clear", args: []string{"canary_web/web-2"}, want: "",
			kv: map[string]string{"canary_web/web-2": ""}, note: "nothing to clear: hastate/state/canary_web/web-2 does not exist"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			sels, err := ctl.ParseSelectors(tt.args)
			if err != nil {
				t.Fatal(err)
			}
			o := tt.o
			o.Command, o.Value, o.Prefix = tt.cmd, cmp.Or(tt.value, `{"state":"`+tt.cmd+`"}`), "hastate/"
			if o.MinReady == 0 {
				o.MinReady = 1
			}
			f := ctltest.Fleet()
			if tt.edit != nil {
				tt.edit(f)
			}
			if tt.noFleet {
				f = nil
			}
			p, err := planAll(t, f, kvOf(ctltest.Fleet(), tt.kv), sels, o)
			if want, ok := strings.CutPrefix(tt.want, "ERR:"); ok {
				if err == nil || !strings.Contains(err.Error(), want) {
					t.Fatalf("err = %v, want %q", err, want)
				}
				// Issue 15.5: matching nothing is exit 3 in every command.
				if noMatch := strings.Contains(want, "no server matches"); errors.Is(err, ctl.ErrNoMatch) != noMatch {
					t.Fatalf("err = %v: ErrNoMatch %v, want %v", err, errors.Is(err, ctl.ErrNoMatch), noMatch)
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
	f := ctltest.Fleet()
	for i := range MaxTxnKeys / 2 { // each key is written with its meta key
		f.Servers = append(f.Servers, api.ServerState{Backend: "big", Server: "s" + string(rune('a'+i%26)) + string(rune('a'+i/26)), Polled: 1, Answer: "ready 100%"})
	}
	sels, _ := ctl.ParseSelectors([]string{"big/s*", "canary_web/web-1"})
	if _, err := planAll(t, f, kvOf(f, nil), sels, Options{Command: "drain", Value: "drain", Prefix: "hastate/", MinReady: 1}); err == nil || !strings.Contains(err.Error(), "use backend-wide keys") {
		t.Errorf("%d keys: %v, want a refusal with advice", MaxTxnKeys/2+1, err)
	}
	// A replica did not answer: refused unless --force.
	f = ctltest.Fleet()
	f.Replicas[1] = api.ReplicaAnswer{ID: "n2", Error: "connection refused"}
	sels, _ = ctl.ParseSelectors([]string{"canary_*/*"})
	if _, err := planAll(t, f, kvOf(f, nil), sels, Options{Command: "drain", Value: "drain", Prefix: "hastate/", KeepOwn: true}); !errors.Is(err, ctl.ErrCannotConfirm) ||
		!strings.Contains(err.Error(), "replica n2 unreachable") || !strings.Contains(err.Error(), "--allow-no-replica") {
		t.Errorf("with n2 unreachable: %v, want cannot confirm naming n2 and --allow-no-replica", err)
	}
	p, err := planAll(t, f, kvOf(f, nil), sels, Options{Command: "drain", Value: "drain", Prefix: "hastate/", KeepOwn: true, Allow: Allow{NoReplica: true}})
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
			k := ctl.Key("hastate/", r.Backend, r.Server)
			kv.keys[k] = KVKey{Key: k, Present: true, Value: strings.TrimPrefix(r.Desired, "ready "), Index: 7}
		}
	}
	for bs, v := range edits {
		b, s, _ := strings.Cut(bs, "/")
		k := ctl.Key("hastate/", b, s)
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
func planAll(t testing.TB, f *api.StateView, kv *KVRead, sels []ctl.Selector, o Options) (Plan, error) {
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

// TestPlanWriteDuringMigration: while a migration from the per-node agent
// is marked, every write is one the per-node agent serves the same way.
func TestPlanWriteDuringMigration(t *testing.T) {
	for _, tt := range []struct {
		name, cmd, value string
		args             []string
		o                Options
		want, note       string // keys ("-": delete) or "ERR:" and the error text; a note
	}{
		{name: "a canary drain expands to per-server keys", cmd: "drain", args: []string{"canary_*/*"}, o: Options{Override: true},
			want: "canary_api/api-1 canary_web/web-1 canary_web/web-2", note: "canary_*/* expanded to the per-server keys of canary_web (the per-node agent ignores backend-wide keys): web-1, web-2"},
		{name: "a server whose own key escapes the drain is refused", cmd: "drain", args: []string{"canary_web"},
			want: "ERR:canary_web/* (expanded to per-server keys: a migration from the per-node agent is marked) would not change servers with their own key: web-2 keeps 50%"},
		{name: "keep-own leaves it", cmd: "drain", args: []string{"canary_web"}, o: Options{KeepOwn: true},
			want: "canary_web/web-1", note: "servers with their own key left as they are: web-2 keeps 50%"},
		{name: "a backend drain is not refused by min-ready", cmd: "maint", args: []string{"main_web"}, want: "main_web/gke-cny-web main_web/m-1 main_web/m-2 main_web/m-3"},
		{name: "ready of a backend deletes every key it has", cmd: "ready", args: []string{"canary_*/*"}, want: "-canary_api/* -canary_web/web-2",
			note: "canary_*/* deletes every key of canary_api"},
		{name: "clear of a backend too", cmd: "clear", args: []string{"main_web"}, want: "-main_web/m-3"},
		{name: "ready of a backend leaves a server's own maint", cmd: "ready", args: []string{"main_web"}, want: "",
			note: "main_web: servers with their own key left as they are: m-3 keeps maint (--override makes it ready too)"},
		{name: "ready of a backend with --override readies it too", cmd: "ready", args: []string{"main_web"}, o: Options{Override: true}, want: "-main_web/m-3"},
		{name: "a zonal drain is per server as always", cmd: "drain", args: []string{"*/*-us-east1-b"}, want: "main_api/x-us-east1-b"},
		{name: "--for is refused", cmd: "drain", value: `{"state":"drain","until":"2026-12-02T03:00:00Z"}`, args: []string{"canary_web/web-1"},
			want: "ERR:--for would expire the state only on the HAProxy nodes that ask hastate"},
		{name: "--ramp is refused", cmd: "ready", value: `{"state":"ready","ramp":"10m"}`, args: []string{"canary_web/web-2"},
			want: "ERR:--ramp would ramp the weight only on the HAProxy nodes that ask hastate"},
		{name: "--reason is fine (the meta key changes no answer)", cmd: "drain", value: `{"state":"drain","reason":"r"}`, args: []string{"canary_web/web-1"},
			want: "canary_web/web-1"},
		{name: "the typo guard accepts a server with a key in Consul", cmd: "drain", args: []string{"main_web/m-3"}, want: "main_web/m-3"},
		{name: "the typo guard still refuses a typo", cmd: "drain", args: []string{"main_web/m-4"},
			want: "ERR:no server matches 'main_web/m-4': no HAProxy that asks hastate has polled main_web/m-4"},
		{name: "a backend no moved HAProxy polls is refused", cmd: "drain", args: []string{"new_web"},
			want: "ERR:no HAProxy that asks hastate polls any of them: hastate knows only those with a key (n-1)"},
		{name: "ready under a backend-wide key writes ready", cmd: "ready", args: []string{"canary_api/api-1"}, want: "canary_api/api-1"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			sels, err := ctl.ParseSelectors(tt.args)
			if err != nil {
				t.Fatal(err)
			}
			o := tt.o
			o.Command, o.Prefix, o.MinReady, o.Migration, o.MigrationKey = tt.cmd, "hastate/", 1, true, "hastate/config/migration"
			o.Value = tt.value
			if o.Value == "" {
				o.Value = `{"state":"` + tt.cmd + `"}`
			}
			f := ctltest.Fleet()
			f.Servers = append(f.Servers, api.ServerState{Backend: "new_web", Server: "n-1", Key: "state/new_web/n-1", Source: "state/new_web/n-1", Desired: "drain", Kind: api.KindDrain, Answer: "drain"})
			p, err := planAll(t, f, kvOf(f, nil), sels, o)
			if want, ok := strings.CutPrefix(tt.want, "ERR:"); ok {
				if err == nil || !strings.Contains(err.Error(), want) {
					t.Fatalf("err = %v, want %q", err, want)
				}
				return
			}
			if err != nil || planKeys(p) != tt.want {
				t.Fatalf("plan %q, %v; want %q", planKeys(p), err, tt.want)
			}
			if tt.note != "" && !strings.Contains(strings.Join(p.Notes, "\n"), tt.note) {
				t.Errorf("notes %q, want %q", p.Notes, tt.note)
			}
			for _, op := range p.Ops {
				if strings.HasSuffix(op.Key, "/*") && !op.Delete {
					t.Errorf("a backend-wide key written during a migration: %s", op.Key)
				}
			}
		})
	}
}

// TestMarkerIsADependency: every write's transaction checks the migration
// marker as it was read, and counts that check against Consul's limit.
func TestMarkerIsADependency(t *testing.T) {
	f := ctltest.Fleet()
	sels, _ := ctl.ParseSelectors([]string{"canary_web/web-1"})
	absent := KVKey{Key: "hastate/config/migration"}
	p, err := planAll(t, f, kvOf(f, nil), sels, Options{Command: "drain", Value: "drain", Prefix: "hastate/", MinReady: 1, Marker: &absent})
	if err != nil || !slices.Contains(p.Deps, absent) {
		t.Fatalf("deps %v, %v: want the absent marker among them", p.Deps, err)
	}
	var big []string
	for i := range MaxTxnKeys / 2 { // each key and its meta key fill the transaction
		s := fmt.Sprintf("s%02d", i)
		f.Servers = append(f.Servers, api.ServerState{Backend: "big", Server: s, Polled: 1, Answer: "ready 100%", Kind: api.KindReady, Weight: 100})
		big = append(big, "big/"+s)
	}
	sels, _ = ctl.ParseSelectors(big)
	o := Options{Command: "weight 50%", Value: "50%", Prefix: "hastate/", MinReady: 1}
	if _, err := planAll(t, f, kvOf(f, nil), sels, o); err != nil {
		t.Fatalf("%d keys, %d operations: %v", len(big), MaxTxnKeys, err)
	}
	o.Marker = &absent
	if _, err := planAll(t, f, kvOf(f, nil), sels, o); err == nil || !strings.Contains(err.Error(), "more than one Consul transaction holds") {
		t.Fatalf("with the marker's check: %v", err)
	}
}

// Issue 34: the runbook's zonal undrain is a clear, so a typo must not
// exit 0: clear of a name that has no key and that the cluster does not
// know is "matched nothing" (exit 3) with a did-you-mean; clear of a
// server the cluster knows whose key is already gone says so and passes.
func TestClearOfATypo(t *testing.T) {
	f := ctltest.Fleet()
	for _, tt := range []struct {
		arg, want string // want: "" passes, else the error says it
	}{
		{"canary_web/web-3", "did you mean canary_web/web-1"},
		{"canary_wbe/web-1", "did you mean canary_web/web-1?"},
		{"canary_wbe", "did you mean canary_web?"},
		{"canary_web/web-1", ""}, // known (polled), no key: nothing to clear
		{"canary_web", ""},       // known backend, no backend-wide key
	} {
		sels, err := ctl.ParseSelectors([]string{tt.arg})
		if err != nil {
			t.Fatal(err)
		}
		p, err := planAll(t, f, kvOf(f, nil), sels, Options{Command: "clear", Prefix: "hastate/"})
		switch {
		case tt.want == "" && (err != nil || len(p.Ops) != 0 || !strings.Contains(strings.Join(p.Notes, " "), "nothing to clear")):
			t.Errorf("clear %s: %v, notes %v; want nothing to clear, no error", tt.arg, err, p.Notes)
		case tt.want != "" && (!errors.Is(err, ctl.ErrNoMatch) || !strings.Contains(err.Error(), tt.want)):
			t.Errorf("clear %s: %v; want ErrNoMatch (exit 3) with %q", tt.arg, err, tt.want)
		}
	}
}

// Issue 45: `hastate weight 25% canary_web/web-2` silently replaced an
// active expiring drain. Every plan (and --dry-run) shows what each key
// held: the value from Consul, the meta the replica shows.
func TestPlanShowsWhatItReplaces(t *testing.T) {
	f := ctltest.Fleet()
	until := time.Date(2026, 12, 7, 5, 0, 0, 0, time.UTC)
	web2 := &f.Servers[3] // canary_web/web-2, own key
	web2.Answer, web2.Kind, web2.Desired, web2.Until, web2.By, web2.Reason = "drain", api.KindDrain, "drain", &until, "alice", "zonal maintenance"
	sels, _ := ctl.ParseSelectors([]string{"canary_web/web-2", "canary_web/web-1"})
	p, err := planAll(t, f, kvOf(f, nil), sels, Options{Command: "weight 25%", Value: "25%", Prefix: "hastate/", MinReady: 1})
	if err != nil {
		t.Fatal(err)
	}
	var out strings.Builder
	p.Print(&out)
	want := "  set    hastate/state/canary_web/web-2 = 25%   (replaces drain until 2026-12-07 05:00:00 UTC by alice: zonal maintenance)\n"
	if !strings.Contains(out.String(), want) || strings.Count(out.String(), "replaces") != 1 {
		t.Errorf("the plan does not show what it replaces (web-1 had no key):\n%s\nwant %q", out.String(), want)
	}
}

// Issue 45: `hastate ready canary_web --reason "backend back"` deleted the
// keys and recorded the reason nowhere, silently. The plan says so.
func TestReadyThatDeletesSaysItsReasonIsNotRecorded(t *testing.T) {
	f := ctltest.Fleet()
	sels, _ := ctl.ParseSelectors([]string{"canary_web/web-2"})
	p, err := planAll(t, f, kvOf(f, nil), sels, Options{Command: "ready", Value: `{"state":"ready","reason":"backend back"}`, Prefix: "hastate/", MinReady: 1})
	if err != nil || planKeys(p) != "-canary_web/web-2" {
		t.Fatalf("ready of an own key: %q %v, want its deletion", planKeys(p), err)
	}
	want := `--reason "backend back" is recorded nowhere: ready deletes 1 key (state/canary_web/web-2; an absent key is ready)`
	if !strings.Contains(strings.Join(p.Notes, "\n"), want) {
		t.Errorf("notes %q, want %q", p.Notes, want)
	}
	// A ready that writes keeps its reason in the meta key: nothing to say.
	sels, _ = ctl.ParseSelectors([]string{"canary_web/web-2"})
	p, err = planAll(t, f, kvOf(f, nil), sels, Options{Command: "ready", Value: `{"state":"ready","reason":"backend back","ramp":"10m"}`, Prefix: "hastate/", MinReady: 1})
	if err != nil || strings.Contains(strings.Join(p.Notes, "\n"), "recorded nowhere") {
		t.Errorf("ready --ramp (a key written): %v, notes %q", err, p.Notes)
	}
}
