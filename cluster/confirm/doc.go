// Package confirm decides what a replica may answer: the confirmation of
// agent answers by read index (the leader's own round of acknowledgements,
// a follower's read-index request to its leader, the wait until the state
// serves the index) and the withhold reasons that stop every answer and
// fail readiness (no leader, catching up, unconfirmed, not understood).
//
// It sees raft through a narrow view (Raft: term, state, commit index,
// configuration, leader contact), the applied state through State, and
// the other members through Transport, so each rule can be tested with
// fakes, without a node. See cluster/DESIGN.md, "Confirmed reads".
package confirm
