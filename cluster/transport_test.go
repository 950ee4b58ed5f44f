package cluster

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/raft"
	"github.com/hastate/hastate/api"
	"github.com/hastate/hastate/cluster/raftport"
	"github.com/hastate/hastate/internal/testenv"
	"github.com/prometheus/client_golang/prometheus"
)

// The status is the named query "status"; a replica of an older version
// knows no such query (it answers null) but answers the kind byte
// raftport.KindStatus, and is asked that way: a rolling upgrade works both ways.
func TestStatusIsANamedQueryAndOlderReplicasAreAskedTheirWay(t *testing.T) {
	n := startLeader(t, Options{PeerQueries: map[string]func() any{"pollers": func() any { return []string{"p"} }}})
	addr := n.opts.BindAddr
	raw, err := n.stream.Query(addr, raftport.StatusQuery, 2*time.Second)
	var st api.PeerStatus
	if err != nil || json.Unmarshal(raw, &st) != nil || st.ID != "n1" || st.State != "leader" {
		t.Fatalf("the named query status: %s, %v; want n1's status as leader", raw, err)
	}
	// An older replica asks with the kind byte alone.
	c, err := net.DialTimeout("tcp", addr, 2*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	_ = c.SetDeadline(time.Now().Add(3 * time.Second))
	_, _ = c.Write([]byte{raftport.KindStatus})
	got, _ := io.ReadAll(c)
	c.Close()
	if !bytes.Contains(got, []byte(`"id":"n1"`)) {
		t.Errorf("raftport.KindStatus from an older replica answered %q, want n1's status", got)
	}
	if raw, err := n.stream.Query(addr, "no such query", 2*time.Second); err != nil || string(raw) != "null" {
		t.Errorf("an unknown query: %s, %v; want null", raw, err)
	}

	// A replica of an older version: "status" is no named query there.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	var asked []string
	done := make(chan struct{})
	go func() {
		defer close(done)
		for range 2 {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			r := bufio.NewReader(c)
			kind, _ := r.ReadByte()
			switch kind {
			case raftport.KindQuery:
				name, _ := r.ReadString('\n')
				asked = append(asked, "Q "+strings.TrimSpace(name))
				_, _ = io.WriteString(c, "null\n")
			case raftport.KindStatus:
				asked = append(asked, "S")
				_, _ = io.WriteString(c, `{"id":"old","state":"follower","state_index":7}`+"\n")
			}
			c.Close()
		}
	}()
	st, err = n.stream.QueryStatus(ln.Addr().String(), 2*time.Second)
	<-done
	if err != nil || st.ID != "old" || st.StateIndex != 7 {
		t.Fatalf("status of an older replica: %+v, %v; want its answer to raftport.KindStatus", st, err)
	}
	if fmt.Sprint(asked) != "[Q status S]" {
		t.Errorf("asked the older replica %v, want the named query, then raftport.KindStatus", asked)
	}
}

func TestAStatusPeerQueryIsRefused(t *testing.T) {
	addr := fmt.Sprintf("127.0.0.1:%d", testenv.FreePort(t))
	_, err := New(Options{ID: "n1", BindAddr: addr, Advertise: addr, DataDir: t.TempDir(), Registerer: prometheus.NewRegistry(),
		PeerQueries: map[string]func() any{raftport.StatusQuery: func() any { return nil }}})
	if err == nil || !strings.Contains(err.Error(), "status query") {
		t.Fatalf("New with a peer query named status: %v, want it refused", err)
	}
}

// The node's raft transport refuses pipelined replication (see
// noPipelining: raft's pipeline can deadlock replication and Shutdown).
func TestRaftTransportDoesNotPipeline(t *testing.T) {
	n := startLeader(t, Options{})
	if _, err := n.transport.AppendEntriesPipeline("n2", raft.ServerAddress(n.opts.BindAddr)); !errors.Is(err, raft.ErrPipelineReplicationNotSupported) {
		t.Fatalf("AppendEntriesPipeline: %v, want raft.ErrPipelineReplicationNotSupported", err)
	}
}
