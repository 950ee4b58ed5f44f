package main

// mutation removes one safety rule: File (from the repository's root)
// holds From exactly once; To replaces it. Package's tests (the ones Run
// selects, all when empty) must then fail. Module is the folder of the
// module that holds Package ("": the root's).
type mutation struct {
	Name     string
	File     string
	From, To string
	Package  string
	Module   string
	Run      string
	Why      string // what the rule keeps, said when it survives
}

// mutations are the rules of the read path, the withhold decision, the
// mirror's checks of Consul's answers and the write path's conditions.
var mutations = []mutation{
	// Confirmed reads (cluster/confirm).
	{
		Name: "confirm/check-joins-a-round-in-flight", File: "cluster/confirm/round.go", Package: "cluster/confirm",
		From: "		nr := rs.conf.next.Swap(newReadNotifier())\n		rs.conf.rounds.Add(1)\n		began := time.Now()\n		rs.wg.Add(1)\n		go func() {\n			defer rs.wg.Done()\n			nr.index, nr.err = rs.confirmRound(began.Add(rs.o.Timeout))",
		To:   "		rs.conf.rounds.Add(1)\n		began := time.Now()\n		rs.wg.Add(1)\n		go func() {\n			defer rs.wg.Done()\n			index, err := rs.confirmRound(began.Add(rs.o.Timeout))\n			nr := rs.conf.next.Swap(newReadNotifier())\n			nr.index, nr.err = index, err",
		Why:  "a check waits for a round that began after it arrived (the notifier is swapped before the round)",
	},
	{
		Name: "confirm/rounds-pipelined", File: "cluster/confirm/round.go", Package: "cluster/confirm",
		From: "maxRoundsInFlight = 2", To: "maxRoundsInFlight = 1",
		Why: "a round begins while another is in flight: a check waits for the next round to begin, not for the one in flight to end",
	},
	{
		Name: "confirm/every-waiting-round-wakes", File: "cluster/confirm/round.go", Package: "cluster/confirm",
		From: "	next := make(chan struct{})\n	close(*c.applied.Swap(&next))", To: "	next := make(chan struct{})\n	old := c.applied.Swap(&next)\n	select {\n	case *old <- struct{}{}:\n	default:\n	}",
		Why: "one advance of the state wakes every round waiting for it (pipelined rounds wait together)",
	},
	{
		Name: "confirm/readindex-ack-is-quorum", File: "cluster/confirm/round.go", Package: "cluster/confirm",
		From: "if rs.ackIsQuorum(req.ID) && rs.peerIs(peer, req.ID) {", To: "if rs.peerIs(peer, req.ID) {",
		Why: "a follower's request stands for an acknowledgement only where it and the leader's vote are a quorum",
	},
	{
		Name: "confirm/readindex-cert-binding", File: "cluster/confirm/round.go", Package: "cluster/confirm",
		From: "	return err == nil\n}", To: "	return true\n}",
		Why: "with mutual TLS a request counts as its member's acknowledgement only if the certificate names that member",
	},
	{
		Name: "confirm/readindex-term", File: "cluster/confirm/round.go", Package: "cluster/confirm",
		From: "	case req.Term != term:\n", To: "	case false:\n",
		Why: "the leader answers a read-index request only in the follower's term",
	},
	{
		Name: "confirm/readindex-barrier", File: "cluster/confirm/round.go", Package: "cluster/confirm",
		From: "	case rs.barrierTerm.Load() != term:\n		return readIndexAnswer", To: "	case false:\n		return readIndexAnswer",
		Why: "the leader answers a read-index request only after the barrier of its term",
	},
	{
		Name: "confirm/leader-round-barrier", File: "cluster/confirm/round.go", Package: "cluster/confirm",
		From: "	if rs.barrierTerm.Load() != term {\n		return 0, errLeaderNotReady", To: "	if false {\n		return 0, errLeaderNotReady",
		Why: "the leader confirms its own reads only after the barrier of its term",
	},
	{
		Name: "confirm/wait-applied", File: "cluster/confirm/round.go", Package: "cluster/confirm",
		From: "	return index, rs.waitApplied(index, deadline)", To: "	return index, nil",
		Why: "a round confirms only once the state serves the read index",
	},
	{
		Name: "confirm/withheld-after-the-round", File: "cluster/confirm/round.go", Package: "cluster/confirm",
		From: "		return nil\n	}\n	if rs.withheld.any() {\n		return nil\n	}\n	return rs.o.State.Serving()", To: "		return nil\n	}\n	return rs.o.State.Serving()",
		Why: "a reason to withhold that came into force during the round withholds the answer",
	},
	{
		Name: "confirm/ack-other-term", File: "cluster/confirm/ack.go", Package: "cluster/confirm",
		From: "	case ans.Term != req.Term:\n", To: "	case false:\n",
		Why: "an acknowledgement from another term does not count",
	},
	{
		Name: "confirm/ack-round-seq", File: "cluster/confirm/ack.go", Package: "cluster/confirm",
		From: "ans.ID != string(s.ID) || ans.Seq != req.Seq", To: "ans.ID != string(s.ID)",
		Why: "an answer to an earlier round (a reply held while paused) does not count for a later one",
	},
	{
		Name: "confirm/quorum-majority", File: "cluster/confirm/ack.go", Package: "cluster/confirm",
		From: "yes >= voters/2+1", To: "yes >= voters/2",
		Why: "a round needs a majority of the voters",
	},
	{
		Name: "confirm/ack-is-quorum-asker-votes", File: "cluster/confirm/round.go", Package: "cluster/confirm",
		From: "if id == self || !voter {", To: "if id == self && voter {",
		Why: "a non-voter's read-index request is no acknowledgement",
	},
	{
		Name: "confirm/no-fallback-after-a-newer-term", File: "cluster/confirm/ack.go", Package: "cluster/confirm",
		From: "if legacy > 0 && otherTerm != 0 {", To: "if false {",
		Why: "a leader that heard a newer term does not fall back to VerifyLeader (issue 43, rolling upgrade)",
	},
	{
		Name: "confirm/still-leads-after-quorum", File: "cluster/confirm/ack.go", Package: "cluster/confirm",
		From: "				rs.acks.prefer(r.id)\n				return rs.stillLeads(term)", To: "				rs.acks.prefer(r.id)\n				return nil",
		Why: "a round confirms only if its node still leads in the round's term",
	},
	{
		Name: "confirm/still-leads-state", File: "cluster/confirm/ack.go", Package: "cluster/confirm",
		From: "	case rs.raft.State() != raft.Leader:\n		return fmt.Errorf(\"confirm leadership: no longer", To: "	case false:\n		return fmt.Errorf(\"confirm leadership: no longer",
		Why: "after VerifyLeader, the node must still be leader, not only in the same term",
	},
	// The withhold decision (cluster/confirm/withhold.go).
	{
		Name: "withhold/leaderless", File: "cluster/confirm/withhold.go", Package: "cluster/confirm",
		From: "leaderless := in.Now.Sub(in.LastContact) > in.Grace", To: "leaderless := false",
		Why: "a replica without contact with a leader for the grace withholds",
	},
	{
		Name: "withhold/catching-up-kept", File: "cluster/confirm/withhold.go", Package: "cluster/confirm",
		From: "if leaderless || (in.Was&uint32(withholdCatchingUp) != 0 && !in.CaughtUp) {", To: "if leaderless {",
		Why: "catching_up stays until the replica caught up",
	},
	{
		Name: "withhold/unconfirmed-failing", File: "cluster/confirm/withhold.go", Package: "cluster/confirm",
		From: "failing := !in.FailingSince.IsZero() && in.Now.Sub(in.FailingSince) > in.Grace", To: "failing := false",
		Why: "rounds failing for the grace withhold (the load balancer sends checks elsewhere)",
	},
	{
		Name: "withhold/state-behind-confirmed", File: "cluster/confirm/withhold.go", Package: "cluster/confirm",
		From: "(failing || in.StateIndex < in.ConfirmedIndex)", To: "(failing)",
		Why: "a state that went back below the confirmed index (an older snapshot restored) withholds",
	},
	{
		Name: "withhold/not-understood", File: "cluster/confirm/withhold.go", Package: "cluster/confirm",
		From: "	if in.NotUnderstood {\n", To: "	if false {\n",
		Why: "an entry of a newer release withholds every answer",
	},
	{
		Name: "withhold/follower-caught-up", File: "cluster/confirm/withhold.go", Package: "cluster/confirm",
		From: "return leaderStateIndex != 0 && stateIndex >= leaderStateIndex", To: "return true",
		Why: "a follower is caught up only once it serves the leader's state index",
	},
	{
		Name: "withhold/leader-caught-up", File: "cluster/confirm/withhold.go", Package: "cluster/confirm",
		From: "	if leading {\n		return barrierDone\n	}", To: "	if leading {\n		return true\n	}",
		Why: "a leader is caught up only after the barrier of its term",
	},
}
