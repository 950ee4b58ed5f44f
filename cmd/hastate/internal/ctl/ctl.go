// Package ctl is the base of the operator library: the words every
// operator command shares. It owns selectors (parsing, matching, the
// exit-3 "did you mean" of one that matches nothing), the error kinds that
// cmd/hastate maps to exit codes, the explanation of a failed call (who did
// not answer, what to check), timeouts, plurals and ages.
//
// The concerns sit in packages below it, each importing only downwards
// (enforced by internal/layers):
//
//   - fleet: the replicas' client and the gates (precheck, wait);
//   - haproxy: what HAProxy reports through Prometheus (verify, wait --idle);
//   - write: the write planner, its guards, the Consul transaction, the run
//     loop, maint --drain-first;
//   - migration: the per-node agent migration marker, compare, migrate-kv;
//   - status: hastate status, which composes the views.
//
// ctl itself imports none of them; cmd/hastate parses flags and calls them.
package ctl

import (
	"cmp"
	"errors"
	"fmt"
	"path"
	"strings"
	"unicode"

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
)

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
	switch {
	case strings.ContainsFunc(arg, unicode.IsControl):
		return sel, &UnnamableError{Arg: arg, Why: "has a control character"}
	case strings.Contains(s, "/"):
		return sel, &UnnamableError{Arg: arg, Why: "is not <backend>/<server>: it has more than one '/'"}
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

// UnnamableError is a selector no agent request can name (a control
// character, more than one '/'): a usage error whose hint is the consul
// CLI's delete of such a key, with the KV prefix when it is known.
type UnnamableError struct {
	Arg, Why string
	Prefix   string // "": the hint says <kv-prefix>
}

func (e *UnnamableError) Error() string {
	return fmt.Sprintf("%v: %q %s; if it is a key in KV, no agent request can name it: remove it with `consul kv delete '%s'`",
		ErrUsage, e.Arg, e.Why, KVDeleteKey(e.Prefix, state.StatePrefix+e.Arg))
}

func (e *UnnamableError) Unwrap() error { return ErrUsage }

// KVDeleteKey is key (relative to the prefix) as `consul kv delete` takes
// it: with the prefix, or <kv-prefix> when it is not known.
func KVDeleteKey(prefix, key string) string { return cmp.Or(prefix, "<kv-prefix>") + key }

// ParseSelectorsIn is ParseSelectors for a command that knows the KV
// prefix: a hint to delete a key names it whole.
func ParseSelectorsIn(prefix string, args []string) ([]Selector, error) {
	sels, err := ParseSelectors(args)
	var ue *UnnamableError
	if errors.As(err, &ue) {
		ue.Prefix = prefix
	}
	return sels, err
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

// Globbed reports whether a part has glob characters.
func Globbed(part string) bool { return strings.ContainsAny(part, `*?[\`) }

// Key is the KV key of backend/server under prefix.
func Key(prefix, backend, server string) string {
	return prefix + state.StatePrefix + backend + "/" + server
}
