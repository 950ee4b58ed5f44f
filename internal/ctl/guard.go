package ctl

import (
	"fmt"
	"strings"
)

// Each guard of a write has its own override (DESIGN.md, Operator
// commands); --force lifts the three, and every lifted guard is named in
// the output, with what it would have said, and in the meta key. The
// partial-backend refusal is no guard: it needs a choice, --override or
// --keep-own, and --force does not make it.

// Guard is one check a write makes before it writes.
type Guard string

const (
	// GuardUnknown: a server no HAProxy polls, a backend the cluster
	// does not know (a typo). --allow-unknown lifts it.
	GuardUnknown Guard = "unknown server"
	// GuardMinReady: taking single servers out would leave a backend
	// below --min-ready. --allow-below-min-ready lifts it.
	GuardMinReady Guard = "capacity"
	// GuardNoReplica: no replica (or not every replica) could be asked,
	// or the replica did not catch up with Consul within --timeout:
	// what only they know (who polls, capacity, that they read this
	// prefix) cannot be checked. --allow-no-replica lifts it.
	GuardNoReplica Guard = "no replica to ask"
)

// Flag is the flag that lifts the guard.
func (g Guard) Flag() string {
	switch g {
	case GuardUnknown:
		return "--allow-unknown"
	case GuardMinReady:
		return "--allow-below-min-ready"
	}
	return "--allow-no-replica"
}

// advice says how to lift the guard, for a refusal.
func (g Guard) advice(Allow) string {
	return fmt.Sprintf("add %s to write anyway (or --force, which lifts every guard but the partial-backend one)", g.Flag())
}

// Allow says which guards a write lifts.
type Allow struct {
	Unknown       bool // --allow-unknown
	BelowMinReady bool // --allow-below-min-ready
	NoReplica     bool // --allow-no-replica
	// Force: the three were lifted by --force (messages name it).
	Force bool
}

// AllowForce is what --force lifts.
func AllowForce() Allow {
	return Allow{Unknown: true, BelowMinReady: true, NoReplica: true, Force: true}
}

func (a Allow) by(g Guard) string {
	if a.Force {
		return "--force"
	}
	return g.Flag()
}

// Lifted is a guard a write lifted, with what it would have said.
type Lifted struct {
	Guard Guard
	By    string // the flag that lifted it
	Said  string // what the guard would have said ("" when it could not tell)
}

func (l Lifted) String() string {
	if l.Said == "" {
		return fmt.Sprintf("%s (%s)", l.Guard, l.By)
	}
	return fmt.Sprintf("%s (%s); it would have said: %s", l.Guard, l.By, l.Said)
}

// lift records a lifted guard once per guard and message.
func (pl *planner) lift(g Guard, said string) {
	pl.p.lift(g, pl.o.Allow.by(g), said)
}

func (p *Plan) lift(g Guard, by, said string) {
	said = strings.TrimPrefix(strings.TrimPrefix(said, ErrNoMatch.Error()+": "), "refused, nothing was written: ")
	for _, l := range p.Lifted {
		if l.Guard == g && l.Said == said {
			return
		}
	}
	p.Lifted = append(p.Lifted, Lifted{Guard: g, By: by, Said: said})
}

// liftedNames are the lifted guards as the meta key records them.
func (p Plan) liftedNames() []string {
	var out []string
	for _, l := range p.Lifted {
		out = append(out, l.String())
	}
	return out
}
