package test

import (
	"fmt"
	"os"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/hastate/hastate/internal/testenv"
)

// exitRow is one row of the README's exit-code table.
type exitRow struct {
	code             int
	meaning, example string
}

// readmeExitCodes reads the README's table of exit codes: | exit |
// meaning | for example |.
func readmeExitCodes(t *testing.T) []exitRow {
	t.Helper()
	b, err := os.ReadFile("../README.md")
	if err != nil {
		t.Fatal(err)
	}
	_, table, ok := strings.Cut(string(b), "| exit | meaning | for example |\n|---|---|---|\n")
	if !ok {
		t.Fatal("README.md has no table | exit | meaning | for example |")
	}
	row := regexp.MustCompile(`^\| (\d) \| (.+) \| (.+) \|$`)
	var rows []exitRow
	for _, l := range strings.Split(table, "\n") {
		m := row.FindStringSubmatch(l)
		if m == nil {
			break
		}
		code, _ := strconv.Atoi(m[1])
		rows = append(rows, exitRow{code, m[2], m[3]})
	}
	for i, r := range rows {
		if r.code != i {
			t.Fatalf("README's exit codes: row %d is code %d, want 0..5 in order: %v", i, r.code, rows)
		}
	}
	if len(rows) != 6 {
		t.Fatalf("README's exit codes: %d rows, want 0..5: %v", len(rows), rows)
	}
	return rows
}

// TestE2EExitCodes runs, for each code of the README's exit-code table,
// the command the table gives as its example, against a real replica with
// a real HAProxy polling canary_web/web-1 and web-2 (web-2 drained): each
// exits with its code. An example that says "while no replica answers"
// runs with the replica stopped. No other document says otherwise
// (issue 35: "exits 1 with cannot confirm").
func TestE2EExitCodes(t *testing.T) {
	rows := readmeExitCodes(t)
	docs := map[string]string{}
	for _, f := range []string{"../README.md", "../docs/runbook.md", "../docs/deploy.md", "../docs/migration.md"} {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		docs[f] = string(b)
	}
	// What cannot be confirmed is 4, everywhere.
	contradiction := regexp.MustCompile(`(?i)exits? ([0-35-9])\W{0,3}(with\s+|\(|:\s+)?"?cannot\s+confirm|\d failure \(including\s+"?cannot\s+confirm`)
	for f, s := range docs {
		for _, m := range contradiction.FindAllString(s, -1) {
			t.Errorf("%s says %q: cannot confirm is exit 4 (README's table)", f, m)
		}
	}

	// `hastate --help` lists the same codes in the same words, and no
	// command's --help gives cannot confirm another code.
	op := Operator{Addr: "127.0.0.1:1"} // --help asks no replica
	// Issue 45: every "exit N" the documents and every --help claim is
	// said in the words of code N, never only in another code's.
	for f, s := range docs {
		for _, bad := range exitClaimsAgainstTable(s) {
			t.Errorf("%s: %s", f, bad)
		}
	}
	for _, c := range []string{"", "drain", "maint", "ready", "weight", "clear", "status", "wait", "precheck", "verify", "probe", "compare", "migration", "migrate-kv", "adopt-consul"} {
		for _, bad := range exitClaimsAgainstTable(op.Run(t, strings.Fields(c+" --help")...)) {
			t.Errorf("hastate %s --help: %s", c, bad)
		}
	}
	help := strings.Join(strings.Fields(op.Run(t, "--help")), " ")
	for _, r := range rows {
		if want := strings.Join(strings.Fields(fmt.Sprintf("%d %s", r.code, r.meaning)), " "); !strings.Contains(help, want) {
			t.Errorf("hastate --help does not say %q:\n%s", want, help)
		}
	}
	for _, c := range []string{"drain", "maint", "ready", "weight", "clear", "status", "wait", "precheck", "verify", "probe", "compare", "migration", "migrate-kv"} {
		out := op.Run(t, c, "--help")
		for _, m := range contradiction.FindAllString(out, -1) {
			t.Errorf("hastate %s --help says %q: cannot confirm is exit 4", c, m)
		}
	}

	consul := testenv.StartConsul(t, testenv.ConsulOptions{})
	hs := StartCluster(t, 1, HastateOptions{ConsulAddr: consul.Addr()})
	StartHAProxyLB(t, hs, Backend{Name: "canary_web", Servers: []string{"web-1", "web-2"}})
	op = hs[0].Operator()
	// HAProxy asks after each server's first health check.
	testenv.Eventually(t, 20*time.Second, func() error {
		var v stateView
		hs[0].GetJSON(t, "/v1/state", &v)
		n := 0
		for _, r := range v.Servers {
			if r.Backend == "canary_web" && r.Polled > 0 {
				n++
			}
		}
		return testenv.Expect(n == 2, "HAProxy polled %d of canary_web's 2 servers", n)
	})
	op.Run(t, "drain", "canary_web/web-2", "--reason", "exit codes")
	op.Run(t, "wait", "canary_web/web-2")

	example := regexp.MustCompile("^`hastate ([^`]+)`(.*)$")
	for _, r := range rows {
		m := example.FindStringSubmatch(r.example)
		if m == nil {
			t.Fatalf("exit %d: the example %q is not a `hastate ...` command", r.code, r.example)
		}
		args, when := strings.Fields(m[1]), strings.TrimSpace(m[2])
		run := op
		switch {
		case when == "while no replica answers":
			hs[0].Kill()
		case when == "with the replicas' read token (ACLs on)":
			// A Consul with ACLs on and default deny, the shipped
			// policies, a replica that reads with the read token, and the
			// command run with that token too.
			acl, read, _ := aclConsul(t)
			h := StartHastate(t, HastateOptions{ConsulAddr: acl.Addr(), Args: []string{"--consul-token-file", tokenFile(t, read.SecretID)}})
			run = h.Operator()
			run.Env = append(run.Env, "CONSUL_HTTP_TOKEN="+read.SecretID)
		case when != "" && !strings.HasPrefix(when, "("):
			t.Fatalf("exit %d: the test does not know how to make %q", r.code, when)
		}
		out, code := run.RunCode(t, args...)
		if code != r.code {
			t.Errorf("README: exit %d (%s) for `hastate %s` %s; it exits %d:\n%s", r.code, r.meaning, m[1], when, code, out)
			continue
		}
		t.Logf("exit %d: hastate %s %s: %s", code, m[1], when, lastLine(out))
	}
}

// codeWords are, per exit code, words only its meaning in the README's
// table uses.
var codeWords = map[int]*regexp.Regexp{
	1: regexp.MustCompile(`(?i)\bblock(s|ed)?\b|timed out|disagree`),
	2: regexp.MustCompile(`(?i)\busage error`),
	3: regexp.MustCompile(`(?i)match(es|ed)? nothing|\btypo\b`),
	4: regexp.MustCompile(`(?i)cannot confirm|no replica is ready|no raft leader`),
	5: regexp.MustCompile(`(?i)permission|\bACL\b|token Consul refuses`),
}

// exitClaim is one "exit N" or "exits N" (not a list such as "exits 0, 1
// or 4", which names several).
var (
	exitClaim = regexp.MustCompile(`(?i)\bexits? (\d)\b`)
	codeList  = regexp.MustCompile(`^,? (or )?\d\b`)
)

// exitClaimsAgainstTable returns each claim "exit N" of text whose
// clause (between ". ", ";", "|" or a blank line) says what another code
// means and nothing of what N means: e.g. "exits 1 with cannot confirm".
func exitClaimsAgainstTable(text string) []string {
	s := strings.Join(strings.Fields(text), " ")
	var bad []string
	for _, m := range exitClaim.FindAllStringSubmatchIndex(s, -1) {
		n := int(s[m[2]] - '0')
		if codeList.MatchString(s[m[1]:]) {
			continue
		}
		start, end := 0, len(s)
		for _, sep := range []string{". ", ";", "|"} {
			if i := strings.LastIndex(s[:m[0]], sep); i+len(sep) > start && i >= 0 {
				start = i + len(sep)
			}
			if i := strings.Index(s[m[1]:], sep); i >= 0 && m[1]+i < end {
				end = m[1] + i
			}
		}
		clause := s[start:end]
		if own := codeWords[n]; own != nil && own.MatchString(clause) {
			continue
		}
		for code, w := range codeWords {
			if code != n && w.MatchString(clause) {
				bad = append(bad, fmt.Sprintf("claims exit %d where it says what exit %d means: %q", n, code, clause))
				break
			}
		}
	}
	return bad
}

// The claim check catches what issue 35 and issue 45 found, and passes
// what is right.
func TestExitClaimsAgainstTable(t *testing.T) {
	for text, want := range map[string]bool{
		`precheck exits 1 with "cannot confirm" when a replica is down.`:                                               true,
		`kill -9 hastate-0; hastate precheck canary_api/api-2 # exit 4: cannot confirm, replica hastate-0 unreachable`: false,
		`a selector that matches nothing exits 1.`:                                                                     true,
		`blocks (exit 1) while anything selected is drained, and exits 4 when it cannot confirm.`:                      false,
		`then exits 0, 1 for a real disagreement, or 4 if it still cannot tell.`:                                       false,
		`a token Consul refuses exits 5, naming the rule.`:                                                             false,
	} {
		if got := len(exitClaimsAgainstTable(text)) > 0; got != want {
			t.Errorf("%q: flagged %v, want %v (%q)", text, got, want, exitClaimsAgainstTable(text))
		}
	}
}
