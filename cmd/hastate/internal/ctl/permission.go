package ctl

// This file is the one error every Consul permission problem of a command
// becomes (exit 5, ErrPermission): a token that may not read the prefix
// (none set, deleted, a policy on another prefix) or may not write a key
// the command writes (the read token). It names the rule of the shipped
// writer policy (deploy/terraform/policies/writer.hcl.tftpl) that would
// allow it; a write refused so wrote nothing, its meta keys included
// (the state key and its meta key are one transaction).

import (
	"errors"
	"fmt"
	"net/http"
	"strings"

	consul "github.com/hashicorp/consul/api"
)

// PermissionError is Consul refusing the command's token: what it refused,
// and the rule that would allow it.
type PermissionError struct {
	Refused string // "read hastate/", "write hastate/meta/web/s1"
	Rule    string // `key_prefix "hastate/meta/" { policy = "write" }`
	Consul  string // Consul's own words
	Note    string // e.g. "nothing was written"
}

func (e *PermissionError) Error() string {
	s := fmt.Sprintf("permission denied: the Consul token (CONSUL_HTTP_TOKEN / CONSUL_HTTP_TOKEN_FILE) may not %s (%s); it needs %s, as the writer policy grants (deploy/terraform/policies/writer.hcl.tftpl, docs/deploy.md)",
		e.Refused, e.Consul, e.Rule)
	if e.Note != "" {
		s += "; " + e.Note
	}
	return s
}

func (e *PermissionError) Is(target error) bool { return target == ErrPermission }

// ReadRule is the rule that lets a token read prefix as a command does
// (recursively: list, which is read plus the recursive read).
func ReadRule(prefix string) string {
	return fmt.Sprintf("key_prefix %q { policy = \"list\" }", prefix)
}

// WriteRule is the rule of the writer policy that lets a token write key:
// the tree under prefix it belongs to (state/, meta/ or config/).
func WriteRule(prefix, key string) string {
	tree := prefix
	if rel, ok := strings.CutPrefix(key, prefix); ok {
		if t, _, ok := strings.Cut(rel, "/"); ok {
			tree = prefix + t + "/"
		}
	}
	return fmt.Sprintf("key_prefix %q { policy = \"write\" }", tree)
}

// readRefusal is the PermissionError of err when Consul refused the token
// (403) a read under prefix ("": not known), else nil.
func readRefusal(err error, prefix, note string) error {
	var se consul.StatusError
	if errors.As(err, &se) && (se.Code == http.StatusForbidden || se.Code == http.StatusUnauthorized) {
		refused, rule := "read "+prefix, ReadRule(prefix)
		if prefix == "" {
			refused, rule = "what the command asked", "the rules of the writer policy"
		}
		return &PermissionError{Refused: refused, Rule: rule, Consul: fmt.Sprintf("%d %s", se.Code, se.Body), Note: note}
	}
	return nil
}
