# The GCP and Consul side of hastate. GKE builds the internal load balancer
# from the chart's agent Service; this module owns only what GKE does not:
# the reserved internal address, its DNS record, the firewall rules, and the
# Consul ACL policies and token. See docs/deploy.md.
terraform {
  required_version = ">= 1.5"
  required_providers {
    google = {
      source = "hashicorp/google"
      # One major version: a new major changes resources' arguments and
      # defaults (6.0 made labels on an address effective_labels); move to
      # the next one on purpose, with a plan reviewed.
      version = ">= 6.0, < 7.0"
    }
    consul = {
      source  = "hashicorp/consul"
      version = ">= 2.20, < 3.0" # one major version
    }
  }
}
