package kvsync

import (
	"strings"

	"github.com/hashicorp/consul/api"
)

// ClientConfig returns the Consul client configuration every Consul tool
// uses: api.DefaultConfig reads CONSUL_HTTP_ADDR, CONSUL_HTTP_TOKEN(_FILE),
// CONSUL_HTTP_SSL, CONSUL_CACERT, CONSUL_CLIENT_CERT/KEY and the rest. A
// non-empty addr (the --consul-addr flag) overrides the address: it may be
// "host:port" (scheme from the environment, http by default),
// "http://host:port" or "https://host:port"; other forms such as
// "unix:///path" are passed to api.NewClient as they are.
func ClientConfig(addr string) *api.Config {
	cfg := api.DefaultConfig()
	addr = strings.TrimSpace(addr)
	if addr == "" {
		return cfg
	}
	switch {
	case strings.HasPrefix(addr, "https://"):
		cfg.Scheme = "https"
		cfg.Address = strings.TrimSuffix(strings.TrimPrefix(addr, "https://"), "/")
	case strings.HasPrefix(addr, "http://"):
		cfg.Scheme = "http"
		cfg.Address = strings.TrimSuffix(strings.TrimPrefix(addr, "http://"), "/")
	default:
		cfg.Address = addr
	}
	return cfg
}
