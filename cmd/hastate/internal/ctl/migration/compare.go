package migration

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/hastate/hastate/api"
	"github.com/hastate/hastate/cmd/hastate/internal/ctl"
	"github.com/hastate/hastate/cmd/hastate/internal/ctl/fleet"
	"github.com/hastate/hastate/state"
)

// Compare asks an agent (the runbook's per-node agent, or a replica's
// agent port) about every server hastate knows, as HAProxy would, and
// compares each answer with hastate's. "No answer" on either side is an
// answer too: HAProxy keeps the server's state. What Compare cannot
// observe (the agent refused the connection or did not answer in time)
// cannot be confirmed.

// CompareOptions configure Compare.
type CompareOptions struct {
	// Agent is the agent port to ask, host:port.
	Agent string
	// Gate reaches Consul and the replica; its Selectors choose the
	// servers (none: every known server).
	Gate fleet.GateOptions
	// Parallel is how many checks run at once (0: 16); CheckTimeout
	// bounds each (0: 2s, HAProxy's default check timeout is about that).
	Parallel     int
	CheckTimeout time.Duration
}

// CompareResult is what Compare found.
type CompareResult struct {
	// Checked counts the servers compared; Index is the Consul index
	// both sides were compared at.
	Checked int
	Index   uint64
	// Differ names each server where the answers differ, Unconfirmed
	// each server the agent could not be asked about; one line each,
	// sorted.
	Differ, Unconfirmed []string
}

// compareTries bounds how often Compare starts again because KV changed
// while it compared (a write in flight is not a difference).
const compareTries = 3

// Compare checks that the replica reads this prefix of this Consul (as a
// write does), waits until it holds every write made to Consul before
// it started, reads the servers the cluster knows, asks the agent about
// each one (sending "<backend>/<server>\n" and the manual probe's marker,
// which an agent that reads one line ignores), and compares: equal lines,
// or both without an answer, or hastate ramping (a ramp counts as ready)
// where the agent answers ready at a weight above 0. When Consul's index
// moved meanwhile it starts again, at most compareTries times. It fails
// with ctl.ErrCannotConfirm when the replica's view cannot be trusted, and
// ctl.ErrNoMatch for a selector that matches nothing.
func Compare(ctx context.Context, o CompareOptions) (CompareResult, error) {
	o.Parallel = max(o.Parallel, 0)
	if o.Parallel == 0 {
		o.Parallel = 16
	}
	if o.CheckTimeout <= 0 {
		o.CheckTimeout = 2 * time.Second
	}
	if len(o.Gate.Selectors) == 0 {
		o.Gate.Selectors = []ctl.Selector{{Backend: "*", Server: "*"}}
	}
	// hastate's side must be the replica that serves this prefix of this
	// Consul, or every "same" means nothing.
	if err := fleet.CheckReplica(ctx, o.Gate.Consul, o.Gate.ConsulAddr, o.Gate.Prefix, o.Gate.Replica); err != nil {
		return CompareResult{}, err
	}
	for try := 1; ; try++ {
		index, err := o.Gate.ConsulIndex(ctx)
		if err != nil {
			return CompareResult{}, fmt.Errorf("%w: %w", ctl.ErrCannotConfirm, err)
		}
		if err := o.Gate.Synced(ctx, index); err != nil {
			return CompareResult{}, err
		}
		rows, err := compareRows(ctx, o.Gate)
		if err != nil {
			return CompareResult{}, err
		}
		res := CompareResult{Checked: len(rows), Index: index}
		res.Differ, res.Unconfirmed = compareAll(ctx, o, rows)
		after, err := o.Gate.ConsulIndex(ctx)
		if err != nil {
			return res, fmt.Errorf("%w: %w", ctl.ErrCannotConfirm, err)
		}
		if after == index {
			return res, nil
		}
		if try == compareTries {
			return res, fmt.Errorf("%w: Consul's index of the prefix moved during each of %d comparisons (last %d -> %d): KV is being written; compare again when it is quiet",
				ctl.ErrCannotConfirm, compareTries, index, after)
		}
	}
}

// compareRows are the servers (not backend-wide keys) the selectors
// match, from a confirmed cluster-wide view (see confirmedFleet); a literal backend/server the
// cluster does not know is read on its own (a server no moved HAProxy
// polls and without a key is still answered by both).
func compareRows(ctx context.Context, g fleet.GateOptions) ([]api.ServerState, error) {
	// As precheck: a replica that holds no state yet, or whose leader has
	// not reported a KV sync since it started (an election), is read again
	// until ctx ends.
	view, err := g.ConfirmedFleet(ctx)
	if err != nil {
		return nil, err
	}
	var servers []api.ServerState
	for _, r := range view.Servers {
		if r.Server != state.Wildcard {
			servers = append(servers, r)
		}
	}
	var out []api.ServerState
	for _, sel := range g.Selectors {
		matched := ctl.Select(servers, sel)
		if len(matched) == 0 {
			if ctl.Globbed(sel.Backend) || ctl.Globbed(sel.Server) {
				return nil, ctl.NoMatch(sel, view.Servers)
			}
			r, err := g.Replica.Server(ctx, sel.Backend, sel.Server)
			if err != nil {
				return nil, fmt.Errorf("%w: %w", ctl.ErrCannotConfirm, err)
			}
			matched = []api.ServerState{r}
		}
		for _, r := range matched {
			if !slices.ContainsFunc(out, func(x api.ServerState) bool { return x.Backend == r.Backend && x.Server == r.Server }) {
				out = append(out, r)
			}
		}
	}
	return out, nil
}

// compareAll asks the agent about every row, o.Parallel at a time.
func compareAll(ctx context.Context, o CompareOptions, rows []api.ServerState) (differ, unconfirmed []string) {
	var (
		mu   sync.Mutex
		wg   sync.WaitGroup
		sem  = make(chan struct{}, o.Parallel)
		note = func(list *[]string, s string) {
			mu.Lock()
			*list = append(*list, s)
			mu.Unlock()
		}
	)
	for _, r := range rows {
		sem <- struct{}{}
		wg.Add(1)
		go func() {
			defer func() { <-sem; wg.Done() }()
			name := r.Backend + "/" + r.Server
			cctx, cancel := context.WithTimeout(ctx, o.CheckTimeout)
			line, err := fleet.Probe(cctx, o.Agent, ctl.Selector{Backend: r.Backend, Server: r.Server})
			cancel()
			switch {
			case errors.Is(err, fleet.ErrNoAnswer):
				line = ""
			case err != nil:
				note(&unconfirmed, fmt.Sprintf("%s: %v", name, err))
				return
			}
			if !sameAnswer(r, line) {
				note(&differ, fmt.Sprintf("%s: the agent answers %s, hastate %s", name, shown(line), hastateShown(r)))
			}
		}()
	}
	wg.Wait()
	slices.Sort(differ)
	slices.Sort(unconfirmed)
	return differ, unconfirmed
}

// sameAnswer reports whether the agent's line (without LF; "" for no
// answer) means for HAProxy what hastate answers for row r.
func sameAnswer(r api.ServerState, line string) bool {
	switch {
	case r.Withheld:
		return line == ""
	case r.Kind == api.KindRamping:
		w, ok := strings.CutPrefix(line, "ready ")
		n, err := state.ParsePercent(w, state.MaxWeight)
		return ok && err == nil && n > 0
	}
	return line == r.Answer
}

func shown(line string) string {
	if line == "" {
		return "nothing (HAProxy keeps its state)"
	}
	return fmt.Sprintf("%q", line)
}

// hastateShown is hastate's answer for r with where it comes from.
func hastateShown(r api.ServerState) string {
	s := shown(r.Answer)
	if r.Withheld {
		s = shown("")
	}
	switch {
	case r.Kind == api.KindRamping:
		s += " (ramping, counts as ready)"
	case r.Key != "" && strings.HasSuffix(r.Key, state.StatePrefix+r.Backend+"/"+state.Wildcard):
		s += " (from the backend-wide key " + r.Backend + "/*, which the per-node agent ignores)"
	case r.Expired != "":
		s += " (" + strings.TrimPrefix(r.Expired, state.StatePrefix) + " expired; the per-node agent never expires a key)"
	case r.Source != "" && r.Source != string(state.SourceAbsent):
		s += " (from " + r.Source + ")"
	}
	return s
}

// Print writes the result: what was compared, then every difference and
// every server that could not be confirmed.
func (r CompareResult) Print(w io.Writer, agent, replica string) {
	for _, d := range r.Differ {
		fmt.Fprintln(w, "differs: "+d)
	}
	for _, u := range r.Unconfirmed {
		fmt.Fprintln(w, "cannot confirm: "+u)
	}
	switch {
	case len(r.Differ) > 0:
		fmt.Fprintf(w, "compare: the agent at %s and hastate (replica %s, Consul index %d) differ on %d of %d servers\n", agent, replica, r.Index, len(r.Differ), r.Checked)
	case len(r.Unconfirmed) > 0:
		fmt.Fprintf(w, "compare: %d of %d servers could not be asked at %s; the others answer the same\n", len(r.Unconfirmed), r.Checked, agent)
	default:
		fmt.Fprintf(w, "compare: the agent at %s and hastate (replica %s, Consul index %d) answer the same for all %d servers (a ramp counts as ready)\n", agent, replica, r.Index, r.Checked)
	}
}
