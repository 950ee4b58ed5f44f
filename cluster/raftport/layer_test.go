package raftport

import (
	"errors"
	"net"
	"syscall"
	"testing"
	"time"

	"github.com/hastate/hastate/internal/ratelog"
	"go.uber.org/zap"
)

// failingListener fails every Accept with err.
type failingListener struct {
	net.Listener
	err error
}

func (l failingListener) Accept() (net.Conn, error) { return nil, l.err }

// The raft port's accept loop follows internal/accept: a permanent Accept
// error ends it and is reported (the wiring restarts the replica), not
// retried forever.
func TestRaftAcceptFailureIsReported(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	s := &Layer{ln: failingListener{ln, &net.OpError{Op: "accept", Net: "tcp", Err: syscall.EPERM}}, log: zap.NewNop(),
		retries: ratelog.New(time.Second, nil), failed: make(chan error, 1), closed: make(chan struct{})}
	s.wg.Add(1)
	go s.acceptLoop()
	select {
	case err := <-s.Failed():
		if !errors.Is(err, syscall.EPERM) {
			t.Fatalf("Failed: %v, want EPERM", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("a permanent accept error was not reported")
	}
	s.wg.Wait()
}
