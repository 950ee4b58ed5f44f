// Package kvsync mirrors one Consul KV prefix into hastate: a Watcher lists
// the prefix with blocking queries and hands every changed full read to a
// Sink (the raft leader's apply path).
//
// It owns the Consul side of the contract: blocking-query index rules,
// pacing, backoff while Consul cannot be read, and the staleness signals
// (Status and the hastate_kv_* metrics). It knows nothing of raft: the
// wiring passes a Sink. See DESIGN.md.
package kvsync
