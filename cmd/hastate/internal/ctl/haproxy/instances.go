package haproxy

import (
	"context"
	"fmt"
	"maps"
	"net"
	"slices"
	"strings"
)

// Address matching: HAProxy instances (Prometheus' instance label) against
// the HAProxy nodes that poll hastate, which the replicas know by address.

// hosts resolves each instance to the addresses of its host (the part
// before the port), to match instances with the HAProxy nodes that poll
// hastate (which know them by address).
func (p *Prometheus) hosts(ctx context.Context, instances []string) map[string][]string {
	out := map[string][]string{}
	for _, in := range instances {
		host := in
		if h, _, err := net.SplitHostPort(in); err == nil {
			host = h
		}
		if ip := net.ParseIP(host); ip != nil {
			out[in] = []string{ip.String()}
			continue
		}
		if addrs, err := p.o.LookupHost(ctx, host); err == nil {
			for _, a := range addrs {
				if ip := net.ParseIP(a); ip != nil {
					out[in] = append(out[in], ip.String())
				}
			}
		}
	}
	return out
}

// unscraped names the HAProxy nodes (by address) that poll a server of
// pollers but match no instance.
func (p *Prometheus) unscraped(ctx context.Context, instances []string, pollers map[string][]string) []string {
	addrs := map[string]bool{}
	for _, as := range p.hosts(ctx, instances) {
		for _, a := range as {
			addrs[a] = true
		}
	}
	var out []string
	for _, ip := range slices.Sorted(maps.Keys(pollers)) {
		if !addrs[ip] {
			out = append(out, fmt.Sprintf("HAProxy %s polls %s but no instance Prometheus scrapes is at that address", ip, strings.Join(pollers[ip], ", ")))
		}
	}
	return out
}
