package cluster

import (
	"fmt"
	"time"
)

// CheckLeaderlessGrace is the one check of Options.LeaderlessGrace (and
// of serve's --leaderless-grace, which cmd/hastate/internal/app runs before it starts
// anything): 0 means DefaultLeaderlessGrace, negative is refused.
func CheckLeaderlessGrace(d time.Duration) error {
	if d < 0 {
		return fmt.Errorf("--leaderless-grace %s is negative: set a positive duration, or leave it unset for %s", d, DefaultLeaderlessGrace)
	}
	return nil
}
