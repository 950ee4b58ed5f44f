package app

import (
	"encoding/json"
	"errors"
	"reflect"
	"strings"
	"testing"

	"github.com/hastate/hastate/cluster"
	"github.com/hastate/hastate/server"
)

// A peer's poll-summary is read by the summary's own reading when in its
// form, and is then what encoding/json reads; null is a release without
// the query; a malformed answer, which the raft port hands over as it
// came, is encoding/json's *json.SyntaxError (the raft port's before), an
// index beyond the tables the summary's error; the peer's failure is
// its error. Each error sends the asker to the peer's polls
// (restOfSummary), as before.
func TestDecodePeerSummary(t *testing.T) {
	sum := server.PollSummary{Sources: []string{"127.0.0.1"}, Answers: []string{"", "ready 100%"}, Next: "web/s1",
		Servers: []server.ServerPolls{{Backend: "web", Server: "s1", Polls: []server.SourcePoll{{Source: 0, Answer: 1, Count: 2, LastMs: 1}}}}}
	raw, err := json.Marshal(sum)
	if err != nil {
		t.Fatal(err)
	}
	var want *server.PollSummary
	if err := json.Unmarshal(raw, &want); err != nil {
		t.Fatal(err)
	}
	for _, line := range [][]byte{raw, []byte(strings.Replace(string(raw), `"sources"`, ` "sources"`, 1))} { // the fast form, another
		got, err := decodeAnswer[server.PollSummary](cluster.PeerAnswer{Raw: line})
		if err != nil || !reflect.DeepEqual(got, want) {
			t.Errorf("%s: %+v (%v), want %+v", line, got, err, want)
		}
	}
	if got, err := decodeAnswer[server.PollSummary](cluster.PeerAnswer{Raw: []byte("null")}); got != nil || err != nil {
		t.Errorf("null: %+v (%v), want nil without an error", got, err)
	}
	var syntax *json.SyntaxError
	if got, err := decodeAnswer[server.PollSummary](cluster.PeerAnswer{Raw: raw[:len(raw)/2]}); got != nil || !errors.As(err, &syntax) {
		t.Errorf("cut short: %+v (%v), want a *json.SyntaxError", got, err)
	}
	beyond := []byte(strings.Replace(string(raw), `"sources":["127.0.0.1"]`, `"sources":[]`, 1))
	if _, err := decodeAnswer[server.PollSummary](cluster.PeerAnswer{Raw: beyond}); err == nil || !strings.Contains(err.Error(), "poll summary: malformed polls") {
		t.Errorf("a source beyond the table: %v, want the summary's error", err)
	}
	failed := errors.New("connection reset")
	if got, err := decodeAnswer[server.PollSummary](cluster.PeerAnswer{Err: failed}); got != nil || err != failed {
		t.Errorf("a failed peer: %+v (%v), want its error", got, err)
	}
	// An answer that does not read itself goes by encoding/json.
	polls, err := decodeAnswer[server.PollsAnswer](cluster.PeerAnswer{Raw: []byte(`{"polls":[],"total":3}`)})
	if err != nil || polls == nil || polls.Total != 3 {
		t.Errorf("a PollsAnswer: %+v (%v)", polls, err)
	}
}
