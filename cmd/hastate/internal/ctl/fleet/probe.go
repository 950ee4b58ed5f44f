package fleet

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"

	"github.com/hastate/hastate/cmd/hastate/internal/ctl"
	"github.com/hastate/hastate/state"
)

// DefaultAgentAddr is where Probe connects without --addr.
const DefaultAgentAddr = "127.0.0.1:9777"

// maxAnswer bounds the answer Probe reads; a real one is about 12 bytes.
const maxAnswer = 256

// ErrNoAnswer: the agent closed the connection without a line (an empty
// reply, HAProxy's L7RSP): HAProxy keeps the server's state.
var ErrNoAnswer = errors.New("no answer")

// Probe performs one agent check as HAProxy does: connect to the agent port
// at addr, send "backend/server\n" (then state.ProbeMarker: a manual probe is
// never counted as an HAProxy), read one LF-terminated line. It returns
// the line without its LF. No answer (the replica withholds it, or the
// request was refused), a closed or refused connection and an expired ctx
// are errors that say so.
func Probe(ctx context.Context, addr string, t ctl.Selector) (string, error) {
	const advice = "check --addr (the agent port, 9777, or the load balancer in front of it)"
	var d net.Dialer
	conn, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return "", ctl.CallError(ctx, "agent", addr, err, advice)
	}
	defer conn.Close()
	stop := context.AfterFunc(ctx, func() { _ = conn.Close() })
	defer stop()
	// The marker follows in the same write, so that the replica reads it
	// with the request and does not count this probe as an HAProxy.
	if _, err := io.WriteString(conn, t.String()+"\n"+state.ProbeMarker); err != nil {
		return "", ctl.CallError(ctx, "agent", addr, err, advice)
	}
	line, err := bufio.NewReaderSize(io.LimitReader(conn, maxAnswer), maxAnswer).ReadString('\n')
	switch {
	case err == nil:
		return strings.TrimSuffix(line, "\n"), nil
	case ctx.Err() != nil:
		return "", ctl.CallError(ctx, "agent", addr, err, advice)
	case errors.Is(err, io.EOF) && line == "":
		return "", ctl.Explain(fmt.Sprintf("agent at %s closed the connection without an answer for %s: HAProxy keeps its current state; "+
			"`hastate status %s` shows whether the key is invalid (then its answer is withheld)", addr, t, t), ErrNoAnswer)
	case errors.Is(err, io.EOF):
		return "", fmt.Errorf("agent at %s answered %q for %s without a line feed (HAProxy ignores such an answer): %s", addr, line, t, advice)
	default:
		return "", ctl.CallError(ctx, "agent", addr, err, advice)
	}
}
