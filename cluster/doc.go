// Package cluster is hastate's raft: node setup, the host-name stream layer,
// bootstrap, the FSM that turns committed KV changes into the serving
// snapshot, durable snapshots, and the leader's duties. See DESIGN.md.
//
// It knows raft and the state domain; it does not know Consul or sockets
// other than raft's own. The leader's work (the Consul watch) is handed in
// as a LeaderDuty by the wiring.
package cluster
