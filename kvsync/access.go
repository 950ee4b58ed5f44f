package kvsync

// This file is the proof that the token may read the prefix. Consul hides
// what a token may not read: a listing leaves out every key the token may
// not read, and for the anonymous token (no token set) it lists the prefix
// as empty with a 404 and no "filtered by ACLs" header; Consul sets
// X-Consul-Results-Filtered-By-ACLs only for a non-anonymous token. An
// empty or shrunken listing is therefore a guess until proven. A direct
// read of one key is not filtered: Consul answers 403 when the token may
// not read that key and 404 when it may and the key is absent. With
// acl.enable_key_list_policy, a listing the token may not make is a 403
// too.

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/hashicorp/consul/api"
	hapi "github.com/hastate/hastate/api"
)

// TokenError is a Consul token refused something the mirror needs.
type TokenError struct {
	Prefix     string
	AccessorID string // never the secret; "" when not known
	Refused    string // "read hastate/meta/", "list hastate/"
	Err        error  // Consul's answer (a 403)
}

func (e *TokenError) Error() string { return e.Problem(time.Time{}).String() }
func (e *TokenError) Unwrap() error { return e.Err }

// Problem is the error as status reports it, with since as its start.
func (e *TokenError) Problem(since time.Time) *hapi.TokenProblem {
	msg := e.Err.Error()
	var se api.StatusError
	switch {
	case errors.As(e.Err, &se):
		msg = fmt.Sprintf("%d %s", se.Code, se.Body)
	case errors.Is(e.Err, errFilteredByACLs):
		msg = errFilteredByACLs.Error()
	}
	return &hapi.TokenProblem{Prefix: e.Prefix, AccessorID: e.AccessorID, Refused: e.Refused, Error: msg, Since: since}
}

// refused reports whether err is Consul refusing the token: 403, for a
// rule that does not allow it ("Permission denied") and for a token
// Consul does not know ("ACL not found": deleted, or from another
// cluster).
func refused(err error) bool {
	var se api.StatusError
	return errors.As(err, &se) && (se.Code == http.StatusForbidden || se.Code == http.StatusUnauthorized)
}

// tokenError is the TokenError of err, Consul's refusal to do what.
// Consul's filtering of a listing is refused "read every key under".
func tokenError(prefix, accessor, what string, err error) *TokenError {
	if errors.Is(err, errFilteredByACLs) {
		what = "read every key under " + prefix
	}
	return &TokenError{Prefix: prefix, AccessorID: accessor, Refused: what, Err: err}
}

// ProbePaths are the keys CheckRead reads directly: the prefix itself and
// the three trees the mirror reads (desired state, its meta keys, the
// config keys). A key the token may not read answers 403; an absent one
// the token may read answers 404.
func ProbePaths(prefix string) []string {
	return []string{prefix, prefix + "state/", prefix + "meta/", prefix + "config/"}
}

// CheckRead proves that c's token may read prefix: one level of its
// listing (which Consul refuses only with acl.enable_key_list_policy, and
// answers with X-Consul-Results-Filtered-By-ACLs for a non-anonymous token
// that may not read a key), and a direct read of each of ProbePaths. It returns a *TokenError when Consul
// refuses the token, another error when Consul could not be asked (no
// proof either way), and nil when the token may read. accessor names the
// token in the error.
func CheckRead(ctx context.Context, c *api.Client, prefix, accessor string) error {
	// Consistent: the Consul leader answers, and resolves the token, so a
	// token just deleted or a policy just changed is what it answers.
	// Checked (withCheck): a 404 proves something only when Consul says
	// it, not a proxy or another service at the address.
	// One secret: every read of the proof is the same token's (and,
	// inside a Watcher's attempt, the listing's).
	q := (&api.QueryOptions{RequireConsistent: true}).WithContext(withCheck(withOneSecret(ctx)))
	kv := c.KV()
	_, _, err := kv.Keys(prefix, "/", q)
	switch {
	case refused(err), errors.Is(err, errFilteredByACLs):
		return tokenError(prefix, accessor, "list "+prefix, err)
	case err != nil:
		return fmt.Errorf("consul: list the keys of %q to check the token: %w", prefix, err)
	}
	for _, p := range ProbePaths(prefix) {
		_, _, err := kv.Get(p, q)
		switch {
		case refused(err):
			return &TokenError{Prefix: prefix, AccessorID: accessor, Refused: "read " + p, Err: err}
		case err != nil:
			return fmt.Errorf("consul: read %q to check the token: %w", p, err)
		}
	}
	return nil
}
