// Package nemesis draws the fault schedule of the fault-injection test
// (test/nemesis_e2e_test.go) from a seed: which fault, on which replica,
// when and for how long. The same seed gives the same schedule, so a run
// that found a violation can be repeated (HASTATE_NEMESIS_SEED).
package nemesis

import (
	"fmt"
	"math/rand/v2"
	"strconv"
	"time"
)

// Kind is a kind of fault.
type Kind string

const (
	Kill   Kind = "kill"   // SIGKILL a replica; start it again when the fault ends
	Pause  Kind = "pause"  // SIGSTOP a replica; SIGCONT when the fault ends
	Cut    Kind = "cut"    // cut every raft link from and to a replica; heal them when the fault ends
	Consul Kind = "consul" // SIGKILL Consul; start it again (same data) when the fault ends
	// PauseLong: SIGSTOP the leader for longer than the election timeout
	// (at least LongPause) and commit a write meanwhile (the others elect a
	// new leader and serve it); SIGCONT when the fault ends. The resumed
	// leader must not answer from before that write (issue 33).
	PauseLong Kind = "pause-long"
	// Wipe: SIGKILL a follower and remove its data directory; start it
	// empty once the others have moved on (it rejoins from the leader's
	// snapshot), then make it leader by leadership transfer (the leader's
	// SIGTERM, with the other followers stopped so that the transfer picks
	// it); the run fails unless it led.
	Wipe Kind = "wipe"
	// Transfer: the leader hands leadership over (SIGTERM: a rolling
	// restart's shutdown transfers it) and is started again when the
	// fault ends.
	Transfer Kind = "transfer"
	// LBCut: cut the load balancer's links (agent and health check) to a
	// replica; heal them when the fault ends. The replica stays in the
	// cluster.
	LBCut Kind = "lb-cut"
	// Token: revoke the leader's Consul token (`consul acl token delete`)
	// while writes go on, hold it for at least TokenHold (the leader
	// holds its last state, applies nothing, and hands leadership at
	// once to a follower whose token can read), then
	// restore access: a new token written to that replica's token file
	// (a rotation) or the same accessor and secret created again (a
	// revocation undone). The leader's: a follower's token is read only
	// once it leads.
	Token Kind = "token"
)

// Kinds are the kinds Plan draws from, equally likely.
var Kinds = []Kind{Kill, Pause, Cut, Consul, PauseLong, Wipe, Transfer, LBCut, Token}

// MixedKinds are the kinds of a run with one replica of the previous
// release: every kind but Token (a release before the token file's
// re-read holds its token until restarted; the hand-over on a refused
// token is this release's).
var MixedKinds = []Kind{Kill, Pause, Cut, Consul, PauseLong, Wipe, Transfer, LBCut}

// LongPause is the shortest hold of a PauseLong fault: above the replicas'
// election timeout (1s) and a -race election on two busy cores.
const LongPause = 3 * time.Second

// TokenHold is the shortest hold of a Token fault: the probe that finds
// the token refused (every 2s) and a hand-over (at once; the test allows
// 5s), with room, on two busy cores.
const TokenHold = 8 * time.Second

// Target says which replica a fault hits. The roles are resolved when the
// fault starts (which replica leads depends on the run).
type Target string

const (
	Leader   Target = "leader"
	Follower Target = "follower"
	None     Target = "" // Consul faults
)

// Fault is one step of a schedule: wait Gap, inject the fault, hold it for
// Hold, end it.
type Fault struct {
	Kind   Kind
	Target Target
	Gap    time.Duration
	Hold   time.Duration
}

func (f Fault) String() string {
	if f.Target == None {
		return fmt.Sprintf("%s for %s (after %s)", f.Kind, f.Hold, f.Gap)
	}
	return fmt.Sprintf("%s %s for %s (after %s)", f.Kind, f.Target, f.Hold, f.Gap)
}

// Options bound a schedule.
//
// The seed decides the kinds, targets, gaps and holds; which replica a
// role is, and what else happens (an election's outcome), is the run's.
type Options struct {
	// Duration is the sum of the gaps and holds to fill, at least.
	Duration time.Duration
	// MinHold and MaxHold bound a fault's hold; MinGap and MaxGap the
	// pause before it. Zero: 1s..6s and 1s..3s.
	MinHold, MaxHold, MinGap, MaxGap time.Duration
	// Kinds are the kinds to draw from, equally likely (nil: Kinds).
	Kinds []Kind
}

// Plan draws faults from seed until their gaps and holds fill o.Duration.
func Plan(seed uint64, o Options) []Fault {
	if o.MaxHold == 0 {
		o.MinHold, o.MaxHold = time.Second, 6*time.Second
	}
	if o.MaxGap == 0 {
		o.MinGap, o.MaxGap = time.Second, 3*time.Second
	}
	kinds := o.Kinds
	if len(kinds) == 0 {
		kinds = Kinds
	}
	r := rand.New(rand.NewPCG(seed, 0x6e656d65736973))
	between := func(lo, hi time.Duration) time.Duration {
		return (lo + time.Duration(r.Int64N(int64(hi-lo)+1))).Round(100 * time.Millisecond)
	}
	var out []Fault
	var total time.Duration
	for total < o.Duration {
		f := Fault{Kind: kinds[r.IntN(len(kinds))], Gap: between(o.MinGap, o.MaxGap), Hold: between(o.MinHold, o.MaxHold)}
		target := []Target{Leader, Follower}[r.IntN(2)]
		switch f.Kind {
		case Consul:
		case PauseLong:
			f.Target, f.Hold = Leader, max(f.Hold, LongPause)
		case Transfer:
			f.Target = Leader
		case Token:
			f.Target, f.Hold = Leader, max(f.Hold, TokenHold)
		case Wipe:
			f.Target = Follower
		default:
			f.Target = target
		}
		out = append(out, f)
		total += f.Gap + f.Hold
	}
	return out
}

// Seed returns the seed named by env (a decimal uint64) or, when env is
// empty, one drawn from the clock; fromEnv says which.
func Seed(env string) (seed uint64, fromEnv bool, err error) {
	if env == "" {
		return uint64(time.Now().UnixNano()), false, nil
	}
	s, err := strconv.ParseUint(env, 10, 64)
	if err != nil {
		return 0, true, fmt.Errorf("nemesis: seed %q is not a decimal number: %w", env, err)
	}
	return s, true, nil
}
