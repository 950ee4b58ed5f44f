package deploytest

import (
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/hashicorp/hcl/v2"
	"github.com/hashicorp/hcl/v2/hclparse"
	"github.com/hashicorp/hcl/v2/hclsyntax"
	"github.com/hastate/hastate/internal/testenv"
	"github.com/zclconf/go-cty/cty"
	"github.com/zclconf/go-cty/cty/function"
)

const tfDir = "../terraform"

// tfFiles parses every .tf file under deploy/terraform (module and examples).
func tfFiles(t *testing.T) map[string]*hclsyntax.Body {
	t.Helper()
	p := hclparse.NewParser()
	bodies := map[string]*hclsyntax.Body{}
	err := filepath.Walk(tfDir, func(path string, info os.FileInfo, err error) error {
		if err != nil || info.IsDir() || !strings.HasSuffix(path, ".tf") {
			return err
		}
		f, diags := p.ParseHCLFile(path)
		if diags.HasErrors() {
			t.Errorf("%s: %s", path, diags.Error())
			return nil
		}
		bodies[path] = f.Body.(*hclsyntax.Body)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(bodies) < 6 {
		t.Fatalf("found %d .tf files under %s, want the module and examples/gstg", len(bodies), tfDir)
	}
	return bodies
}

func TestTerraformVariablesTypedAndDescribed(t *testing.T) {
	n := 0
	for path, body := range tfFiles(t) {
		for _, b := range body.Blocks {
			switch b.Type {
			case "variable":
				n++
				if _, ok := b.Body.Attributes["type"]; !ok {
					t.Errorf("%s: variable %q has no type", path, b.Labels[0])
				}
				if d := literalString(t, b.Body.Attributes["description"]); strings.TrimSpace(d) == "" {
					t.Errorf("%s: variable %q has no description", path, b.Labels[0])
				}
			case "output":
				if d := literalString(t, b.Body.Attributes["description"]); strings.TrimSpace(d) == "" {
					t.Errorf("%s: output %q has no description", path, b.Labels[0])
				}
			}
		}
	}
	if n < 15 {
		t.Errorf("only %d variables found", n)
	}
}

// The shipped policies, rendered for a prefix as Terraform renders them,
// are exactly these rules. The read policy lets the replicas mirror the
// prefix ("list": read, and the recursive read that
// acl.enable_key_list_policy asks for separately) and read their agent's
// datacenter; the writer also writes state/,
// meta/ (every CLI write writes the meta key in the same transaction) and
// config/ (ramp policy, migration marker). That each rule is enough, and
// needed, is shown against a real Consul with ACLs on by the e2e tests
// (test/acl_e2e_test.go), which render the same files.
func TestTerraformPoliciesGrantExactly(t *testing.T) {
	for _, prefix := range []string{"hastate/", "gitlab-haproxy-agent/"} {
		got := consulRules(t, "hastate", prefix)
		want := []rule{{"key_prefix", prefix, "list"}, {"agent_prefix", "", "read"}}
		if !slices.Equal(got, want) {
			t.Errorf("hastate (read) policy for %s = %v, want %v", prefix, got, want)
		}
		got = consulRules(t, "writer", prefix)
		want = []rule{{"key_prefix", prefix, "list"}, {"key_prefix", prefix + "state/", "write"},
			{"key_prefix", prefix + "meta/", "write"}, {"key_prefix", prefix + "config/", "write"}, {"agent_prefix", "", "read"}}
		if !slices.Equal(got, want) {
			t.Errorf("writer policy for %s = %v, want %v", prefix, got, want)
		}
	}
}

// consul.tf takes each policy's rules from the file the e2e tests render
// (testenv.ShippedPolicy), and that rendering is HCL's own: the rules
// Terraform sends Consul are the rules the tests grant.
func TestTerraformPoliciesAreTheTestedFiles(t *testing.T) {
	for name, file := range map[string]string{"hastate": testenv.ReadPolicy, "writer": testenv.WriterPolicy} {
		for _, prefix := range []string{"hastate/", "gitlab-haproxy-agent/"} {
			rules, used := policyRules(t, name, prefix)
			if want := filepath.Join(tfDir, "policies", file); !slices.Equal(used, []string{want}) {
				t.Errorf("consul_acl_policy.%s reads %v, want templatefile(%q, ...) and nothing else", name, used, want)
			}
			if tested := testenv.ShippedPolicy(t, file, prefix); rules != tested {
				t.Errorf("consul_acl_policy.%s for %s: Terraform renders\n%s\nthe tests grant\n%s", name, prefix, rules, tested)
			}
		}
	}
}

// Nothing project- or region-specific is written into the .tf files:
// project and region always come from variables, no region or zone name
// and no literal project appear anywhere.
func TestTerraformNothingHardCoded(t *testing.T) {
	regionRE := regexp.MustCompile(`\b(us|europe|asia|australia|northamerica|southamerica|me|africa)-[a-z]+[0-9](-[a-z])?\b`)
	for path, body := range tfFiles(t) {
		src, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		if m := regionRE.Find(src); m != nil {
			t.Errorf("%s: region or zone %q written in", path, m)
		}
		if strings.Contains(string(src), "googleapis.com/compute/v1/projects/") {
			t.Errorf("%s: a literal self link (project) written in", path)
		}
		walkBlocks(body, func(b *hclsyntax.Block) {
			for _, name := range []string{"project", "region", "zone", "network", "subnetwork", "managed_zone"} {
				a, ok := b.Body.Attributes[name]
				if !ok {
					continue
				}
				if refs := a.Expr.Variables(); len(refs) == 0 {
					t.Errorf("%s: %s %v sets %s to a literal; use a variable", path, b.Type, b.Labels, name)
				}
			}
		})
	}
}

// Terraform owns only what GKE does not make: an INTERNAL address in the
// given subnetwork, a DNS record, firewall rules for 9777 and the health
// checks.
func TestTerraformResources(t *testing.T) {
	bodies := tfFiles(t)
	var addr, fw *hclsyntax.Block
	for path, body := range bodies {
		if filepath.Dir(path) != filepath.Clean(tfDir) {
			continue
		}
		for _, b := range body.Blocks {
			if b.Type == "resource" && b.Labels[0] == "google_compute_address" {
				addr = b
			}
			if b.Type == "resource" && b.Labels[0] == "google_compute_firewall" && b.Labels[1] == "agent_from_haproxy" {
				fw = b
			}
		}
	}
	if addr == nil || fw == nil {
		t.Fatal("google_compute_address or the agent firewall rule missing")
	}
	if got := literalString(t, addr.Body.Attributes["address_type"]); got != "INTERNAL" {
		t.Errorf("address_type = %q, want INTERNAL", got)
	}
	if _, ok := addr.Body.Attributes["subnetwork"]; !ok {
		t.Errorf("the address names no subnetwork")
	}
	var ports []string
	for _, b := range fw.Body.Blocks {
		if b.Type == "allow" {
			v, diags := b.Body.Attributes["ports"].Expr.Value(nil)
			if diags.HasErrors() {
				t.Fatal(diags.Error())
			}
			for _, p := range v.AsValueSlice() {
				ports = append(ports, p.AsString())
			}
		}
	}
	if !slices.Equal(ports, []string{"9777"}) {
		t.Errorf("agent firewall allows %v, want only 9777", ports)
	}
}

type rule struct{ kind, name, policy string }

// policyRules evaluates the rules of consul_acl_policy.<name> with
// var.kv_prefix = prefix, as Terraform does: templatefile() renders its
// file with HCL's template engine. It returns the rules and the files
// templatefile() read.
func policyRules(t *testing.T, name, prefix string) (string, []string) {
	t.Helper()
	var used []string
	templatefile := function.New(&function.Spec{
		Params: []function.Parameter{{Name: "path", Type: cty.String}, {Name: "vars", Type: cty.DynamicPseudoType}},
		Type:   function.StaticReturnType(cty.String),
		Impl: func(args []cty.Value, _ cty.Type) (cty.Value, error) {
			path := filepath.Clean(args[0].AsString())
			used = append(used, path)
			src, err := os.ReadFile(path)
			if err != nil {
				return cty.NilVal, err
			}
			expr, diags := hclsyntax.ParseTemplate(src, path, hcl.InitialPos)
			if diags.HasErrors() {
				return cty.NilVal, diags
			}
			v, diags := expr.Value(&hcl.EvalContext{Variables: args[1].AsValueMap()})
			if diags.HasErrors() {
				return cty.NilVal, diags
			}
			return v, nil
		},
	})
	for path, body := range tfFiles(t) {
		for _, b := range body.Blocks {
			if b.Type != "resource" || b.Labels[0] != "consul_acl_policy" || b.Labels[1] != name {
				continue
			}
			ctx := &hcl.EvalContext{
				Variables: map[string]cty.Value{
					"var":  cty.ObjectVal(map[string]cty.Value{"kv_prefix": cty.StringVal(prefix)}),
					"path": cty.ObjectVal(map[string]cty.Value{"module": cty.StringVal(tfDir)}),
				},
				Functions: map[string]function.Function{"templatefile": templatefile},
			}
			v, diags := b.Body.Attributes["rules"].Expr.Value(ctx)
			if diags.HasErrors() {
				t.Fatalf("%s: rules: %s", path, diags.Error())
			}
			return v.AsString(), used
		}
	}
	t.Fatalf("consul_acl_policy %q not found", name)
	return "", nil
}

// consulRules parses the rules of consul_acl_policy.<name> for prefix as
// Consul's HCL rule language.
func consulRules(t *testing.T, name, prefix string) []rule {
	t.Helper()
	src, _ := policyRules(t, name, prefix)
	f, diags := hclsyntax.ParseConfig([]byte(src), "rules.hcl", hcl.InitialPos)
	if diags.HasErrors() {
		t.Fatalf("rules are not HCL: %s\n%s", diags.Error(), src)
	}
	rb := f.Body.(*hclsyntax.Body)
	if len(rb.Attributes) != 0 {
		t.Errorf("rules have top-level attributes (e.g. operator, acl): %v", rb.Attributes)
	}
	var rules []rule
	for _, blk := range rb.Blocks {
		r := rule{kind: blk.Type}
		if len(blk.Labels) == 1 {
			r.name = blk.Labels[0]
		}
		if len(blk.Body.Attributes) != 1 || len(blk.Body.Blocks) != 0 {
			t.Errorf("rule %s %q: want only policy = ...", blk.Type, r.name)
		}
		r.policy = literalString(t, blk.Body.Attributes["policy"])
		rules = append(rules, r)
	}
	return rules
}

func literalString(t *testing.T, a *hclsyntax.Attribute) string {
	t.Helper()
	if a == nil {
		return ""
	}
	v, diags := a.Expr.Value(nil)
	if diags.HasErrors() || v.Type() != cty.String {
		return ""
	}
	return v.AsString()
}

func walkBlocks(body *hclsyntax.Body, f func(*hclsyntax.Block)) {
	for _, b := range body.Blocks {
		f(b)
		walkBlocks(b.Body, f)
	}
}
