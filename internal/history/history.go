// Package history checks what HAProxy-like pollers were told against what
// was written to Consul: the validator of the fault-injection ("nemesis")
// test, in the spirit of etcd's tests/robustness validators and Jepsen's
// checkers. It is pure: the test records writes and answers, Check judges
// them.
//
// The version of an answer is a Consul index. A replica serves a mirror of
// the KV prefix as Consul held it at one index (the leader applies whole
// listings, each at its X-Consul-Index), so every answer is explained by
// some index X at which its key held a value whose answer it is. A key's
// writes are serialized (one writer owns each key), so each write is known
// with its index, exactly (a set: the key's ModifyIndex) or within bounds
// (a delete: after the write before it, at or before the index read once
// it returned), and the value it wrote was held from its index until the
// next write of that key.
//
// Three rules, one per Violation kind:
//   - NeverHeld: an answer that no write of its key ever meant (nor the
//     absent key's "ready 100%"), or only writes that began after the
//     answer had arrived (an answer from the future);
//   - StepBack: a poller was told something older than what it had been
//     told before, on any key and through any replica. Each poller's
//     answers must be explained by indexes that never decrease: the answers
//     are judged in order, each at the smallest index at or above the last
//     one that explains it (greedy is exact: the smallest choice leaves the
//     most room for what follows);
//   - NotConverged: once the faults and the writes are over, a replica that
//     does not answer a key's last value by the deadline, or stops doing so
//     after it did.
//
// These rules explain each wrong answer in Consul's terms. The verdict on
// the whole history in real time, across pollers, is Linearizable
// (linear.go: porcupine, a register per server): it also rejects a poller
// told an older value after another poller was told a newer one, or after
// a write had been served, which these rules cannot express.
//
// Ramps are out of this model (the test runs with --ramp-duration 0): a
// ramp's weight is a leader's raft entry, not a Consul write.
package history

import (
	"cmp"
	"fmt"
	"maps"
	"math"
	"slices"
	"strings"
	"time"
)

// Absent is the answer of a key that does not exist: ready at full weight.
const Absent = "ready 100%"

// Write is one change of one key, as Consul recorded it.
type Write struct {
	Server string // "backend/server"
	// Answer is what the written value means on the agent protocol
	// (AnswerFor): "drain", "ready 37%", Absent for a delete.
	Answer string
	// Index is the Consul index of the write, or the lowest it can be;
	// MaxIndex the highest it can be (0: exactly Index).
	Index, MaxIndex uint64
	// Began is when the writer started it: an answer that had arrived
	// before cannot show it. Ended is when it was known to be served (the
	// cluster held it); zero: not known (timed out, never seen served),
	// so it may take effect at any time after Began (Linearizable).
	Began, Ended time.Time
	By           string // who wrote it ("cli", "consul"), for messages
}

func (w Write) hi() uint64 { return max(w.Index, w.MaxIndex) }

// Answer is one agent check a poller made.
type Answer struct {
	Poller string // a poller, or a replica for convergence samples
	Server string
	// Began and Ended bound the check in real time. A poller makes one
	// check at a time, so its checks are ordered.
	Began, Ended time.Time
	// Line is the answer without its LF; "" when there was none (refused,
	// closed without an answer, timed out): HAProxy keeps its state, and
	// the check is not judged.
	Line string
}

// Kind is the kind of a violation.
type Kind string

const (
	NeverHeld    Kind = "never-held"
	StepBack     Kind = "step-back"
	NotConverged Kind = "not-converged"
)

// Violation is one answer the rules reject.
type Violation struct {
	Kind   Kind
	Answer Answer
	Detail string
}

func (v Violation) String() string {
	a := v.Answer
	return fmt.Sprintf("%s: %s asked %s at %s, told %q: %s", v.Kind, a.Poller, a.Server, a.Began.Format("15:04:05.000"), a.Line, v.Detail)
}

// AnswerFor is the agent answer of a state value (DESIGN.md, agent
// protocol) and whether the value is one this model knows: ready, drain,
// maint, N% (0..256), or "" for an absent key.
func AnswerFor(value string) (string, bool) {
	switch v := strings.ToLower(strings.TrimSpace(value)); {
	case v == "" || v == "ready":
		return Absent, true
	case v == "drain" || v == "maint":
		return v, true
	case strings.HasSuffix(v, "%"):
		var n int
		if _, err := fmt.Sscanf(v, "%d%%", &n); err != nil || n < 0 || n > 256 || fmt.Sprintf("%d%%", n) != v {
			return "", false
		}
		return fmt.Sprintf("ready %d%%", n), true
	}
	return "", false
}

// span is an interval [lo, hi) of Consul indexes during which a key may
// have held the value of write w (hi = math.MaxUint64: still holds it).
type span struct {
	lo, hi uint64
	w      Write
}

// Model is the writes of every key, ready to judge answers.
type Model struct {
	spans map[string][]span // by server, in index order
	final map[string]string // by server: the answer of its last write
}

// NewModel orders the writes of each key by index. Every key starts
// absent at index 0.
func NewModel(writes []Write) *Model {
	by := map[string][]Write{}
	for _, w := range writes {
		by[w.Server] = append(by[w.Server], w)
	}
	m := &Model{spans: map[string][]span{}, final: map[string]string{}}
	for srv, ws := range by {
		slices.SortStableFunc(ws, func(a, b Write) int { return cmp.Compare(a.Index, b.Index) })
		ws = append([]Write{{Server: srv, Answer: Absent, By: "initial (absent)"}}, ws...)
		for i, w := range ws {
			// The value of w holds from w's own index at the earliest
			// until the next write's at the latest: where an index is
			// only bounded, both neighbours may explain an answer.
			hi := uint64(math.MaxUint64)
			if i+1 < len(ws) {
				hi = ws[i+1].hi()
			}
			m.spans[srv] = append(m.spans[srv], span{lo: w.Index, hi: hi, w: w})
		}
		m.final[srv] = ws[len(ws)-1].Answer
	}
	return m
}

// Final returns the answer every replica must converge to for server.
func (m *Model) Final(server string) string {
	if a, ok := m.final[server]; ok {
		return a
	}
	return Absent
}

// Servers returns the servers that were written, sorted.
func (m *Model) Servers() []string { return slices.Sorted(maps.Keys(m.final)) }

// explain returns the smallest index >= from at which a's key may have
// held a's answer by a write that began before a ended; ok false when none.
// held reports whether any write of the key ever meant that answer.
func (m *Model) explain(a Answer, from uint64) (idx uint64, ok, held bool) {
	spans := m.spans[a.Server]
	if len(spans) == 0 {
		spans = []span{{lo: 0, hi: math.MaxUint64, w: Write{Answer: Absent}}}
	}
	for _, s := range spans {
		if s.w.Answer != a.Line {
			continue
		}
		held = true
		if !s.w.Began.IsZero() && !a.Ended.IsZero() && !s.w.Began.Before(a.Ended) {
			continue // written after the answer arrived
		}
		if s.hi <= from {
			continue
		}
		x := max(s.lo, from)
		if !ok || x < idx {
			idx, ok = x, true
		}
	}
	return idx, ok, held
}

// Check judges every poller's answers (in the order each poller made them)
// and returns the violations of NeverHeld and StepBack.
func Check(writes []Write, answers []Answer) []Violation {
	return NewModel(writes).Check(answers)
}

// Check is the package's Check on a model.
func (m *Model) Check(answers []Answer) []Violation {
	byPoller := map[string][]Answer{}
	for _, a := range answers {
		if a.Line != "" {
			byPoller[a.Poller] = append(byPoller[a.Poller], a)
		}
	}
	var out []Violation
	for _, p := range slices.Sorted(maps.Keys(byPoller)) {
		as := byPoller[p]
		slices.SortStableFunc(as, func(a, b Answer) int { return a.Began.Compare(b.Began) })
		var at uint64 // the index the poller's last answer was explained at
		var atBy Answer
		for _, a := range as {
			idx, ok, held := m.explain(a, at)
			switch {
			case ok:
				if idx > at {
					at, atBy = idx, a
				}
			case !held:
				out = append(out, Violation{Kind: NeverHeld, Answer: a, Detail: fmt.Sprintf("no write of %s ever meant it (%d writes)", a.Server, len(m.spans[a.Server])-1)})
			default:
				if _, okAny, _ := m.explain(a, 0); !okAny {
					out = append(out, Violation{Kind: NeverHeld, Answer: a, Detail: fmt.Sprintf("only writes that began after the answer arrived meant it (held at Consul index %s)", m.describe(a.Server, a.Line))})
					continue
				}
				out = append(out, Violation{Kind: StepBack, Answer: a, Detail: fmt.Sprintf("%s held it at Consul index %s, older than %d, which the poller had been shown by %q for %s at %s",
					a.Server, m.describe(a.Server, a.Line), at, atBy.Line, atBy.Server, atBy.Began.Format("15:04:05.000"))})
			}
		}
	}
	return out
}

// describe lists the index intervals during which server may have held
// answer ("none" if it never did), for messages.
func (m *Model) describe(server, answer string) string {
	var parts []string
	for _, s := range m.spans[server] {
		if s.w.Answer != answer {
			continue
		}
		hi := "now"
		if s.hi != math.MaxUint64 {
			hi = fmt.Sprint(s.hi - 1)
		}
		parts = append(parts, fmt.Sprintf("%d..%s (%s)", s.lo, hi, cmp.Or(s.w.By, "?")))
	}
	if len(parts) == 0 {
		return "none"
	}
	return strings.Join(parts, ", ")
}

// CheckConverged judges samples taken once the faults and writes were
// over: each replica (Answer.Poller) must answer every written server's
// final answer in a sample that began at or before deadline, and every
// sample of that replica and server after the first such one must still
// say it (a sample with no answer counts against it too).
func (m *Model) CheckConverged(replicas []string, samples []Answer, deadline time.Time) []Violation {
	type key struct{ replica, server string }
	by := map[key][]Answer{}
	for _, s := range samples {
		by[key{s.Poller, s.Server}] = append(by[key{s.Poller, s.Server}], s)
	}
	var out []Violation
	for _, r := range replicas {
		for _, srv := range m.Servers() {
			want := m.Final(srv)
			ss := by[key{r, srv}]
			slices.SortStableFunc(ss, func(a, b Answer) int { return a.Began.Compare(b.Began) })
			first := slices.IndexFunc(ss, func(a Answer) bool { return a.Line == want })
			switch {
			case first < 0:
				last := Answer{Poller: r, Server: srv}
				if len(ss) > 0 {
					last = ss[len(ss)-1]
				}
				out = append(out, Violation{Kind: NotConverged, Answer: last, Detail: fmt.Sprintf("never answered the last written %q (%d samples)", want, len(ss))})
			case ss[first].Began.After(deadline):
				out = append(out, Violation{Kind: NotConverged, Answer: ss[first], Detail: fmt.Sprintf("answered the last written %q only %s after the deadline", want, ss[first].Began.Sub(deadline).Round(time.Millisecond))})
			default:
				for _, s := range ss[first+1:] {
					if s.Line != want {
						out = append(out, Violation{Kind: NotConverged, Answer: s, Detail: fmt.Sprintf("stopped answering the last written %q", want)})
						break
					}
				}
			}
		}
	}
	return out
}
