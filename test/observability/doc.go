// Package observability checks hastate's alert rules and Grafana dashboard
// against a running hastate: every PromQL expression parses, the dashboard
// is well formed, and every metric they name is exported. It is its own
// module so that the Prometheus parser stays out of the service's go.mod.
package observability
