# The GCP and Consul side of hastate. GKE builds the internal load balancer
# from the chart's agent Service; this module owns only what GKE does not:
# the reserved internal address, its DNS record, the firewall rules, and the
# Consul ACL policies and token. See docs/deploy.md.
terraform {
  required_version = ">= 1.5"
  required_providers {
    google = {
      source  = "hashicorp/google"
      version = ">= 5.0, < 8.0"
    }
    consul = {
      source  = "hashicorp/consul"
      version = ">= 2.20, < 3.0"
    }
  }
}
