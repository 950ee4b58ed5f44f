// Package raftport is hastate's raft port: one TCP port (mutual TLS
// optional) that carries raft's RPCs and the named queries between
// members, told apart by their first byte. It holds the stream layer raft
// dials through (host names resolved at dial time), the guard on inbound
// connections, the TLS material with its reload and peer-name pinning,
// the patient transport that keeps dialling a follower that is down, and
// the framing of the queries (one JSON answer, or line by line on a
// connection kept open).
//
// It knows raft's transport interfaces and the wire types of api; it
// knows nothing of the state machine, of leadership or of the node that
// answers the queries it carries: the node hands it the answers.
package raftport
