//go:build !hastate_pprof

package server

import "net/http"

// registerDebug serves nothing in a release build (see debug_pprof.go).
func registerDebug(*http.ServeMux) {}
