//go:build hastate_pprof

package server

import (
	"net/http"
	"net/http/pprof"
)

// registerDebug serves net/http/pprof under /debug/pprof/ in a binary
// built with -tags hastate_pprof: a test-only build, for profiling the
// replicas of a benchmark (HASTATE_E2E_TAGS=hastate_pprof, see
// test/main_test.go). A release build has no such endpoint.
func registerDebug(mux *http.ServeMux) {
	mux.HandleFunc("GET /debug/pprof/", pprof.Index)
	mux.HandleFunc("GET /debug/pprof/profile", pprof.Profile)
	mux.HandleFunc("GET /debug/pprof/trace", pprof.Trace)
}
