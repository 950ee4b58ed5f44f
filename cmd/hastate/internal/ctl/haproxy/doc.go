// Package haproxy is what HAProxy itself reports, read from the Prometheus
// that scrapes its exporter: the series and queries (Prometheus, Read),
// whether the selected servers are idle (WaitIdle: wait --idle and maint
// --drain-first) and whether each HAProxy agrees with what hastate told
// it (Verify).
//
// It may import ctl and fleet (the replicas' view it compares against);
// nothing above it.
package haproxy
