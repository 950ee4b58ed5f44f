// Package leader holds what a hastate replica does only while it leads
// raft: the barrier of a new leadership, the KV apply path (a read of
// Consul's prefix becomes one raft entry of differences, from the recorded
// source only), undrain ramps, expiry, the record of HAProxy nodes, the
// feature-level gate, the hand-over of a leader that cannot mirror Consul,
// and the audit log of what it applied.
//
// It writes raft entries (fsm.Command) and reads the state machine; it
// asks the other members only through Peers, and knows nothing of the raft
// port or of confirmed reads.
package leader
