// Package fsm is hastate's raft state machine: what a committed entry
// (Command) does to the mirror of Consul's KV, the serving snapshot it
// publishes after each one, the snapshots raft persists, and the cache of
// recent raft entries in front of the log store.
//
// It knows raft's FSM and LogStore interfaces and the state domain; it
// knows nothing of the node, the raft port or leadership: what it reports
// (an entry applied, rejected, not understood) goes to the callbacks of
// its Options.
package fsm
