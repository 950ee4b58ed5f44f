package testenv

// This file is Consul's ACL system for tests: tokens and policies made with
// the management token of an agent started with ConsulOptions.ACL, and the
// policies hastate ships (deploy/terraform/policies), rendered for a prefix
// exactly as Terraform's templatefile() renders them, so that what the
// tests grant is what an installation grants.

import (
	"crypto/rand"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/hashicorp/consul/api"
)

// Token is a Consul ACL token: the accessor ID names it (logs, metrics,
// `consul acl token read`), the secret ID is what a client sends.
type Token struct {
	AccessorID string
	SecretID   string
}

// The shipped policies: the files under deploy/terraform/policies that
// consul.tf renders with templatefile(path, { kv_prefix = var.kv_prefix }).
const (
	// ReadPolicy is the replicas' policy (consul_acl_policy.hastate).
	ReadPolicy = "read.hcl.tftpl"
	// WriterPolicy is the operators' and pipelines' policy
	// (consul_acl_policy.writer).
	WriterPolicy = "writer.hcl.tftpl"
)

// NewUUID returns a random UUID (Consul's form for token secrets and
// accessors).
func NewUUID(t testing.TB) string {
	t.Helper()
	var b [16]byte
	if _, err := rand.Read(b[:]); err != nil {
		t.Fatalf("testenv: random UUID: %v", err)
	}
	b[6] = b[6]&0x0f | 0x40
	b[8] = b[8]&0x3f | 0x80
	return fmt.Sprintf("%x-%x-%x-%x-%x", b[0:4], b[4:6], b[6:8], b[8:10], b[10:16])
}

// ManagementToken is the agent's management token ("" without ACL).
func (c *Consul) ManagementToken() string { return c.mgmt }

// CreatePolicy makes a policy named name with rules (Consul's rule
// language) and returns its ID.
func (c *Consul) CreatePolicy(t testing.TB, name, rules string) string {
	t.Helper()
	c.needACL(t)
	p, _, err := c.Client(t).ACL().PolicyCreate(&api.ACLPolicy{Name: name, Rules: rules}, nil)
	if err != nil {
		t.Fatalf("testenv: consul acl policy create %s: %v\nrules:\n%s", name, err, rules)
	}
	return p.ID
}

// SetPolicyRules replaces the rules of the policy named name: tokens that
// carry it change at once, as an operator's `consul acl policy update`.
func (c *Consul) SetPolicyRules(t testing.TB, name, rules string) {
	t.Helper()
	c.needACL(t)
	acl := c.Client(t).ACL()
	p, _, err := acl.PolicyReadByName(name, nil)
	if err != nil || p == nil {
		t.Fatalf("testenv: consul acl policy read %s: %v (found: %t)", name, err, p != nil)
	}
	p.Rules = rules
	if _, _, err := acl.PolicyUpdate(p, nil); err != nil {
		t.Fatalf("testenv: consul acl policy update %s: %v", name, err)
	}
}

// CreateToken makes a token carrying the named policies.
func (c *Consul) CreateToken(t testing.TB, description string, policies ...string) Token {
	t.Helper()
	return c.createToken(t, &api.ACLToken{Description: description}, policies)
}

// RecreateToken creates tok again, with its accessor and secret, carrying
// the named policies: a deleted token restored (`consul acl token create
// -accessor <id> -secret <secret>`), so that a client still holding the
// secret is let in again without being told a new one.
func (c *Consul) RecreateToken(t testing.TB, tok Token, description string, policies ...string) {
	t.Helper()
	c.createToken(t, &api.ACLToken{AccessorID: tok.AccessorID, SecretID: tok.SecretID, Description: description}, policies)
}

func (c *Consul) createToken(t testing.TB, tok *api.ACLToken, policies []string) Token {
	t.Helper()
	c.needACL(t)
	for _, p := range policies {
		tok.Policies = append(tok.Policies, &api.ACLTokenPolicyLink{Name: p})
	}
	got, _, err := c.Client(t).ACL().TokenCreate(tok, nil)
	if err != nil {
		t.Fatalf("testenv: consul acl token create %q (accessor %q, policies %v): %v", tok.Description, tok.AccessorID, policies, err)
	}
	return Token{AccessorID: got.AccessorID, SecretID: got.SecretID}
}

// DeleteToken deletes tok: Consul refuses its secret from then on.
func (c *Consul) DeleteToken(t testing.TB, tok Token) {
	t.Helper()
	c.needACL(t)
	if _, err := c.Client(t).ACL().TokenDelete(tok.AccessorID, nil); err != nil {
		t.Fatalf("testenv: consul acl token delete %s: %v", tok.AccessorID, err)
	}
}

// ShippedTokens creates the shipped read and writer policies for prefix
// (named as consul.tf names them for var.name "hastate") and one token
// for each.
func (c *Consul) ShippedTokens(t testing.TB, prefix string) (read, writer Token) {
	t.Helper()
	c.CreatePolicy(t, "hastate-read", ShippedPolicy(t, ReadPolicy, prefix))
	c.CreatePolicy(t, "hastate-write", ShippedPolicy(t, WriterPolicy, prefix))
	return c.CreateToken(t, "hastate replicas", "hastate-read"), c.CreateToken(t, "hastate writer", "hastate-write")
}

func (c *Consul) needACL(t testing.TB) {
	t.Helper()
	if c.mgmt == "" {
		t.Fatalf("testenv: this Consul runs without ACLs; start it with ConsulOptions{ACL: true}")
	}
}

// ShippedPolicy returns the rules of the shipped policy file (ReadPolicy,
// WriterPolicy) rendered for prefix.
func ShippedPolicy(t testing.TB, file, prefix string) string {
	t.Helper()
	path := filepath.Join(RepoRoot(t), "deploy", "terraform", "policies", file)
	src, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("testenv: shipped policy: %v", err)
	}
	rules, err := RenderPolicy(string(src), prefix)
	if err != nil {
		t.Fatalf("testenv: shipped policy %s: %v", path, err)
	}
	return rules
}

// RenderPolicy renders a policy template as Terraform's templatefile()
// does with the one variable kv_prefix. The templates use nothing else: a
// template with another interpolation or a directive (${...}, %{...}) is
// refused rather than rendered differently from Terraform (deploy/test
// checks the rendering against HCL's own template engine).
func RenderPolicy(src, prefix string) (string, error) {
	out := strings.ReplaceAll(src, "${kv_prefix}", prefix)
	rest := strings.ReplaceAll(src, "${kv_prefix}", "")
	for _, seq := range []string{"${", "%{"} {
		if i := strings.Index(rest, seq); i >= 0 {
			end := min(len(rest), i+40)
			return "", fmt.Errorf("template uses %q other than ${kv_prefix} (at %q): render it with templatefile() or keep to ${kv_prefix}", seq, rest[i:end])
		}
	}
	return out, nil
}

// RepoRoot is the repository's root: the nearest directory above the
// test's working directory that holds deploy/terraform/consul.tf (tests
// of the main module and of deploy/test both find it).
func RepoRoot(t testing.TB) string {
	t.Helper()
	dir, err := os.Getwd()
	if err != nil {
		t.Fatalf("testenv: working directory: %v", err)
	}
	for d := dir; ; d = filepath.Dir(d) {
		if _, err := os.Stat(filepath.Join(d, "deploy", "terraform", "consul.tf")); err == nil {
			return d
		}
		if filepath.Dir(d) == d {
			t.Fatalf("testenv: no deploy/terraform/consul.tf above %s", dir)
		}
	}
}
