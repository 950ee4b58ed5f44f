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
		From: "		nr := rs.conf.next.Swap(newReadNotifier())\n		rs.conf.rounds.Add(1)\n		began := time.Now()\n		nr.index, nr.err = rs.confirmRound(began.Add(rs.o.Timeout))",
		To:   "		rs.conf.rounds.Add(1)\n		began := time.Now()\n		index, err := rs.confirmRound(began.Add(rs.o.Timeout))\n		nr := rs.conf.next.Swap(newReadNotifier())\n		nr.index, nr.err = index, err",
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
		From: "		return nil\n	}\n	if b := rs.withheld.bits.Load(); b != 0 {\n		rs.m.withheldCheck(b)\n		return nil\n	}\n	s := rs.o.State.Serving()", To: "		return nil\n	}\n	s := rs.o.State.Serving()",
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
	// The mirror's checks of Consul's answers (kvsync).
	{
		Name: "kvsync/proof-only-on-the-first-read", File: "kvsync/watcher.go", Package: "kvsync",
		From: "if last.kv == nil || l.count == 0 || l.removes {", To: "if last.kv == nil {",
		Why: "an empty listing, or one that removes keys, is applied only once the token is proven able to read the prefix",
	},
	{
		Name: "kvsync/proof-on-a-shrinking-listing", File: "kvsync/watcher.go", Package: "kvsync",
		From: "if last.kv == nil || l.count == 0 || l.removes {", To: "if last.kv == nil || l.count == 0 {",
		Why: "a listing that removes keys the Sink holds is applied only once the token is proven able to read the prefix",
	},
	{
		Name: "kvsync/index-backwards-resets", File: "kvsync/watcher.go", Package: "kvsync",
		From: "			index = 0\n			continue\n		case got == index:", To: "			index = got\n			continue\n		case got == index:",
		Why: "an index that went backwards starts over with a full read at index 0",
	},
	{
		Name: "kvsync/failed-delivery-keeps-the-index", File: "kvsync/watcher.go", Package: "kvsync",
		From: "				reread = errors.Is(err, state.ErrIndexBehind)\n", To: "				reread = errors.Is(err, state.ErrIndexBehind)\n				index = got\n",
		Why: "a read the Sink refused is not delivered: the index stays where the Sink is in sync, so the retry hands it the then-current data",
	},
	{
		Name: "kvsync/refused-read-drops-the-held-read", File: "kvsync/watcher.go", Package: "kvsync",
		From: "					last, accepted = held{}, 0\n", To: "",
		Why: "after the Sink refused a read merged into the held map, the next read is compared in full, not with the refused one",
	},
	{
		Name: "kvsync/reread-after-index-behind", File: "kvsync/watcher.go", Package: "kvsync",
		From: "				reread = errors.Is(err, state.ErrIndexBehind)\n", To: "				reread = false\n",
		Why: "a read the Sink refused as behind its index is marked Reread when read again (Consul confirmed it)",
	},
	{
		Name: "kvsync/one-secret-per-attempt", File: "kvsync/watcher.go", Package: "kvsync",
		From: "		actx := withOneSecret(ctx)\n", To: "		actx := ctx\n",
		Why: "the listing, its proof and its identity are read with one token (issue 43: a token filled between the listing and its proof)",
	},
	{
		Name: "kvsync/token-transport-pins-the-secret", File: "kvsync/token.go", Package: "kvsync",
		From: "			s = p.use(t.tok, s) // one attempt, one secret (withOneSecret)", To: "			_ = p",
		Why: "the token transport sends the secret of the attempt's first request with every request of the attempt",
	},
	{
		Name: "kvsync/proof-alone-is-one-secret", File: "kvsync/access.go", Package: "kvsync",
		From: "WithContext(withCheck(withOneSecret(ctx)))", To: "WithContext(withCheck(ctx))",
		Why: "CheckRead on its own (the probe) makes every read of the proof with one token",
	},
	{
		Name: "kvsync/identity-read-with-the-listing", File: "kvsync/watcher.go", Package: "kvsync",
		From: "if err == nil && (src == nil || s != *src) {", To: "if err == nil && src == nil {",
		Why: "a read is applied only if the identity read after it is the one read before it (issue 43)",
	},
	{
		Name: "kvsync/identity-after-the-listing", File: "kvsync/watcher.go", Package: "kvsync",
		From: "			if w.o.Identify != nil {\n				// The identity of the read handed over", To: "			if false {\n				// The identity of the read handed over",
		Why: "the identity of the read handed over is read after it, with its token",
	},
	{
		Name: "kvsync/identity-unreadable-fails-the-read", File: "kvsync/watcher.go", Package: "kvsync",
		From: "				if err != nil {\n					src = nil // read again before the next listing", To: "				if err != nil && false {\n					src = nil // read again before the next listing",
		Why: "a read whose Consul cluster cannot be read is not applied",
	},
	{
		Name: "kvsync/answer-index-present", File: "kvsync/transport.go", Package: "kvsync",
		From: "	case idx == \"\":\n", To: "	case false:\n",
		Why: "an answer without X-Consul-Index is not Consul's",
	},
	{
		Name: "kvsync/answer-index-above-zero", File: "kvsync/transport.go", Package: "kvsync",
		From: "	case n == 0:\n", To: "	case n == 0 && false:\n",
		Why: "an answer with X-Consul-Index 0 is not Consul's",
	},
	{
		Name: "kvsync/answer-known-leader", File: "kvsync/transport.go", Package: "kvsync",
		From: "kl != \"true\" {", To: "false {",
		Why: "an answer without X-Consul-KnownLeader: true is no consistent read",
	},
	{
		Name: "kvsync/answer-last-contact", File: "kvsync/transport.go", Package: "kvsync",
		From: "	} else if _, err := strconv.ParseUint(lc, 10, 64); err != nil {", To: "	} else if _, err := strconv.ParseUint(lc, 10, 64); false && err != nil {",
		Why: "an answer whose X-Consul-LastContact is not a number is not Consul's (and hides the ACL-filtered header from consul/api)",
	},
	{
		Name: "kvsync/answer-filtered-by-acls", File: "kvsync/transport.go", Package: "kvsync",
		From: "	if h.Get(\"X-Consul-Results-Filtered-By-ACLs\") == \"true\" {", To: "	if false {",
		Why: "an answer Consul filtered by ACLs is refused, the proof's key list included",
	},
	{
		Name: "kvsync/answer-404-is-consuls", File: "kvsync/transport.go", Package: "kvsync",
		From: "	case http.StatusOK, http.StatusNotFound:\n", To: "	case http.StatusOK:\n",
		Why: "a 404 is \"no key\" only with Consul's headers (a proxy without a route answers a bare 404), for the listing and the proof",
	},
	{
		Name: "kvsync/answer-redirect-refused", File: "kvsync/transport.go", Package: "kvsync",
		From: "	case http.StatusMovedPermanently, http.StatusFound, http.StatusSeeOther, http.StatusTemporaryRedirect, http.StatusPermanentRedirect:\n", To: "	case -1:\n",
		Why: "a redirect (Consul cleaning the path) answers for another prefix",
	},
	{
		Name: "kvsync/answer-empty-200", File: "kvsync/decode.go", Package: "kvsync",
		From: "		return fmt.Errorf(\"%w: the body is []\", errEmptyAnswer)", To: "		return nil",
		Why: "a 200 with [] is not Consul's empty prefix (a 404 is)",
	},
	{
		Name: "kvsync/answer-key-outside-the-prefix", File: "kvsync/decode.go", Package: "kvsync",
		From: "		if !ok {\n			return fmt.Errorf(\"%w: %q (in the pair at byte %d)\", errOutsidePrefix", To: "		if !ok && false {\n			return fmt.Errorf(\"%w: %q (in the pair at byte %d)\", errOutsidePrefix",
		Why: "a key outside the prefix asked means the answer is for another path",
	},
	{
		Name: "kvsync/answer-duplicate-key", File: "kvsync/merge.go", Package: "kvsync",
		From: "			case 0:\n				return fmt.Errorf(\"%w: %q\", errDuplicateKey, cutKey(rel))", To: "			case 0:\n				return nil",
		Why: "a key listed twice (invalid UTF-8 merged by Consul's JSON) is refused",
	},
	{
		Name: "kvsync/consistent-read", File: "kvsync/watcher.go", Package: "kvsync",
		From: "RequireConsistent: !w.defaultMode}", To: "RequireConsistent: false}",
		Why: "every listing is a consistent read (Consul's default mode answered an empty prefix at index 1 after a restart)",
	},
	// Adoption only by a marker in the adopted Consul (state, internal/app).
	{
		Name: "adopt/marker-names-the-read-cluster", File: "state/adopt.go", Package: "state",
		From: "	case !NamesSource(a.Cluster, read):\n", To: "	case false:\n",
		Why: "a marker adopts only the cluster that holds it",
	},
	{
		Name: "adopt/marker-replaces-the-recorded-source", File: "state/adopt.go", Package: "state",
		From: "	case !NamesSource(a.ReplacesCluster, rec) || a.ReplacesPrefix != rec.Prefix:\n", To: "	case false:\n",
		Why: "a marker adopts only in place of the source raft records (written for this transition)",
	},
	{
		Name: "adopt/marker-replaces-the-recorded-prefix", File: "state/adopt.go", Package: "state",
		From: "	case !NamesSource(a.ReplacesCluster, rec) || a.ReplacesPrefix != rec.Prefix:\n", To: "	case !NamesSource(a.ReplacesCluster, rec):\n",
		Why: "a marker adopts only in place of the prefix raft records",
	},
	{
		Name: "adopt/sink-ignores-a-bad-marker", File: "cmd/hastate/internal/app/adopt.go", Package: "cmd/hastate/internal/app", Run: "Adopt",
		From: "	if why != nil {\n", To: "	if false {\n",
		Why: "a marker that names another cluster or transition adopts nothing",
	},
	{
		Name: "adopt/sink-only-for-identity-refusals", File: "cmd/hastate/internal/app/adopt.go", Package: "cmd/hastate/internal/app", Run: "Adopt",
		From: "if !errors.As(err, &me) || !me.Verdict.Identity() || r.Source == nil {", To: "if err == nil || r.Source == nil {",
		Why: "only a read refused as another cluster's or prefix's is a candidate for adoption",
	},
	// The leader's apply path and level gate (cluster/leader; the node's tests).
	{
		Name: "leader/verdict-identity-unread", File: "cluster/leader/mirror.go", Package: "cluster/leader",
		From: "	if h.Source == nil {\n", To: "	if false {\n",
		Why: "a replica that cannot tell which Consul it reads may not mirror a recorded source",
	},
	{
		Name: "leader/apply-other-source-refused", File: "cluster/leader/apply.go", Package: "cluster", Run: "Mirror|Source|Adopt",
		From: "if v := api.SourceVerdict(*r.Source, *rec); !v.CanMirror() {", To: "if v := api.SourceVerdict(*r.Source, *rec); false && !v.CanMirror() {",
		Why: "a read from another Consul cluster or prefix than the recorded one is refused",
	},
	{
		Name: "leader/apply-index-behind-refused", File: "cluster/leader/apply.go", Package: "cluster", Run: "Mirror|Source|Adopt",
		From: "	if r.Index < held && !r.Reread {\n", To: "	if false {\n",
		Why: "a read below the Consul index the mirror holds is refused until read again",
	},
	{
		Name: "leader/apply-index-behind-reread", File: "cluster/leader/apply.go", Package: "cluster", Run: "Mirror|Source|Adopt",
		From: "	if r.Index < held && !r.Reread {\n", To: "	if r.Index < held {\n",
		Why: "a read below the index held is applied once Consul confirmed it (a snapshot restored into the same cluster)",
	},
	{
		Name: "leader/level-gate-every-member", File: "cluster/leader/gate.go", Package: "cluster", Run: "Level|Gate|Source",
		From: "		case len(below) > 0:\n			w = waitingText(next, below)", To: "		case false:\n			w = waitingText(next, below)",
		Why: "no level is raised while a member advertises less",
	},
	{
		Name: "leader/level-gate-silent-member", File: "cluster/leader/gate.go", Package: "cluster", Run: "Level|Gate|Source",
		From: "d.below(next, d.o.Peers.Statuses(LevelEvery), cur < next)", To: "d.below(next, d.o.Peers.Statuses(LevelEvery), false)",
		Why: "a member that does not answer is not counted as advertising the next level",
	},
	{
		Name: "leader/no-ramp-while-migrating", File: "cluster/leader/migration.go", Package: "cluster", Run: "Ramp|Migration",
		From: "	if migrating {\n		p.Duration = 0\n	}", To: "	_ = migrating",
		Why: "while a migration is marked an undrain is not ramped (the per-node agent restores full weight at once)",
	},
	// The raft port (cluster/raftport): nothing writes to a closed raft store.
	{
		Name: "raftport/no-heartbeat-after-stop", File: "cluster/raftport/heartbeat.go", Package: "cluster/raftport", Run: "Heartbeat",
		From: "		if t.hb.stopped {\n			return\n		}\n", To: "",
		Why: "no heartbeat reaches raft once the node stopped them (it would save a term to the closed store: raft panics)",
	},
	{
		Name: "raftport/stop-waits-for-heartbeat", File: "cluster/raftport/heartbeat.go", Package: "cluster/raftport", Run: "Heartbeat",
		From: "	t.hb.mu.Lock()\n	defer t.hb.mu.Unlock()\n	t.hb.stopped = true\n", To: "	t.hb.mu.RLock()\n	defer t.hb.mu.RUnlock()\n	t.hb.stopped = true\n",
		Why: "stopping heartbeats waits for the one raft is handling, so the store closes after it",
	},
	// The operator gates (cmd/hastate/internal/ctl/fleet, api).
	{
		Name: "fleet/wait-live-cannot-confirm", File: "cmd/hastate/internal/ctl/fleet/gate.go", Package: "cmd/hastate/internal/ctl/fleet",
		From: "	if err := o.live(ctx, fleet.Replicas); err != nil {\n		return []string{err.Error()}, true, nil", To: "	if err := o.live(ctx, fleet.Replicas); err != nil {\n		return []string{err.Error()}, false, nil",
		Why: "wait turns \"the live replicas do not cover the fleet\" into exit 4 (cannot confirm), not exit 1",
	},
	{
		Name: "fleet/wait-timeout-cannot-confirm", File: "cmd/hastate/internal/ctl/fleet/gate.go", Package: "cmd/hastate/internal/ctl/fleet",
		From: "			kind = ctl.ErrCannotConfirm\n", To: "			kind = ctl.ErrNotDone\n",
		Why: "wait that times out on something it cannot see exits 4, not 1",
	},
	{
		Name: "fleet/wait-last-whole-look", File: "cmd/hastate/internal/ctl/fleet/gate.go", Package: "cmd/hastate/internal/ctl/fleet",
		From: "		case (err != nil || len(lag) > 0) && ctx.Err() != nil && len(last) > 0:\n", To: "		case err != nil && ctx.Err() != nil && len(last) > 0:\n",
		Why: "wait that times out in the middle of a look reports the last whole look, not the read the deadline cut short",
	},
	{
		Name: "fleet/wait-synced-index", File: "cmd/hastate/internal/ctl/fleet/gate.go", Package: "cmd/hastate/internal/ctl/fleet",
		From: "	if ci.KV.SyncedIndex < index {\n", To: "	if false {\n",
		Why: "wait passes only once the replica applied the Consul index current when it started",
	},
	{
		Name: "fleet/wait-per-pair", File: "cmd/hastate/internal/ctl/fleet/gate.go", Package: "cmd/hastate/internal/ctl/fleet",
		From: "if unseen := UnseenPairs(pv, current, time.Now()); len(unseen) > 0 {", To: "if unseen := UnseenPairs(pv, current, time.Now()); false && len(unseen) > 0 {",
		Why: "with a replica down, wait decides per (server, HAProxy) pair",
	},
	{
		Name: "fleet/unseen-pairs-per-pair", File: "cmd/hastate/internal/ctl/fleet/polls.go", Package: "cmd/hastate/internal/ctl/fleet",
		From: "			case ok && now.Sub(at) <= api.SeenWithin:\n", To: "			case alive[h]:\n",
		Why: "a pair whose polls all went to the dead replica is not passed because its HAProxy was seen elsewhere",
	},
	{
		Name: "fleet/precheck-live", File: "cmd/hastate/internal/ctl/fleet/gate.go", Package: "cmd/hastate/internal/ctl/fleet",
		From: "			if err == nil {\n				err = o.live(ctx, fleet.Replicas)\n			}\n", To: "",
		Why: "precheck (and the write guards' fleet read) fails with cannot confirm while the live replicas do not cover the fleet",
	},
	{
		Name: "fleet/live-needs-the-record", File: "cmd/hastate/internal/ctl/fleet/replica.go", Package: "cmd/hastate/internal/ctl/fleet",
		From: "	case !v.Recorded:\n", To: "	case false:\n",
		Why: "while the cluster does not record which HAProxy nodes exist, every replica must answer",
	},
	{
		Name: "fleet/dead-replica-sighting-not-live", File: "api/filter.go", Package: "cmd/hastate/internal/ctl/fleet",
		From: "seen = seen || (live[id] && now.Sub(at) <= SeenWithin)", To: "seen = seen || (id != \"\" && now.Sub(at) <= SeenWithin)",
		Why: "an HAProxy seen only by the replica that did not answer is not seen by a live one",
	},
	{
		Name: "fleet/replica-reads-the-prefix", File: "cmd/hastate/internal/ctl/fleet/identity.go", Package: "cmd/hastate/internal/ctl/fleet",
		From: "	if ci.KVPrefix != prefix {\n", To: "	if false {\n",
		Why: "a command refuses a replica that reads another KV prefix than the one it writes",
	},
	{
		Name: "fleet/replica-reads-the-cluster", File: "cmd/hastate/internal/ctl/fleet/identity.go", Package: "cmd/hastate/internal/ctl/fleet",
		From: "	if !theirs.Same(mine) {\n", To: "	if false {\n",
		Why: "a command refuses a replica that reads another Consul cluster than the one it writes to",
	},
	// The write path's conditions (cmd/hastate/internal/ctl/write).
	{
		Name: "write/cas-on-the-state-key", File: "cmd/hastate/internal/ctl/write/writer.go", Package: "cmd/hastate/internal/ctl/write",
		From: "					op.Verb, op.Index = consul.KVCAS, d.Index // 0: only if absent", To: "					op.Verb = consul.KVSet",
		Why: "a state key is set only if it still has the index it was read at (absent: still absent)",
	},
	{
		Name: "write/delete-cas-on-the-state-key", File: "cmd/hastate/internal/ctl/write/writer.go", Package: "cmd/hastate/internal/ctl/write",
		From: "					op.Verb, op.Index = consul.KVDeleteCAS, d.Index", To: "					op.Verb = consul.KVDelete",
		Why: "a state key is deleted only if it still has the index it was read at",
	},
	{
		Name: "write/check-keys-read-not-written", File: "cmd/hastate/internal/ctl/write/writer.go", Package: "cmd/hastate/internal/ctl/write",
		From: "		if written[d.Key] {\n			continue\n		}", To: "		if true {\n			continue\n		}",
		Why: "a key the plan read but does not write (a backend-wide key, a server counted ready) is checked in the transaction",
	},
	{
		Name: "write/check-index-of-a-present-key", File: "cmd/hastate/internal/ctl/write/writer.go", Package: "cmd/hastate/internal/ctl/write",
		From: "		if d.Present {\n			op = &consul.KVTxnOp{Verb: consul.KVCheckIndex", To: "		if false {\n			op = &consul.KVTxnOp{Verb: consul.KVCheckIndex",
		Why: "a present key read is checked by its ModifyIndex, not only for existence",
	},
	{
		Name: "write/conflict-read-again-by-modifyindex", File: "cmd/hastate/internal/ctl/write/kvread.go", Package: "cmd/hastate/internal/ctl/write",
		From: "		case p != nil && p.ModifyIndex != d.Index:\n", To: "		case false:\n",
		Why: "after a rolled-back transaction a key whose ModifyIndex moved counts as changed (plan again)",
	},
	{
		Name: "write/min-ready-guard", File: "cmd/hastate/internal/ctl/write/guard.go", Package: "cmd/hastate/internal/ctl/write",
		From: "		if len(c.after) < want && len(c.after) < c.before {", To: "		if false {",
		Why: "taking servers out is refused below --min-ready ready servers",
	},
	{
		Name: "write/min-ready-counts-consul", File: "cmd/hastate/internal/ctl/write/guard.go", Package: "cmd/hastate/internal/ctl/write",
		From: "		if guard && (!okOwn || !okWild || !consulReady(ServerKeys{Own: own, Backend: wild})) {", To: "		if guard && false && (!okOwn || !okWild || !consulReady(ServerKeys{Own: own, Backend: wild})) {",
		Why: "a server counts as ready only if Consul's keys leave it in rotation",
	},
	{
		Name: "write/min-ready-depends-on-the-ready-keys", File: "cmd/hastate/internal/ctl/write/guard.go", Package: "cmd/hastate/internal/ctl/write",
		From: "	for _, k := range deps {\n		pl.dep(k)\n	}", To: "	_ = deps",
		Why: "the transaction depends on the keys of the servers that stay ready (a concurrent drain plans again)",
	},
	{
		Name: "write/unknown-server-guard", File: "cmd/hastate/internal/ctl/write/guard.go", Package: "cmd/hastate/internal/ctl/write",
		From: "			if r.Polled > 0 {\n				return nil\n			}", To: "			if true {\n				return nil\n			}",
		Why: "a write for a server no HAProxy polled is refused unless --force",
	},
	{
		Name: "write/partial-backend-refused", File: "cmd/hastate/internal/ctl/write/plan.go", Package: "cmd/hastate/internal/ctl/write",
		From: "	if len(escape) > 0 && !o.KeepOwn {\n		pl.refuse(", To: "	if false {\n		pl.refuse(",
		Why: "a backend-wide drain or maint that servers with their own key would escape is refused without --override or --keep-own",
	},
	{
		Name: "write/override-conditional-on-own-keys", File: "cmd/hastate/internal/ctl/write/plan.go", Package: "cmd/hastate/internal/ctl/write",
		From: "		if o.Override {\n			pl.dep(k)\n", To: "		if o.Override {\n",
		Why: "--override deletes a server's own key only as it was read (a concurrent write to it plans again)",
	},
	{
		Name: "write/no-replica-refuses", File: "cmd/hastate/internal/ctl/write/run.go", Package: "cmd/hastate/internal/ctl/write",
		From: "	case !w.req.Allow.NoReplica:\n		return nil, fmt.Errorf(", To: "	case false:\n		return nil, fmt.Errorf(",
		Why: "a write whose replica cannot be asked, or does not catch up, is refused unless --allow-no-replica (or --force)",
	},
	{
		Name: "write/waits-for-the-replica", File: "cmd/hastate/internal/ctl/write/run.go", Package: "cmd/hastate/internal/ctl/write",
		From: "	err := w.gate.Synced(wctx, index)\n", To: "	var err error\n",
		Why: "the plan uses the replica's fleet only once it applied the Consul index the plan read",
	},
	// The told counts a server keeps (server/toldcache.go): what /v1/state,
	// the status page and `wait` count as told.
	{
		Name: "told/record-of-another-answer", File: "server/toldcache.go", Package: "server", Run: "ToldCache",
		From: "at >= e.last && e.answer == answer && e.kept == kept && e.merged()", To: "at >= e.last && e.merged()",
		Why: "a record that changes a poll's answer or kept answer drops the server's counts",
	},
	{
		Name: "told/record-back-in-time", File: "server/toldcache.go", Package: "server", Run: "ToldCache",
		From: "return c.ok && at >= e.last && ", To: "return c.ok && ",
		Why: "a record older than the poll's last drops the counts (the poll stops polling earlier than they said)",
	},
	{
		Name: "told/record-of-an-uncounted-poll", File: "server/toldcache.go", Package: "server", Run: "ToldCache",
		From: " && e.merged().polling(c.atMs) &&\n", To: " &&\n",
		Why: "a record of a poll the counts left out (new, or no longer polling) drops them",
	},
	{
		Name: "told/single-poll-grace", File: "server/toldcache.go", Package: "server", Run: "ToldCache",
		From: "until = min(until, m.LastMs+grace-1)", To: "until = min(until, m.LastMs+grace)",
		Why: "counts that hold a single poll (a probe or an HAProxy's first check) hold only within ProbeGrace",
	},
	{
		Name: "told/ttl-bound", File: "server/toldcache.go", Package: "server", Run: "ToldCache",
		From: "c.untilMs = min(c.untilMs, until)", To: "_ = until",
		Why: "counts hold only until their oldest poll passes PollerTTL",
	},
	{
		Name: "told/sweep-drops", File: "server/pollers.go", Package: "server", Run: "ToldCache",
		From: "				sp.told.ok = false // its counts may have held a removed poll\n", To: "\n",
		Why: "a sweep that removes polls of a server drops its counts",
	},
	{
		Name: "told/window-start", File: "server/toldcache.go", Package: "server", Run: "ToldCache",
		From: "&& sinceNs >= c.sinceNs && sinceNs <= c.sinceUntil", To: "&& sinceNs <= c.sinceUntil",
		Why: "counts of a window hold only for a window that starts no earlier (an earlier one holds older polls)",
	},
	{
		Name: "told/window-end", File: "server/toldcache.go", Package: "server", Run: "ToldCache",
		From: "&& sinceNs >= c.sinceNs && sinceNs <= c.sinceUntil", To: "&& sinceNs >= c.sinceNs",
		Why: "counts of a window hold only until its start passes their oldest poll (which then leaves the window, its source and its counts with it)",
	},
	{
		Name: "told/record-outside-the-window", File: "server/toldcache.go", Package: "server", Run: "ToldCache",
		From: " &&\n\t\te.last >= c.sinceNs\n", To: "\n",
		Why: "a record of a poll older than the counts' window brings it into the window (a source and counts more): it drops them",
	},
}
