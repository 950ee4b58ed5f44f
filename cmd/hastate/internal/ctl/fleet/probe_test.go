package fleet_test

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/hastate/hastate/cmd/hastate/internal/ctl"
	"github.com/hastate/hastate/cmd/hastate/internal/ctl/fleet"
	"github.com/hastate/hastate/internal/testenv"
)

// fakeAgent serves one agent-protocol exchange per connection on
// 127.0.0.1: it reads the request line and writes answer (if any), then
// closes. It returns the address.
func fakeAgent(t *testing.T, answer string) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			req, _ := bufio.NewReader(c).ReadString('\n')
			if req == "web/a\n" {
				fmt.Fprint(c, answer)
			}
			c.Close()
		}
	}()
	t.Cleanup(func() { ln.Close(); <-done })
	return ln.Addr().String()
}

func TestProbe(t *testing.T) {
	refused := fmt.Sprintf("127.0.0.1:%d", testenv.FreePort(t))
	for _, tt := range []struct {
		name, addr string
		want       string // the answer, or the error substring after "ERR:"
	}{
		{"answer", fakeAgent(t, "drain\n"), "drain"},
		{"withheld", fakeAgent(t, ""), "ERR:closed the connection without an answer for web/a"},
		{"no line feed", fakeAgent(t, "ready 100%"), "ERR:without a line feed"},
		{"refused", refused, "ERR:refused the connection"},
		{"hung", testenv.HungServer(t), "ERR:did not answer within 200ms"},
	} {
		ctx, cancel := ctl.WithTimeout(context.Background(), 200*time.Millisecond)
		got, err := fleet.Probe(ctx, tt.addr, ctl.Selector{Backend: "web", Server: "a"})
		cancel()
		if want, isErr := strings.CutPrefix(tt.want, "ERR:"); isErr {
			if err == nil || !strings.Contains(err.Error(), want) || !strings.Contains(err.Error(), tt.addr) {
				t.Errorf("%s: Probe = %q, %v; want an error naming %s with %q", tt.name, got, err, tt.addr, want)
			}
			continue
		}
		if err != nil || got != tt.want {
			t.Errorf("%s: Probe = %q, %v; want %q", tt.name, got, err, tt.want)
		}
	}
}
