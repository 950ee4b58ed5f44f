// Package deploytest holds the tests of what ships outside the binary: the
// Helm chart rendered with the Helm SDK and decoded into k8s.io/api types,
// the Terraform module parsed with hcl/v2, the generated chart copies of the
// dashboard and alert rules, and the container image run with podman.
//
// It is its own Go module so that the Helm SDK and the Kubernetes API types
// stay out of the service's go.mod.
package deploytest
