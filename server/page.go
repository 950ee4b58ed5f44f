package server

import (
	"bufio"
	"crypto/rand"
	_ "embed"
	"encoding/hex"
	"fmt"
	"html/template"
	"io"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/hastate/hastate/api"
	"go.uber.org/zap"
)

// The status page at /: what an operator woken at 3 a.m. needs on one
// screen. It is rendered on the server from the cluster-wide state view
// (the same as /v1/state?scope=cluster), the replica's cluster info and
// its Consul status. It loads nothing from anywhere: CSS and JS are inline
// and a Content-Security-Policy forbids every other source. It refreshes
// itself by fetching itself (a <noscript> meta refresh without JS) and says
// so when a refresh fails, so that a frozen page never passes for a live one.

//go:embed page.html
var pageHTML string

// pageRefresh is how often the page fetches itself.
const pageRefresh = 5 * time.Second

// pageHead and pageTail are page.html before and after its table's
// bodies ({{.Rows}}, which they replace): the rows are written between
// them as they are rendered (writeRows), not first rendered into one
// string that the template then copies through fmt (about 1 MB each for
// 1,000 rows).
var pageHead, pageTail = pageTemplates()

// pageTemplates parses page.html cut where its rows go. Both parts begin
// and end in HTML text, where the rows stood, so html/template escapes
// each as it escaped the whole.
func pageTemplates() (head, tail *template.Template) {
	before, after, ok := strings.Cut(pageHTML, pageRowsAt)
	if !ok || strings.Contains(after, pageRowsAt) {
		panic("page.html must hold " + pageRowsAt + " once, where the table's rows go")
	}
	parse := func(name, text string) *template.Template {
		return template.Must(template.New(name).Funcs(template.FuncMap{"count": thousands}).Parse(text))
	}
	return parse("page", before), parse("page-tail", after)
}

// pageRowsAt is where page.html's table bodies go.
const pageRowsAt = "{{.Rows}}"

// writePage writes the page of d: the template before the rows, the rows
// (yielding: yield.go), the template after them, through one buffer.
func writePage(w io.Writer, d pageData) error {
	bw := bufio.NewWriterSize(w, 64<<10)
	err := pageHead.Execute(bw, d)
	if err == nil {
		writeRows(bw, d.Backends)
		err = pageTail.Execute(bw, d)
	}
	if ferr := bw.Flush(); err == nil {
		err = ferr
	}
	return err
}

// pageData is what the status page shows. Cut is its note when the table
// is cut (nil: not cut).
type pageData struct {
	Nonce     string
	Generated time.Time
	RefreshMS int64
	// Served is the replica that rendered the page, and its raft state.
	Served, ServedState string
	Ready               bool
	ReadyDetail         string
	Leader              string // "" when there is none
	Leaderless          string // how long without a leader, when there is none
	Members             []pageMember
	KV                  pageKV
	Banners             []pageBanner // red: the view may be stale or partial
	Migration           string       // a migration from the per-node agent is marked: since when, by whom
	Headline            pageHeadline
	Backends            []pageBackend
	Invalid             []pageInvalid
	InvalidTotal        int
	Total               int
	Cut                 *pageCut
	Title               string
	Icon                template.URL
}

// pageCut is the status page's note when its table is cut.
type pageCut struct{ Shown, Total, More, Max int }

// pageMember is one raft member in the header.
type pageMember struct {
	ID, Address, Suffrage string
	State                 string // leader, follower, ... or "no answer"
	Contact               string // last contact with the leader (followers)
	Consul                string // "Consul ok", "Consul unreachable" or ""
	Class                 string // ok, warn or bad
	Self                  bool
}

// pageKV is the Consul line of the header.
type pageKV struct {
	Class   string // ok or bad
	Text    string
	Age     string
	Index   uint64
	Warning string
}

// pageBanner is one red line above everything, with a detail in small.
type pageBanner struct{ Text, Detail string }

// pageHeadline is the one line that says how the fleet stands.
type pageHeadline struct {
	Class string // ok, warn or bad
	Text  string
}

// pageBackend is one backend: its summary line and its rows.
type pageBackend struct {
	Name    string
	Summary []pageCount
	Rows    []pageRow
	Class   string // ok or warn (some server not ready at full weight)
}

// pageCount is one part of a summary line, coloured like the rows it counts.
type pageCount struct {
	Class, Text string
}

// pageRow is one server (or backend-wide key) row.
type pageRow struct {
	api.ServerState
	Class string // ready, weight, ramping, drain, maint or withheld
	Label string // what the state cell says
	// Weight bar: shown for ready answers; BarPct is min(weight, 100)
	// and Over marks weights above 100%.
	HasWeight bool
	Weight    int
	BarPct    int
	Over      bool
	// Ramp progress (time elapsed of the ramp's duration) and its ETA.
	RampPct            int
	RampETA, RampETAAt string
	Since, SinceAt     string
	Until, UntilAt     string
	UntilPast          bool
	Told               string
	ToldClass          string // ok, warn, bad (withheld) or none
	ToldTitle          string // what Told counts
	ShortValue         string // the raw value when short and not JSON (the cells show the rest)
	Wildcard           bool
	Problem            bool   // not ready at 100%, or invalid
	Text               string // what the filter box matches, lower case
}

// pageInvalid is one invalid key in the list at the top.
type pageInvalid struct {
	Key, Value, Error, Effect string
}

func (h *httpAPI) page(w http.ResponseWriter, r *http.Request) {
	limit, err := parseLimit(r)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	ok, detail := h.o.Replica.Ready()
	now := time.Now
	if h.o.now != nil {
		now = h.o.now
	}
	// HAProxy nodes a ramp step behind, by backend/server.
	behind := map[string]int{}
	v := h.view(listQuery{limit: limit}, true, func(row api.ServerState, told map[string]int) {
		if n := stepsBehind(row, told); n > 0 {
			behind[row.Backend+"/"+row.Server] = n
		}
	})
	d := buildPage(now(), v, behind, h.o.Replica.ClusterInfo(), ok, detail)
	d.Nonce = newNonce()
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.Header().Set("Cache-Control", "no-store")
	w.Header().Set("Content-Security-Policy", "default-src 'none'; script-src 'nonce-"+d.Nonce+"'; "+
		"style-src 'unsafe-inline'; img-src data:; connect-src 'self'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	if err := writePage(w, d); err != nil {
		h.o.Logger.Warn("render status page", zap.Error(err))
	}
}

func newNonce() string {
	b := make([]byte, 16)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// stepsBehind counts the HAProxy nodes polling a ramping server that were
// last told an earlier step of its ramp (a lower weight, in rotation): at
// every step the answer changes, and each HAProxy hears the new one at its
// next check, an agent-inter later. That is the ramp working, not an
// HAProxy left behind. told counts the HAProxy nodes by the answer they
// were last told.
func stepsBehind(row api.ServerState, told map[string]int) int {
	if row.Kind != api.KindRamping {
		return 0
	}
	n := 0
	for answer, k := range told {
		if w, ok := readyWeight(answer); ok && w > 0 && w < row.Weight {
			n += k
		}
	}
	return n
}

// readyWeight is N of the wire answer "ready N%" an HAProxy was told (the
// polls keep the agent protocol's text).
func readyWeight(answer string) (int, bool) {
	w, ok := strings.CutPrefix(answer, "ready ")
	if !ok {
		return 0, false
	}
	n, err := strconv.Atoi(strings.TrimSuffix(w, "%"))
	return n, err == nil
}

// buildPage turns the cluster-wide view into what the page shows, at now.
// behind counts, by backend/server, the HAProxy nodes a ramp step behind.
func buildPage(now time.Time, v api.StateView, behind map[string]int, ci api.ClusterInfo, ready bool, readyDetail string) pageData {
	d := pageData{
		Generated: now, RefreshMS: pageRefresh.Milliseconds(),
		Served: ci.NodeID, ServedState: ci.State, Ready: ready, ReadyDetail: readyDetail,
		Leader: ci.LeaderID, Total: v.Total, InvalidTotal: v.InvalidTotal,
	}
	if d.ServedState == "" {
		d.ServedState = "unknown"
	}
	if ci.LeaderID == "" {
		d.Leaderless = "no leader"
		if ci.LeaderlessSeconds > 0 {
			d.Leaderless = "no leader for " + short(time.Duration(ci.LeaderlessSeconds*float64(time.Second)))
		}
	}
	for _, m := range ci.Members {
		d.Members = append(d.Members, member(m, ci.NodeID))
	}
	d.KV = kvLine(v.KV)
	d.Banners = banners(v, ci, ready, readyDetail)
	d.Migration = migrationLine(v.Migration)

	var all api.Rotation
	var counts []api.Rotation // by backend, as d.Backends
	outBackends := 0          // backends with servers, none in rotation
	byName := map[string]int{}
	var perBackend []int // rows by backend, as d.Backends
	for _, s := range v.Servers {
		i, ok := byName[s.Backend]
		if !ok {
			i = len(d.Backends)
			byName[s.Backend] = i
			d.Backends = append(d.Backends, pageBackend{Name: s.Backend})
			counts = append(counts, api.Rotation{})
			perBackend = append(perBackend, 0)
		}
		perBackend[i]++
	}
	// Each backend's rows in one slab, cut to their number: no growing
	// of a 600-byte row slice per backend.
	slab := make([]pageRow, 0, len(v.Servers))
	for i, n := range perBackend {
		d.Backends[i].Rows, slab = slab[:0:n], slab[n:n:cap(slab)]
	}
	for _, s := range v.Servers {
		i := byName[s.Backend]
		n := 0
		if len(behind) > 0 {
			n = behind[s.Backend+"/"+s.Server]
		}
		row := pageRowOf(now, s, n)
		d.Backends[i].Rows = append(d.Backends[i].Rows, row)
		if !row.Wildcard {
			counts[i].Add(s)
		}
	}
	for i := range d.Backends {
		c := counts[i]
		all.Merge(c)
		d.Backends[i].Summary, d.Backends[i].Class = summary(c)
		if c.Servers > 0 && c.In == 0 {
			outBackends++
		}
	}
	for _, k := range v.InvalidKeys {
		d.Invalid = append(d.Invalid, invalidOf(k))
	}
	d.Headline = headline(all, outBackends, len(d.Banners) > 0, v.InvalidTotal)
	if len(v.Servers) < v.Total {
		d.Cut = &pageCut{Shown: len(v.Servers), Total: v.Total, More: min(v.Total, api.MaxLimit), Max: api.MaxLimit}
	}
	d.Title, d.Icon = titleAndIcon(d)
	return d
}

func member(m api.MemberInfo, self string) pageMember {
	pm := pageMember{ID: m.ID, Address: m.Address, Suffrage: m.Suffrage, Self: m.ID == self, Class: "ok"}
	st := m.Status
	if st == nil {
		pm.State, pm.Class = "no answer", "bad"
		return pm
	}
	pm.State = st.State
	if m.Leader {
		pm.State = "leader"
	}
	if st.LastContact != "" && !m.Leader {
		pm.Contact = st.LastContact
		if d, err := time.ParseDuration(st.LastContact); err == nil {
			pm.Contact = fine(d)
			if d > 5*time.Second {
				pm.Class = "warn"
			}
		}
	}
	switch v := st.Verdict(); {
	case v.CanMirror():
		pm.Consul = "Consul ok"
	case v.Reason == api.MirrorConsulUnreachable:
		pm.Consul, pm.Class = "Consul unreachable", "bad"
	default:
		pm.Consul, pm.Class = "cannot mirror: "+string(v.Reason), "bad"
	}
	if pm.State != "leader" && pm.State != "follower" {
		pm.Class = "bad"
	}
	return pm
}

func kvLine(kv api.KVStatus) pageKV {
	l := pageKV{Class: "ok", Warning: kv.Warning, Index: kv.SyncedIndex}
	age := time.Duration(kv.SyncAgeSeconds * float64(time.Second))
	switch {
	case !kv.Known:
		l.Text = "Consul: unknown (no report from a leader)"
	case kv.Reachable:
		l.Text = "Consul: reachable"
	default:
		l.Text = "Consul: NOT reachable"
	}
	if kv.Synced {
		l.Age = "synced " + fine(age) + " ago"
	} else {
		l.Age = "never synced (" + short(age) + " since start)"
	}
	if kv.Warning != "" || !kv.Reachable {
		l.Class = "bad"
	}
	return l
}

// banners are the red lines above everything: what makes this view stale
// or partial.
func banners(v api.StateView, ci api.ClusterInfo, ready bool, detail string) []pageBanner {
	var out []pageBanner
	if w := v.KV.Warning; w != "" {
		b := pageBanner{Text: w}
		if ws := v.KV.Watch; ws != nil && ws.LastError != "" {
			b.Detail = "last error: " + ws.LastError
		}
		out = append(out, b)
	}
	for _, r := range v.Replicas {
		if !r.Answered {
			out = append(out, pageBanner{Text: "replica " + r.ID + " did not answer: servers and HAProxy nodes only it saw are missing from this page", Detail: r.Error})
		}
	}
	for _, m := range ci.Members {
		if m.Status == nil {
			continue
		}
		if v := m.Status.Verdict(); !v.CanMirror() && v.Reason != api.MirrorConsulUnreachable {
			who := "replica " + m.ID
			if m.Leader {
				who = "the raft leader " + m.ID
			}
			out = append(out, pageBanner{Text: who + " cannot mirror Consul (" + string(v.Reason) + "): as leader it applies nothing and hands leadership to a replica that can", Detail: v.Detail})
		}
	}
	if ci.LeaderID == "" && ci.NodeID != "" {
		out = append(out, pageBanner{Text: "no raft leader: replica " + ci.NodeID + " serves its last state; no KV change and no ramp step is applied"})
	}
	if !ready {
		out = append(out, pageBanner{Text: "replica " + ci.NodeID + " is NOT READY", Detail: detail})
	} else if c := ci.Confirm.NotAnswering; c != "" {
		out = append(out, pageBanner{Text: "replica " + ci.NodeID + " answers HAProxy nothing: " + c})
	}
	if !v.HoldsState {
		out = append(out, pageBanner{Text: "replica " + ci.NodeID + " holds no state yet: it answers HAProxy nothing"})
	}
	return out
}

// summary is a backend's line, in the words of every command
// (api.Rotation): "3 of 5 in rotation", how many of those ramp or hold a
// weight, then each server out of rotation by reason; the parts add up. A
// backend with servers but none in rotation (a backend-wide drain, say)
// is classed bad and says that it takes no traffic.
func summary(c api.Rotation) ([]pageCount, string) {
	class := "ok"
	if c.In < c.Servers || c.Ramping+c.Weighted > 0 {
		class = "warn"
	}
	if c.Servers == 0 {
		return []pageCount{{"none", "no server known (only a backend-wide key)"}}, class
	}
	var out []pageCount
	for i, p := range c.Parts(false) {
		out = append(out, pageCount{countClass(p.Class), p.Text})
		if i == 0 && c.In == 0 {
			class = "bad"
			out = append(out, pageCount{"none", "no server in rotation: HAProxy sends this backend no traffic"})
		}
	}
	return out, class
}

// countClass is the page's class for a part of an api.Rotation: a server
// at 0% looks drained (HAProxy shows it as DRAIN), a withheld one that
// HAProxy keeps at its last answer looks withheld.
func countClass(c string) string {
	switch c {
	case "zero":
		return "drain"
	case "kept":
		return "withheld"
	}
	return c
}

// headline is the fleet's line at the top of the page: the rotation line
// of `hastate status` (the same words, numbers that add up), after the
// backends that take no traffic and before the invalid keys.
func headline(all api.Rotation, outBackends int, banner bool, invalid int) pageHeadline {
	h := pageHeadline{Class: "ok"}
	switch {
	case all.Servers == 0:
		h.Text = "no servers known yet (none has a key, and no HAProxy has asked)"
	case all.Full() && invalid == 0:
		h.Text = fmt.Sprintf("all %s in rotation at full weight", plural(all.Servers, "server", "servers"))
	default:
		h.Class = "warn"
		h.Text = all.String()
		if outBackends > 0 {
			// First: it is what takes a service down.
			h.Text = plural(outBackends, "backend", "backends") + " with no server in rotation; " + h.Text
		}
		if invalid > 0 {
			h.Text += "; " + plural(invalid, "invalid key", "invalid keys")
		}
	}
	if banner {
		h.Class = "bad"
	}
	return h
}

func plural(n int, one, many string) string { return api.Plural(n, one, many) }

// pageRowOf classifies one server row and renders its times at now.
// behind is how many of its HAProxy nodes are a ramp step behind.
func pageRowOf(now time.Time, s api.ServerState, behind int) pageRow {
	r := pageRow{ServerState: s, Wildcard: s.Server == "*"}
	switch s.Kind {
	case api.KindWithheld:
		// HAProxy keeps what it was last told: say it (the counts count
		// it there, api.Rotation).
		r.Class, r.Label = "withheld", "withheld: HAProxy keeps its own state (never told)"
		if s.Keeps != "" {
			r.Label = "withheld: HAProxy keeps " + s.Keeps
			if k, w := s.KeptKind(); k != api.KindDrain && k != api.KindMaint {
				r.HasWeight, r.Weight, r.BarPct, r.Over = true, w, min(w, 100), w > 100
			}
		}
	case api.KindDrain:
		r.Class, r.Label = "drain", "drain"
	case api.KindMaint:
		r.Class, r.Label = "maint", "maint"
	default:
		w := s.Weight
		r.HasWeight, r.Weight, r.BarPct, r.Over = true, w, min(w, 100), w > 100
		switch s.Kind {
		case api.KindRamping:
			r.Class, r.Label = "ramping", "ramping"
		case api.KindWeight:
			r.Class, r.Label = "weight", "weight"
		default:
			r.Class, r.Label = "ready", "ready"
		}
	}
	if rp := s.Ramping; rp != nil {
		if total := rp.ETA.Sub(rp.Started); total > 0 {
			r.RampPct = int(min(max(now.Sub(rp.Started)*100/total, 0), 100))
		}
		r.RampETA, r.RampETAAt = relative(now, rp.ETA), absolute(rp.ETA)
	}
	if s.Since != nil {
		r.Since, r.SinceAt = relative(now, *s.Since), absolute(*s.Since)
	}
	if s.Until != nil {
		r.Until, r.UntilAt, r.UntilPast = relative(now, *s.Until), absolute(*s.Until), !s.Until.After(now)
	}
	r.ToldTitle = "HAProxy nodes that asked within the last minute, and how many were last told the current answer"
	switch {
	case s.Polled == 0:
		r.Told, r.ToldClass = "not polled", "none"
	case s.Kind == api.KindWithheld:
		// Told counts those told nothing: that is no "told".
		r.Told, r.ToldClass = countOf("told nothing: ", s.Told, s.Polled), "bad"
		r.ToldTitle = "HAProxy nodes that asked within the last minute, and how many got no answer (each keeps the state it had)"
	case s.Kind == api.KindRamping && s.Told+behind == s.Polled:
		// Stable over the ramp's steps: one HAProxy or another is always
		// a step behind for an agent-inter after each.
		r.Told, r.ToldClass = countOf("on the ramp: ", s.Polled, s.Polled), "ok"
		r.ToldTitle = "HAProxy nodes that asked within the last minute, all told the current step of the ramp"
		if behind > 0 {
			r.ToldTitle = fmt.Sprintf("HAProxy nodes that asked within the last minute: told the current step of the ramp, or (%d of them) an earlier one; each hears the next step at its next check", behind)
		}
	case s.Told == s.Polled:
		r.Told, r.ToldClass = countOf("told ", s.Told, s.Polled), "ok"
	default:
		r.Told, r.ToldClass = countOf("told ", s.Told, s.Polled), "warn"
	}
	if len(s.Value) <= 24 && !strings.HasPrefix(s.Value, "{") {
		r.ShortValue = s.Value
	}
	// An expired key is no problem (its --for did what it was for): the
	// row says "expired", and `hastate clear --expired` removes the key.
	r.Problem = r.Class != "ready" || !s.Valid
	words := []string{s.Backend + "/" + s.Server, r.Class, s.Answer, s.Reason, s.By, s.Key, s.Value, s.Note}
	if !s.Valid {
		words = append(words, "invalid", s.Error)
	}
	if s.Expired != "" {
		words = append(words, "expired")
	}
	r.Text = strings.ToLower(strings.Join(words, " "))
	return r
}

// countOf is fmt.Sprintf(what+"%d of %d", n, of), without fmt: a page
// of 1,000 rows writes one a row.
func countOf(what string, n, of int) string {
	var buf [64]byte
	b := strconv.AppendInt(append(buf[:0], what...), int64(n), 10)
	return string(strconv.AppendInt(append(b, " of "...), int64(of), 10))
}

func invalidOf(k api.ServerState) pageInvalid {
	p := pageInvalid{Key: k.Key, Value: k.Value, Error: k.Error}
	if p.Key == "" {
		p.Key = k.Source
	}
	switch {
	case k.Backend == "" && k.Note != "":
		p.Effect = k.Note // a configuration key: config/ramp
	case k.Backend == "":
		p.Effect = "ignored: not a state/<backend>/<server> key"
	case k.Withheld:
		p.Effect = "no valid value yet: " + k.Backend + "/" + k.Server + " is answered nothing (HAProxy keeps its state)"
	default:
		p.Effect = "keeps its last valid value: " + k.Answer
	}
	return p
}

// relative says how far t is from now, compactly: "12s ago", "2h 5m ago",
// "in 3m".
func relative(now, t time.Time) string {
	d := now.Sub(t)
	if d < 0 {
		return "in " + short(-d)
	}
	if d < time.Second {
		return "just now"
	}
	return short(d) + " ago"
}

// short renders d with at most two units: 45s, 3m 20s, 2h 5m, 3d 4h.
func short(d time.Duration) string {
	switch d = d.Round(time.Second); {
	case d < time.Minute:
		return strconv.Itoa(int(d.Seconds())) + "s"
	case d < time.Hour:
		return two(int(d/time.Minute), "m", int(d%time.Minute/time.Second), "s")
	case d < 48*time.Hour:
		return two(int(d/time.Hour), "h", int(d%time.Hour/time.Minute), "m")
	default:
		return two(int(d/(24*time.Hour)), "d", int(d%(24*time.Hour)/time.Hour), "h")
	}
}

// fine is short, but with milliseconds under a second: 12ms, 400ms, 3s.
func fine(d time.Duration) string {
	if d < time.Second {
		return d.Round(time.Millisecond).String()
	}
	return short(d)
}

func two(a int, au string, b int, bu string) string {
	if b == 0 {
		return strconv.Itoa(a) + au
	}
	return strconv.Itoa(a) + au + " " + strconv.Itoa(b) + bu
}

func absolute(t time.Time) string { return t.UTC().Format("2006-01-02 15:04:05 UTC") }

// titleAndIcon make the browser tab tell the state: a title that counts
// what is off and a dot coloured like the headline.
func titleAndIcon(d pageData) (string, template.URL) {
	title := "hastate: " + d.Headline.Text
	if len(d.Banners) > 0 {
		title = "(!) " + title
	}
	colour := map[string]string{"ok": "%2316a34a", "warn": "%23d97706", "bad": "%23dc2626"}[d.Headline.Class]
	icon := "data:image/svg+xml," + "%3Csvg xmlns='http://www.w3.org/2000/svg' viewBox='0 0 16 16'%3E%3Ccircle cx='8' cy='8' r='7' fill='" +
		colour + "'/%3E%3C/svg%3E"
	return title, template.URL(icon)
}

// migrationLine is the header's line for a marked migration ("": none).
func migrationLine(m *api.Migration) string {
	if m == nil {
		return ""
	}
	return m.String()
}
