package kvsync

// Tests against a real Consul with ACLs on and default deny, as production
// runs it, with the policies hastate ships (deploy/terraform/policies).
// Each way Consul hides keys from a token is met here: the listing it
// answers is never applied, Status and the probe name the token.

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/consul/api"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"github.com/hastate/hastate/internal/testenv"
)

// aclFixture is what every case holds in Consul: drained and maint
// servers, their meta keys and the ramp policy.
var aclFixture = map[string]string{
	"hastate/state/web/s1":  "drain",
	"hastate/state/web/s2":  "maint",
	"hastate/state/api/*":   "drain",
	"hastate/meta/web/s1":   `{"state":"drain","reason":"zonal","by":"alice"}`,
	"hastate/config/ramp":   `{"duration":"1m"}`,
	"hastatex/state/web/s1": "ready",
}

func putFixture(t *testing.T, c *testenv.Consul) {
	t.Helper()
	for k, v := range aclFixture {
		c.Put(t, k, v)
	}
}

// tokenClient is the product's client (NewTokenClient) sending secret.
func tokenClient(t *testing.T, c *testenv.Consul, secret string) (*api.Client, *Token) {
	t.Helper()
	t.Setenv(api.HTTPTokenEnvName, "")
	t.Setenv(api.HTTPTokenFileEnvName, "")
	return runToken(t, c, TokenOptions{Secret: secret})
}

// runToken makes the Token of o and its client for c, and runs the Token
// (file re-reads, accessor look-ups) until the test ends.
func runToken(t *testing.T, c *testenv.Consul, o TokenOptions) (*api.Client, *Token) {
	t.Helper()
	tok, err := NewToken(o)
	if err != nil {
		t.Fatal(err)
	}
	cl, err := NewTokenClient("http://"+c.Addr(), tok)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = tok.Run(ctx, cl) }()
	t.Cleanup(func() { cancel(); <-done })
	return cl, tok
}

func TestACLHiddenListingIsNeverApplied(t *testing.T) {
	cases := []struct {
		name    string
		keyList bool // acl.enable_key_list_policy
		// token makes the token (nil: none, Consul's anonymous token).
		token   func(t *testing.T, c *testenv.Consul) testenv.Token
		refused string // what TokenProblem.Refused names
		unknown bool   // Consul does not know the token: no accessor
	}{
		{name: "no token: anonymous lists the prefix as empty", refused: "read hastate/"},
		{name: "a policy on another prefix", refused: "read every key under hastate/", token: func(t *testing.T, c *testenv.Consul) testenv.Token {
			c.CreatePolicy(t, "other", `key_prefix "hastatex/" { policy = "read" }`)
			return c.CreateToken(t, "other prefix", "other")
		}},
		{name: "a policy on state/ only: meta and config hidden", refused: "read every key under hastate/", token: func(t *testing.T, c *testenv.Consul) testenv.Token {
			c.CreatePolicy(t, "state-only", `key_prefix "hastate/state/" { policy = "read" }`)
			return c.CreateToken(t, "state only", "state-only")
		}},
		{name: "a deleted token", refused: "list hastate/", unknown: true, token: func(t *testing.T, c *testenv.Consul) testenv.Token {
			read, _ := c.ShippedTokens(t, "hastate/")
			c.DeleteToken(t, read)
			return read
		}},
		{name: "enable_key_list_policy, no token", keyList: true, refused: "list hastate/"},
		{name: "enable_key_list_policy, read on state/ only", keyList: true, refused: "list hastate/", token: func(t *testing.T, c *testenv.Consul) testenv.Token {
			c.CreatePolicy(t, "state-only", `key_prefix "hastate/state/" { policy = "read" }`)
			return c.CreateToken(t, "state only", "state-only")
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c := testenv.StartConsul(t, testenv.ConsulOptions{ACL: true, KeyListPolicy: tc.keyList})
			putFixture(t, c)
			var tok testenv.Token
			if tc.token != nil {
				tok = tc.token(t, c)
			}
			client, token := tokenClient(t, c, tok.SecretID)
			sink := &recSink{}
			core, logs := observer.New(zapcore.ErrorLevel)
			o := consulOptions(client, "hastate/", sink)
			o.Token, o.Logger, o.BackoffMax = token, zap.New(core), 200*time.Millisecond
			w, err := New(o)
			if err != nil {
				t.Fatal(err)
			}
			runWatcher(t, w)
			testenv.Eventually(t, deliveryTimeout, func() error {
				return testenv.Expect(w.Status().ConsecutiveErrors >= 3, "three failed attempts, got %+v", w.Status())
			})
			if calls := sink.all(); len(calls) != 0 {
				t.Fatalf("the Sink was handed %d reads (first %v): a listing the token cannot vouch for was applied", len(calls), calls[0].kv)
			}
			st := w.Status()
			p := st.TokenProblem
			if p == nil {
				t.Fatalf("status names no token problem: %+v", st)
			}
			wantAcc := tok.AccessorID
			switch {
			case tok.SecretID == "":
				wantAcc = AnonymousAccessor
			case tc.unknown:
				wantAcc = "" // a deleted token has no accessor Consul would name
			}
			if p.Prefix != "hastate/" || p.Refused != tc.refused || p.AccessorID != wantAcc || !strings.Contains(p.Error, "403") && !strings.Contains(p.Error, "Filtered-By-ACLs") {
				t.Errorf("token problem = %+v, want prefix hastate/, refused %q, accessor %q, Consul's 403", p, tc.refused, wantAcc)
			}
			if tok.SecretID != "" && strings.Contains(p.String()+st.LastError, tok.SecretID) {
				t.Errorf("the status names the token's secret: %s / %s", p, st.LastError)
			}
			if !strings.Contains(p.String(), "the Consul token cannot read hastate/") {
				t.Errorf("token problem reads %q", p)
			}
			if logs.FilterMessageSnippet("holds the last state until the token may read the prefix").Len() == 0 {
				t.Errorf("no error line says the state is held for the token: %v", logs.All())
			}

			// The probe of a follower with the same token names it too.
			reg := prometheus.NewRegistry()
			pr, err := NewProbe(ProbeOptions{Client: client, Prefix: "hastate/", Registerer: reg, Token: token})
			if err != nil {
				t.Fatal(err)
			}
			pr.check(context.Background())
			if h := pr.Health(); h.Reachable || h.TokenProblem == nil {
				t.Errorf("probe health = %+v, want unreachable with the token problem", h)
			}
			if v := testutil.ToFloat64(pr.denied); v != 1 {
				t.Errorf("hastate_consul_token_denied = %v, want 1", v)
			}
		})
	}
}

// The shipped read policy reads everything the mirror needs, with and
// without enable_key_list_policy, and a prefix that is truly empty is
// applied as empty once the token has proven it may read it.
func TestACLShippedReadPolicyMirrors(t *testing.T) {
	for _, keyList := range []bool{false, true} {
		c := testenv.StartConsul(t, testenv.ConsulOptions{ACL: true, KeyListPolicy: keyList})
		read, _ := c.ShippedTokens(t, "hastate/")

		// Empty first: the 404 is proven, and applied.
		client, token := tokenClient(t, c, read.SecretID)
		sink := &recSink{}
		o := consulOptions(client, "hastate/", sink)
		o.Token = token
		w, err := New(o)
		if err != nil {
			t.Fatal(err)
		}
		runWatcher(t, w)
		waitFor(t, sink, map[string]string{})

		putFixture(t, c)
		want := map[string]string{}
		for k, v := range aclFixture {
			if rel, ok := strings.CutPrefix(k, "hastate/"); ok {
				want[rel] = v
			}
		}
		waitFor(t, sink, want)
		if st := w.Status(); st.TokenProblem != nil || st.ConsecutiveErrors != 0 {
			t.Errorf("key list policy %t: status = %+v", keyList, st)
		}
		testenv.Eventually(t, 5*time.Second, func() error {
			return testenv.Expect(token.AccessorID() == read.AccessorID, "accessor %q, want %q", token.AccessorID(), read.AccessorID)
		})
		pr, err := NewProbe(ProbeOptions{Client: client, Prefix: "hastate/", Token: token})
		if err != nil {
			t.Fatal(err)
		}
		pr.check(context.Background())
		if h := pr.Health(); !h.Reachable || h.TokenProblem != nil {
			t.Errorf("key list policy %t: probe health = %+v", keyList, h)
		}
	}
}

// A token whose policy changes while the watch runs: the shrunken listing
// is held back until the policy reads the prefix again; the Sink never
// sees a key go.
func TestACLPolicyChangedWhileRunning(t *testing.T) {
	c := testenv.StartConsul(t, testenv.ConsulOptions{ACL: true})
	putFixture(t, c)
	read, _ := c.ShippedTokens(t, "hastate/")
	client, token := tokenClient(t, c, read.SecretID)
	sink := &recSink{}
	o := consulOptions(client, "hastate/", sink)
	o.Token, o.WaitTime, o.BackoffMax = token, time.Second, 300*time.Millisecond
	w, err := New(o)
	if err != nil {
		t.Fatal(err)
	}
	runWatcher(t, w)
	testenv.Eventually(t, deliveryTimeout, func() error {
		return testenv.Expect(len(sink.lastDelivered()) == 5, "the fixture delivered: %v", sink.lastDelivered())
	})
	n := len(sink.all())

	for _, rules := range []string{
		`key_prefix "hastatex/" { policy = "read" }`,      // another prefix
		`key_prefix "hastate/state/" { policy = "read" }`, // state only
	} {
		c.SetPolicyRules(t, "hastate-read", rules)
		testenv.Eventually(t, deliveryTimeout, func() error {
			st := w.Status()
			return testenv.Expect(st.TokenProblem != nil && st.TokenProblem.AccessorID == read.AccessorID,
				"the watch to name the token (policy %s): %+v", rules, st)
		})
		c.Put(t, "hastate/state/web/s3", "drain") // wakes the watch: still not applied
		testenv.Consistently(t, 2*time.Second, func() error {
			return testenv.Expect(len(sink.all()) == n, "no read applied while the policy hides keys, got %v", sink.all()[n:])
		})
		c.Delete(t, "hastate/state/web/s3")
	}
	c.SetPolicyRules(t, "hastate-read", testenv.ShippedPolicy(t, testenv.ReadPolicy, "hastate/"))
	testenv.Eventually(t, deliveryTimeout, func() error {
		st := w.Status()
		return testenv.Expect(st.TokenProblem == nil && st.ConsecutiveErrors == 0, "recovered: %+v", st)
	})
	for _, call := range sink.all() {
		if len(call.kv) != 5 {
			t.Errorf("the Sink was handed %v", call.kv)
		}
	}
}

// The token file is read again when it changes: the client sends the new
// token from then on, the old one can be revoked, and the log and metrics
// name the switch.
func TestTokenFileRotation(t *testing.T) {
	c := testenv.StartConsul(t, testenv.ConsulOptions{ACL: true})
	putFixture(t, c)
	c.CreatePolicy(t, "hastate-read", testenv.ShippedPolicy(t, testenv.ReadPolicy, "hastate/"))
	oldTok := c.CreateToken(t, "old", "hastate-read")
	newTok := c.CreateToken(t, "new", "hastate-read")
	file := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(file, []byte(oldTok.SecretID+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	t.Setenv(api.HTTPTokenEnvName, "")
	t.Setenv(api.HTTPTokenFileEnvName, file) // as Consul's own tools read it
	core, logs := observer.New(zapcore.InfoLevel)
	reg := prometheus.NewRegistry()
	client, token := runToken(t, c, TokenOptions{Interval: 100 * time.Millisecond, Logger: zap.New(core), Registerer: reg})
	testenv.Eventually(t, 5*time.Second, func() error {
		return testenv.Expect(token.AccessorID() == oldTok.AccessorID, "accessor %q", token.AccessorID())
	})
	if st := token.State(); st.Source != TokenFromFile || st.File != file {
		t.Errorf("token state = %+v", st)
	}

	// Empty (a writer caught half-way) and missing: the last token stays.
	for _, step := range []struct {
		write func() error
		seen  string
	}{
		{func() error { return os.WriteFile(file, nil, 0o600) }, "empty"},
		{func() error { return os.Remove(file) }, "no such file"},
	} {
		if err := step.write(); err != nil {
			t.Fatal(err)
		}
		testenv.Eventually(t, 5*time.Second, func() error {
			fe := token.State().FileError
			return testenv.Expect(strings.Contains(fe, step.seen), "the file problem %q noticed, got %q", step.seen, fe)
		})
		if token.Secret() != oldTok.SecretID {
			t.Fatalf("an empty or missing file changed the token")
		}
	}
	if err := os.WriteFile(file, []byte(newTok.SecretID), 0o600); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 5*time.Second, func() error {
		return testenv.Expect(token.AccessorID() == newTok.AccessorID, "accessor %q, want the new %q", token.AccessorID(), newTok.AccessorID)
	})
	c.DeleteToken(t, oldTok)
	if err := CheckRead(context.Background(), client, "hastate/", token.AccessorID()); err != nil {
		t.Fatalf("after the old token was revoked: %v", err)
	}
	var te *TokenError
	if err := CheckRead(context.Background(), client, "hastate/", ""); errors.As(err, &te) || err != nil {
		t.Fatalf("%v", err)
	}
	if n := logs.FilterMessageSnippet("Consul token changed").FilterField(zap.String("old_accessor_id", oldTok.AccessorID)).Len(); n != 1 {
		t.Errorf("%d log lines of the switch from %s, want 1: %v", n, oldTok.AccessorID, logs.All())
	}
	if n := logs.FilterMessageSnippet("Consul token in use").FilterField(zap.String("accessor_id", newTok.AccessorID)).Len(); n != 1 {
		t.Errorf("%d log lines naming the new accessor, want 1", n)
	}
	if v := testutil.ToFloat64(token.changes); v != 1 {
		t.Errorf("hastate_consul_token_changes_total = %v, want 1", v)
	}
	if v := testutil.ToFloat64(token.info.WithLabelValues(newTok.AccessorID, TokenFromFile)); v != 1 {
		t.Errorf("hastate_consul_token_info for the new accessor = %v, want 1", v)
	}
	if n := testutil.CollectAndCount(token.info); n != 1 {
		t.Errorf("hastate_consul_token_info has %d series, want only the token in use", n)
	}
	if v := testutil.ToFloat64(token.fileErrors); v < 2 {
		t.Errorf("hastate_consul_token_file_errors_total = %v, want the empty and the missing file counted", v)
	}
}

// A token file that cannot be read at start is an error naming the file.
func TestTokenFileMissingAtStart(t *testing.T) {
	_, err := NewToken(TokenOptions{File: filepath.Join(t.TempDir(), "absent")})
	if err == nil || !strings.Contains(err.Error(), "--consul-token-file") {
		t.Fatalf("NewToken with a missing file = %v", err)
	}
}
