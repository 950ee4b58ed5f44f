package status

import (
	"bufio"
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/hastate/hastate/api"
	"github.com/hastate/hastate/cmd/hastate/internal/ctl"
	"github.com/hastate/hastate/cmd/hastate/internal/ctl/fleet"
	"github.com/hastate/hastate/cmd/hastate/internal/ctl/haproxy"
	"github.com/hastate/hastate/state"
)

// Options configure Status (`hastate status`).
type Options struct {
	Replica *fleet.Replica
	// Selectors choose the rows; nil: every row, and no selector can
	// match nothing.
	Selectors []ctl.Selector
	// HAProxy, when not nil, adds what HAProxy reports through haproxy.Prometheus
	// against what it was told (status --haproxy): the column of haproxy.Verify.
	HAProxy *haproxy.PrometheusOptions
	// Warn receives what the operator must know but does not stop status:
	// a stale Consul sync, a replica that did not answer, a haproxy.Prometheus
	// that could not be read (nil: discarded).
	Warn io.Writer
	// Prefix is the KV prefix the operator means (--kv-prefix): a replica
	// that reads another is warned about ("": not checked).
	Prefix string
}

// Report is what status shows.
type Report struct {
	Rows        []api.ServerState
	InvalidKeys []api.ServerState
	// HAProxy (with Options.HAProxy) is, by backend/server, the
	// HAPROXY column: "agrees (N)" or the first disagreement; HAProxyRows
	// what each instance reports. Nil without --haproxy.
	HAProxy     map[string]string
	HAProxyRows map[string][]haproxy.VerifyRow
	// Prefix is the KV prefix the replica reads ("" when it did not say):
	// the delete hint of a key no selector can name has it.
	Prefix string
	// Migration is the migration marker the replica mirrors (nil: none).
	Migration *api.Migration
}

// Read reads the cluster's view through the replica, says on Warn what
// makes it partial or stale, and selects the rows (ctl.ErrNoMatch, naming the
// known backends, for a selector that matches nothing).
func Read(ctx context.Context, o Options) (Report, error) {
	warn := o.Warn
	if warn == nil {
		warn = io.Discard
	}
	v, err := o.Replica.Fleet(ctx, o.Selectors...)
	if err != nil {
		return Report{}, err
	}
	ci, cerr := o.Replica.Cluster(ctx)
	// No raft leader comes first, as on the status page: it explains
	// the rest (a stale sync, replicas that do not answer), which it
	// replaces: "the replicas that are up decide" is not so without one.
	_, leaderless := fleet.NoLeader(ci)
	if cerr == nil && leaderless != nil {
		fmt.Fprintln(warn, "warning:", leaderless)
	} else {
		// Stale is not wrong, but the operator must know: once, with
		// the runbook section, when what stops the sync is that no
		// replica reaches Consul.
		down := ""
		if cerr == nil {
			down = consulDown(ci)
		}
		switch w := v.KV.Warning; {
		case w != "" && down != "":
			fmt.Fprintf(warn, "warning: %s; %s\n", w, down)
		case w != "":
			fmt.Fprintln(warn, "warning:", w)
		case down != "":
			fmt.Fprintln(warn, "warning:", down)
		}
		if note, err := o.Replica.Live(ctx, v.Replicas); err != nil {
			fmt.Fprintln(warn, "warning:", err)
		} else if note != "" {
			fmt.Fprintln(warn, "note:", note)
		}
	}
	if !v.HoldsState {
		fmt.Fprintln(warn, "warning: this replica holds no state yet; its answers are withheld")
	}
	sels := o.Selectors
	if sels == nil {
		sels = []ctl.Selector{{Backend: "*", Server: "*"}}
	} else if err := ctl.Matched(fleet.KnownRows(v), sels); err != nil {
		return Report{}, err
	}
	rep := Report{Rows: selectAll(v.Servers, sels, o.Selectors == nil), InvalidKeys: v.InvalidKeys, Migration: v.Migration}
	if cerr == nil && consulDown(ci) == "" {
		if w := mirrorWarning(ci); w != "" && leaderless == nil {
			fmt.Fprintln(warn, "warning:", w)
		}
		rep.Prefix = ci.KVPrefix
		if o.Prefix != "" && ci.KVPrefix != "" && ci.KVPrefix != o.Prefix {
			// A write with this prefix is refused; status says why what
			// it shows is not what this prefix holds.
			fmt.Fprintf(warn, "warning: replica %s at %s reads KV prefix %q, not %q (--kv-prefix / HASTATE_KV_PREFIX): no replica there serves %q, "+
				"so this is the state of %q; a write with %q is refused; use --kv-prefix %s, or point HASTATE_ADDR / --addr at a replica that reads %q\n",
				ci.NodeID, o.Replica.Addr(), ci.KVPrefix, o.Prefix, o.Prefix, ci.KVPrefix, o.Prefix, ci.KVPrefix, o.Prefix)
		}
	}
	if o.HAProxy != nil {
		rep.HAProxy, rep.HAProxyRows = haproxyColumn(ctx, *o.HAProxy, o.Replica, &v, sels, warn)
	}
	return rep, nil
}

// selectAll is ctl.Select(rows, sels...), without a copy of the rows when
// sels is every server (all, */*) and every row is one that */* matches: a
// name without '/' (path.Match's * stops there). ctl.Select copied the
// 10,000 rows of `hastate status -o json` one append at a time.
func selectAll(rows []api.ServerState, sels []ctl.Selector, all bool) []api.ServerState {
	if !all || len(rows) == 0 {
		return ctl.Select(rows, sels...)
	}
	for i := range rows {
		if strings.Contains(rows[i].Backend, "/") || strings.Contains(rows[i].Server, "/") {
			return ctl.Select(rows, sels...)
		}
	}
	return rows
}

// consulDown says, when every replica that reported cannot reach Consul,
// that Consul is down, each distinct error once, and the runbook section;
// "" otherwise (mirrorWarning then names the replicas that cannot mirror).
func consulDown(ci api.ClusterInfo) string {
	var errs []string
	reported := 0
	for _, m := range ci.Members {
		if m.Status == nil {
			continue
		}
		reported++
		v := m.Status.Verdict()
		if v.Reason != api.MirrorConsulUnreachable {
			return ""
		}
		if d := cmp.Or(v.Detail, "no detail"); !slices.Contains(errs, d) {
			errs = append(errs, d)
		}
	}
	if reported == 0 {
		return ""
	}
	return fmt.Sprintf("no replica reaches Consul (%s): Consul is down or cut off; every replica serves the last state it mirrored, and writes are refused until it is back; "+
		`see docs/runbook.md, "Consul is down"`, strings.Join(errs, "; "))
}

// mirrorWarning says which replicas cannot mirror Consul into raft, as
// each reported it over the raft port ("" when every one that answered
// can): what a leader among them would not apply, and whether any replica
// could.
func mirrorWarning(ci api.ClusterInfo) string {
	var bad []string
	reported := 0
	for _, m := range ci.Members {
		if m.Status == nil {
			continue
		}
		reported++
		if v := m.Status.Verdict(); !v.CanMirror() {
			bad = append(bad, fmt.Sprintf("%s: %s", m.ID, v))
		}
	}
	const see = `see docs/runbook.md, "A replica cannot mirror Consul"`
	switch {
	case len(bad) == 0:
		return ""
	case len(bad) == reported:
		return fmt.Sprintf("no replica can mirror Consul (%s): the leader applies nothing, so what is written to Consul is not served and the fleet keeps its last state; %s",
			strings.Join(bad, "; "), see)
	default:
		return fmt.Sprintf("%s cannot mirror Consul (%s): as leader it would apply nothing, and hands leadership to a replica that can; %s",
			ctl.PluralN(len(bad), "replica", "replicas"), strings.Join(bad, "; "), see)
	}
}

// haproxyColumn is status --haproxy: per selected server, whether every
// HAProxy agrees, else the first disagreement, and the rows for -o json.
// A haproxy.Prometheus that does not answer leaves the column "?" and is a
// warning.
func haproxyColumn(ctx context.Context, po haproxy.PrometheusOptions, r *fleet.Replica, v *api.StateView, sels []ctl.Selector, warn io.Writer) (map[string]string, map[string][]haproxy.VerifyRow) {
	col, rows := map[string]string{}, map[string][]haproxy.VerifyRow{}
	prom, err := haproxy.NewPrometheus(po)
	var rep haproxy.VerifyReport
	if err == nil {
		rep, err = haproxy.Verify(ctx, haproxy.VerifyOptions{Prometheus: prom, Replica: r, Selectors: sels, Fleet: v})
	}
	if err != nil {
		fmt.Fprintf(warn, "warning: --haproxy: %v\n", err)
		return col, rows
	}
	for _, row := range rep.Rows {
		rows[row.Name()] = append(rows[row.Name()], row)
	}
	for name, rs := range rows {
		bad := 0
		first := ""
		for _, x := range rs {
			if x.Problem != "" {
				if bad++; first == "" {
					first = fmt.Sprintf("%s: %s", x.Instance, x.Reports())
				}
			}
		}
		switch {
		case bad == 0:
			col[name] = fmt.Sprintf("agrees (%d)", len(rs))
		case bad == 1:
			col[name] = first
		default:
			col[name] = fmt.Sprintf("%s (+%d more)", first, bad-1)
		}
	}
	fmt.Fprintf(warn, "haproxy: newest sample %s old, %d samples read; `hastate verify` explains each disagreement\n", ctl.SampleAge(rep.Newest), rep.Samples)
	return col, rows
}

// statusRow is a row of status -o json --haproxy: the server's state and
// what each HAProxy instance reports for it.
type statusRow struct {
	api.ServerState
	HAProxy []haproxy.VerifyRow `json:"haproxy"`
}

// WriteJSON writes the rows as JSON (with --haproxy, each with what every
// HAProxy instance reports).
func (rep Report) WriteJSON(w io.Writer) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	if rep.HAProxy != nil {
		out := []statusRow{}
		for _, r := range rep.Rows {
			out = append(out, statusRow{ServerState: r, HAProxy: rep.HAProxyRows[r.Backend+"/"+r.Server]})
		}
		return enc.Encode(out)
	}
	if len(rep.Rows) == 0 {
		return enc.Encode([]api.ServerState{})
	}
	// What enc.Encode(rep.Rows) writes, its rows by api.AppendRowJSON
	// (TestStatusJSONIsEncodingJSONs): a fifth of the CPU of
	// `status -o json` of 10,000 servers was encoding/json's reflection
	// and its second pass to indent.
	bw := bufio.NewWriterSize(w, 64<<10)
	buf := make([]byte, 0, 2048)
	for i := range rep.Rows {
		buf = append(buf[:0], ",\n  "...)
		if i == 0 {
			buf[0] = '['
		}
		buf = api.AppendRowJSON(buf, &rep.Rows[i], 1)
		if _, err := bw.Write(buf); err != nil {
			return err
		}
	}
	_, _ = bw.WriteString("\n]\n")
	return bw.Flush()
}

// statusTime is how status shows a time: with seconds and the zone.
const statusTime = "Jan 2 15:04:05 MST"

// WriteTable writes the status table, the servers in and out of rotation,
// the invalid keys that name no server, and the value grammar once if a
// row's problem is an invalid value.
func (rep Report) WriteTable(w io.Writer) error {
	rows, hap := rep.Rows, rep.HAProxy
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprint(tw, "BACKEND\tSERVER\tANSWER\tSINCE\tVALUE\tRAMP\tUNTIL\tTOLD\tREASON\tBY\tPROBLEM")
	if hap != nil {
		fmt.Fprint(tw, "\tHAPROXY")
	}
	fmt.Fprintln(tw)
	grammar := false
	problem := func(msg string) string {
		if short, ok := strings.CutSuffix(msg, "; valid forms: "+state.ValidForms); ok {
			grammar = true
			return short
		}
		return msg
	}
	var rot api.Rotation
	expired := map[string]bool{}
	for _, r := range rows {
		ans := r.Answer
		if r.Withheld {
			ans = withheldAnswer(r)
		}
		until := ""
		var problems []string
		if r.Error != "" {
			problems = append(problems, problem(r.Error))
		}
		// An expired key is no problem: its --for did what it was for.
		// It is said where the time goes, and named once below the table
		// with the command that removes it (issue 35).
		switch {
		case r.Expired != "" && r.ExpiredAt != nil:
			until = "expired " + r.ExpiredAt.Local().Format(statusTime)
			expired[r.Expired] = true
		case r.Expired != "":
			until = "expired"
			expired[r.Expired] = true
		case r.Until != nil:
			until = r.Until.Local().Format(statusTime)
		}
		if r.AtZero() {
			problems = append(problems, "at 0%: HAProxy shows it as DRAIN")
		}
		if r.Note != "" {
			problems = append(problems, r.Note)
		}
		since := ""
		if r.Since != nil {
			since = ctl.Ago(time.Since(*r.Since))
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%d/%d\t%s\t%s\t%s", r.Backend, r.Server, ans, since, r.Desired, r.Ramping.String(),
			until, r.Told, r.Polled, r.Reason, r.By, strings.Join(problems, "; "))
		if hap != nil {
			fmt.Fprint(tw, "\t"+cmp.Or(hap[r.Backend+"/"+r.Server], "?"))
		}
		fmt.Fprintln(tw)
		if r.Server == state.Wildcard {
			continue
		}
		rot.Add(r)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if rot.Servers > 0 {
		// The status page's headline says the same line (api.Rotation).
		fmt.Fprintln(w, rot.String())
	}
	if len(expired) > 0 {
		keys := slices.Sorted(maps.Keys(expired))
		list := strings.Join(keys[:min(len(keys), 5)], ", ")
		if len(keys) > 5 {
			list += fmt.Sprintf(" and %d more", len(keys)-5)
		}
		fmt.Fprintf(w, "%s (--for passed: hastate treats %s as absent): %s; `hastate clear --expired` removes %s\n",
			ctl.PluralN(len(keys), "expired key", "expired keys"), map[bool]string{true: "it", false: "them"}[len(keys) == 1], list,
			map[bool]string{true: "it", false: "them"}[len(keys) == 1])
	}
	for _, r := range rep.InvalidKeys {
		if r.Backend == "" {
			effect := r.Note // a configuration key: what applies instead
			if effect == "" {
				effect = fmt.Sprintf("ignored: no agent request can name it; remove it with `consul kv delete '%s'`", ctl.KVDeleteKey(rep.Prefix, r.Key))
			}
			fmt.Fprintf(w, "invalid key %s: %s; %s\n", r.Key, problem(r.Error), effect)
		}
	}
	if grammar {
		fmt.Fprintf(w, "valid values: %s\n", state.ValidForms)
	}
	if rep.Migration != nil {
		fmt.Fprintln(w, rep.Migration)
	}
	return nil
}

// withheldAnswer is the ANSWER cell of a withheld server: it is answered
// nothing, so HAProxy keeps the last answer it was told.
func withheldAnswer(r api.ServerState) string {
	if r.Keeps == "" {
		return "(withheld: HAProxy keeps its own state, never told)"
	}
	return "(withheld: HAProxy keeps " + r.Keeps + ")"
}
