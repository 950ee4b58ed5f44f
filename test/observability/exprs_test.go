package observability

import (
	"bytes"
	"encoding/json"
	"log/slog"
	"os"
	"slices"
	"strings"
	"testing"

	"github.com/prometheus/common/model"
	"github.com/prometheus/prometheus/model/rulefmt"
	"github.com/prometheus/prometheus/promql/parser"
)

const (
	alertsPath    = "../../deploy/prometheus/alerts.yaml"
	dashboardPath = "../../deploy/grafana/hastate.json"
	runbookPath   = "../../docs/runbook.md"
	runbookURL    = "https://github.com/hastate/hastate/blob/main/docs/runbook.md#"
)

var promql = parser.NewParser(parser.Options{})

// alertRules parses alerts.yaml as Prometheus does (unknown fields and bad
// expressions are errors).
func alertRules(t *testing.T) []rulefmt.Rule {
	t.Helper()
	groups, errs := rulefmt.ParseFile(alertsPath, false, model.UTF8Validation, promql, slog.New(slog.DiscardHandler))
	if len(errs) > 0 {
		t.Fatalf("%s: %v", alertsPath, errs)
	}
	var rules []rulefmt.Rule
	for _, g := range groups.Groups {
		rules = append(rules, g.Rules...)
	}
	if len(rules) == 0 {
		t.Fatalf("%s holds no rules", alertsPath)
	}
	return rules
}

// grafanaVars stand for the dashboard's variables when its expressions are
// parsed.
var grafanaVars = strings.NewReplacer("$__rate_interval", "5m", "$__interval", "1m", "$__range", "1h", "$job", "hastate")

// metricNames returns the metric names an expression selects.
func metricNames(t *testing.T, where, expr string) []string {
	t.Helper()
	e, err := promql.ParseExpr(expr)
	if err != nil {
		t.Errorf("%s: %v\n%s", where, err, expr)
		return nil
	}
	var names []string
	parser.Inspect(e, func(n parser.Node, _ []parser.Node) error {
		if vs, ok := n.(*parser.VectorSelector); ok {
			if vs.Name == "" {
				t.Errorf("%s: a selector without a metric name: %s", where, vs)
			}
			names = append(names, vs.Name)
		}
		return nil
	})
	return names
}

// usedMetrics maps every metric name the alerts and the dashboard select to
// where it is used.
func usedMetrics(t *testing.T) map[string][]string {
	t.Helper()
	used := map[string][]string{}
	for _, r := range alertRules(t) {
		for _, n := range metricNames(t, "alert "+r.Alert, r.Expr) {
			used[n] = append(used[n], "alert "+r.Alert)
		}
	}
	d := loadDashboard(t)
	for _, q := range d.queries() {
		for _, n := range metricNames(t, q.where, grafanaVars.Replace(q.expr)) {
			used[n] = append(used[n], q.where)
		}
	}
	return used
}

// Every alert says what it is, how to react (a runbook section that
// exists), and has a severity and a for: that is not a hair trigger.
func TestAlertRules(t *testing.T) {
	runbook, err := os.ReadFile(runbookPath)
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range alertRules(t) {
		if r.Alert == "" {
			t.Errorf("recording rule %q: alerts.yaml holds alerts only", r.Record)
			continue
		}
		for _, a := range []string{"summary", "description", "runbook_url"} {
			if r.Annotations[a] == "" {
				t.Errorf("alert %s has no %s", r.Alert, a)
			}
		}
		if want := runbookURL + strings.ToLower(r.Alert); r.Annotations["runbook_url"] != want {
			t.Errorf("alert %s: runbook_url %q, want %q", r.Alert, r.Annotations["runbook_url"], want)
		}
		if !bytes.Contains(runbook, []byte("\n## "+r.Alert+"\n")) {
			t.Errorf("alert %s: docs/runbook.md has no section '## %s'", r.Alert, r.Alert)
		}
		if !slices.Contains([]string{"critical", "warning", "info"}, r.Labels["severity"]) {
			t.Errorf("alert %s: severity %q, want critical, warning or info", r.Alert, r.Labels["severity"])
		}
		if r.For == 0 && !strings.Contains(r.Expr, "increase(") {
			t.Errorf("alert %s: no for: (only a counter's increase may fire at once)", r.Alert)
		}
	}
}

// The dashboard is what Grafana would import as is: no export artefacts, a
// stable uid, every panel on the datasource variable, every expression
// parsing, panels laid out without overlap.
func TestDashboard(t *testing.T) {
	raw, err := os.ReadFile(dashboardPath)
	if err != nil {
		t.Fatal(err)
	}
	for _, bad := range []string{"__inputs", "${DS_", "__requires"} {
		if bytes.Contains(raw, []byte(bad)) {
			t.Errorf("dashboard holds the export artefact %q", bad)
		}
	}
	d := loadDashboard(t)
	if d.UID != "hastate" || d.Title == "" {
		t.Errorf("uid %q title %q, want the stable uid hastate and a title", d.UID, d.Title)
	}
	var dsVar *variable
	for i, v := range d.Templating.List {
		if v.Type == "datasource" {
			dsVar = &d.Templating.List[i]
		}
		if v.Datasource != nil && *v.Datasource != dsRef {
			t.Errorf("variable %s: datasource %+v, want %+v", v.Name, *v.Datasource, dsRef)
		}
	}
	if dsVar == nil || dsVar.Name != "datasource" || dsVar.Query != "prometheus" {
		t.Fatalf("no datasource variable named datasource of type prometheus: %+v", d.Templating.List)
	}
	ids := map[int]bool{}
	rows := 0
	var cells [][4]int
	for _, p := range d.Panels {
		if ids[p.ID] {
			t.Errorf("panel id %d twice", p.ID)
		}
		ids[p.ID] = true
		g := p.GridPos
		if g.W <= 0 || g.H <= 0 || g.X < 0 || g.X+g.W > 24 || g.Y < 0 {
			t.Errorf("panel %q: gridPos %+v outside the 24-column grid", p.Title, g)
		}
		for _, c := range cells {
			if g.X < c[0]+c[2] && c[0] < g.X+g.W && g.Y < c[1]+c[3] && c[1] < g.Y+g.H {
				t.Errorf("panel %q overlaps another at %+v", p.Title, g)
			}
		}
		cells = append(cells, [4]int{g.X, g.Y, g.W, g.H})
		if p.Type == "row" {
			rows++
			if len(p.Targets) > 0 || len(p.Panels) > 0 {
				t.Errorf("row %q: rows are open and hold no queries", p.Title)
			}
			continue
		}
		if p.Title == "" || p.Description == "" {
			t.Errorf("panel %d: needs a title and a description (what it answers)", p.ID)
		}
		if p.Datasource == nil || *p.Datasource != dsRef {
			t.Errorf("panel %q: datasource %+v, want the variable %+v", p.Title, p.Datasource, dsRef)
		}
		if len(p.Targets) == 0 {
			t.Errorf("panel %q has no query", p.Title)
		}
		refs := map[string]bool{}
		for _, q := range p.Targets {
			if q.Datasource == nil || *q.Datasource != dsRef {
				t.Errorf("panel %q query %s: datasource %+v, want the variable %+v", p.Title, q.RefID, q.Datasource, dsRef)
			}
			if q.RefID == "" || refs[q.RefID] {
				t.Errorf("panel %q: refId %q empty or twice", p.Title, q.RefID)
			}
			refs[q.RefID] = true
		}
	}
	if want := []string{"Fleet", "Drift", "Desired state", "Cluster", "Consul sync"}; rows != len(want) {
		t.Errorf("%d rows, want %d (%v)", rows, len(want), want)
	} else {
		i := 0
		for _, p := range d.Panels {
			if p.Type == "row" {
				if !strings.HasPrefix(p.Title, want[i]) {
					t.Errorf("row %d is %q, want %s...", i, p.Title, want[i])
				}
				i++
			}
		}
	}
	for _, q := range d.queries() {
		metricNames(t, q.where, grafanaVars.Replace(q.expr))
	}
}

// The dashboard's shape: only these fields are allowed, so a typo or an
// export artefact fails the test.
type dashboard struct {
	UID           string   `json:"uid"`
	Title         string   `json:"title"`
	Description   string   `json:"description"`
	Tags          []string `json:"tags"`
	Editable      bool     `json:"editable"`
	SchemaVersion int      `json:"schemaVersion"`
	Version       int      `json:"version"`
	Refresh       string   `json:"refresh"`
	Timezone      string   `json:"timezone"`
	Time          struct{ From, To string }
	Links         []link `json:"links"`
	Templating    struct{ List []variable }
	Annotations   struct{ List []json.RawMessage }
	Panels        []panel `json:"panels"`
}

type link struct {
	Title       string `json:"title"`
	Type        string `json:"type"`
	URL         string `json:"url"`
	TargetBlank bool   `json:"targetBlank"`
}

type dsRefT struct {
	Type string `json:"type"`
	UID  string `json:"uid"`
}

var dsRef = dsRefT{Type: "prometheus", UID: "${datasource}"}

type variable struct {
	Name       string          `json:"name"`
	Label      string          `json:"label"`
	Type       string          `json:"type"`
	Datasource *dsRefT         `json:"datasource"`
	Query      any             `json:"query"`
	Definition string          `json:"definition"`
	Refresh    int             `json:"refresh"`
	IncludeAll bool            `json:"includeAll"`
	Multi      bool            `json:"multi"`
	Current    json.RawMessage `json:"current"`
	Hide       int             `json:"hide"`
}

type panel struct {
	ID              int     `json:"id"`
	Type            string  `json:"type"`
	Title           string  `json:"title"`
	Description     string  `json:"description"`
	Collapsed       bool    `json:"collapsed"`
	Datasource      *dsRefT `json:"datasource"`
	GridPos         struct{ H, W, X, Y int }
	FieldConfig     json.RawMessage   `json:"fieldConfig"`
	Options         json.RawMessage   `json:"options"`
	Transformations []json.RawMessage `json:"transformations"`
	Targets         []target          `json:"targets"`
	Panels          []panel           `json:"panels"`
}

type target struct {
	RefID        string  `json:"refId"`
	Datasource   *dsRefT `json:"datasource"`
	Expr         string  `json:"expr"`
	LegendFormat string  `json:"legendFormat"`
	Instant      bool    `json:"instant"`
	Range        bool    `json:"range"`
	Format       string  `json:"format"`
}

type query struct{ where, expr string }

func (d dashboard) queries() []query {
	var qs []query
	for _, p := range d.Panels {
		for _, q := range p.Targets {
			qs = append(qs, query{"panel " + p.Title + " " + q.RefID, q.Expr})
		}
	}
	for _, v := range d.Templating.List {
		if m, ok := v.Query.(map[string]any); ok {
			if s, ok := m["query"].(string); ok {
				// label_values(<selector>, <label>) is Grafana's; its
				// selector must be a metric that exists.
				if sel, ok := strings.CutPrefix(s, "label_values("); ok {
					sel, _, _ = strings.Cut(sel, ",")
					qs = append(qs, query{"variable " + v.Name, sel})
				}
			}
		}
	}
	return qs
}

func loadDashboard(t *testing.T) dashboard {
	t.Helper()
	raw, err := os.ReadFile(dashboardPath)
	if err != nil {
		t.Fatal(err)
	}
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.DisallowUnknownFields()
	var d dashboard
	if err := dec.Decode(&d); err != nil {
		t.Fatalf("%s: %v", dashboardPath, err)
	}
	for _, q := range d.queries() {
		if strings.TrimSpace(q.expr) == "" {
			t.Errorf("%s: empty expression", q.where)
		}
	}
	return d
}
