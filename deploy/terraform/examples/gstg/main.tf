# One environment's instance of the module. Every environment-specific value
# comes from variables (a gstg.tfvars kept with the environment's other
# settings), none is written here.
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

provider "google" {
  project = var.project
  region  = var.region
}

# CONSUL_HTTP_ADDR and CONSUL_HTTP_TOKEN (an operator token that may manage
# ACLs) come from the environment.
provider "consul" {}

module "hastate" {
  source = "../.."

  name                  = "hastate-${var.environment}"
  project               = var.project
  network_project       = var.network_project
  region                = var.region
  network               = var.network
  subnetwork            = var.subnetwork
  dns_project           = var.dns_project
  dns_managed_zone      = var.dns_managed_zone
  dns_name              = "hastate.${var.dns_domain}"
  haproxy_source_ranges = var.haproxy_cidrs
  gke_node_tags         = var.gke_node_tags
  gke_node_ranges       = var.gke_node_ranges
  health_check_port     = var.health_check_port
  kv_prefix             = var.kv_prefix
  labels                = { environment = var.environment, app = "hastate" }
}

output "address" {
  description = "Set as the chart's agentService.loadBalancerIP."
  value       = module.hastate.address
}

output "dns_name" {
  description = "HAProxy's agent-addr, if it resolves names."
  value       = module.hastate.dns_name
}

output "hastate_token_accessor_id" {
  description = "The read token for the chart's consul.existingSecret."
  value       = module.hastate.hastate_token_accessor_id
}

output "haproxy_cidrs" {
  description = "Set as the chart's haproxyCIDRs."
  value       = module.hastate.haproxy_cidrs
}

output "haproxy_server_line" {
  description = "The server line for haproxy.cfg."
  value       = module.hastate.haproxy_server_line
}
