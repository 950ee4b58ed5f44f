package haproxy

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"path"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hastate/hastate/cmd/hastate/internal/ctl"
	"github.com/hastate/hastate/cmd/hastate/internal/ctl/internal/ctltest"
)

func TestGlobRegexpMatchesWhatPathMatchMatches(t *testing.T) {
	names := []string{"web", "canary_web", "canary_api", "main_web", "gke-cny-web", "api-us-east1-b", "a.b", "a+b", "x/y", "w1", "w2", "wx", "", "ü-1"}
	for _, glob := range []string{"*", "canary_*", "*web", "gke-cny-web", "api-*-b", "a.b", "a+b", "w?", "w[12]", "w[^1]", `a\.b`, "?-1", "[a-c]*"} {
		re := regexp.MustCompile("^(?:" + globRegexp(glob) + ")$")
		for _, n := range names {
			want, _ := path.Match(glob, n)
			if got := re.MatchString(n); want && !got {
				t.Errorf("glob %q matches %q but its regexp %q does not", glob, n, globRegexp(glob))
			} else if got && !want && !strings.Contains(glob, "[") {
				t.Errorf("regexp %q of glob %q matches %q, which the glob does not", globRegexp(glob), glob, n)
			}
		}
	}
}

func TestNewPrometheusChecksItsOptions(t *testing.T) {
	for _, tc := range []struct {
		o    PrometheusOptions
		want string // "" ok
	}{
		{PrometheusOptions{URL: "prometheus:9090"}, ""},
		{PrometheusOptions{URL: "https://prom.example/"}, ""},
		{PrometheusOptions{}, "HASTATE_PROMETHEUS_URL"},
		{PrometheusOptions{URL: "ftp://x"}, "want http://host:port"},
		{PrometheusOptions{URL: "p:9090", ProxyLabel: "back-end"}, "--proxy-label"},
		{PrometheusOptions{URL: "p:9090", ServerLabel: "state"}, "--server-label"},
		{PrometheusOptions{URL: "p:9090", ProxyLabel: "host", InstanceLabel: "host"}, "both name label"},
		{PrometheusOptions{URL: "p:9090", MaxSampleAge: -time.Second}, "--max-sample-age"},
	} {
		p, err := NewPrometheus(tc.o)
		switch {
		case tc.want == "" && err != nil:
			t.Errorf("%+v: %v", tc.o, err)
		case tc.want == "" && !strings.HasPrefix(p.Addr(), "http"):
			t.Errorf("%+v: address %q", tc.o, p.Addr())
		case tc.want != "" && (!errors.Is(err, ctl.ErrUsage) || !strings.Contains(err.Error(), tc.want)):
			t.Errorf("%+v: error %v, want a usage error naming %q", tc.o, err, tc.want)
		}
	}
	// --max-sample-age is checked here only (issue 27.18): 0 is the
	// default, as for every zero option.
	if p, err := NewPrometheus(PrometheusOptions{URL: "p:9090"}); err != nil || p.o.MaxSampleAge != DefaultMaxSampleAge {
		t.Errorf("MaxSampleAge 0: %v, %v; want the default %s", p, err, DefaultMaxSampleAge)
	}
}

// fakePrometheus answers the queries Read makes from fixed series, with the
// label names of a relabelled setup (backend, srv, host).
type fakePrometheus struct {
	now time.Time
	mu  sync.Mutex
	qs  []string
}

func (f *fakePrometheus) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	_ = r.ParseForm()
	q := r.Form.Get("query")
	f.mu.Lock()
	f.qs = append(f.qs, q)
	f.mu.Unlock()
	ts := func(d time.Duration) string { return fmt.Sprintf("%.3f", float64(f.now.Add(-d).UnixMilli())/1000) }
	var data string
	switch {
	case q == "time()":
		data = fmt.Sprintf(`{"resultType":"scalar","result":[%s,"%s"]}`, ts(0), ts(0))
	case strings.HasPrefix(q, `{__name__=~`):
		// h1 is fresh, h2's scrapes stopped 40s ago (outside the window).
		data = `{"resultType":"matrix","result":[
{"metric":{"__name__":"haproxy_server_current_sessions","host":"10.0.0.1:8405","backend":"web","srv":"a"},"values":[[` + ts(2*time.Second) + `,"3"],[` + ts(time.Second) + `,"2"]]},
{"metric":{"__name__":"haproxy_server_weight","host":"10.0.0.1:8405","backend":"web","srv":"a"},"values":[[` + ts(time.Second) + `,"100"]]}]}`
	case strings.HasPrefix(q, "haproxy_server_status{"):
		data = `{"resultType":"vector","result":[{"metric":{"host":"10.0.0.1:8405","backend":"web","srv":"a","state":"DRAIN"},"value":[` + ts(0) + `,"1"]}]}`
	case strings.HasPrefix(q, "max by (host, backend, srv)"):
		data = `{"resultType":"vector","result":[
{"metric":{"host":"10.0.0.1:8405","backend":"web","srv":"a"},"value":[` + ts(0) + `,"` + ts(15*time.Second) + `"]},
{"metric":{"host":"10.0.0.2:8405","backend":"web","srv":"a"},"value":[` + ts(0) + `,"` + ts(45*time.Second) + `"]}]}`
	case strings.HasPrefix(q, `haproxy_server_current_sessions{host="10.0.0.2:8405"`):
		data = `{"resultType":"matrix","result":[{"metric":{"__name__":"haproxy_server_current_sessions","host":"10.0.0.2:8405","backend":"web","srv":"a"},"values":[[` + ts(41*time.Second) + `,"5"],[` + ts(40*time.Second) + `,"5"]]}]}`
	default:
		w.WriteHeader(http.StatusBadRequest)
		_, _ = io.WriteString(w, `{"status":"error","errorType":"bad_data","error":"unexpected query `+strings.ReplaceAll(q, `"`, `'`)+`"}`)
		return
	}
	_, _ = io.WriteString(w, `{"status":"success","data":`+data+`}`)
}

func TestReadTakesTheNewestSampleAndFindsStaleInstances(t *testing.T) {
	f := &fakePrometheus{now: time.Now().Truncate(time.Millisecond)}
	srv := httptest.NewServer(f)
	defer srv.Close()
	p, err := NewPrometheus(PrometheusOptions{URL: srv.URL, ProxyLabel: "backend", ServerLabel: "srv", InstanceLabel: "host"})
	if err != nil {
		t.Fatal(err)
	}
	rd, err := p.Read(context.Background(), []ctl.Selector{{Backend: "web", Server: "*"}})
	if err != nil {
		t.Fatalf("%v; queries: %q", err, f.qs)
	}
	if !rd.At.Equal(f.now) {
		t.Errorf("At %s, want Prometheus' time %s", rd.At, f.now)
	}
	if len(rd.Servers) != 2 {
		t.Fatalf("rows %+v, want web/a on both instances", rd.Servers)
	}
	a1, a2 := rd.Servers[0], rd.Servers[1]
	if a1.Instance != "10.0.0.1:8405" || a1.Sessions != 2 || a1.Weight != 100 || a1.State != "DRAIN" || rd.At.Sub(a1.Sample) != time.Second {
		t.Errorf("fresh row %+v: want the newest sample (2 sessions, 1s old), weight 100, DRAIN", a1)
	}
	if a2.Instance != "10.0.0.2:8405" || a2.Sessions != -1 || rd.At.Sub(a2.Sample) != 40*time.Second {
		t.Errorf("stale row %+v: want no value and its instance's newest sample, 40s old", a2)
	}
	if got := rd.Stale(30 * time.Second); len(got) != 1 || got[0] != "10.0.0.2:8405 (newest sample 40s old)" {
		t.Errorf("stale %q", got)
	}
	if rd.Newest() != time.Second || rd.Samples != 3+1+2+2 {
		t.Errorf("newest %s samples %d", rd.Newest(), rd.Samples)
	}
	if !strings.Contains(f.qs[1], `backend=~"web",srv=~"[^/]*"`) {
		t.Errorf("the matchers use the configured labels: %s", f.qs[1])
	}
}

func TestReadCannotConfirmWithoutPrometheus(t *testing.T) {
	srv := httptest.NewServer(http.NotFoundHandler())
	addr := srv.URL
	srv.Close() // nothing listens there now
	p, err := NewPrometheus(PrometheusOptions{URL: addr})
	if err != nil {
		t.Fatal(err)
	}
	_, err = p.Read(context.Background(), []ctl.Selector{{Backend: "web", Server: "a"}})
	if !errors.Is(err, ctl.ErrCannotConfirm) || !strings.Contains(err.Error(), "Prometheus at "+addr+" refused") || !strings.Contains(err.Error(), "HASTATE_PROMETHEUS_URL") {
		t.Fatalf("error %v, want cannot confirm naming Prometheus and what to check", err)
	}
}

func TestIdleLag(t *testing.T) {
	now := time.Now()
	since := now.Add(-2 * time.Second)
	row := func(in string, sessions int, age time.Duration) Reported {
		return Reported{Instance: in, Backend: "web", Server: "a", Sessions: sessions, Weight: 100, State: "DRAIN", Sample: now.Add(-age)}
	}
	sel := map[string]bool{"web/a": true}
	for _, tc := range []struct {
		name string
		rows []Reported
		want []string
	}{
		{"idle on both", []Reported{row("h1", 0, time.Second), row("h2", 0, 500*time.Millisecond)}, nil},
		{"sessions on one", []Reported{row("h1", 3, time.Second), row("h2", 0, time.Second)}, []string{"web/a on HAProxy h1: 3 sessions (sample 1s old)"}},
		{"a zero from before the wait", []Reported{row("h1", 0, 3*time.Second)}, []string{"web/a on HAProxy h1: no sample since the wait began yet (newest 3s old)"}},
		{"no sessions sample", []Reported{{Instance: "h1", Backend: "web", Server: "a", Sessions: -1, Sample: now}}, []string{"web/a on HAProxy h1: no sample since the wait began yet (newest 0s old)"}},
		{"another server", []Reported{{Instance: "h1", Backend: "web", Server: "b", Sessions: 9, Sample: now}}, nil},
	} {
		got, _ := idleLag(Reading{At: now, Servers: tc.rows}, sel, since)
		if strings.Join(got, "\n") != strings.Join(tc.want, "\n") {
			t.Errorf("%s: %q, want %q", tc.name, got, tc.want)
		}
	}
}

func TestJudge(t *testing.T) {
	now := time.Now()
	ago := func(d time.Duration) *time.Time { x := now.Add(-d); return &x }
	row := func(state string, weight int, answer, told string, toldAgo time.Duration) VerifyRow {
		kind, w := ctltest.KindOf(answer)
		return VerifyRow{Reported: Reported{Instance: "h1", Backend: "web", Server: "a", State: state, Weight: weight, Sessions: 0, Sample: now.Add(-time.Second)},
			Answer: answer, Told: told, ToldAt: ago(toldAgo), kind: kind, weight: w}
	}
	const maxAge = 30 * time.Second
	for _, tc := range []struct {
		name   string
		r      VerifyRow
		polled bool
		since  *time.Time
		age    time.Duration
		want   string // substring of the problem; "" agrees
		v      verdict
	}{
		{"drained", row("DRAIN", 100, "drain", "drain", time.Second), true, ago(time.Minute), time.Second, "", disagrees},
		{"maint", row("MAINT", 100, "maint", "maint", time.Second), true, ago(time.Minute), time.Second, "", disagrees},
		{"ready", row("UP", 50, "ready 50%", "ready 50%", time.Second), true, nil, time.Second, "", disagrees},
		{"health check down", row("DOWN", 100, "drain", "drain", time.Second), true, ago(time.Minute), time.Second, "", disagrees},
		{"agent disabled through a drain", row("UP", 100, "drain", "ready 100%", 20*time.Second), true, ago(20 * time.Second), time.Second, `last told "ready 100%" 20s ago`, disagrees},
		{"never reaches hastate", row("UP", 100, "drain", "", 0), false, ago(time.Minute), time.Second, "no agent check from this HAProxy reached hastate", disagrees},
		{"silent but agreeing", row("UP", 100, "ready 100%", "ready 100%", 30*time.Second), true, nil, time.Second, "agrees for now, but its last agent check reached hastate 30s ago", disagrees},
		{"socket maint", row("MAINT", 100, "ready 100%", "ready 100%", time.Second), true, ago(time.Minute), time.Second, "set over the admin socket", disagrees},
		{"socket weight 0", row("UP", 0, "ready 100%", "ready 100%", time.Second), true, nil, time.Second, "set over the admin socket", disagrees},
		{"weight 0% not applied", row("UP", 100, "ready 0%", "ready 0%", time.Second), true, ago(time.Minute), time.Second, "reports UP weight 100", disagrees},
		{"just changed", row("UP", 100, "drain", "drain", 0), true, ago(time.Second), time.Second, "cannot confirm yet: reports UP weight 100, hastate answers \"drain\" since 1s ago: the newest sample", pending},
		{"stale", row("DRAIN", 100, "drain", "drain", time.Second), true, nil, 40 * time.Second, "cannot confirm: its newest sample is 40s old", unconfirmed},
		// Issue 35: right after a write, an HAProxy not told yet, or a
		// sample from before it applied the change, is not a disagreement.
		{"not asked since the change", row("UP", 100, "drain", "ready 100%", 2*time.Second), true, ago(time.Second), time.Second, "cannot confirm yet: reports UP weight 100, hastate answers \"drain\" since 1s ago, and this HAProxy has not asked since", pending},
		{"a ramp step not asked yet", row("UP", 40, "ready 50%", "ready 40%", 2*time.Second), true, ago(time.Second), time.Second, "cannot confirm yet", pending},
		{"withheld", VerifyRow{Reported: Reported{State: "UP", Sample: now}, Withheld: true}, true, nil, 0, "withholds", disagrees},
		// Issue 45: UP weight 100 against ready 25%, told, the sample from
		// before the change: it looked like agreement ("ok").
		{"a weight change the sample predates", func() VerifyRow {
			r := row("UP", 100, "ready 25%", "ready 25%", 0)
			r.since = ago(time.Second)
			return r
		}(), true, ago(time.Second), time.Second, "pending: reports UP weight 100, hastate answers \"ready 25%\" since 1s ago: the newest sample (1s old) predates", pending},
		{"a weight change the sample shows", func() VerifyRow {
			r := row("UP", 25, "ready 25%", "ready 25%", 0)
			r.since = ago(10 * time.Second)
			return r
		}(), true, ago(10 * time.Second), time.Second, "", disagrees},
	} {
		got, _, v := judge(tc.r, tc.polled, tc.since, tc.age, maxAge)
		if (tc.want == "") != (got == "") || !strings.Contains(got, tc.want) {
			t.Errorf("%s: problem %q, want %q", tc.name, got, tc.want)
		}
		if got != "" && v != tc.v {
			t.Errorf("%s: verdict %d, want %d (%q)", tc.name, v, tc.v, got)
		}
	}
}
