package test

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/hastate/hastate/internal/testenv"
	promv1 "github.com/prometheus/client_golang/api/prometheus/v1"
	"github.com/prometheus/common/model"
)

// The drift alerts with real parts: a real Prometheus scrapes the built-in
// exporter of two real HAProxy processes and a hastate replica, with the
// alert rules of deploy/prometheus/alerts.yaml loaded, and each drift
// alert fires in Prometheus's own /api/v1/alerts, naming the HAProxy
// instance, and resolves once the fault is fixed:
//
//  1. HastateHAProxyOverride: a MAINT set over HAProxy A's admin socket
//     (its agent check disabled first: with the agent running, hastate's
//     next "ready" answer clears it within one agent-inter, which the test
//     checks too) on a server hastate answers ready; fixed by enabling the
//     agent again.
//  2. HastateDrainNotApplied: HAProxy B's agent checks cannot reach
//     hastate (its agent-port has no listener) while a server is drained:
//     A applies the drain, B keeps it UP; fixed by pointing B's agent-port
//     at hastate over its admin socket.
//
// The dashboard's table of the servers that drift lists each, and only
// it, while it fires. The rules are the shipped ones with only the for:
// of the three drift alerts cut to driftFor (1m and 5m shipped) and
// scrapes and evaluations every second: the expressions, their 10 s
// settle window included, are the shipped ones. It runs once per HAProxy
// release (2.6 and 3.0), both HAProxy processes of that release.
func TestE2EDriftAlerts(t *testing.T) {
	forEachRelease(t, driftAlerts)
}

func driftAlerts(t *testing.T, r haproxyRelease) {
	consul := testenv.StartConsul(t, testenv.ConsulOptions{})
	hs := StartCluster(t, 1, HastateOptions{ConsulAddr: consul.Addr()})
	be := Backend{Name: "be_drift", Servers: []string{"s1", "s2", "s3"}}
	expA, expB := freeAddr(t), freeAddr(t)
	hapA := startHAProxy(t, hs[0].AgentAddr, nil, "", []Backend{be}, hapExtras{release: r, sections: exporterFrontend(expA)})
	// B's agent checks go to a port nothing listens on (L4CON: HAProxy
	// keeps the server's state).
	dead := freeAddr(t)
	hapB := startHAProxy(t, dead, nil, "", []Backend{be}, hapExtras{release: r, sections: exporterFrontend(expB)})
	prom := runPrometheus(t, func(dir string) string {
		rules := filepath.Join(dir, "alerts.yaml")
		if err := os.WriteFile(rules, []byte(driftRules(t)), 0o644); err != nil {
			t.Fatal(err)
		}
		return fmt.Sprintf(`global:
  scrape_interval: 1s
  scrape_timeout: 900ms
  evaluation_interval: 1s
rule_files: ['%s']
scrape_configs:
  - job_name: haproxy
    static_configs:
      - targets: ['%s', '%s']
  - job_name: hastate
    metrics_path: /-/metrics
    static_configs:
      - targets: ['%s']
`, rules, expA, expB, hs[0].HTTPAddr)
	})
	api := promClient(t, "http://"+prom)

	// Prometheus scrapes all three and holds hastate's answer for every
	// server A polls; the shipped drift alerts are loaded.
	testenv.Eventually(t, 30*time.Second, func() error {
		up := promCount(api, `up == 1`)
		known := promCount(api, `hastate_desired_answer{proxy="be_drift",state="ready"} == 100`)
		return testenv.Expect(up == 3 && known == len(be.Servers), "Prometheus: %d of 3 targets up, %d of %d servers with hastate's answer", up, known, len(be.Servers))
	})
	loaded := loadedAlerts(t, api)
	for _, name := range driftAlertNames {
		if loaded[name] != driftFor {
			t.Fatalf("Prometheus did not load %s with for %s: loaded %v", name, driftFor, loaded)
		}
	}
	if a := driftActive(t, api); len(a) != 0 {
		t.Fatalf("drift alerts active before any fault: %v", a)
	}

	// With the agent check running, a socket maint does not last:
	// hastate's answer carries its admin word, and its "ready" clears the
	// MAINT at the next agent check (the CLI and the agent write the same
	// flags).
	hapCommand(t, hapA, "set server be_drift/s3 state maint")
	hapA.WaitServer(t, "be_drift/s3", "UP", -1)
	// A scrape may have caught the moment of MAINT: that alert may go
	// pending, never firing, and is gone at the next evaluation.
	testenv.Eventually(t, 10*time.Second, func() error {
		a := driftActive(t, api)
		return testenv.Expect(len(a) == 0, "drift alerts active after a socket maint the agent cleared: %v", a)
	})

	// 1. A socket maint nobody clears, on a server hastate answers ready.
	hapCommand(t, hapA, "disable agent be_drift/s1")
	fault := time.Now()
	hapCommand(t, hapA, "set server be_drift/s1 state maint")
	hapA.WaitServer(t, "be_drift/s1", statMaint, -1)
	override := model.LabelSet{"alertname": "HastateHAProxyOverride", "instance": model.LabelValue(expA), "proxy": "be_drift", "server": "s1", "state": "MAINT"}
	fired := waitAlert(t, api, override, fault)
	if rows := driftPanel(t, api); len(rows) != 1 || rows[0]["instance"] != model.LabelValue(expA) || rows[0]["server"] != "s1" ||
		rows[0]["state"] != "MAINT" || rows[0]["drift"] != "held in MAINT or DRAIN" {
		t.Fatalf("the dashboard's table of servers that drift lists %v, want be_drift/s1 in MAINT on %s only", rows, expA)
	}
	fix := time.Now()
	hapCommand(t, hapA, "enable agent be_drift/s1") // hastate's next answer, ready, clears the MAINT
	hapA.WaitServer(t, "be_drift/s1", "UP", -1)
	resolved := waitResolved(t, api, override, fix)
	t.Logf("HastateHAProxyOverride (socket maint, agent disabled): fault to pending %.1fs, to firing %.1fs; fix to resolved %.1fs",
		fired.ActiveAt.Sub(fault).Seconds(), fired.seen.Sub(fault).Seconds(), resolved.Sub(fix).Seconds())

	// 2. A drain that HAProxy B, whose agent checks cannot reach hastate,
	// never hears of.
	op := hs[0].Operator()
	fault = time.Now()
	op.Run(t, "drain", "be_drift/s2", "--reason", "drift test")
	hapA.WaitServer(t, "be_drift/s2", statDrainAgent, -1)
	if r := hapB.Server(t, "be_drift/s2"); r.Status != "UP" || r.AgentStatus != "L4CON" {
		t.Fatalf("HAProxy B, whose agent cannot reach hastate: be_drift/s2 %s; want UP with agent status L4CON", r)
	}
	notApplied := model.LabelSet{"alertname": "HastateDrainNotApplied", "instance": model.LabelValue(expB), "proxy": "be_drift", "server": "s2"}
	fired = waitAlert(t, api, notApplied, fault)
	if fired.ActiveAt.Sub(fault) < 10*time.Second {
		t.Fatalf("HastateDrainNotApplied went pending %s after the drain, within the 10s HAProxy is given to poll", fired.ActiveAt.Sub(fault))
	}
	// The dashboard's table lists it too, by HAProxy instance, and only it.
	rows := driftPanel(t, api)
	if len(rows) != 1 || rows[0]["instance"] != model.LabelValue(expB) || rows[0]["server"] != "s2" || rows[0]["drift"] != "drain or maint not applied (UP)" {
		t.Fatalf("the dashboard's table of servers that drift lists %v, want be_drift/s2 on %s only", rows, expB)
	}
	_, port, _ := net.SplitHostPort(hs[0].AgentAddr)
	fix = time.Now()
	hapCommand(t, hapB, "set server be_drift/s2 agent-port "+port)
	hapB.WaitServer(t, "be_drift/s2", statDrainAgent, -1)
	resolved = waitResolved(t, api, notApplied, fix)
	t.Logf("HastateDrainNotApplied (agent of B unreachable, drain): fault to pending %.1fs, to firing %.1fs; fix to resolved %.1fs",
		fired.ActiveAt.Sub(fault).Seconds(), fired.seen.Sub(fault).Seconds(), resolved.Sub(fix).Seconds())
	if a := driftActive(t, api); len(a) != 0 {
		t.Fatalf("drift alerts still active once fixed: %v", a)
	}
}

// exporterFrontend is the haproxy.cfg section of HAProxy's built-in
// Prometheus exporter on addr.
func exporterFrontend(addr string) string {
	return fmt.Sprintf("\nfrontend exporter\n    mode http\n    bind %s\n    http-request use-service prometheus-exporter if { path /metrics }\n", addr)
}

// driftAlertNames are the drift alerts of deploy/prometheus/alerts.yaml;
// driftFor is the for: the e2e test gives them.
var driftAlertNames = []string{"HastateDrainNotApplied", "HastateHAProxyOverride", "HastateWeightDrift"}

const driftFor = 3 * time.Second

// driftRules is deploy/prometheus/alerts.yaml with the for: of the drift
// alerts set to driftFor, and nothing else changed.
func driftRules(t *testing.T) string {
	t.Helper()
	b, err := os.ReadFile("../deploy/prometheus/alerts.yaml")
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(string(b), "\n")
	alert, n := "", 0
	for i, l := range lines {
		if name, ok := strings.CutPrefix(strings.TrimSpace(l), "- alert: "); ok {
			alert = name
		}
		if j := strings.Index(l, "for: "); j >= 0 && strings.TrimSpace(l[:j]) == "" && slices.Contains(driftAlertNames, alert) {
			lines[i] = l[:j] + "for: " + model.Duration(driftFor).String()
			n++
		}
	}
	if n != len(driftAlertNames) {
		t.Fatalf("deploy/prometheus/alerts.yaml: found the for: of %d drift alerts, want %d (%v)", n, len(driftAlertNames), driftAlertNames)
	}
	return strings.Join(lines, "\n")
}

// loadedAlerts are the alerting rules Prometheus loaded, by name, with
// their for.
func loadedAlerts(t *testing.T, api promv1.API) map[string]time.Duration {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	rules, err := api.Rules(ctx, nil)
	if err != nil {
		t.Fatalf("prometheus /api/v1/rules: %v", err)
	}
	out := map[string]time.Duration{}
	for _, g := range rules.Groups {
		for _, r := range g.Rules {
			if a, ok := r.(promv1.AlertingRule); ok {
				out[a.Name] = time.Duration(a.Duration * float64(time.Second))
			}
		}
	}
	return out
}

// seenAlert is an alert of /api/v1/alerts and when the test first saw it
// firing.
type seenAlert struct {
	promv1.Alert
	seen time.Time
}

// activeAlerts is /api/v1/alerts: the pending and firing alerts.
func activeAlerts(t *testing.T, api promv1.API) []promv1.Alert {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	res, err := api.Alerts(ctx)
	if err != nil {
		t.Fatalf("prometheus /api/v1/alerts: %v", err)
	}
	return res.Alerts
}

// matches reports whether a's labels include every label of want.
func matches(a promv1.Alert, want model.LabelSet) bool {
	for k, v := range want {
		if a.Labels[k] != v {
			return false
		}
	}
	return true
}

// driftActive lists the active drift alerts.
func driftActive(t *testing.T, api promv1.API) []string {
	t.Helper()
	var out []string
	for _, a := range activeAlerts(t, api) {
		if slices.Contains(driftAlertNames, string(a.Labels["alertname"])) {
			out = append(out, fmt.Sprintf("%s %s", a.State, a.Labels))
		}
	}
	return out
}

// waitAlert waits until the alert with labels want fires, polling
// /api/v1/alerts, and fails if another drift alert fires meanwhile
// (another HAProxy, another server).
func waitAlert(t *testing.T, api promv1.API, want model.LabelSet, since time.Time) seenAlert {
	t.Helper()
	var got seenAlert
	testenv.Eventually(t, 45*time.Second, func() error {
		for _, a := range activeAlerts(t, api) {
			if !slices.Contains(driftAlertNames, string(a.Labels["alertname"])) {
				continue
			}
			if !matches(a, want) && a.State == promv1.AlertStateFiring {
				t.Fatalf("drift alert %s %s fires, want only %s", a.State, a.Labels, want)
			}
			if matches(a, want) && a.State == promv1.AlertStateFiring {
				got = seenAlert{a, time.Now()}
				return nil
			}
		}
		return fmt.Errorf("%s does not fire %s after the fault; active drift alerts: %v", want, time.Since(since).Round(time.Second), driftActive(t, api))
	})
	return got
}

// waitResolved waits until no alert with labels want is active and
// returns when the test saw that.
func waitResolved(t *testing.T, api promv1.API, want model.LabelSet, since time.Time) time.Time {
	t.Helper()
	testenv.Eventually(t, 30*time.Second, func() error {
		for _, a := range activeAlerts(t, api) {
			if matches(a, want) {
				return fmt.Errorf("%s still %s %s after the fix", want, a.State, time.Since(since).Round(time.Second))
			}
		}
		return nil
	})
	return time.Now()
}

// driftPanel runs the query of the dashboard's table "Servers that drift,
// by HAProxy instance" (deploy/grafana/hastate.json, $job set to the
// scrape job of the replicas) and returns the label sets of its rows.
func driftPanel(t *testing.T, api promv1.API) []model.Metric {
	t.Helper()
	b, err := os.ReadFile("../deploy/grafana/hastate.json")
	if err != nil {
		t.Fatal(err)
	}
	var d struct {
		Panels []struct {
			Title   string
			Targets []struct{ Expr string }
		}
	}
	if err := json.Unmarshal(b, &d); err != nil {
		t.Fatalf("deploy/grafana/hastate.json: %v", err)
	}
	const title = "Servers that drift, by HAProxy instance"
	for _, p := range d.Panels {
		if p.Title != title || len(p.Targets) != 1 {
			continue
		}
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		v, _, _, err := api.Query(ctx, strings.ReplaceAll(p.Targets[0].Expr, "$job", "hastate"), time.Time{})
		if err != nil {
			t.Fatalf("the query of the dashboard's %q: %v", title, err)
		}
		var rows []model.Metric
		for _, s := range v.(model.Vector) {
			rows = append(rows, s.Metric)
		}
		return rows
	}
	t.Fatalf("deploy/grafana/hastate.json has no panel %q with one query", title)
	return nil
}
