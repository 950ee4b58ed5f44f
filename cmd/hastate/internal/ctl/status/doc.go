// Package status is `hastate status`: the cluster's view through one
// replica, with what makes it partial or stale, and with --haproxy the
// column of haproxy.Verify. It composes the views, so it sits above them.
//
// It may import ctl, fleet and haproxy; nothing imports it but
// cmd/hastate.
package status
