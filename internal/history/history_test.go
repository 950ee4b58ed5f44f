package history

import (
	"strings"
	"testing"
	"time"
)

var t0 = time.Date(2026, 12, 2, 1, 0, 0, 0, time.UTC)

func at(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }

// ask is one answer of poller p for server, from ms to ms+5.
func ask(p, server string, ms int, line string) Answer {
	return Answer{Poller: p, Server: server, Began: at(ms), Ended: at(ms + 5), Line: line}
}

// writes of the tests: be/a absent -> drain@10 -> ready 40%@20 -> deleted
// somewhere in 21..30 -> maint@40; be/b drain@15 -> ready 70%@25.
func writes() []Write {
	return []Write{
		{Server: "be/a", Answer: "drain", Index: 10, Began: at(100)},
		{Server: "be/b", Answer: "drain", Index: 15, Began: at(150)},
		{Server: "be/a", Answer: "ready 40%", Index: 20, Began: at(200)},
		{Server: "be/b", Answer: "ready 70%", Index: 25, Began: at(250)},
		{Server: "be/a", Answer: Absent, Index: 21, MaxIndex: 30, Began: at(300), By: "consul"},
		{Server: "be/a", Answer: "maint", Index: 40, Began: at(400)},
	}
}

func kinds(vs []Violation) []Kind {
	var ks []Kind
	for _, v := range vs {
		ks = append(ks, v.Kind)
	}
	return ks
}

func TestCheckRejectsBadHistories(t *testing.T) {
	cases := []struct {
		name    string
		answers []Answer
		want    []Kind
	}{
		{"in order on one key", []Answer{
			ask("p", "be/a", 50, Absent), ask("p", "be/a", 150, "drain"), ask("p", "be/a", 250, "ready 40%"),
			ask("p", "be/a", 350, Absent), ask("p", "be/a", 450, "maint"),
		}, nil},
		{"repeats and no answers are fine", []Answer{
			ask("p", "be/a", 150, "drain"), ask("p", "be/a", 160, ""), ask("p", "be/a", 170, "drain"),
		}, nil},
		{"a value the key never held", []Answer{ask("p", "be/a", 250, "ready 70%")}, []Kind{NeverHeld}},
		{"a malformed answer", []Answer{ask("p", "be/b", 250, "ready 70")}, []Kind{NeverHeld}},
		{"a value from the future", []Answer{ask("p", "be/a", 50, "maint")}, []Kind{NeverHeld}},
		{"back on one key", []Answer{
			ask("p", "be/a", 250, "ready 40%"), ask("p", "be/a", 260, "drain"),
		}, []Kind{StepBack}},
		{"back to the initial absent key", []Answer{
			ask("p", "be/a", 150, "drain"), ask("p", "be/a", 160, Absent),
		}, []Kind{StepBack}},
		{"back across keys: be/b's 70% (25) then be/a's drain (10..20)", []Answer{
			ask("p", "be/b", 260, "ready 70%"), ask("p", "be/a", 270, "drain"),
		}, []Kind{StepBack}},
		{"across keys in order: be/a's drain (10..20) then be/b's drain (15..25)", []Answer{
			ask("p", "be/a", 160, "drain"), ask("p", "be/b", 170, "drain"), ask("p", "be/a", 180, "drain"),
		}, nil},
		{"be/b's 70% (25..) leaves be/a's 40% possible only until the delete (at most 30)", []Answer{
			ask("p", "be/b", 260, "ready 70%"), ask("p", "be/a", 270, "ready 40%"),
		}, nil},
		{"be/a's maint (40) then be/a's 40% is back", []Answer{
			ask("p", "be/a", 450, "maint"), ask("p", "be/b", 460, "ready 70%"), ask("p", "be/a", 470, "ready 40%"),
		}, []Kind{StepBack}},
		{"a delete's bounded index: the absent key then 40% within the bounds", []Answer{
			ask("p", "be/a", 350, Absent), ask("p", "be/a", 360, "ready 40%"),
		}, nil},
		{"one poller's order, not another's: two pollers each in order", []Answer{
			ask("p1", "be/a", 250, "ready 40%"), ask("p2", "be/a", 255, "drain"),
		}, nil},
		{"answers judged in the order they began, whatever order they were recorded in", []Answer{
			ask("p", "be/a", 260, "drain"), ask("p", "be/a", 250, "ready 40%"),
		}, []Kind{StepBack}},
		{"a server never written answers ready 100% only", []Answer{
			ask("p", "be/z", 100, Absent), ask("p", "be/z", 110, "drain"),
		}, []Kind{NeverHeld}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got := Check(writes(), c.answers)
			if strings.Join(kindStrings(kinds(got)), ",") != strings.Join(kindStrings(c.want), ",") {
				t.Fatalf("violations %v, want kinds %v", got, c.want)
			}
			for _, v := range got {
				if v.Detail == "" || !strings.Contains(v.String(), v.Answer.Server) {
					t.Errorf("violation without a useful message: %s", v)
				}
			}
		})
	}
}

func kindStrings(ks []Kind) []string {
	var s []string
	for _, k := range ks {
		s = append(s, string(k))
	}
	return s
}

// The flip-back of issue 23 as the nemesis test sees it: a cut-off
// follower behind the load balancer answers the drain's previous value
// after another replica answered the drain.
func TestCheckCatchesAFollowerBehindTheLoadBalancer(t *testing.T) {
	ws := []Write{
		{Server: "be/s01", Answer: "ready 55%", Index: 100, Began: at(0)},
		{Server: "be/s01", Answer: "drain", Index: 120, Began: at(1000)},
	}
	var as []Answer
	for i, line := range []string{"ready 55%", "ready 55%", "drain", "drain", "ready 55%", "drain"} {
		as = append(as, ask("poller1", "be/s01", 1000+100*i, line))
	}
	got := Check(ws, as)
	if len(got) != 1 || got[0].Kind != StepBack || !got[0].Answer.Began.Equal(at(1400)) {
		t.Fatalf("violations %v, want one step back at the fifth answer", got)
	}
}

func TestAnswerFor(t *testing.T) {
	for in, want := range map[string]string{"": Absent, "ready": Absent, " Drain ": "drain", "maint": "maint", "0%": "ready 0%", "256%": "ready 256%", "37%": "ready 37%"} {
		if got, ok := AnswerFor(in); !ok || got != want {
			t.Errorf("AnswerFor(%q) = %q, %v; want %q", in, got, ok, want)
		}
	}
	for _, in := range []string{"257%", "-1%", "x%", "07%", "{}", "drainx"} {
		if got, ok := AnswerFor(in); ok {
			t.Errorf("AnswerFor(%q) = %q, want not understood", in, got)
		}
	}
}

func TestCheckConverged(t *testing.T) {
	m := NewModel(writes()) // final: be/a maint, be/b ready 70%
	deadline := at(1000)
	good := []Answer{
		ask("n1", "be/a", 900, "maint"), ask("n1", "be/b", 900, "ready 70%"),
		ask("n2", "be/a", 800, "drain"), ask("n2", "be/a", 950, "maint"), ask("n2", "be/b", 950, "ready 70%"),
		ask("n2", "be/a", 1100, "maint"),
	}
	if got := m.CheckConverged([]string{"n1", "n2"}, good, deadline); len(got) != 0 {
		t.Fatalf("converged fleet rejected: %v", got)
	}
	cases := []struct {
		name    string
		samples []Answer
	}{
		{"a replica that never answers the last value", []Answer{ask("n1", "be/a", 900, "ready 40%"), ask("n1", "be/b", 900, "ready 70%")}},
		{"a replica with no samples for a key", []Answer{ask("n1", "be/a", 900, "maint")}},
		{"after the deadline", []Answer{ask("n1", "be/a", 1200, "maint"), ask("n1", "be/b", 900, "ready 70%")}},
		{"converged, then went back", []Answer{ask("n1", "be/a", 900, "maint"), ask("n1", "be/a", 1200, "drain"), ask("n1", "be/b", 900, "ready 70%")}},
		{"converged, then stopped answering", []Answer{ask("n1", "be/a", 900, "maint"), ask("n1", "be/a", 1200, ""), ask("n1", "be/b", 900, "ready 70%")}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got := m.CheckConverged([]string{"n1"}, c.samples, deadline)
			if len(got) != 1 || got[0].Kind != NotConverged {
				t.Fatalf("violations %v, want one %s", got, NotConverged)
			}
		})
	}
}
