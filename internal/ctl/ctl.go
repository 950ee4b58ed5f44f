// Package ctl implements the operator commands: reading what the cluster
// knows from a hastate replica (status, the gates wait and precheck), and
// planning and writing desired state to Consul KV, each command one Consul
// transaction. cmd/hastate parses flags and calls it.
package ctl

import (
	"encoding/json"
	"errors"
	"fmt"
	"path"
	"strconv"
	"strings"
	"time"
	"unicode"

	"github.com/hastate/hastate/api"
	"github.com/hastate/hastate/state"
)

// Errors the commands return; cmd/hastate maps them to exit codes.
var (
	// ErrUsage marks errors in what the operator typed (exit 2).
	ErrUsage = errors.New("usage")
	// ErrNoMatch: a selector matched no server the cluster knows (exit 3).
	ErrNoMatch = errors.New("nothing matched")
	// ErrNotDone: wait ran out of time, or precheck found something
	// unsettled (exit 1).
	ErrNotDone = errors.New("not done")
	// ErrCannotConfirm: a command could not read hastate, Consul or
	// Prometheus well enough to decide (a replica did not answer, Consul
	// is not in sync or down), so it fails closed (exit 4, so that a
	// pipeline tells "blocked on purpose" from "hastate is broken").
	ErrCannotConfirm = errors.New("cannot confirm")
	// ErrWrongReplica: the replica asked reads another KV prefix, or
	// another Consul cluster, than the command: a write there is one
	// nobody serves, so it is refused (exit 1), whatever the flags.
	ErrWrongReplica = errors.New("the replica reads something else")
	// ErrTruncated: a replica cut a list; no command acts on a partial
	// list (exit 4: cannot confirm).
	ErrTruncated = api.ErrTruncated
)

// MaxTxnKeys is the most operations one Consul transaction may carry.
const MaxTxnKeys = 64

// Selector is backend/server, either part with path.Match globs (*, ?,
// [...]). Server "*" alone means the whole backend.
type Selector struct{ Backend, Server string }

func (s Selector) String() string { return s.Backend + "/" + s.Server }

// ParseSelector parses "backend/server"; "backend" alone is "backend/*",
// in every command. Names may hold spaces (a key "state/web/web 3" is
// served); a name with a control character, or more than one '/', can
// never be asked for by HAProxy: the error says how to remove such a key
// with the consul CLI.
func ParseSelector(arg string) (Selector, error) {
	b, s, ok := strings.Cut(arg, "/")
	if !ok && b != "" {
		s = state.Wildcard
	}
	sel := Selector{b, s}
	remove := fmt.Sprintf("if it is a key in KV, no agent request can name it: remove it with `consul kv delete '<kv-prefix>%s%s'`", state.StatePrefix, arg)
	switch {
	case strings.ContainsFunc(arg, unicode.IsControl):
		return sel, fmt.Errorf("%w: %q has a control character; %s", ErrUsage, arg, remove)
	case strings.Contains(s, "/"):
		return sel, fmt.Errorf("%w: %q is not <backend>/<server>: it has more than one '/'; %s", ErrUsage, arg, remove)
	case b == "" || s == "":
		return sel, fmt.Errorf("%w: %q is not <backend>/<server>: write e.g. canary_web/gke-cny-web, canary_web (the whole backend) or 'canary_*/*'", ErrUsage, arg)
	}
	for _, p := range []string{b, s} {
		if _, err := path.Match(p, ""); err != nil {
			return sel, fmt.Errorf("%w: %q: bad glob %q (%v)", ErrUsage, arg, p, err)
		}
	}
	return sel, nil
}

// ParseSelectors parses several arguments, dropping repeats.
func ParseSelectors(args []string) ([]Selector, error) {
	if len(args) == 0 {
		return nil, fmt.Errorf("%w: name at least one <backend>/<server> (or <backend> for the whole backend)", ErrUsage)
	}
	var out []Selector
	for _, a := range args {
		sel, err := ParseSelector(a)
		if err != nil {
			return nil, err
		}
		if !containsSel(out, sel) {
			out = append(out, sel)
		}
	}
	return out, nil
}

func containsSel(sels []Selector, s Selector) bool {
	for _, x := range sels {
		if x == s {
			return true
		}
	}
	return false
}

// Match reports whether backend/server matches the selector.
func (s Selector) Match(backend, server string) bool {
	mb, _ := path.Match(s.Backend, backend)
	ms, _ := path.Match(s.Server, server)
	return mb && ms
}

// globbed reports whether a part has glob characters.
func globbed(part string) bool { return strings.ContainsAny(part, `*?[\`) }

// Key is the KV key of backend/server under prefix.
func Key(prefix, backend, server string) string {
	return prefix + state.StatePrefix + backend + "/" + server
}

// ValueOptions are the audit fields and options of a written value.
type ValueOptions struct {
	Reason, By string
	// Ramp is the undrain ramp duration for these keys ("": the policy's,
	// "0": none).
	Ramp string
	// For makes the state expire that long after Now (0: never).
	For time.Duration
	Now time.Time
}

// Value builds the JSON value written for a state ("ready", "drain",
// "maint" or "N%"), and checks each part in the operator's terms.
func Value(st string, o ValueOptions) (string, error) {
	v := map[string]string{"state": st}
	if _, err := state.ParseValue(st); err != nil {
		return "", fmt.Errorf("%w: state %q: want ready, drain, maint or a weight such as 25%%", ErrUsage, st)
	}
	if o.Reason != "" {
		v["reason"] = o.Reason
	}
	if o.By != "" {
		v["by"] = o.By
	}
	if o.Ramp != "" {
		if _, err := state.ParseRamp(o.Ramp); err != nil {
			return "", fmt.Errorf("%w: --ramp: %v", ErrUsage, err)
		}
		v["ramp"] = o.Ramp
	}
	if o.For < 0 {
		return "", fmt.Errorf("%w: --for %s: want a positive duration such as 2h", ErrUsage, o.For)
	}
	if !o.Now.IsZero() {
		v["at"] = o.Now.UTC().Format(time.RFC3339)
		if o.For > 0 {
			v["until"] = o.Now.Add(o.For).UTC().Format(time.RFC3339)
		}
	}
	b, err := json.Marshal(v)
	if err != nil {
		return "", err
	}
	if _, err := state.ParseValue(string(b)); err != nil {
		return "", fmt.Errorf("%w: %v", ErrUsage, err) // a bug: every part was checked
	}
	return string(b), nil
}

// ParseWeight reads the weight argument of `hastate weight`: a whole
// percentage 0..256, "25%" or "25".
func ParseWeight(arg string) (string, error) {
	if strings.HasPrefix(strings.TrimSpace(arg), "-") {
		return "", fmt.Errorf("%w: weight %s is below 0%%: want 0%% to %d%%", ErrUsage, arg, state.MaxWeight)
	}
	n, err := state.ParsePercent(arg, state.MaxWeight)
	if err != nil {
		return "", fmt.Errorf("%w: weight %v (HAProxy's cap is %d%%)", ErrUsage, err, state.MaxWeight)
	}
	return strconv.Itoa(n) + "%", nil
}
