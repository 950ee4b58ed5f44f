package api

import "testing"

// The rotation line's numbers add up: in rotation plus each reason out is
// every server, whatever the mix (issue 35: the page's headline counted
// groups that overlapped).
func TestRotationAddsUp(t *testing.T) {
	rows := []ServerState{
		{Kind: KindReady, Weight: 100},
		{Kind: KindRamping, Weight: 40},
		{Kind: KindWeight, Weight: 50},
		{Kind: KindWeight, Weight: 0},
		{Kind: KindDrain},
		{Kind: KindDrain},
		{Kind: KindMaint},
		{Kind: KindWithheld, Withheld: true, Keeps: "ready 100%"},
		{Kind: KindWithheld, Withheld: true, Keeps: "drain"},
		{Kind: KindWithheld, Withheld: true},
	}
	var r Rotation
	for _, s := range rows {
		r.Add(s)
	}
	if sum := r.In + r.Drain + r.Maint + r.Zero + r.Never; sum != r.Servers || r.Servers != len(rows) {
		t.Fatalf("%+v: in+out = %d, servers %d, rows %d", r, sum, r.Servers, len(rows))
	}
	want := "4 of 10 servers in rotation (of which 1 ramping, 1 at a set weight); out: 3 drain, 1 maint, 1 at 0% (HAProxy shows DRAIN), " +
		"1 withheld and never told (HAProxy keeps its own state); 2 withheld: HAProxy keeps the last answer it was told, counted there"
	if got := r.String(); got != want {
		t.Errorf("line\n got %s\nwant %s", got, want)
	}
	var one Rotation
	one.Add(ServerState{Kind: KindDrain})
	if got := one.String(); got != "0 of 1 server in rotation; out: 1 drain" {
		t.Errorf("one drained server: %q", got)
	}
	var all Rotation
	all.Merge(r)
	all.Merge(one)
	if all.Servers != 11 || all.Drain != 4 || all.Full() {
		t.Errorf("merged: %+v", all)
	}
	if got := Plural(1024, "key", "keys"); got != "1,024 keys" {
		t.Errorf("Plural(1024) = %q", got)
	}
}
