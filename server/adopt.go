package server

// This file holds what is left of POST /v1/consul/adopt: a refusal. Adopting
// a Consul changes what every HAProxy is told, so it takes a writer's
// authority over that Consul, proven to Consul: the adoption marker
// (<prefix>config/adopt) written with a writer token (hastate
// adopt-consul). The HTTP port serves reads only; the endpoint stays to
// tell a client of an older release what to do instead.

import (
	"net/http"

	"github.com/hastate/hastate/api"
)

// adoptGone is the message of POST /v1/consul/adopt.
const adoptGone = "nothing adopted: adopting a Consul is no longer an HTTP request to a replica (anyone who reaches the HTTP port could make it). " +
	"Write the adoption marker into the Consul to adopt, with a token that may write <prefix>config/ there (the writer policy): " +
	"CONSUL_HTTP_ADDR=<that Consul> CONSUL_HTTP_TOKEN=<writer token> hastate adopt-consul --cluster <its cluster ID> (docs/runbook.md, Adopting a restored or rebuilt Consul)"

// adoptGoneHandler answers every POST /v1/consul/adopt 410 Gone, adopting
// nothing, with what to do instead.
func adoptGoneHandler(w http.ResponseWriter, _ *http.Request) {
	writeJSON(w, http.StatusGone, api.AdoptError{Code: http.StatusGone, Message: adoptGone})
}
