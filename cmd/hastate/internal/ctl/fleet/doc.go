// Package fleet is the operator's client of the hastate replicas: what the
// cluster serves, who polls which server and what it was told (Replica),
// whether a replica reads the Consul cluster and KV prefix a command
// writes (CheckReplica), one agent check as HAProxy sends it (Probe), and
// the deploy pipeline's gates, precheck and wait, which fail closed.
//
// It may import ctl (the shared words), api, state and kvsync's identity
// read; no other package of the operator library: the views above it
// (haproxy, write, migration, status) use its types, never the other way
// round.
package fleet
