package leader

// This file holds what the cluster does while a migration from the
// runbook's per-node agent is marked (state.MigrationKey): no undrain
// ramps, as the per-node agent has none.

import "github.com/hastate/hastate/state"

// noRampWhile returns p without undrain ramps (duration 0) while a
// migration from the per-node agent is marked (state.MigrationKey): the
// agent restores full weight at once, and both must serve an undrain the
// same way (rampLoop ends the ramps in progress). The policy travels in the raft entry, so every replica (of
// any release) applies what the leader decided.
func noRampWhile(migrating bool, p state.RampPolicy) state.RampPolicy {
	if migrating {
		p.Duration = 0
	}
	return p
}
