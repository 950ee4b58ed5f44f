// Package state is hastate's domain: the KV value grammar, the rules that
// turn the mirrored KV content into the answer for one HAProxy server, and
// the immutable serving Snapshot built from them.
//
// It does no I/O and keeps no clock of its own: everything here is a pure
// function of its inputs, so every replica that applies the same raft
// entries in the same order computes the same answers.
package state
