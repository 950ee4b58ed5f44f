locals {
  # Shared VPC: the network, its subnetworks and its firewall rules live in
  # the host project (network_project); the address, in the service
  # project, is taken from the host's subnetwork, named by its self link.
  network_project = coalesce(var.network_project, var.project)
  shared_vpc      = var.network_project != null && var.network_project != var.project
  subnetwork      = local.shared_vpc && !strcontains(var.subnetwork, "/") ? "projects/${var.network_project}/regions/${var.region}/subnetworks/${var.subnetwork}" : var.subnetwork
  network         = local.shared_vpc && !strcontains(var.network, "/") ? "projects/${var.network_project}/global/networks/${var.network}" : var.network
  # Where the firewall rules let traffic go: the load balancer's address
  # and the GKE nodes' ranges, not every VM the target tags may ever match.
  agent_destinations = concat(["${google_compute_address.agent.address}/32"], var.gke_node_ranges)
}

# The internal address GKE's load balancer takes (the chart's
# agentService.loadBalancerIP).
resource "google_compute_address" "agent" {
  project      = var.project
  region       = var.region
  name         = "${var.name}-agent"
  description  = "hastate agent-check internal load balancer (port 9777)"
  address_type = "INTERNAL"
  subnetwork   = local.subnetwork
  address      = var.address
  labels       = var.labels

  lifecycle {
    # Every haproxy.cfg hard-codes this address (agent-addr): destroying
    # it, or replacing it through a changed argument, cuts every HAProxy
    # off from hastate. Remove this line on purpose, in a reviewed change.
    prevent_destroy = true
  }
}

resource "google_dns_record_set" "agent" {
  project      = coalesce(var.dns_project, var.project)
  managed_zone = var.dns_managed_zone
  name         = var.dns_name
  type         = "A"
  ttl          = var.dns_ttl
  rrdatas      = [google_compute_address.agent.address]
}

# HAProxy nodes to the agent port on the GKE nodes (an internal passthrough
# load balancer keeps the client's address, so the rule names the HAProxy
# nodes, not the load balancer).
#
# Which rule filters: VPC allow rules add up, so the widest one decides.
# GKE makes its own rule for the load balancer from the agent Service's
# loadBalancerSourceRanges, which the chart renders from its required
# haproxyCIDRs: give the chart the same CIDRs as haproxy_source_ranges
# (output haproxy_cidrs) and both rules allow exactly the HAProxy nodes.
# This rule is the one that exists where GKE may not create firewall
# rules, as in a Shared VPC without that permission (GKE then only emits
# an event asking for it); it lives in the network's project.
resource "google_compute_firewall" "agent_from_haproxy" {
  project       = local.network_project
  name          = "${var.name}-agent-from-haproxy"
  network       = local.network
  description   = "HAProxy agent checks to hastate (tcp/9777)"
  direction     = "INGRESS"
  source_ranges = var.haproxy_source_ranges
  # Packets of an internal passthrough load balancer keep its address as
  # their destination; the node ranges cover a node's own address.
  destination_ranges = local.agent_destinations
  target_tags        = var.gke_node_tags
  allow {
    protocol = "tcp"
    ports    = ["9777"]
  }
  dynamic "log_config" {
    for_each = var.firewall_logging ? [1] : []
    content {
      metadata = "EXCLUDE_ALL_METADATA"
    }
  }
}

# Google's health checkers to the one node port they probe: the agent
# Service's pinned healthCheckNodePort (externalTrafficPolicy Local), or
# kube-proxy's 10256 (Cluster). Not 30000-32767: that range holds every
# NodePort of the cluster.
resource "google_compute_firewall" "health_checks" {
  project            = local.network_project
  name               = "${var.name}-lb-health-checks"
  network            = local.network
  description        = "Google load balancer health checks to the GKE nodes running hastate"
  direction          = "INGRESS"
  source_ranges      = var.health_check_ranges
  destination_ranges = local.agent_destinations
  target_tags        = var.gke_node_tags
  allow {
    protocol = "tcp"
    ports    = [tostring(var.health_check_port)]
  }
  dynamic "log_config" {
    for_each = var.firewall_logging ? [1] : []
    content {
      metadata = "EXCLUDE_ALL_METADATA"
    }
  }
}
