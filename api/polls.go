package api

import "time"

// ProbeGrace is how long a source that has asked for a server only once
// may still be an HAProxy: one that just started, whose next check comes
// within its agent-inter (2 s by default). A source that asked once and not
// again within ProbeGrace is a manual probe (`nc`, as the runbook shows):
// it is never an HAProxy (DESIGN.md, Operator commands). `hastate probe`
// is not even recorded.
const ProbeGrace = 5 * time.Second

// FromHAProxy reports whether the source of p counts as an HAProxy at now:
// it asked more than once (an HAProxy asks every agent-inter), or its one
// ask is younger than ProbeGrace. p.Count must cover every replica (see
// MergePolls): an HAProxy behind a load balancer spreads its checks over
// them.
func (p Poll) FromHAProxy(now time.Time) bool {
	return p.Count > 1 || now.Sub(p.LastAsked) < ProbeGrace
}

// PollKey names one source's polls of one server.
type PollKey struct{ Backend, Server, HAProxy string }

// MergePolls merges the polls of every replica into one per server and
// source: the latest (its answer, time and replica), with Count summed
// over the replicas.
func MergePolls(polls []Poll) map[PollKey]Poll {
	out := make(map[PollKey]Poll, len(polls))
	for _, p := range polls {
		k := PollKey{p.Backend, p.Server, p.HAProxy}
		old, ok := out[k]
		if !ok {
			out[k] = p
			continue
		}
		count := old.Count + p.Count
		newer, older := old, p
		if p.LastAsked.After(old.LastAsked) {
			newer, older = p, old
		}
		if newer.Withheld && newer.Kept == "" {
			// What the HAProxy keeps is what another replica told it.
			newer.Kept = older.Kept
			if !older.Withheld {
				newer.Kept = older.Answer
			}
		}
		newer.Count = count
		out[k] = newer
	}
	return out
}

// Polling reports whether p, merged over the replicas, is an HAProxy that
// polls its server at now: it counts as an HAProxy and asked within
// PollerTTL.
func (p Poll) Polling(now time.Time) bool {
	return p.FromHAProxy(now) && now.Sub(p.LastAsked) <= PollerTTL
}
