package raftport

import (
	"io"
	"testing"
	"time"

	"github.com/hashicorp/raft"
)

// tcpTransport is raft's TCP transport on a free loopback port.
func tcpTransport(t *testing.T) *raft.NetworkTransport {
	t.Helper()
	tr, err := raft.NewTCPTransport("127.0.0.1:0", nil, 2, 5*time.Second, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	return tr
}

// TestStopHeartbeatsWaitsForTheOneInFlight: StopHeartbeats returns only
// once the heartbeat raft is handling has returned (the node closes the
// raft store after it), and no later heartbeat reaches raft.
func TestStopHeartbeatsWaitsForTheOneInFlight(t *testing.T) {
	recv := &PatientTransport{NetworkTransport: tcpTransport(t)}
	defer recv.Close()
	send := tcpTransport(t)
	defer send.Close()
	entered, release := make(chan struct{}, 2), make(chan struct{})
	recv.SetHeartbeatHandler(func(rpc raft.RPC) {
		entered <- struct{}{}
		<-release
		rpc.Respond(&raft.AppendEntriesResponse{Term: 3, Success: true}, nil)
	})
	heartbeat := func() chan error {
		done := make(chan error, 1)
		go func() {
			args := &raft.AppendEntriesRequest{RPCHeader: raft.RPCHeader{ID: []byte("leader"), Addr: []byte(send.LocalAddr())}, Term: 3}
			done <- send.AppendEntries("follower", recv.LocalAddr(), args, &raft.AppendEntriesResponse{})
		}()
		return done
	}
	first := heartbeat()
	select {
	case <-entered:
	case <-time.After(5 * time.Second):
		t.Fatal("the heartbeat never reached the handler")
	}
	stopped := make(chan struct{})
	go func() {
		recv.StopHeartbeats()
		close(stopped)
	}()
	select {
	case <-stopped:
		t.Fatal("StopHeartbeats returned while a heartbeat was being handled: the store could close under it")
	case <-time.After(100 * time.Millisecond):
	}
	close(release)
	select {
	case <-stopped:
	case <-time.After(5 * time.Second):
		t.Fatal("StopHeartbeats did not return once the heartbeat was handled")
	}
	if err := <-first; err != nil {
		t.Fatalf("the heartbeat in flight: %v, want its answer", err)
	}
	second := heartbeat()
	select {
	case <-entered:
		t.Fatal("a heartbeat after StopHeartbeats reached raft's handler")
	case <-time.After(200 * time.Millisecond):
	}
	recv.Close()
	select {
	case err := <-second:
		if err == nil {
			t.Fatal("a heartbeat after StopHeartbeats was answered")
		}
	case <-time.After(10 * time.Second):
		t.Fatal("a heartbeat after StopHeartbeats still waits after the transport closed")
	}
}
