package deploytest

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	yamlv3 "gopkg.in/yaml.v3"
)

// The chart's README (what `helm show readme` prints) holds a table of
// every value, generated from values.yaml and its comments, between these
// markers; the rest of the README is written by hand.
const (
	readmeBegin = "<!-- values: generated from values.yaml by deploy/test (UPDATE_CHART_README=1 go test -run TestChartREADME), do not edit -->"
	readmeEnd   = "<!-- end of values -->"
)

// valuesTable renders values.yaml as a Markdown table: every value with
// its default and the comment above it (a map with a comment of its own
// gets a row too, its children below it).
func valuesTable(t *testing.T, src []byte) string {
	t.Helper()
	var doc yamlv3.Node
	if err := yamlv3.Unmarshal(src, &doc); err != nil {
		t.Fatalf("values.yaml: %v", err)
	}
	var b strings.Builder
	b.WriteString("| Value | Default | What it does |\n|---|---|---|\n")
	var walk func(n *yamlv3.Node, path string)
	walk = func(n *yamlv3.Node, path string) {
		for i := 0; i+1 < len(n.Content); i += 2 {
			k, v := n.Content[i], n.Content[i+1]
			p := k.Value
			if path != "" {
				p = path + "." + k.Value
			}
			text := commentText(k.HeadComment)
			if v.Kind == yamlv3.MappingNode && len(v.Content) > 0 {
				if text != "" {
					fmt.Fprintf(&b, "| `%s` | | %s |\n", p, text)
				}
				walk(v, p)
				continue
			}
			fmt.Fprintf(&b, "| `%s` | %s | %s |\n", p, defaultText(t, v), text)
		}
	}
	walk(doc.Content[0], "")
	return b.String()
}

// commentText joins a head comment into one table cell. A comment that
// starts with a blank line or is separated from the key belongs to the
// section above it, so only the paragraph right above the key counts.
func commentText(c string) string {
	paras := strings.Split(strings.TrimSpace(c), "\n\n")
	last := paras[len(paras)-1]
	var words []string
	for _, l := range strings.Split(last, "\n") {
		l = strings.TrimSpace(strings.TrimPrefix(strings.TrimSpace(l), "#"))
		if l != "" {
			words = append(words, l)
		}
	}
	return strings.NewReplacer("|", `\|`, "<", `\<`).Replace(strings.Join(words, " "))
}

func defaultText(t *testing.T, v *yamlv3.Node) string {
	t.Helper()
	if v.Kind == yamlv3.ScalarNode {
		if v.Tag == "!!null" {
			return "`null`"
		}
		if v.Value == "" {
			return `""`
		}
		return "`" + v.Value + "`"
	}
	v.Style = yamlv3.FlowStyle
	out, err := yamlv3.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return "`" + strings.ReplaceAll(strings.TrimSpace(string(out)), "|", `\|`) + "`"
}

// The chart README's values table is values.yaml's, so that `helm show
// readme` cannot drift from the values the chart reads. With
// UPDATE_CHART_README=1 the test writes it instead.
func TestChartREADME(t *testing.T) {
	src, err := os.ReadFile(filepath.Join(chartDir, "values.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(chartDir, "README.md")
	readme, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("the chart has no README.md (helm show readme): %v", err)
	}
	before, rest, ok1 := strings.Cut(string(readme), readmeBegin)
	_, after, ok2 := strings.Cut(rest, readmeEnd)
	if !ok1 || !ok2 {
		t.Fatalf("%s lacks the markers %q and %q", path, readmeBegin, readmeEnd)
	}
	want := before + readmeBegin + "\n\n" + valuesTable(t, src) + "\n" + readmeEnd + after
	if os.Getenv("UPDATE_CHART_README") != "" {
		if err := os.WriteFile(path, []byte(want), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	if string(readme) != want {
		t.Errorf("%s's values table is not values.yaml's: run `make chart-readme` (UPDATE_CHART_README=1 go test -run TestChartREADME in deploy/test)", path)
	}
	// Every value of values.yaml is in the table, and the README says how
	// to render without a cluster.
	var vals map[string]any
	if err := yamlv3.Unmarshal(src, &vals); err != nil {
		t.Fatal(err)
	}
	for k := range vals {
		if !strings.Contains(string(readme), "| `"+k) {
			t.Errorf("README lacks value %s", k)
		}
	}
	for _, s := range []string{"--kube-version", "--api-versions", "--is-upgrade"} {
		if !strings.Contains(before+after, s) {
			t.Errorf("README does not say when to pass %s", s)
		}
	}
}
