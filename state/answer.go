package state

import "strconv"

// Answer is what one HAProxy server is told.
type Answer struct {
	// Withheld: say nothing and close, so HAProxy keeps what it has.
	Withheld bool
	Admin    Admin
	Weight   int // percent; meaningful when Admin is Ready
}

// readyFull is the answer for a server with no key: ready at full weight.
var readyFull = Answer{Admin: Ready, Weight: 100}

// String renders the answer as sent, without the line feed; "" when withheld.
func (a Answer) String() string {
	switch {
	case a.Withheld:
		return ""
	case a.Admin == Drain:
		return "drain"
	case a.Admin == Maint:
		return "maint"
	case a.Weight >= 0 && a.Weight <= MaxWeight:
		return textReady[a.Weight]
	default:
		return "ready " + strconv.Itoa(a.Weight) + "%"
	}
}

// lineRef returns a pointer to the shared, LF-terminated wire form (to a
// nil slice when withheld). A shard's map holds one per server, and a pointer takes a
// third of the room of the slice itself.
func (a Answer) lineRef() *[]byte {
	switch {
	case a.Withheld:
		return &lineWithheld
	case a.Admin == Drain:
		return &lineDrain
	case a.Admin == Maint:
		return &lineMaint
	case a.Weight >= 0 && a.Weight <= MaxWeight:
		return &lineReady[a.Weight]
	default:
		l := []byte(a.String() + "\n")
		return &l
	}
}

// Immutable wire lines, shared by every snapshot so that serving an answer
// never allocates.
var (
	lineWithheld []byte // nil: say nothing
	lineDrain    = []byte("drain\n")
	lineMaint    = []byte("maint\n")
	lineReady    = func() (l [MaxWeight + 1][]byte) {
		for i := range l {
			l[i] = []byte("ready " + strconv.Itoa(i) + "%\n")
		}
		return l
	}()
	// textReady is lineReady's text without its LF (Answer.String: a
	// status of 10,000 servers renders as many).
	textReady = func() (l [MaxWeight + 1]string) {
		for i := range l {
			l[i] = "ready " + strconv.Itoa(i) + "%"
		}
		return l
	}()
)

// ValueAnswer is the answer for a valid value.
func ValueAnswer(v Value) Answer {
	switch {
	case v.Admin != Ready:
		return Answer{Admin: v.Admin}
	case v.WeightSet:
		return Answer{Admin: Ready, Weight: v.Weight}
	default:
		return readyFull
	}
}

func entryAnswer(e *Entry) Answer {
	if !e.HasLast {
		return Answer{Withheld: true}
	}
	return ValueAnswer(e.Last())
}
