package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/user"
	"strings"
	"time"

	"github.com/hastate/hastate/api"
	"github.com/hastate/hastate/internal/ctl"
	"github.com/spf13/cobra"
)

// consulFlags are shared by the commands that talk to Consul.
type consulFlags struct {
	consulAddr, prefix string
}

func (w *consulFlags) add(c *cobra.Command) {
	c.Flags().StringVar(&w.consulAddr, "consul-addr", "", "Consul HTTP address (default CONSUL_HTTP_ADDR, else 127.0.0.1:8500)")
	c.Flags().StringVar(&w.prefix, "kv-prefix", "hastate/", "Consul KV prefix (also HASTATE_KV_PREFIX)")
}

func (w *consulFlags) writer() (ctl.Writer, error) { return ctl.NewWriter(w.consulAddr, w.prefix) }

// writeFlags are the flags of every write command.
type writeFlags struct {
	consulFlags
	addr             string
	dryRun, force    bool
	override         bool
	minReady         int
	reason, by, ramp string
	forDur           time.Duration
}

// add adds the flags; audit adds --reason, --by and --for, ramp --ramp.
func (w *writeFlags) add(c *cobra.Command, audit, ramp bool) {
	w.consulFlags.add(c)
	replicaFlag(c, &w.addr)
	f := c.Flags()
	f.BoolVar(&w.dryRun, "dry-run", false, "print the transaction and write nothing")
	f.BoolVar(&w.force, "force", false, "skip the checks: a server no HAProxy polls, --min-ready, a replica that does not answer")
	if !audit {
		return
	}
	f.BoolVar(&w.override, "override", false, "with <backend>/*: also clear the own keys of the backend's servers, so that the backend-wide key reaches them")
	f.IntVar(&w.minReady, "min-ready", 1, "refuse to drain or maint single servers when that leaves a backend with fewer ready servers (among those HAProxy polls)")
	f.StringVar(&w.reason, "reason", "", "why, shown in status")
	f.StringVar(&w.by, "by", osUser(), "who, shown in status")
	f.DurationVar(&w.forDur, "for", 0, "the state expires after this long (e.g. 2h): hastate then treats the key as absent, through a ramp after a drain")
	if ramp {
		f.StringVar(&w.ramp, "ramp", "", `undrain ramp duration for these keys, e.g. 10m ("0": no ramp)`)
	}
}

func osUser() string {
	if u, err := user.Current(); err == nil && u.Username != "" {
		return u.Username
	}
	return os.Getenv("USER")
}

// runWrite plans a write against the servers the cluster knows and writes
// it as one Consul transaction (or prints it with --dry-run).
func (w *writeFlags) run(c *cobra.Command, stdout io.Writer, command, value string, args []string) error {
	sels, err := ctl.ParseSelectors(args)
	if err != nil {
		return err
	}
	wr, err := w.writer()
	if err != nil {
		return err
	}
	ctx := c.Context()
	var fleet *api.StateView
	r, err := ctl.NewReplica(w.addr)
	if err != nil {
		return err
	}
	// The checks read the cluster's view once it holds every write made
	// so far (a drain written a moment ago counts for --min-ready). With
	// --force there are no checks: the view only expands globs, and the
	// write must not wait for a replica that cannot sync.
	var (
		v    api.StateView
		ferr error
	)
	if w.force {
		fctx, cancel := context.WithTimeout(ctx, forcedRead)
		v, ferr = r.Fleet(fctx)
		cancel()
	} else if ferr = (ctl.GateOptions{Consul: wr.Client, ConsulAddr: wr.Addr, Prefix: wr.Prefix, Replica: r}).WaitSynced(ctx); ferr == nil {
		v, ferr = r.Fleet(ctx)
	}
	switch {
	case ferr == nil:
		fleet = &v
	case !w.force:
		return fmt.Errorf("%w; the replica tells which servers exist and who polls them (nothing was written; --force writes literal <backend>/<server> keys without it)", ferr)
	default:
		fmt.Fprintf(c.ErrOrStderr(), "warning: %v; --force: writing without checks\n", ferr)
	}
	plan, err := ctl.PlanWrite(fleet, sels, ctl.WriteOptions{Command: command, Value: value, Prefix: wr.Prefix,
		Force: w.force, Override: w.override, MinReady: w.minReady})
	if err != nil {
		return err
	}
	if command == "clear" {
		if err := wr.DropAbsent(ctx, &plan); err != nil {
			return err
		}
	}
	switch {
	case len(plan.Ops) == 0:
		fmt.Fprintf(stdout, "%s: nothing to write\n", command)
	case w.dryRun:
		fmt.Fprintf(stdout, "%s (dry run, nothing written): %s in one transaction:\n", command, keys(len(plan.Ops)))
	default:
		if err := wr.Apply(ctx, plan); err != nil {
			return err
		}
		fmt.Fprintf(stdout, "%s: %s written in one Consul transaction:\n", command, keys(len(plan.Ops)))
	}
	plan.Print(stdout)
	return nil
}

// forcedRead bounds the replica read of a --force write, so that a hung
// replica leaves the write its time.
const forcedRead = 2 * time.Second

func keys(n int) string {
	if n == 1 {
		return "1 key"
	}
	return fmt.Sprintf("%d keys", n)
}

const selectorHelp = `Selectors expand against the servers the cluster knows (KV keys and what
HAProxy polled, over every replica), into one Consul transaction:
  backend/server   that server's key (refused when no HAProxy polls it; --force)
  backend/*        the backend-wide key: every server without a key of its own
  'glob/*'         one backend-wide key per known backend that matches (canary_*/*)
  'glob/glob'      one key per known server that matches (*/gke-cny-web, */*-us-east1-b)
Quote globs so that the shell leaves them alone.`

func setCmd(st string, stdout io.Writer) *cobra.Command {
	var w writeFlags
	var df drainFirstFlags
	c := &cobra.Command{
		Use: st + " <selector>...",
		Short: map[string]string{"drain": "Drain servers: no new sessions, existing ones finish",
			"maint": "Put servers in maintenance: no traffic at all", "ready": "Mark servers ready (overrides a backend-wide key)"}[st],
		Long: selectorHelp,
		Example: fmt.Sprintf(`  hastate %[1]s canary_web/gke-cny-web --reason "zonal maintenance" --for 2h
  hastate %[1]s 'canary_*/*' --reason "release 16.4"     # every canary backend
  hastate %[1]s '*/gke-cny-web' --dry-run                # that server in every backend`, st),
		Args: needArgs(1, 0, "at least one <backend>/<server> selector, e.g. canary_web/gke-cny-web"),
		RunE: func(c *cobra.Command, args []string) error {
			if df.on {
				return drainFirst(c, &w, &df.prom, df.idleTimeout, stdout, args)
			}
			val, err := ctl.Value(st, ctl.ValueOptions{Reason: w.reason, By: w.by, Ramp: w.ramp, For: w.forDur, Now: time.Now()})
			if err != nil {
				return err
			}
			return w.run(c, stdout, st, val, args)
		},
	}
	w.add(c, true, true)
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
		Long:  selectorHelp,
		Example: `  hastate weight 25% canary_web/gke-cny-web canary_web/gke-cny-api
  hastate weight 50% 'canary_*/*' --for 1h`,
		Args: needArgs(2, 0, "a weight and at least one selector, e.g. hastate weight 25% canary_web/gke-cny-web"),
		RunE: func(c *cobra.Command, args []string) error {
			pct, err := ctl.ParseWeight(args[0])
			if err != nil {
				return err
			}
			val, err := ctl.Value(pct, ctl.ValueOptions{Reason: w.reason, By: w.by, For: w.forDur, Now: time.Now()})
			if err != nil {
				return err
			}
			return w.run(c, stdout, "weight "+pct, val, args[1:])
		},
	}
	w.add(c, true, false)
	// "weight -5% web/a" reads -5% as flags: say what is wrong instead.
	c.SetFlagErrorFunc(func(c *cobra.Command, err error) error {
		// pflag says: unknown shorthand flag: '5' in -5%
		if _, arg, ok := strings.Cut(err.Error(), " in -"); ok && arg != "" && arg[0] >= '0' && arg[0] <= '9' {
			_, werr := ctl.ParseWeight("-" + arg)
			return werr
		}
		return usageError(c, err)
	})
	return c
}

func clearCmd(stdout io.Writer) *cobra.Command {
	var w writeFlags
	c := &cobra.Command{
		Use:   "clear <selector>...",
		Short: "Delete servers' keys: they fall back to the backend-wide key, else ready",
		Long:  selectorHelp + "\nKeys that do not exist are left out (\"nothing to clear\").",
		Example: `  hastate clear canary_web/gke-cny-web canary_web/*
  hastate clear '*/gke-cny-web' --dry-run`,
		Args: needArgs(1, 0, "at least one <backend>/<server> selector"),
		RunE: func(c *cobra.Command, args []string) error {
			return w.run(c, stdout, "clear", "", args)
		},
	}
	w.add(c, false, false)
	return c
}
