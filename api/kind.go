package api

import (
	"encoding/json"
	"strconv"
	"strings"
)

// Kind is a server's effective state as its replica resolved it. Callers
// decide on it (and on ServerState.Weight), never on the text of Answer.
//
// It is not state.Kind because api is the wire contract and imports no
// hastate package (a client of /v1/state needs only api); server.rowFor
// converts, and server's TestKindsAgree holds the two lists equal.
type Kind string

// The kinds of effective state (state.Resolution.Kind names the same).
const (
	KindReady    Kind = "ready"    // ready 100% without a ramp: the default
	KindDrain    Kind = "drain"    // drain
	KindMaint    Kind = "maint"    // maint
	KindWeight   Kind = "weight"   // an explicit N%
	KindRamping  Kind = "ramping"  // ready, its weight set by an undrain ramp
	KindWithheld Kind = "withheld" // no answer: invalid key without a last valid value
)

// InRotation reports whether HAProxy sends the server new sessions: it is
// ready at a weight above 0% (HAProxy shows weight 0 as DRAIN). A withheld
// server counts by what HAProxy keeps (Keeps, the last answer it was told).
func (s ServerState) InRotation() bool {
	switch s.Kind {
	case KindReady, KindWeight, KindRamping:
		return s.Weight > 0
	case KindWithheld:
		k, w := s.KeptKind()
		return (k == KindReady || k == KindWeight) && w > 0
	}
	return false
}

// KeptKind is, for a withheld server, the kind and weight of what HAProxy
// keeps (Keeps): ready, weight, drain or maint; KindWithheld when no
// HAProxy polling it was ever told anything (it keeps its own state).
// For any other server it is the server's own Kind and Weight.
func (s ServerState) KeptKind() (Kind, int) {
	if s.Kind != KindWithheld {
		return s.Kind, s.Weight
	}
	if s.Keeps == "" {
		return KindWithheld, 0
	}
	return kindOfAnswer(ServerState{Answer: s.Keeps})
}

// AtZero reports whether the server is told ready at 0%: HAProxy shows it
// as DRAIN, and every command counts it as out of rotation.
func (s ServerState) AtZero() bool {
	return (s.Kind == KindWeight || s.Kind == KindRamping) && s.Weight == 0
}

// UnmarshalJSON decodes a row, and gives one from a replica that predates
// Kind and Weight (a rolling upgrade) the kind and weight its answer says.
func (s *ServerState) UnmarshalJSON(b []byte) error {
	type plain ServerState
	if err := json.Unmarshal(b, (*plain)(s)); err != nil {
		return err
	}
	if s.Kind == "" {
		s.Kind, s.Weight = kindOfAnswer(*s)
	}
	return nil
}

// kindOfAnswer reads the kind from the answer text: only for rows of a
// replica that does not send Kind.
func kindOfAnswer(s ServerState) (Kind, int) {
	w, err := strconv.Atoi(strings.TrimSuffix(strings.TrimPrefix(s.Answer, "ready "), "%"))
	switch {
	case s.Withheld:
		return KindWithheld, 0
	case s.Answer == "drain":
		return KindDrain, 0
	case s.Answer == "maint":
		return KindMaint, 0
	case err != nil:
		return KindWithheld, 0
	case s.Ramping != nil:
		return KindRamping, w
	case w != 100:
		return KindWeight, w
	}
	return KindReady, w
}
