package leader

import (
	"cmp"
	"errors"
	"sync/atomic"
	"time"

	"github.com/hashicorp/raft"
	"github.com/hastate/hastate/api"
	"github.com/hastate/hastate/cluster/fsm"
	"github.com/hastate/hastate/state"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"
)

// Errors of the leader's writes.
var (
	// ErrNotLeader: a write was attempted on a follower. Only the leader
	// applies KV changes; the caller should stop its leader duty.
	ErrNotLeader = errors.New("not the raft leader")
	// ErrAdoptRefused wraps every refusal of Adopt.
	ErrAdoptRefused = errors.New("adopt refused")
)

// Raft is what the leader's duties ask of raft (a *raft.Raft).
type Raft interface {
	State() raft.RaftState
	CurrentTerm() uint64
	Apply(cmd []byte, timeout time.Duration) raft.ApplyFuture
	Barrier(timeout time.Duration) raft.Future
	LeadershipTransfer() raft.Future
	LeadershipTransferToServer(id raft.ServerID, address raft.ServerAddress) raft.Future
	GetConfiguration() raft.ConfigurationFuture
}

// Peers is what the leader asks the other members (over the raft port,
// through the node).
type Peers interface {
	// Statuses asks every member for its status (this node answers for
	// itself); members that do not answer within timeout are missing.
	Statuses(timeout time.Duration) map[string]api.PeerStatus
	// Seen is when each HAProxy source last polled, merged over the
	// replicas that answered.
	Seen() map[string]time.Time
}

// Options configure Duties. Required: ID, Raft, FSM, Peers.
type Options struct {
	ID    string // this member's raft server ID
	Raft  Raft
	FSM   *fsm.FSM
	Peers Peers
	// BarrierDone is told the term whose barrier this leader completed
	// (its FSM holds every entry committed before; confirmed reads may
	// answer the commit index of that term). Nil: nobody is told.
	BarrierDone func(term uint64)
	// ConsulHealth is this node's view of its Consul, from the wiring; a
	// leader that cannot mirror hands leadership over (mirror.go). Nil: no
	// failover.
	ConsulHealth func() ConsulHealth
	// Duty is the wiring's own (the Consul watch); nil: none.
	Duty Duty
	// Ramp is the base undrain ramp policy (with its defaults set);
	// <prefix>config/ramp overrides it.
	Ramp state.RampPolicy
	// Now is the clock (nil: time.Now); ramps start at the leader's time.
	Now func() time.Time
	// ApplyTimeout bounds a raft Apply (0: 5s); KVFailoverAfter is how
	// long the leader's Consul may be unreachable before it hands over
	// (negative: never); HAProxySyncEvery is how often the record of
	// HAProxy nodes is gathered (0: state.HAProxySyncEvery).
	ApplyTimeout, KVFailoverAfter, HAProxySyncEvery time.Duration
	Logger                                          *zap.Logger // nil: no logs
	// AfterBarrier (tests) runs when raft's Barrier returned, before its
	// term is checked.
	AfterBarrier func()
}

// Duties are what runs only on the leader (Run) and the writes only the
// leader makes (ApplyRead, Adopt).
type Duties struct {
	o   Options
	log *zap.Logger
	m   *metrics

	lastBadPolicy atomic.Pointer[string]
	// levelWaiting is what the level gate waits for (nil: nothing).
	levelWaiting atomic.Pointer[string]
	// readSource is the source of the reads this leader accepted, and
	// the term it accepted them in (nil: none yet): what the mirror holds
	// came from it, so the level gate records it once
	// state.LevelRecorded is in force (see recordReadSource).
	readSource atomic.Pointer[termSource]
}

// New returns the duties of a node; they run only while Run runs.
func New(o Options) *Duties {
	o.ApplyTimeout = cmp.Or(o.ApplyTimeout, 5*time.Second)
	if o.BarrierDone == nil {
		o.BarrierDone = func(uint64) {}
	}
	return &Duties{o: o, log: cmp.Or(o.Logger, zap.NewNop()), m: newMetrics()}
}

func (d *Duties) now() time.Time {
	if d.o.Now != nil {
		return d.o.Now()
	}
	return time.Now()
}

func (d *Duties) leading() bool { return d.o.Raft.State() == raft.Leader }

// Waiting reports whether, as leader, a feature level waits (a rolling
// upgrade in progress) or a replica runs a release below the level in
// force.
func (d *Duties) Waiting() bool { return d.leading() && d.levelWaiting.Load() != nil }

// Voters is the number of voters in r's latest configuration (0 when it
// cannot be read).
func Voters(r interface {
	GetConfiguration() raft.ConfigurationFuture
}) int {
	f := r.GetConfiguration()
	if f.Error() != nil {
		return 0
	}
	c := 0
	for _, s := range f.Configuration().Servers {
		if s.Suffrage == raft.Voter {
			c++
		}
	}
	return c
}

// metrics are the counters and histogram the duties update.
type metrics struct {
	applyDuration prometheus.Histogram
	kvFailovers   prometheus.Counter
	dutyFailures  prometheus.Counter
	haproxyWrites prometheus.Counter
}

func newMetrics() *metrics {
	return &metrics{
		kvFailovers: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "hastate_raft_kv_failovers_total", Help: "Per replica: times this replica, as leader, handed leadership to a follower because it could not read Consul."}),
		dutyFailures: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "hastate_leader_duty_failures_total", Help: "Per replica: times this replica, as leader, could not run its duty (building the Consul watch) and handed leadership over or retried."}),
		haproxyWrites: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "hastate_haproxies_writes_total", Help: "Leader only: haproxies entries written to raft (the record of which HAProxy nodes exist). At most one every 5s; in a steady fleet about one every 30s (each source's last poll is recorded to within 30s)."}),
		applyDuration: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "hastate_raft_apply_duration_seconds", Help: "Leader only (observed where the entry was written): time from raft Apply to the entry being committed by a quorum and applied on the leader: the raft commit latency.",
			Buckets: prometheus.ExponentialBuckets(0.0005, 2, 14)}),
	}
}

// Collectors are the duties' metrics, registered with the node's.
func (d *Duties) Collectors() []prometheus.Collector {
	return []prometheus.Collector{d.m.applyDuration, d.m.kvFailovers, d.m.dutyFailures, d.m.haproxyWrites}
}
