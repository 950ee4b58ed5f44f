package fleet

import (
	"context"
	"errors"
	"time"

	consul "github.com/hashicorp/consul/api"
	"github.com/hastate/hastate/cmd/hastate/internal/ctl"
	"github.com/hastate/hastate/kvsync"
)

// CheckToken proves, before a command decides anything from Consul, that
// its token may read prefix (kvsync.CheckRead: a direct read answers 403
// where it may not; Consul lists the prefix as empty for the anonymous
// token, and a command would plan from nothing). A refusal is a
// ctl.PermissionError (exit 5) naming the rule; a Consul that cannot be
// asked is ctl.ConsulError.
func CheckToken(ctx context.Context, c *consul.Client, addr, prefix, note string) error {
	err := kvsync.CheckRead(ctx, c, prefix, "")
	var te *kvsync.TokenError
	switch {
	case err == nil:
		return nil
	case errors.As(err, &te):
		return &ctl.PermissionError{Refused: te.Refused, Rule: ctl.ReadRule(te.Prefix), Consul: te.Problem(time.Time{}).Error, Note: note}
	}
	return ctl.ConsulError(ctx, addr, err, note)
}
