package app

import (
	"slices"
	"testing"
	"time"

	"github.com/hastate/hastate/internal/testenv"
	dto "github.com/prometheus/client_model/go"
)

// hastate_desired_answer shows on a ready replica, for a server with a key
// and one an HAProxy polls; --desired-metrics=false (NoDesiredMetrics)
// leaves both families out and nothing else.
func TestDesiredMetricsFlag(t *testing.T) {
	consul := testenv.StartConsul(t, testenv.ConsulOptions{})
	consul.Put(t, "hastate/state/web/a", "drain")
	on := startApp(t, consul.Addr(), "on")
	off := startApp(t, consul.Addr(), "off", func(o *Options) { o.NoDesiredMetrics = true })
	for _, a := range []*App{on, off} {
		testenv.Eventually(t, 10*time.Second, func() error { return testenv.Expect(ask(t, a, "web/a") == "drain\n", "replica never answered drain") })
		ask(t, a, "web/b")
		ask(t, a, "web/b") // polled twice: an HAProxy, not a manual probe
	}
	family := func(a *App, name string) []string {
		fams, err := a.o.Registry.Gather()
		if err != nil {
			t.Fatal(err)
		}
		i := slices.IndexFunc(fams, func(f *dto.MetricFamily) bool { return f.GetName() == name })
		if i < 0 {
			return nil
		}
		var out []string
		for _, m := range fams[i].GetMetric() {
			var l []string
			for _, p := range m.GetLabel() {
				l = append(l, p.GetName()+"="+p.GetValue())
			}
			out = append(out, l...)
		}
		return out
	}
	want := []string{"proxy=web", "server=a", "state=drain", "proxy=web", "server=b", "state=ready"}
	if got := family(on, "hastate_desired_answer"); !slices.Equal(got, want) {
		t.Fatalf("hastate_desired_answer labels %v, want %v", got, want)
	}
	for _, name := range []string{"hastate_desired_answer", "hastate_desired_changed_timestamp_seconds"} {
		if got := family(off, name); got != nil {
			t.Fatalf("with NoDesiredMetrics, %s is exported: %v", name, got)
		}
	}
	if family(off, "hastate_server_state") == nil {
		t.Fatal("with NoDesiredMetrics, hastate_server_state is gone too")
	}
}
