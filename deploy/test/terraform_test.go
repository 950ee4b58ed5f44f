package deploytest

import (
	"maps"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/hashicorp/hcl/v2"
	"github.com/hashicorp/hcl/v2/ext/tryfunc"
	"github.com/hashicorp/hcl/v2/hclparse"
	"github.com/hashicorp/hcl/v2/hclsyntax"
	"github.com/hastate/hastate/internal/testenv"
	"github.com/zclconf/go-cty/cty"
	"github.com/zclconf/go-cty/cty/convert"
	"github.com/zclconf/go-cty/cty/function"
	"github.com/zclconf/go-cty/cty/function/stdlib"
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
// given subnetwork, protected from destruction (every haproxy.cfg names
// it), a DNS record, and the firewall rules for 9777 (from the HAProxy
// CIDRs only) and for the health checks (one port), in the network's
// project (Shared VPC).
func TestTerraformResources(t *testing.T) {
	res := map[string]*hclsyntax.Block{}
	for path, body := range tfFiles(t) {
		if filepath.Dir(path) != filepath.Clean(tfDir) {
			continue
		}
		for _, b := range body.Blocks {
			if b.Type == "resource" {
				res[b.Labels[0]+"."+b.Labels[1]] = b
			}
		}
	}
	addr, fw, hc := res["google_compute_address.agent"], res["google_compute_firewall.agent_from_haproxy"], res["google_compute_firewall.health_checks"]
	if addr == nil || fw == nil || hc == nil {
		t.Fatalf("address or firewall rules missing: %v", slices.Sorted(maps.Keys(res)))
	}
	if got := literalString(t, addr.Body.Attributes["address_type"]); got != "INTERNAL" {
		t.Errorf("address_type = %q, want INTERNAL", got)
	}
	if refs := traversals(addr.Body.Attributes["subnetwork"]); !slices.Equal(refs, []string{"local.subnetwork"}) {
		t.Errorf("the address's subnetwork is %v, want local.subnetwork (the host project's in a Shared VPC)", refs)
	}
	var protected bool
	for _, b := range addr.Body.Blocks {
		if b.Type == "lifecycle" {
			if v, diags := b.Body.Attributes["prevent_destroy"].Expr.Value(nil); !diags.HasErrors() && v.True() {
				protected = true
			}
		}
	}
	if !protected {
		t.Errorf("google_compute_address.agent lacks lifecycle { prevent_destroy = true }")
	}
	for _, rule := range []*hclsyntax.Block{fw, hc} {
		name := rule.Labels[1]
		if refs := traversals(rule.Body.Attributes["project"]); !slices.Equal(refs, []string{"local.network_project"}) {
			t.Errorf("%s: project %v, want local.network_project", name, refs)
		}
		if refs := traversals(rule.Body.Attributes["network"]); !slices.Equal(refs, []string{"local.network"}) {
			t.Errorf("%s: network %v, want local.network", name, refs)
		}
		if _, ok := rule.Body.Attributes["source_tags"]; ok {
			t.Errorf("%s: source_tags: the sources are CIDRs, the same as the chart's loadBalancerSourceRanges", name)
		}
	}
	if got := allowedPorts(t, fw, nil); !slices.Equal(got, []string{"9777"}) {
		t.Errorf("agent firewall allows %v, want only 9777", got)
	}
	if refs := traversals(fw.Body.Attributes["source_ranges"]); !slices.Equal(refs, []string{"var.haproxy_source_ranges"}) {
		t.Errorf("agent firewall sources %v, want var.haproxy_source_ranges only", refs)
	}
	ctx := &hcl.EvalContext{Functions: tfFunctions(), Variables: map[string]cty.Value{
		"var": cty.ObjectVal(map[string]cty.Value{"health_check_port": cty.NumberIntVal(32123)}),
	}}
	if got := allowedPorts(t, hc, ctx); !slices.Equal(got, []string{"32123"}) {
		t.Errorf("health check firewall allows %v, want the one pinned port 32123", got)
	}
}

// The locals put a Shared VPC's network, subnetwork and rules in the host
// project, and change nothing for a VPC of the project's own.
func TestTerraformSharedVPC(t *testing.T) {
	locals := map[string]hcl.Expression{}
	for path, body := range tfFiles(t) {
		if filepath.Dir(path) != filepath.Clean(tfDir) {
			continue
		}
		for _, b := range body.Blocks {
			if b.Type == "locals" {
				for n, a := range b.Body.Attributes {
					locals[n] = a.Expr
				}
			}
		}
	}
	eval := func(np cty.Value, subnet string) map[string]string {
		vars := cty.ObjectVal(map[string]cty.Value{
			"project": cty.StringVal("svc-project"), "network_project": np, "region": cty.StringVal("r1"),
			"network": cty.StringVal("vpc"), "subnetwork": cty.StringVal(subnet),
		})
		out := map[string]cty.Value{}
		// Locals refer to each other: evaluate until all are known.
		for range 3 {
			ctx := &hcl.EvalContext{Functions: tfFunctions(), Variables: map[string]cty.Value{"var": vars, "local": cty.ObjectVal(out)}}
			for n, e := range locals {
				if v, diags := e.Value(ctx); !diags.HasErrors() {
					out[n] = v
				}
			}
		}
		got := map[string]string{}
		for _, n := range []string{"network_project", "subnetwork", "network"} {
			v, ok := out[n]
			if !ok {
				t.Fatalf("local.%s did not evaluate", n)
			}
			got[n] = v.AsString()
		}
		return got
	}
	own := eval(cty.NullVal(cty.String), "ops")
	if want := map[string]string{"network_project": "svc-project", "subnetwork": "ops", "network": "vpc"}; !maps.Equal(own, want) {
		t.Errorf("own VPC: %v, want %v", own, want)
	}
	shared := eval(cty.StringVal("host-project"), "ops")
	if want := map[string]string{"network_project": "host-project", "subnetwork": "projects/host-project/regions/r1/subnetworks/ops", "network": "projects/host-project/global/networks/vpc"}; !maps.Equal(shared, want) {
		t.Errorf("Shared VPC: %v, want %v", shared, want)
	}
	link := "projects/host-project/regions/r1/subnetworks/other"
	if got := eval(cty.StringVal("host-project"), link)["subnetwork"]; got != link {
		t.Errorf("a subnetwork given as a self link became %q", got)
	}
}

// The variables' validations refuse what would open the firewall wider or
// reserve no usable address: each bad value is refused with its message,
// each good one passes.
func TestTerraformValidations(t *testing.T) {
	list := func(xs ...string) cty.Value {
		if len(xs) == 0 {
			return cty.ListValEmpty(cty.String)
		}
		var vs []cty.Value
		for _, x := range xs {
			vs = append(vs, cty.StringVal(x))
		}
		return cty.ListVal(vs)
	}
	for _, tc := range []struct {
		variable string
		value    cty.Value
		ok       bool
	}{
		{"address", cty.NullVal(cty.String), true},
		{"address", cty.StringVal("10.1.2.3"), true},
		{"address", cty.StringVal("10.1.2"), false},
		{"address", cty.StringVal("10.1.2.3/32"), false},
		{"address", cty.StringVal("10.1.2.300"), false},
		{"address", cty.StringVal("hastate.internal"), false},
		{"haproxy_source_ranges", list("10.20.0.0/16", "10.30.4.0/24"), true},
		{"haproxy_source_ranges", list(), false},
		{"haproxy_source_ranges", list("10.20.0.0"), false},
		{"haproxy_source_ranges", list("10.20.0.0/16", "everyone"), false},
		{"haproxy_source_ranges", list("10.20.0.0/33"), false},
		{"gke_node_tags", list("gke-ops-node"), true},
		{"gke_node_tags", list(), false},
		{"gke_node_tags", list("GKE Ops"), false},
		{"health_check_port", cty.NumberIntVal(32123), true},
		{"health_check_port", cty.NumberIntVal(10256), true},
		{"health_check_port", cty.NumberIntVal(8080), false},
		{"health_check_port", cty.NumberIntVal(32768), false},
		{"network_project", cty.NullVal(cty.String), true},
		{"network_project", cty.StringVal("gitlab-network-host"), true},
		{"network_project", cty.StringVal("Host Project"), false},
		{"health_check_ranges", list("35.191.0.0/16"), true},
		{"health_check_ranges", list("35.191.0.0"), false},
	} {
		ok, msgs := validate(t, tc.variable, tc.value)
		if ok != tc.ok {
			t.Errorf("variable %s = %s: valid %v, want %v (%v)", tc.variable, tc.value.GoString(), ok, tc.ok, msgs)
		}
		if !ok && (len(msgs) == 0 || !strings.Contains(msgs[0], tc.variable)) {
			t.Errorf("variable %s = %s: error messages %q do not name the variable", tc.variable, tc.value.GoString(), msgs)
		}
	}
}

// validate evaluates every validation block of the module's variable name
// with var.name = v, as terraform plan would; it returns whether all hold
// and the error messages of those that do not.
func validate(t *testing.T, name string, v cty.Value) (bool, []string) {
	t.Helper()
	var blk *hclsyntax.Block
	for path, body := range tfFiles(t) {
		if filepath.Dir(path) != filepath.Clean(tfDir) {
			continue
		}
		for _, b := range body.Blocks {
			if b.Type == "variable" && b.Labels[0] == name {
				blk = b
			}
		}
	}
	if blk == nil {
		t.Fatalf("variable %q not found in the module", name)
	}
	ctx := &hcl.EvalContext{Functions: tfFunctions(), Variables: map[string]cty.Value{"var": cty.ObjectVal(map[string]cty.Value{name: v})}}
	ok, n := true, 0
	var msgs []string
	for _, b := range blk.Body.Blocks {
		if b.Type != "validation" {
			continue
		}
		n++
		res, diags := b.Body.Attributes["condition"].Expr.Value(ctx)
		if diags.HasErrors() {
			// Terraform reports a condition that fails to evaluate as an
			// error too; here it means the test lacks a function.
			t.Fatalf("variable %s: condition: %s", name, diags.Error())
		}
		if !res.True() {
			ok = false
			msgs = append(msgs, literalString(t, b.Body.Attributes["error_message"]))
		}
	}
	if n == 0 {
		t.Fatalf("variable %s has no validation", name)
	}
	return ok, msgs
}

// tfFunctions are the Terraform functions the module's expressions use,
// from go-cty's standard library and hcl's tryfunc, and, for the few that
// are Terraform's own, written here to Terraform's documented behaviour.
func tfFunctions() map[string]function.Function {
	str2 := func(f func(a, b string) bool) function.Function {
		return function.New(&function.Spec{
			Params: []function.Parameter{{Name: "a", Type: cty.String}, {Name: "b", Type: cty.String}},
			Type:   function.StaticReturnType(cty.Bool),
			Impl: func(args []cty.Value, _ cty.Type) (cty.Value, error) {
				return cty.BoolVal(f(args[0].AsString(), args[1].AsString())), nil
			},
		})
	}
	return map[string]function.Function{
		"can":         tryfunc.CanFunc,
		"regex":       stdlib.RegexFunc,
		"length":      stdlib.LengthFunc,
		"coalesce":    stdlib.CoalesceFunc,
		"strcontains": str2(strings.Contains),
		"endswith":    str2(strings.HasSuffix),
		"tostring": function.New(&function.Spec{
			Params: []function.Parameter{{Name: "v", Type: cty.DynamicPseudoType}},
			Type:   function.StaticReturnType(cty.String),
			Impl: func(args []cty.Value, _ cty.Type) (cty.Value, error) {
				return convert.Convert(args[0], cty.String)
			},
		}),
		"alltrue": function.New(&function.Spec{
			Params: []function.Parameter{{Name: "list", Type: cty.List(cty.Bool)}},
			Type:   function.StaticReturnType(cty.Bool),
			Impl: func(args []cty.Value, _ cty.Type) (cty.Value, error) {
				for _, v := range args[0].AsValueSlice() {
					if !v.True() {
						return cty.False, nil
					}
				}
				return cty.True, nil
			},
		}),
		// cidrhost(prefix, hostnum): an error for anything but an IPv4 or
		// IPv6 prefix in CIDR notation, as Terraform's.
		"cidrhost": function.New(&function.Spec{
			Params: []function.Parameter{{Name: "prefix", Type: cty.String}, {Name: "hostnum", Type: cty.Number}},
			Type:   function.StaticReturnType(cty.String),
			Impl: func(args []cty.Value, _ cty.Type) (cty.Value, error) {
				_, n, err := net.ParseCIDR(args[0].AsString())
				if err != nil {
					return cty.UnknownVal(cty.String), err
				}
				return cty.StringVal(n.IP.String()), nil
			},
		}),
	}
}

// allowedPorts evaluates the ports of a firewall rule's allow blocks.
func allowedPorts(t *testing.T, rule *hclsyntax.Block, ctx *hcl.EvalContext) []string {
	t.Helper()
	var ports []string
	for _, b := range rule.Body.Blocks {
		if b.Type == "allow" {
			v, diags := b.Body.Attributes["ports"].Expr.Value(ctx)
			if diags.HasErrors() {
				t.Fatalf("%s ports: %s", rule.Labels[1], diags.Error())
			}
			for _, p := range v.AsValueSlice() {
				ports = append(ports, p.AsString())
			}
		}
	}
	return ports
}

// traversals names the variables and locals an attribute refers to.
func traversals(a *hclsyntax.Attribute) []string {
	if a == nil {
		return nil
	}
	var out []string
	for _, tr := range a.Expr.Variables() {
		name := tr.RootName()
		if len(tr) > 1 {
			if at, ok := tr[1].(hcl.TraverseAttr); ok {
				name += "." + at.Name
			}
		}
		out = append(out, name)
	}
	return out
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

// What a reviewer asks of the module beyond the resources: each provider
// held to one major version (root and example), the replicas' read token
// local to its datacenter, both firewall rules with destinations (the
// address and the node ranges) and logging, and the example passing every
// variable it declares the module needs, dns_project included.
func TestTerraformReview(t *testing.T) {
	files := tfFiles(t)
	majorRE := regexp.MustCompile(`^>= ([0-9]+)\.[0-9]+, < ([0-9]+)\.0$`)
	for path, body := range files {
		walkBlocks(body, func(b *hclsyntax.Block) {
			if b.Type != "required_providers" {
				return
			}
			for name, a := range b.Body.Attributes {
				v, diags := a.Expr.Value(nil)
				if diags.HasErrors() {
					t.Fatalf("%s: %s: %s", path, name, diags.Error())
				}
				c := v.GetAttr("version").AsString()
				m := majorRE.FindStringSubmatch(c)
				if m == nil {
					t.Errorf("%s: provider %s version %q: want \">= X.Y, < X+1.0\" (one major version)", path, name, c)
					continue
				}
				lo, _ := strconv.Atoi(m[1])
				hi, _ := strconv.Atoi(m[2])
				if hi != lo+1 {
					t.Errorf("%s: provider %s version %q spans %d major versions, want one", path, name, c, hi-lo)
				}
			}
		})
	}

	res := map[string]*hclsyntax.Block{}
	for path, body := range files {
		if filepath.Dir(path) != filepath.Clean(tfDir) {
			continue
		}
		for _, b := range body.Blocks {
			if b.Type == "resource" {
				res[b.Labels[0]+"."+b.Labels[1]] = b
			}
		}
	}
	tok := res["consul_acl_token.hastate"]
	if tok == nil {
		t.Fatal("no consul_acl_token.hastate")
	}
	if v, diags := tok.Body.Attributes["local"].Expr.Value(nil); diags.HasErrors() || !v.True() {
		t.Errorf("consul_acl_token.hastate: local is not true: the replicas' read token would be replicated to every datacenter")
	}
	for _, name := range []string{"agent_from_haproxy", "health_checks"} {
		rule := res["google_compute_firewall."+name]
		if refs := traversals(rule.Body.Attributes["destination_ranges"]); !slices.Equal(refs, []string{"local.agent_destinations"}) {
			t.Errorf("%s: destination_ranges %v, want local.agent_destinations", name, refs)
		}
		var logged bool
		for _, b := range rule.Body.Blocks {
			if b.Type == "dynamic" && b.Labels[0] == "log_config" {
				logged = slices.Equal(traversals(b.Body.Attributes["for_each"]), []string{"var.firewall_logging"})
			}
		}
		if !logged {
			t.Errorf("%s: no log_config following var.firewall_logging", name)
		}
	}

	// The example passes every variable of the module it declares too.
	example := files[filepath.Join(tfDir, "examples", "gstg", "main.tf")]
	declared := map[string]bool{}
	for _, b := range files[filepath.Join(tfDir, "examples", "gstg", "variables.tf")].Blocks {
		if b.Type == "variable" {
			declared[b.Labels[0]] = true
		}
	}
	for _, b := range example.Blocks {
		if b.Type != "module" {
			continue
		}
		for _, v := range []string{"dns_project", "gke_node_ranges", "network_project", "health_check_port"} {
			a, ok := b.Body.Attributes[v]
			if !ok || !declared[v] || !slices.Equal(traversals(a), []string{"var." + v}) {
				t.Errorf("examples/gstg: module argument %s not passed from var.%s", v, v)
			}
		}
	}
}
