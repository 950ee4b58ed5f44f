# The internal address GKE's load balancer takes (the chart's
# agentService.loadBalancerIP).
resource "google_compute_address" "agent" {
  project      = var.project
  region       = var.region
  name         = "${var.name}-agent"
  description  = "hastate agent-check internal load balancer (port 9777)"
  address_type = "INTERNAL"
  subnetwork   = var.subnetwork
  address      = var.address
  labels       = var.labels
}

resource "google_dns_record_set" "agent" {
  project      = var.project
  managed_zone = var.dns_managed_zone
  name         = var.dns_name
  type         = "A"
  ttl          = var.dns_ttl
  rrdatas      = [google_compute_address.agent.address]
}

# HAProxy nodes to the agent port on the GKE nodes (an internal passthrough
# load balancer keeps the client's address, so the rule names the HAProxy
# nodes, not the load balancer).
resource "google_compute_firewall" "agent_from_haproxy" {
  project     = var.project
  name        = "${var.name}-agent-from-haproxy"
  network     = var.network
  description = "HAProxy agent checks to hastate (tcp/9777)"
  direction   = "INGRESS"
  allow {
    protocol = "tcp"
    ports    = ["9777"]
  }
  source_tags   = length(var.haproxy_source_tags) > 0 ? var.haproxy_source_tags : null
  source_ranges = length(var.haproxy_source_ranges) > 0 ? var.haproxy_source_ranges : null
  target_tags   = var.gke_node_tags

  lifecycle {
    precondition {
      condition     = length(var.haproxy_source_tags) + length(var.haproxy_source_ranges) > 0
      error_message = "Set haproxy_source_tags or haproxy_source_ranges: the HAProxy nodes must reach port 9777."
    }
  }
}

# Google's health checkers to the nodes' health check ports.
resource "google_compute_firewall" "health_checks" {
  project     = var.project
  name        = "${var.name}-lb-health-checks"
  network     = var.network
  description = "Google load balancer health checks to the GKE nodes running hastate"
  direction   = "INGRESS"
  allow {
    protocol = "tcp"
    ports    = var.health_check_ports
  }
  source_ranges = var.health_check_ranges
  target_tags   = var.gke_node_tags
}
