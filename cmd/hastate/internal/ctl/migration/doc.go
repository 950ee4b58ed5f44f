// Package migration is the move from the runbook's per-node agent: the
// marker in KV (Read, Start, Finish) and the keys the two would serve
// differently, Compare (ask a per-node agent what hastate answers), and
// MigrateKV (rewrite JSON state keys as word + meta key).
//
// It may import ctl, fleet and write (the Consul writer and transaction);
// nothing imports it but cmd/hastate.
package migration
