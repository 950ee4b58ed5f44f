// Package cluster is hastate's raft node: it opens raft's stores, starts
// raft and wires the parts it is handed, each a package of its own that
// does not import the node (see DESIGN.md, "Where each concern lives"):
//
//   - raftport: the raft port (stream layer, TLS, connection guard, the
//     named queries' wire form);
//   - fsm: the state machine (entries, the serving snapshot, snapshots);
//   - confirm: confirmed reads and the withhold decision;
//   - leader: what runs only on the leader.
//
// The node itself holds setup and shutdown, bootstrap, the peer queries,
// readiness and /v1/cluster, the follower's view of the leader's KV
// report, and the metrics read from raft. It knows raft and the state
// domain; it does not know Consul or sockets other than raft's own. The
// leader's work on Consul (the watch) is handed in as a leader.Duty by the
// wiring.
package cluster
