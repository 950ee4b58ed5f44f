package app

import (
	"bufio"
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/hastate/hastate/internal/testenv"
)

// The HTTP port holds no one forever: 300 idle TCP connections to it do not
// stop agent-check probes or other HTTP clients, the server closes them,
// and it closes an idle keep-alive connection after HTTPIdleTimeout. The
// poller table keeps PollersMax pairs and counts what it drops.
func TestHTTPPortHoldsNoOneForever(t *testing.T) {
	consul := testenv.StartConsul(t, testenv.ConsulOptions{})
	consul.Put(t, "hastate/state/web/a", "drain")
	const idle, read = 400 * time.Millisecond, time.Second
	a := startApp(t, consul.Addr(), "h", func(o *Options) {
		o.HTTPIdleTimeout, o.HTTPReadTimeout, o.PollersMax = idle, read, 2
	})
	testenv.Eventually(t, 10*time.Second, func() error { return testenv.Expect(ask(t, a, "web/a") == "drain\n", "replica never answered drain") })

	t.Run("idle connections", func(t *testing.T) {
		opened := time.Now()
		conns := make([]net.Conn, 300)
		for i := range conns {
			c, err := net.DialTimeout("tcp", a.HTTPAddr().String(), time.Second)
			if err != nil {
				t.Fatalf("idle connection %d: %v", i, err)
			}
			t.Cleanup(func() { _ = c.Close() })
			conns[i] = c
		}
		for range 20 {
			if got := ask(t, a, "web/a"); got != "drain\n" {
				t.Fatalf("probe with 300 idle HTTP connections open: %q, want drain", got)
			}
		}
		if code, _ := httpGet(t, a, "/-/liveness"); code != http.StatusOK {
			t.Fatalf("liveness with 300 idle HTTP connections open: %d", code)
		}
		// A connection that never sends a request is closed once the
		// request-header deadline (at most HTTPReadTimeout) passes.
		for i, c := range conns {
			_ = c.SetReadDeadline(opened.Add(read + 5*time.Second))
			if _, err := c.Read(make([]byte, 1)); !errors.Is(err, io.EOF) {
				t.Fatalf("idle connection %d: read %v, want EOF: the server did not close it", i, err)
			}
		}
		t.Logf("300 idle connections closed by the server %s after they opened (read timeout %s)", time.Since(opened).Round(time.Millisecond), read)
	})

	t.Run("idle keep-alive", func(t *testing.T) {
		c, err := net.DialTimeout("tcp", a.HTTPAddr().String(), time.Second)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		br := bufio.NewReader(c)
		for i := range 2 { // the connection is kept alive between requests
			if _, err := io.WriteString(c, "GET /-/liveness HTTP/1.1\r\nHost: hastate\r\n\r\n"); err != nil {
				t.Fatalf("request %d: %v", i, err)
			}
			_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
			resp, err := http.ReadResponse(br, nil)
			if err != nil {
				t.Fatalf("response %d: %v", i, err)
			}
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode != http.StatusOK || resp.Close {
				t.Fatalf("response %d: %s, close %v; want 200 on a kept-alive connection", i, resp.Status, resp.Close)
			}
		}
		idleSince := time.Now()
		_ = c.SetReadDeadline(idleSince.Add(idle + 5*time.Second))
		if _, err := br.ReadByte(); !errors.Is(err, io.EOF) {
			t.Fatalf("idle keep-alive connection: read %v, want EOF: the server did not close it", err)
		}
		if d := time.Since(idleSince); d < idle/2 {
			t.Errorf("keep-alive connection closed %s after its last answer, before the idle timeout %s", d, idle)
		}
		t.Logf("idle keep-alive connection closed %s after its last answer (idle timeout %s)", time.Since(idleSince).Round(time.Millisecond), idle)
	})

	t.Run("pollers max", func(t *testing.T) {
		ask(t, a, "web/b") // the second pair: kept
		ask(t, a, "web/c") // the third: dropped
		ask(t, a, "web/c")
		_, body := httpGet(t, a, "/v1/pollers")
		var v struct {
			Pollers []struct{ Server string }
			Total   int
		}
		if err := json.Unmarshal([]byte(body), &v); err != nil || v.Total != 2 || len(v.Pollers) != 2 || v.Pollers[1].Server != "b" {
			t.Errorf("/v1/pollers with PollersMax 2: %v %s; want web/a and web/b", err, body)
		}
		_, metrics := httpGet(t, a, "/-/metrics")
		for _, want := range []string{"\nhastate_pollers_dropped_total 2\n", "\nhastate_pollers_entries 2\n"} {
			if !strings.Contains(metrics, want) {
				t.Errorf("metrics lack %q", strings.TrimSpace(want))
			}
		}
	})
}

func TestHTTPOptionsDefaults(t *testing.T) {
	o := Options{NodeID: "x", DataDir: "d"}
	if err := o.validate(); err != nil {
		t.Fatal(err)
	}
	if o.HTTPReadTimeout != 10*time.Second || o.HTTPWriteTimeout != 30*time.Second || o.HTTPIdleTimeout != time.Minute || o.HTTPMaxHeaderBytes != 64<<10 {
		t.Errorf("zero HTTP options became read %s write %s idle %s headers %d; want 10s, 30s, 1m, 64 KiB",
			o.HTTPReadTimeout, o.HTTPWriteTimeout, o.HTTPIdleTimeout, o.HTTPMaxHeaderBytes)
	}
	for _, bad := range []Options{
		{NodeID: "x", DataDir: "d", HTTPIdleTimeout: -1},
		{NodeID: "x", DataDir: "d", HTTPMaxHeaderBytes: -1},
		{NodeID: "x", DataDir: "d", PollersMax: -1},
	} {
		if _, err := New(bad); err == nil || !strings.Contains(err.Error(), "negative") {
			t.Errorf("New(%+v) = %v, want an error saying the value is negative", bad, err)
		}
	}
}
