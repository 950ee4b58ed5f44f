package ctl

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"sort"
	"strings"
	"time"

	"github.com/hashicorp/consul/api"
	"github.com/hastate/hastate/server"
	"github.com/hastate/hastate/state"
)

// ErrNotDone is returned by Wait when the deadline passes and by Precheck
// when something selected is not settled.
var ErrNotDone = errors.New("not done")

// Poll is one HAProxy's last probe for a server, as /v1/pollers shows it.
type Poll struct {
	HAProxy   string    `json:"haproxy"`
	Backend   string    `json:"backend"`
	Server    string    `json:"server"`
	LastAsked time.Time `json:"last_asked"`
	Answer    string    `json:"answer"`
	Withheld  bool      `json:"withheld"`
	Replica   string    `json:"replica"`
}

// ActivePoller is how recently an HAProxy must have asked to count as
// polling a server in Wait.
const ActivePoller = time.Minute

// WaitOptions configure Wait.
type WaitOptions struct {
	Consul     *api.Client // to read the prefix and know what is current
	ConsulAddr string      // for messages
	Prefix     string
	Addr       string // a replica's HTTP address (a bare host:port works)
	Selector   string
	Interval   time.Duration // 0: 500ms between looks
	Out        io.Writer     // progress lines; nil: none
}

// Wait returns once the replica at Addr holds Consul's current content of
// the prefix and every HAProxy that polls a selected server (asked within
// ActivePoller, on any replica) was last served that server's current
// answer. It gives up with ErrNotDone when ctx ends, naming what lags.
func Wait(ctx context.Context, o WaitOptions) error {
	if o.Interval == 0 {
		o.Interval = 500 * time.Millisecond
	}
	out := o.Out
	if out == nil {
		out = io.Discard
	}
	pairs, _, err := o.Consul.KV().List(o.Prefix, (&api.QueryOptions{}).WithContext(ctx))
	if err != nil {
		return consulError(ctx, o.ConsulAddr, err, "")
	}
	kv := map[string]string{}
	for _, p := range pairs {
		if !strings.HasSuffix(p.Key, "/") {
			kv[strings.TrimPrefix(p.Key, o.Prefix)] = string(p.Value)
		}
	}
	want := state.Digest(kv)
	var lag []string
	for {
		last := lag
		lag, err = waitLag(ctx, o.Addr, o.Selector, want)
		if err != nil && ctx.Err() != nil && len(last) > 0 {
			return fmt.Errorf("%w: still waiting for:\n  %s", ErrNotDone, strings.Join(last, "\n  "))
		}
		if err != nil {
			return err
		}
		if len(lag) == 0 {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%w: still waiting for:\n  %s", ErrNotDone, strings.Join(lag, "\n  "))
		case <-time.After(o.Interval):
		}
	}
}

// waitLag lists what is not yet current; empty means done.
func waitLag(ctx context.Context, addr, selector, digest string) ([]string, error) {
	var ci struct {
		NodeID   string `json:"node_id"`
		KVDigest string `json:"kv_digest"`
	}
	if err := getJSON(ctx, addr, "/v1/cluster", &ci); err != nil {
		return nil, err
	}
	if ci.KVDigest != digest {
		return []string{fmt.Sprintf("replica %s does not hold Consul's current KV content yet (leader syncing?)", ci.NodeID)}, nil
	}
	v, err := FetchState(ctx, addr)
	if err != nil {
		return nil, err
	}
	current := map[string]string{}
	for _, r := range v.Servers {
		ok, err := Match(selector, r)
		if err != nil {
			return nil, err
		}
		if ok && r.Server != state.Wildcard {
			current[r.Backend+"/"+r.Server] = r.Answer
		}
	}
	var pv struct {
		Pollers   []Poll `json:"pollers"`
		Total     int    `json:"total"`
		Truncated bool   `json:"truncated"`
	}
	p := fmt.Sprintf("/v1/pollers?scope=cluster&limit=%d", server.MaxLimit)
	if err := getJSON(ctx, addr, p, &pv); err != nil {
		return nil, err
	}
	if err := whole(addr, p, pv.Truncated, len(pv.Pollers), pv.Total, "polls"); err != nil {
		return nil, err
	}
	latest := map[[2]string]Poll{} // (server, haproxy) -> latest poll on any replica
	for _, p := range pv.Pollers {
		k := [2]string{p.Backend + "/" + p.Server, p.HAProxy}
		if _, sel := current[k[0]]; !sel || time.Since(p.LastAsked) > ActivePoller {
			continue
		}
		if old, ok := latest[k]; !ok || p.LastAsked.After(old.LastAsked) {
			latest[k] = p
		}
	}
	var lag []string
	for k, p := range latest {
		if p.Answer != current[k[0]] {
			lag = append(lag, fmt.Sprintf("HAProxy %s for %s: last told %q by %s, current %q", k[1], k[0], p.Answer, p.Replica, current[k[0]]))
		}
	}
	sort.Strings(lag)
	return lag, nil
}

// Precheck lists what is selected and draining (drain or maint) or
// ramping; empty means the selection is settled. Servers are those the
// replica knows: keys, ramps and what HAProxy polls for.
func Precheck(ctx context.Context, addr, selector string) (problems []string, checked int, err error) {
	v, err := FetchState(ctx, addr)
	if err != nil {
		return nil, 0, fmt.Errorf("cannot confirm %s: %w", selector, err)
	}
	if !v.HoldsState {
		return nil, 0, fmt.Errorf("replica at %s holds no state yet: cannot tell; ask another replica (HASTATE_ADDR)", addr)
	}
	for _, r := range v.Servers {
		ok, err := Match(selector, r)
		if err != nil || !ok {
			if err != nil {
				return nil, 0, err
			}
			continue
		}
		checked++
		switch {
		case r.Ramping != nil:
			problems = append(problems, fmt.Sprintf("%s/%s is ramping: %s", r.Backend, r.Server, r.Ramping))
		case r.Withheld:
			problems = append(problems, fmt.Sprintf("%s/%s has an invalid key and no valid value: %s", r.Backend, r.Server, r.Error))
		case r.Answer == "drain" || r.Answer == "maint":
			problems = append(problems, fmt.Sprintf("%s/%s is %s (%s)", r.Backend, r.Server, r.Answer, r.Reason))
		}
	}
	return problems, checked, nil
}

// getJSON reads path from the replica at addr into v; ctx bounds all of
// it, the body included.
func getJSON(ctx context.Context, addr, path string, v any) error {
	base := ReplicaURL(addr)
	const advice = "check HASTATE_ADDR / --addr (a replica's HTTP address, port 9778) or ask another replica"
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, base+path, nil)
	if err != nil {
		return fmt.Errorf("%w: HASTATE_ADDR / --addr %q: %v", ErrUsage, addr, err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return callError(ctx, "hastate replica", base, err, advice)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("hastate replica at %s: GET %s: HTTP %s: %s", base, path, resp.Status, advice)
	}
	if err := json.NewDecoder(resp.Body).Decode(v); err != nil {
		return callError(ctx, "hastate replica", base, fmt.Errorf("GET %s: %w", path, err), advice)
	}
	return nil
}
