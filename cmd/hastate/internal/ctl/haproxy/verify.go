package haproxy

import (
	"cmp"
	"context"
	"fmt"
	"io"
	"maps"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/hastate/hastate/api"
	"github.com/hastate/hastate/cmd/hastate/internal/ctl"
	"github.com/hastate/hastate/cmd/hastate/internal/ctl/fleet"
)

// VerifyOptions configure Verify.
type VerifyOptions struct {
	Prometheus *Prometheus
	Replica    *fleet.Replica
	Selectors  []ctl.Selector
	// Fleet, when set, is the cluster's view already read (status); nil:
	// Verify reads it.
	Fleet *api.StateView
	// Gate, when set, makes VerifyWait first wait until the replica has
	// applied every write made to Consul before it started
	// (GateOptions.WaitSynced): what HAProxy reports is compared with the
	// answer of the latest write, not of the one before.
	Gate *fleet.GateOptions
	// changedBy, when set, stands for the time a server's answer took
	// effect when the replica does not say (a server back to the default
	// ready 100% has no since): VerifyWait's start, as a change made just
	// before it may not be applied yet.
	changedBy time.Time
}

// VerifyRow is one selected server on one HAProxy instance: what HAProxy
// reports against what hastate answers and last told that HAProxy.
type VerifyRow struct {
	Reported
	// Answer is what hastate answers for the server now ("" withheld).
	Answer   string `json:"answer"`
	Withheld bool   `json:"withheld,omitempty"`
	// kind and weight are the answer's kind and weight, which verify
	// judges by (never by Answer's text).
	kind   api.Kind
	weight int
	// since is when the answer took effect as the replica says (nil: not
	// known, e.g. the default ready 100%).
	since *time.Time
	// Told is what hastate last told this HAProxy (matched by address),
	// and ToldAt when; empty when no agent check of it reached hastate
	// within api.PollerTTL.
	Told   string     `json:"told,omitempty"`
	ToldAt *time.Time `json:"told_at,omitempty"`
	// Problem says how HAProxy disagrees, or why it cannot be confirmed;
	// "" when it agrees. Note is for what is not hastate's to answer (a
	// failing health check).
	Problem string `json:"problem,omitempty"`
	Note    string `json:"note,omitempty"`
}

// Reports renders what HAProxy reports, e.g. "DRAIN", "UP weight 50".
func (r VerifyRow) Reports() string {
	st := r.State
	if st == "" {
		st = "no state"
	}
	if r.Weight >= 0 && (st == "UP" || r.Weight == 0) {
		st += " weight " + strconv.Itoa(r.Weight)
	}
	return st
}

// VerifyReport is the result of Verify.
type VerifyReport struct {
	Rows []VerifyRow `json:"rows"`
	// Problems are the disagreements and what cannot be confirmed, one
	// line each, naming the server and the HAProxy instance: the rows'
	// and those of no row (a server without series, an HAProxy that
	// Prometheus does not scrape).
	Problems []string `json:"problems"`
	// Servers and Instances count what was compared.
	Servers   int `json:"servers"`
	Instances int `json:"instances"`
	// Samples the read returned, and the age of the newest one.
	Samples       int           `json:"samples"`
	Newest        time.Duration `json:"-"`
	NewestSeconds float64       `json:"newest_sample_age_seconds"` // -1: no sample
	// Disagreements counts the Problems where HAProxy disagrees; the
	// others are what verify cannot confirm.
	Disagreements int `json:"disagreements"`
	// Pending counts the Problems that are an answer too new for the
	// samples: HAProxy applies a change at its next agent check, and the
	// scrape after that shows it (cannot confirm yet). changed is when the
	// newest of those answers took effect.
	Pending int `json:"pending"`
	changed time.Time
	// ScrapeInterval is Prometheus' scrape interval as the samples show it
	// (0: not known).
	ScrapeInterval time.Duration `json:"-"`
}

// Summary says what was compared: servers, instances, samples.
func (rep VerifyReport) Summary() string {
	return fmt.Sprintf("%s on %s; newest sample %s old; %d samples read", ctl.PluralN(rep.Servers, "server", "servers"),
		ctl.PluralN(rep.Instances, "HAProxy instance", "HAProxy instances"), ctl.SampleAge(rep.Newest), rep.Samples)
}

// Err is verify's verdict: nil when every HAProxy agrees; ctl.ErrNotDone
// naming every problem when one disagrees; ctl.ErrCannotConfirm when all it
// has are things it cannot confirm.
func (rep VerifyReport) Err() error {
	if len(rep.Problems) == 0 {
		return nil
	}
	kind := ctl.ErrNotDone
	if rep.Disagreements == 0 {
		kind = ctl.ErrCannotConfirm
	}
	if rep.Disagreements == 0 && rep.Pending == len(rep.Problems) {
		return fmt.Errorf("%w yet: %s pending: hastate's answer changed after the newest sample of HAProxy (%s); run verify again after the next scrape:\n  %s",
			kind, ctl.PluralN(rep.Pending, "row is", "rows are"), rep.Summary(), strings.Join(rep.Problems, "\n  "))
	}
	return fmt.Errorf("%w: HAProxy does not agree with hastate (%s):\n  %s", kind, rep.Summary(), strings.Join(rep.Problems, "\n  "))
}

// WriteTable writes verify's table: one row per server and instance.
func (rep VerifyReport) WriteTable(w io.Writer) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "BACKEND\tSERVER\tHAPROXY\tREPORTS\tSESSIONS\tHASTATE\tTOLD\tSAMPLE\tPROBLEM")
	for _, r := range rep.Rows {
		told := "-"
		if r.ToldAt != nil {
			told = fmt.Sprintf("%s (%s ago)", r.Told, time.Since(*r.ToldAt).Round(time.Second))
		}
		ans := r.Answer
		if r.Withheld {
			ans = "(withheld)"
		}
		sample := "none"
		if !r.Sample.IsZero() {
			sample = ctl.Ago(time.Since(r.Sample))
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%d\t%s\t%s\t%s\t%s\n", r.Backend, r.Server, r.Instance, r.Reports(), r.Sessions, ans, told,
			sample, strings.TrimSpace(r.Problem+" "+r.Note))
	}
	return tw.Flush()
}

// Verify compares, for each selected server on each HAProxy instance, the
// status and weight HAProxy reports (through Prometheus) with what hastate
// answers and last told that HAProxy, and names every disagreement: a
// state set over the admin socket, an HAProxy whose agent check is
// disabled or does not reach hastate, one not yet told, a stale scrape.
// An error means it could not compare at all (Prometheus or the replica
// did not answer; ctl.ErrNoMatch).
func Verify(ctx context.Context, o VerifyOptions) (VerifyReport, error) {
	var rep VerifyReport
	view := o.Fleet
	if view == nil {
		v, err := o.Replica.Fleet(ctx, o.Selectors...)
		if err != nil {
			return rep, fmt.Errorf("%w: %w", ctl.ErrCannotConfirm, err)
		}
		view = &v
	}
	if err := fleet.Confirmable(*view); err != nil {
		rep.Problems = append(rep.Problems, err.Error())
	}
	if _, err := o.Replica.Live(ctx, view.Replicas); err != nil {
		rep.Problems = append(rep.Problems, err.Error())
	}
	rows, err := fleet.SelectedServers(*view, o.Selectors)
	if err != nil {
		return rep, err
	}
	pv, err := o.Replica.Pollers(ctx, o.Selectors...)
	if err != nil {
		return rep, fmt.Errorf("%w: %w", ctl.ErrCannotConfirm, err)
	}
	if _, err := o.Replica.Live(ctx, pv.Replicas); err != nil {
		rep.Problems = append(rep.Problems, err.Error())
	}
	polls := fleet.LatestPolls(pv, rows)
	rd, err := o.Prometheus.Read(ctx, o.Selectors)
	if err != nil {
		return rep, err
	}
	rep.Samples, rep.Newest, rep.ScrapeInterval = rd.Samples, rd.Newest(), rd.Interval
	rep.NewestSeconds = max(rep.Newest.Seconds(), -1)
	hosts := o.Prometheus.hosts(ctx, slices.Collect(maps.Keys(rd.Instances)))
	instances := map[string]bool{}
	have := map[string]bool{}
	scraped := map[string]bool{} // addresses of the instances
	for _, r := range rd.Servers {
		cur, ok := rows[r.Name()]
		if !ok {
			continue
		}
		have[r.Name()] = true
		instances[r.Instance] = true
		row := VerifyRow{Reported: r, Answer: cur.Answer, Withheld: cur.Withheld, kind: cur.Kind, weight: cur.Weight, since: cur.Since}
		var poll *api.Poll
		for _, a := range hosts[r.Instance] {
			scraped[a] = true
			if p, ok := polls[[2]string{r.Name(), a}]; ok && (poll == nil || p.LastAsked.After(poll.LastAsked)) {
				poll = &p
			}
		}
		if poll != nil {
			row.Told, row.ToldAt = fleet.ToldAnswer(*poll), &poll.LastAsked
		}
		var v verdict
		since := cur.Since
		if since == nil && !o.changedBy.IsZero() {
			since = &o.changedBy
		}
		row.Problem, row.Note, v = judge(row, poll != nil, since, rd.At.Sub(r.Sample), o.Prometheus.o.MaxSampleAge)
		if row.Problem != "" {
			rep.Problems = append(rep.Problems, fmt.Sprintf("%s on HAProxy %s: %s", r.Name(), r.Instance, row.Problem))
			switch v {
			case disagrees:
				rep.Disagreements++
			case pending:
				rep.Pending++
				if since.After(rep.changed) {
					rep.changed = *since
				}
			}
		}
		rep.Rows = append(rep.Rows, row)
	}
	for _, s := range slices.Sorted(maps.Keys(rows)) {
		if !have[s] {
			rep.Problems = append(rep.Problems, fmt.Sprintf("%s: cannot confirm: Prometheus has no series for it within the last %s (is every HAProxy's exporter scraped? labels %s, %s, %s)",
				s, o.Prometheus.o.MaxSampleAge, o.Prometheus.o.ProxyLabel, o.Prometheus.o.ServerLabel, o.Prometheus.o.InstanceLabel))
		}
	}
	for _, k := range slices.SortedFunc(maps.Keys(polls), func(a, b [2]string) int { return strings.Compare(a[1]+a[0], b[1]+b[0]) }) {
		if !scraped[k[1]] {
			rep.Problems = append(rep.Problems, fmt.Sprintf("%s on HAProxy %s: cannot confirm: it polls hastate, but no instance Prometheus scrapes is at that address (scrape its exporter; docs/deploy.md)", k[0], k[1]))
		}
	}
	rep.Servers, rep.Instances = len(have), len(instances)
	return rep, nil
}

// applyGrace is how long after an answer changed a sample may still show
// the old state: HAProxy applies it at its next agent check (agent-inter,
// 2s), and the scrape after that shows it.
const applyGrace = 3 * time.Second

// silentAgent is how long an HAProxy may go without an agent check that
// reaches hastate (every agent-inter, 2s) before verify names it.
const silentAgent = 10 * time.Second

// verdict is what a problem of a row is.
type verdict int

const (
	disagrees   verdict = iota // HAProxy disagrees with hastate (exit 1)
	unconfirmed                // verify cannot confirm it (exit 4)
	pending                    // an answer too new for the samples: cannot confirm yet
)

// judge compares one row: what HAProxy reports against what hastate
// answers and told it. polled says an agent check of this HAProxy for the
// server reached hastate within api.PollerTTL; since is when the answer
// took effect (nil: not known); age is how old the row's newest sample is.
// The verdict says what the problem is (nothing when problem is "").
func judge(r VerifyRow, polled bool, since *time.Time, age, maxAge time.Duration) (problem, note string, v verdict) {
	if r.Sample.IsZero() {
		return fmt.Sprintf("cannot confirm: no sample of it within the last %s: is Prometheus still scraping it?", seenWindow), "", unconfirmed
	}
	if age > maxAge {
		return fmt.Sprintf("cannot confirm: its newest sample is %s old (over --max-sample-age %s): is Prometheus still scraping it?", ctl.RoundAge(age), maxAge), "", unconfirmed
	}
	if r.Withheld {
		return "hastate withholds this server's answer (its key is invalid, see hastate status): HAProxy keeps whatever state it had", "", disagrees
	}
	wantState, wantWeight := expected(r.kind, r.weight)
	got := r.State
	agrees := true
	switch {
	case got == "DOWN" || got == "NOLB":
		// The exporter shows a failing health check before the admin
		// state: hastate's part is not visible, and not in question.
		note = got + ": its health check fails; the agent's state is not visible"
	case got != wantState:
		agrees = false
	case got == "UP" && wantWeight == 0 && r.Weight > 0, got == "UP" && wantWeight > 0 && r.Weight == 0:
		agrees = false
	}
	// The answer changed a moment ago (a write, or a ramp's step: since
	// is the ramp's start) and this HAProxy, which asked recently, has not
	// asked since: it asks every agent-inter. Not a disagreement (yet).
	changed := since != nil && r.ToldAt.Before(*since) || r.kind == api.KindRamping
	if polled && r.Told != r.Answer && changed && time.Since(*r.ToldAt) < silentAgent {
		return fmt.Sprintf("cannot confirm yet: reports %s, hastate answers %q since %s ago, and this HAProxy has not asked since (it asks every agent-inter)",
			r.Reports(), r.Answer, ctl.RoundAge(time.Since(*since))), note, pending
	}
	told := ""
	switch {
	case !polled:
		told = "no agent check from this HAProxy reached hastate in the last minute: its agent check is disabled (`enable agent " + r.Name() + "` on its admin socket) or cannot reach hastate"
	case r.Told != r.Answer:
		told = fmt.Sprintf("it was last told %q %s ago and has not checked since (agent check disabled, or it cannot reach hastate?)", r.Told, ctl.RoundAge(time.Since(*r.ToldAt)))
	case time.Since(*r.ToldAt) > silentAgent:
		told = fmt.Sprintf("its last agent check reached hastate %s ago: disabled (`enable agent %s` on its admin socket) or it cannot reach hastate", ctl.RoundAge(time.Since(*r.ToldAt)), r.Name())
	}
	switch {
	case agrees && told == "" && r.since != nil && r.Sample.Before(r.since.Add(applyGrace)):
		// The exporter's weight is HAProxy's absolute weight, so a
		// sample from before the change (UP weight 100 against ready
		// 25%) looks like agreement: it cannot tell yet.
		return fmt.Sprintf("pending: reports %s, hastate answers %q since %s ago: the newest sample (%s old) predates HAProxy applying it at its next agent check",
			r.Reports(), r.Answer, ctl.RoundAge(time.Since(*r.since)), ctl.RoundAge(age)), note, pending
	case agrees && told == "":
		return "", note, disagrees
	case agrees:
		return "agrees for now, but " + told, note, disagrees
	case told != "":
		return fmt.Sprintf("reports %s, hastate answers %q: %s", r.Reports(), r.Answer, told), note, disagrees
	case since != nil && r.Sample.Before(since.Add(applyGrace)):
		// Told, but the sample may predate HAProxy applying it.
		return fmt.Sprintf("cannot confirm yet: reports %s, hastate answers %q since %s ago: the newest sample (%s old) may predate HAProxy applying it at its next agent check",
			r.Reports(), r.Answer, ctl.RoundAge(time.Since(*since)), ctl.RoundAge(age)), note, pending
	}
	// Told the current answer after it took effect, and still showing
	// another state: set over the admin socket (CLI and agent write the
	// same flags, last writer wins) since HAProxy's last agent check.
	return fmt.Sprintf("reports %s, hastate answers %q and told it so %s ago: a state or weight set over the admin socket since that check "+
		"(the next agent check replaces it; if it stays, see `show servers state` on that HAProxy)", r.Reports(), r.Answer, ctl.RoundAge(time.Since(*r.ToldAt))), note, disagrees
}

// defaultScrape is the scrape interval VerifyWait assumes when the
// samples do not show it (Prometheus' default).
const defaultScrape = 15 * time.Second

// verifyPoll is how often VerifyWait reads again.
const verifyPoll = 500 * time.Millisecond

// VerifyWait is Verify for a state that may have changed a moment ago
// (verify right after a write). With Gate, it first waits until the
// replica has applied every write made before it. Then, while every problem is an answer too new
// for the samples (Pending: HAProxy applies a change at its next agent
// check, and the scrape after that shows it), it reads again, until a
// sample newer than the change can tell. It waits at most one scrape
// interval (as the samples show it) past the newest such change and the
// agent check that applies it, and never past ctx (--timeout). A row
// still pending then is what verify cannot confirm (exit 4), never a
// disagreement (exit 1); a real disagreement returns at once.
func VerifyWait(ctx context.Context, o VerifyOptions) (VerifyReport, error) {
	o.changedBy = time.Now()
	if o.Gate != nil {
		if err := o.Gate.WaitSynced(ctx); err != nil {
			return VerifyReport{}, fmt.Errorf("%w; verify compares with the answers of every write made before it", err)
		}
	}
	var deadline time.Time
	for {
		rep, err := Verify(ctx, o)
		if err != nil || rep.Pending == 0 || rep.Disagreements > 0 || o.Fleet != nil {
			return rep, err
		}
		if deadline.IsZero() { // fixed at the first read: a ramp that keeps stepping does not extend it
			deadline = rep.changed.Add(applyGrace + cmp.Or(rep.ScrapeInterval, defaultScrape) + verifyPoll)
		}
		wait := min(verifyPoll, time.Until(deadline))
		if wait <= 0 {
			return rep, nil
		}
		select {
		case <-ctx.Done():
			return rep, nil
		case <-time.After(wait):
		}
	}
}

// expected is the exporter's state, and the weight percentage (-1: any),
// that an answer of that kind and weight makes HAProxy report: drain is DRAIN, maint
// MAINT, ready at N% UP at N% of the configured weight (which the exporter
// does not publish, so only 0 and above 0 can be told apart).
func expected(kind api.Kind, weight int) (string, int) {
	switch kind {
	case api.KindDrain:
		return "DRAIN", -1
	case api.KindMaint:
		return "MAINT", -1
	case api.KindReady, api.KindWeight, api.KindRamping:
		return "UP", weight
	}
	return "UP", -1
}
