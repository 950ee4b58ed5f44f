package write

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	consulapi "github.com/hashicorp/consul/api"
	"github.com/hastate/hastate/api"
	"github.com/hastate/hastate/cmd/hastate/internal/ctl"
)

// Issue 35: clear --expired deletes, with their meta keys, only the
// selected keys whose until has passed and that the cluster shows expired
// with the same until; a key written again between the read and the
// transaction is read again, never deleted. Against a real Consul.
func TestClearExpired(t *testing.T) {
	kv, wr := realConsul(t)
	ctx := context.Background()
	now := time.Now().UTC().Truncate(time.Second)
	past, future := now.Add(-time.Minute), now.Add(time.Hour)
	meta := func(word string, until time.Time) string {
		return fmt.Sprintf(`{"state":%q,"until":%q}`, word, until.Format(time.RFC3339))
	}
	put := func(k, v string) {
		t.Helper()
		if _, err := kv.Put(&consulapi.KVPair{Key: "hastate/" + k, Value: []byte(v)}, nil); err != nil {
			t.Fatal(err)
		}
	}
	for k, v := range map[string]string{
		"state/w/a": "drain", "meta/w/a": meta("drain", past), // expired, confirmed: deleted
		"state/w/*": "maint", "meta/w/*": meta("maint", past), // the backend-wide key, expired: deleted
		"state/w/b": "drain", "meta/w/b": meta("drain", future), // not expired
		"state/w/c": "drain", "meta/w/c": meta("drain", past), // the cluster does not show it expired: left
		"state/w/d": "drain", "meta/w/d": meta("maint", past), // the meta key describes another state: ignored, never expires
		"state/x/e": "50%", "meta/x/e": meta("50%", past), // not selected
	} {
		put(k, v)
	}
	row := func(b, s, expired string) api.ServerState {
		r := api.ServerState{Backend: b, Server: s, Answer: "ready 100%", Kind: api.KindReady, Weight: 100, Polled: 1, Told: 1}
		if expired != "" {
			r.Expired, r.ExpiredAt = expired, &past
		}
		return r
	}
	view := &api.StateView{HoldsState: true, KV: api.KVStatus{KVView: api.KVView{Synced: true}}, Servers: []api.ServerState{
		row("w", "*", "state/w/*"), row("w", "a", "state/w/a"), row("w", "b", ""), row("w", "c", ""), row("w", "d", ""), row("x", "e", "state/x/e"),
	}}
	replica := scriptedReplicaOf(t, identityOf(t, wr), 1<<50, nil, func(int) *api.StateView { return view })
	keys := func() []string {
		t.Helper()
		ks, _, err := kv.Keys("hastate/", "", nil)
		if err != nil {
			t.Fatal(err)
		}
		return ks
	}
	run := func(dry bool, args ...string) (ClearExpiredResult, error) {
		t.Helper()
		var sels []ctl.Selector
		if len(args) > 0 {
			var err error
			if sels, err = ctl.ParseSelectors(args); err != nil {
				t.Fatal(err)
			}
		}
		return ClearExpired(ctx, ClearExpiredOptions{Writer: wr, Replica: replica, Selectors: sels, Now: now, DryRun: dry})
	}

	before := keys()
	res, err := run(true, "w")
	if err != nil || res.Written || len(res.Keys) != 2 || res.Keys[0].Key != "state/w/*" || res.Keys[1].Key != "state/w/a" ||
		!slices.Equal(res.Unconfirmed, []string{"state/w/c"}) {
		t.Fatalf("dry run: %+v, %v", res, err)
	}
	if got := keys(); !slices.Equal(got, before) {
		t.Fatalf("the dry run wrote: %v, before %v", got, before)
	}
	var out strings.Builder
	res.Report(&out)
	for _, want := range []string{"2 expired keys (with their meta keys) would be deleted", "delete hastate/state/w/a (drain, expired ", "left hastate/state/w/c: its until has passed"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("dry run's report without %q:\n%s", want, out.String())
		}
	}

	res, err = run(false, "w")
	if err != nil || !res.Written || len(res.Keys) != 2 {
		t.Fatalf("clear --expired w: %+v, %v", res, err)
	}
	got := strings.Join(keys(), " ")
	for _, k := range []string{"state/w/a", "meta/w/a", "state/w/*", "meta/w/*"} {
		if strings.Contains(got, "hastate/"+k+" ") || strings.HasSuffix(got, "hastate/"+k) {
			t.Errorf("%s is still in Consul: %s", k, got)
		}
	}
	for _, k := range []string{"state/w/b", "state/w/c", "state/w/d", "state/x/e", "meta/x/e"} {
		if !strings.Contains(got, "hastate/"+k) {
			t.Errorf("%s was deleted: %s", k, got)
		}
	}

	// x/e is written again (no --for) between the read and the
	// transaction: the transaction fails its condition, the key is read
	// again, and it is no longer expired: nothing is deleted.
	res, err = ClearExpired(ctx, ClearExpiredOptions{Writer: wr, Replica: replica, Now: now, beforeTxn: func(attempt int) {
		if attempt == 1 {
			put("state/x/e", "50%")
			put("meta/x/e", `{"state":"50%"}`)
		}
	}})
	if err != nil || res.Written || len(res.Keys) != 0 {
		t.Fatalf("clear --expired with x/e written again meanwhile: %+v, %v", res, err)
	}
	if p, _, _ := kv.Get("hastate/state/x/e", nil); p == nil || string(p.Value) != "50%" {
		t.Fatalf("x/e after the concurrent write: %+v", p)
	}

	// A selector that matches no key and no server: exit 3's error.
	if _, err := run(false, "wx/*"); err == nil || !strings.Contains(err.Error(), "no server matches") {
		t.Fatalf("a typo: %v", err)
	}
}
