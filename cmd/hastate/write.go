package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/user"
	"strings"
	"time"

	"github.com/hastate/hastate/cmd/hastate/internal/ctl"
	"github.com/hastate/hastate/cmd/hastate/internal/ctl/fleet"
	"github.com/hastate/hastate/cmd/hastate/internal/ctl/write"
	"github.com/hastate/hastate/state"
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
)

// consulFlags are shared by the commands that talk to Consul.
type consulFlags struct {
	consulAddr, prefix string
}

func (w *consulFlags) add(c *cobra.Command) {
	c.Flags().StringVar(&w.consulAddr, "consul-addr", "", "Consul HTTP address (default CONSUL_HTTP_ADDR, else 127.0.0.1:8500)")
	c.Flags().StringVar(&w.prefix, "kv-prefix", "hastate/", "Consul KV prefix (also HASTATE_KV_PREFIX)")
}

func (w *consulFlags) writer() (write.Writer, error) { return write.NewWriter(w.consulAddr, w.prefix) }

// writeFlags are the flags of every write command.
type writeFlags struct {
	consulFlags
	addr              string
	dryRun, force     bool
	allow             write.Allow
	override, keepOwn bool
	minReady          int
	reason, by, ramp  string
	forDur            time.Duration
}

// writeKind says which flags a write command has: audit adds --reason,
// --by, --for and --override; ramp adds --ramp; takesOut (drain, maint,
// weight, which may take servers out) adds --min-ready and --keep-own.
type writeKind struct{ audit, ramp, takesOut bool }

func (w *writeFlags) add(c *cobra.Command, k writeKind) {
	w.consulFlags.add(c)
	replicaFlag(c, &w.addr)
	f := c.Flags()
	f.BoolVar(&w.dryRun, "dry-run", false, "print the transaction and write nothing")
	f.BoolVar(&w.allow.Unknown, "allow-unknown", false, "write for a server no HAProxy has polled in the last minute, or a backend the cluster does not know (the typo guard)")
	f.BoolVar(&w.allow.NoReplica, "allow-no-replica", false, "write although no replica can be asked, an HAProxy that polled recently is seen by no replica that answers, or the replica did not catch up with Consul in time: "+
		"literal <backend>/<server> only, still decided from Consul; the wait for the replica takes at most half of --timeout")
	lifts := "--allow-unknown and --allow-no-replica"
	if k.takesOut {
		f.BoolVar(&w.allow.BelowMinReady, "allow-below-min-ready", false, "take single servers out even when that leaves a backend with fewer than --min-ready ready servers")
		lifts = "--allow-unknown, --allow-below-min-ready and --allow-no-replica"
	}
	f.BoolVar(&w.force, "force", false, "lift every guard: "+lifts+" (each lifted guard is named in the output and in the meta key); not the partial-backend refusal, which takes --override or --keep-own")
	if k.takesOut {
		f.IntVar(&w.minReady, "min-ready", 1, "refuse to take single servers out (drain, maint, 0%) when that leaves a backend with fewer ready servers (among those HAProxy polls; 0% is not ready)")
		f.BoolVar(&w.keepOwn, "keep-own", false, "with <backend>/*: leave the servers whose own key keeps them out of it (they are named), instead of refusing")
	}
	if !k.audit {
		return
	}
	f.BoolVar(&w.override, "override", false, "with <backend>/*: also clear the own keys of the backend's servers, so that the backend-wide key reaches them")
	f.StringVar(&w.reason, "reason", "", "why, shown in status")
	f.StringVar(&w.by, "by", osUser(), "who, shown in status")
	f.Var(ctl.DurationFlag{D: &w.forDur, Name: "--for"}, "for", "the state expires after this long (e.g. 2h): hastate then treats the key as absent, through a ramp after a drain; leave it out for a state that stays until cleared")
	// --for 0 is no duration: refused, not taken as "no expiry" in
	// silence (issue 35).
	c.PreRunE = func(c *cobra.Command, _ []string) error {
		if err := bindEnv(c.Flags()); err != nil { // HASTATE_FOR=0 too
			return err
		}
		if c.Flags().Changed("for") && w.forDur == 0 {
			return usageError(c, errors.New("--for 0 is no duration: give one such as --for 2h, or leave --for out to write a state that stays until it is cleared (hastate clear)"))
		}
		return nil
	}
	if k.ramp {
		f.StringVar(&w.ramp, "ramp", "", `undrain ramp duration for these keys, e.g. 10m ("0": no ramp)`)
	}
}

// allowed is what the flags lift: --force, every guard.
func (w *writeFlags) allowed() write.Allow {
	if w.force {
		return write.AllowForce()
	}
	return w.allow
}

func osUser() string {
	if u, err := user.Current(); err == nil && u.Username != "" {
		return u.Username
	}
	return os.Getenv("USER")
}

// run runs a write command (write.Write: wait for sync, read the fleet, plan,
// drop absent keys, apply) and prints what it did.
func (w *writeFlags) run(c *cobra.Command, stdout io.Writer, command, value string, args []string) error {
	req, err := w.request(command, args)
	if err != nil {
		return err
	}
	req.Value = value
	plan, err := write.Write(c.Context(), req)
	if err != nil {
		if req.DryRun {
			plan.ReportRefused(stdout)
		}
		return err
	}
	if w.forDur > 0 || w.ramp != "" {
		plan.Notes = append(plan.Notes, metaWaits(c.Context(), req.Replica)...)
	}
	plan.Report(stdout)
	return nil
}

// request is the write request the flags and arguments make (its Value
// is the caller's).
func (w *writeFlags) request(command string, args []string) (write.Request, error) {
	sels, err := ctl.ParseSelectorsIn(w.prefix, args)
	if err != nil {
		return write.Request{}, err
	}
	wr, err := w.writer()
	if err != nil {
		return write.Request{}, err
	}
	r, err := fleet.NewReplica(w.addr)
	if err != nil {
		return write.Request{}, err
	}
	return write.Request{
		Options:   write.Options{Command: command, Allow: w.allowed(), Override: w.override, KeepOwn: w.keepOwn, MinReady: w.minReady},
		Selectors: sels, DryRun: w.dryRun, Writer: wr, Replica: r,
	}, nil
}

const selectorHelp = `Selectors expand against the servers the cluster knows (KV keys and what
HAProxy polled, over every replica), into one Consul transaction:
  backend/server   that server's key (refused when no HAProxy polls it; --allow-unknown)
  backend          the same as backend/*
  backend/*        the backend-wide key: every server without a key of its own
  'glob/*'         one backend-wide key per known backend that matches (canary_*/*)
  'glob/glob'      one key per known server that matches (*/gke-cny-web, */*-us-east1-b)
Quote globs so that the shell leaves them alone. A selector that matches
nothing exits 3 and lists the known backends.`

// guardHelp is what a write command says about its checks; takesOut adds
// the capacity guard (drain, maint, weight).
func guardHelp(takesOut bool) string {
	h := guardText
	if !takesOut {
		h = strings.ReplaceAll(h, "  --allow-below-min-ready   drain/maint/0% of single servers below --min-ready\n", "")
		h = strings.ReplaceAll(h, "A backend-wide drain/maint/0% that servers with their own key would escape\nneeds --override or --keep-own; --force does not choose for you.\n", "")
		h = strings.ReplaceAll(h, "  --force                   all three", "  --force                   both")
	}
	return h
}

const guardText = `Before anything else a write checks that the replica (HASTATE_ADDR) reads
the same KV prefix of the same Consul cluster, and refuses a mismatch naming
both. Which keys exist and which backend-wide key covers a server come from
a consistent Consul read, and the transaction is conditional on them: a
concurrent write is read again (a few times), never overwritten. The replica
tells who polls which server and capacity, once it has applied what was read.
Each guard has its own override, and the output names every guard lifted
(so does the meta key):
  --allow-unknown           a server no HAProxy polls (a typo?), an unknown backend
  --allow-below-min-ready   drain/maint/0% of single servers below --min-ready
  --allow-no-replica        no replica to ask, or one that did not catch up in time
  --force                   all three
A backend-wide drain/maint/0% that servers with their own key would escape
needs --override or --keep-own; --force does not choose for you.
Exit codes: 0 written (or nothing to write), 1 refused, 2 usage, 3 no match,
4 cannot confirm (Consul or the replica could not be read well enough),
5 permission denied: Consul refused the token (none set, the read token, a
token on another prefix); the error names the rule that would allow it and
nothing was written.`

// setHelp is what drain, maint and ready say about themselves.
var setHelp = map[string]struct{ short, long, example string }{
	"drain": {
		short: "Drain servers: no new sessions, existing ones finish",
		long: `drain writes "drain" for the selected servers. A backend-wide drain that
servers with their own key would escape (they keep serving) is refused
unless --override (clear their keys in the same transaction) or --keep-own
(leave them, named in the output). Draining single servers is refused when
it leaves a backend with fewer than --min-ready ready servers.`,
		example: `  hastate drain canary_web/gke-cny-web --reason "zonal maintenance" --for 2h
  hastate drain 'canary_*/*' --reason "release 16.4" --override   # every canary backend
  hastate drain '*/gke-cny-web' --dry-run                         # that server in every backend
  hastate drain canary_web/web-9 --allow-unknown                  # not in haproxy.cfg yet
  hastate drain main_web/m-1 --allow-below-min-ready              # the last ready server, on purpose
  HASTATE_ADDR=hastate-1:9778 hastate drain main_web/m-2 --allow-no-replica   # a replica is down for an upgrade`,
	},
	"maint": {
		short: "Put servers in maintenance: no traffic at all",
		long: `maint writes "maint" for the selected servers: HAProxy sends them nothing,
and health checks stop. A backend-wide maint that servers with their own
key would escape is refused unless --override or --keep-own; single servers
are refused below --min-ready.`,
		example: `  hastate maint canary_web/gke-cny-web --reason "kernel upgrade" --for 1h
  hastate maint main_web --override --reason "backend retired"   # main_web/*, own keys cleared`,
	},
	"ready": {
		short: "Make servers ready again (undrain; a ramp brings the weight back)",
		long: `ready deletes a server's own key when no backend-wide key covers it (an
absent key is ready, and later backend-wide drains reach the server again).
Under a backend-wide key it writes "ready", and says that the server now
stays out of backend-wide drains until "hastate clear". A drained server
ramps back up (--ramp sets the ramp for these keys; the key then stays).`,
		example: `  hastate ready canary_web/gke-cny-web
  hastate ready 'canary_*/*'                          # every canary backend: their backend-wide keys
  hastate ready main_web/m-1 --ramp 10m --dry-run     # undrain over 10 minutes`,
	},
}

func setCmd(st string, stdout io.Writer) *cobra.Command {
	var w writeFlags
	h := setHelp[st]
	var df drainFirstFlags
	c := &cobra.Command{
		Use:     st + " <selector>...",
		Short:   h.short,
		Long:    h.short + ".\n\n" + h.long + "\n\n" + selectorHelp + "\n\n" + guardHelp(st != "ready"),
		Example: h.example,
		Args:    argCount(cobra.MinimumNArgs(1), "at least one <backend>/<server> selector, e.g. canary_web/gke-cny-web"),
		RunE: func(c *cobra.Command, args []string) error {
			if df.on {
				return drainFirst(c, &w, &df.prom, df.idleTimeout, stdout, args)
			}
			val, err := write.Value(st, write.ValueOptions{Reason: w.reason, By: w.by, Ramp: w.ramp, For: w.forDur, Now: time.Now()})
			if err != nil {
				return err
			}
			return w.run(c, stdout, st, val, args)
		},
	}
	w.add(c, writeKind{audit: true, ramp: true, takesOut: st != "ready"})
	if st == "maint" {
		df.add(c)
	}
	return c
}

func weightCmd(stdout io.Writer) *cobra.Command {
	var w writeFlags
	c := &cobra.Command{
		Use:   "weight <N>% <selector>...",
		Short: "Set servers ready at N% of their configured weight (0..256)",
		Long: `Set servers ready at N% of their configured weight (0..256).

The weight takes its %: a bare 25 is refused (HAProxy's own weights are
absolute, so 25 could mean either), as a duration takes its unit (--for 2h,
not --for 2). The plan shows what each key held before.

0% takes servers out of rotation (HAProxy shows it as DRAIN): it is refused
below --min-ready like a drain, precheck blocks on it, and a backend-wide
0% that own keys would escape needs --override or --keep-own.

` + selectorHelp + "\n\n" + guardHelp(true),
		Example: `  hastate weight 25% canary_web/gke-cny-web canary_web/gke-cny-api
  hastate weight 50% 'canary_*/*' --for 1h`,
		Args: argCount(cobra.MinimumNArgs(2), "a weight and at least one selector, e.g. hastate weight 25% canary_web/gke-cny-web"),
		RunE: func(c *cobra.Command, args []string) error {
			pct, err := write.ParseWeight(args[0])
			if err != nil {
				return err
			}
			val, err := write.Value(pct, write.ValueOptions{Reason: w.reason, By: w.by, For: w.forDur, Now: time.Now()})
			if err != nil {
				return err
			}
			return w.run(c, stdout, "weight "+pct, val, args[1:])
		},
	}
	w.add(c, writeKind{audit: true, takesOut: true})
	// "weight -5% web/a" reads -5% as flags: say what is wrong instead.
	c.SetFlagErrorFunc(func(c *cobra.Command, err error) error {
		var unknown *pflag.NotExistError
		if errors.As(err, &unknown) {
			if short := unknown.GetSpecifiedShortnames(); short != "" && short[0] >= '0' && short[0] <= '9' {
				_, werr := write.ParseWeight("-" + short)
				return werr
			}
		}
		return usageError(c, err)
	})
	return c
}

func clearCmd(stdout io.Writer) *cobra.Command {
	var w writeFlags
	var expired, ramped bool
	c := &cobra.Command{
		Use:   "clear <selector>... | clear --expired|--ramped [<selector>...]",
		Short: "Delete servers' keys: they fall back to the backend-wide key, else ready",
		Long: `Delete servers' keys: they fall back to the backend-wide key, else ready.

Keys that do not exist are left out ("nothing to clear"). A key that no
selector can name (more than one '/', a control character) is removed with
the consul CLI: consul kv delete '<kv-prefix>state/<the key>'.

--expired deletes only the keys whose --for has passed (every such key of
the prefix, or of the selectors; <backend>/* includes the backend-wide
key), with their meta keys, in one Consul transaction conditional on each
key's index: a key written again meanwhile is read again, never deleted.
hastate already treats such keys as absent, so no answer changes; status
stops listing them as expired, and migration start no longer refuses
them. A key counts only when the cluster shows it expired too (the
leader's clock decides, not this machine's).

--ramped deletes the keys "hastate ready --ramp" leaves holding ready once
their ramp is done (the same way: every such key, or the selectors', with
its meta key, in one conditional transaction), where that changes no
answer: a server's own ready key under a backend-wide key is left, named
(it keeps the server out of that key), as is one whose ramp still runs.

` + selectorHelp + "\n\n" + guardHelp(false),
		Example: `  hastate clear canary_web/gke-cny-web 'canary_web/*'
  hastate clear 'canary_web/web 3'                 # a server name with a space
  hastate clear '*/gke-cny-web' --dry-run
  hastate clear --expired                          # every key whose --for has passed
  hastate clear --expired 'canary_*/*' --dry-run
  hastate clear --ramped                           # the ready keys ready --ramp left, once ramped`,
		Args: func(c *cobra.Command, args []string) error {
			if expired && ramped {
				return usageError(c, errors.New("--expired and --ramped: give one (run clear twice for both)"))
			}
			if expired || ramped {
				return nil
			}
			return argCount(cobra.MinimumNArgs(1), "at least one <backend>/<server> selector (or --expired, --ramped)")(c, args)
		},
		RunE: func(c *cobra.Command, args []string) error {
			if expired || ramped {
				return w.clearExpired(c, stdout, args, ramped)
			}
			return w.run(c, stdout, "clear", "", args)
		},
	}
	w.add(c, writeKind{})
	c.Flags().BoolVar(&expired, "expired", false, "delete only the keys whose --for has passed (all of them, or those of the selectors), in one conditional transaction")
	c.Flags().BoolVar(&ramped, "ramped", false, "delete only the keys ready --ramp left holding ready, once their ramp is done and where that changes no answer")
	return c
}

// clearExpired runs clear --expired, or with ramped clear --ramped.
func (w *writeFlags) clearExpired(c *cobra.Command, stdout io.Writer, args []string, ramped bool) error {
	var sels []ctl.Selector // none: every key of the prefix
	if len(args) > 0 {
		var err error
		if sels, err = ctl.ParseSelectorsIn(w.prefix, args); err != nil {
			return err
		}
	}
	wr, err := w.writer()
	if err != nil {
		return err
	}
	r, err := fleet.NewReplica(w.addr)
	if err != nil {
		return err
	}
	res, err := write.ClearExpired(c.Context(), write.ClearExpiredOptions{Writer: wr, Replica: r, Selectors: sels, Now: time.Now(), DryRun: w.dryRun, Ramped: ramped})
	if err != nil {
		return err
	}
	res.Report(stdout)
	return nil
}

// metaWaits says, when the cluster's feature level is below
// state.LevelMeta (a replica still runs 0.13.0), that --for and --ramp
// wait: the meta key records them, but they count only from that level.
func metaWaits(ctx context.Context, r *fleet.Replica) []string {
	in, err := r.Cluster(ctx)
	if err != nil || in.Level.Applied >= state.LevelMeta {
		return nil
	}
	why := in.Level.Waiting
	if why == "" {
		why = "replica " + r.Addr() + " runs 0.13.0 or older"
	}
	return []string{fmt.Sprintf("--for and --ramp are in the meta key, but count only from feature level %d (the cluster is at %d: %s); "+
		"until then the state does not expire and undrains with the policy's ramp, on every replica alike", state.LevelMeta, max(in.Level.Applied, state.LevelBase), why)}
}
