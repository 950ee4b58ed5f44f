// Package write plans and writes desired state to Consul KV: a write
// command (drain, maint, ready, weight, clear) is planned by PlanWrite as a
// pure function of a consistent read of Consul (KVRead) and of the
// cluster's view (which servers HAProxy polls, capacity), checked by its
// guards, and applied by Writer as one Consul transaction conditional on
// every key the plan read. Write is the run loop (check the replica, read,
// wait for the replica to apply the index, plan, apply, re-plan after a
// concurrent write); MaintDrainFirst composes it with the gates.
//
// It may import ctl, fleet (the replica's client and gates) and haproxy
// (maint --drain-first's idle wait); migration and status sit above it.
package write
