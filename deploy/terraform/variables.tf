variable "name" {
  type        = string
  description = "Prefix of every resource name (address, firewall rules, Consul policies), e.g. hastate-gstg."
  default     = "hastate"
  validation {
    condition     = can(regex("^[a-z]([-a-z0-9]{0,40}[a-z0-9])?$", var.name))
    error_message = "name must be a lower-case GCP resource name prefix of at most 42 characters."
  }
}

variable "project" {
  type        = string
  description = "GCP project of the VPC where the GKE cluster and the HAProxy nodes live."
}

variable "network_project" {
  type        = string
  description = "Shared VPC: the host project that owns network, subnetwork and the firewall rules, when it is not project (the service project, where the address is reserved). null: project."
  default     = null
  validation {
    condition     = var.network_project == null || can(regex("^[a-z][-a-z0-9]{4,28}[a-z0-9]$", coalesce(var.network_project, "x")))
    error_message = "network_project must be a GCP project ID (6-30 lower-case letters, digits and hyphens), or null."
  }
}

variable "dns_project" {
  type        = string
  description = "Project of the Cloud DNS managed zone (often the Shared VPC host project). null: project."
  default     = null
}

variable "region" {
  type        = string
  description = "GCP region of the GKE cluster (the internal address is regional)."
}

variable "network" {
  type        = string
  description = "VPC network (name or self link) the firewall rules apply to."
}

variable "subnetwork" {
  type        = string
  description = "Subnetwork (name or self link) to reserve the internal address in; the chart's agentService.subnet must name the same one."
}

variable "address" {
  type        = string
  description = "A specific internal IP to reserve; null lets GCP pick a free one in the subnetwork."
  default     = null
  validation {
    condition     = var.address == null || (can(regex("^[0-9]{1,3}(\\.[0-9]{1,3}){3}$", coalesce(var.address, "x"))) && can(cidrhost("${coalesce(var.address, "x")}/32", 0)))
    error_message = "address must be an IPv4 address such as 10.1.2.3 (no prefix length), or null."
  }
}

variable "dns_managed_zone" {
  type        = string
  description = "Name of the private Cloud DNS managed zone that gets the record."
}

variable "dns_name" {
  type        = string
  description = "Fully qualified name of the record, ending with a dot, e.g. hastate.gstg.internal. (HAProxy's agent-addr may use it)."
  validation {
    condition     = endswith(var.dns_name, ".")
    error_message = "dns_name must be fully qualified and end with a dot."
  }
}

variable "dns_ttl" {
  type        = number
  description = "TTL in seconds of the DNS record."
  default     = 300
}

variable "haproxy_source_ranges" {
  type        = list(string)
  description = "CIDRs of the HAProxy VMs allowed to reach the agent port 9777: the same list as the chart's haproxyCIDRs (output haproxy_cidrs), which GKE turns into the load balancer's own firewall rule."
  validation {
    condition     = length(var.haproxy_source_ranges) > 0 && alltrue([for c in var.haproxy_source_ranges : can(cidrhost(c, 0)) && strcontains(c, "/")])
    error_message = "haproxy_source_ranges must list at least one CIDR such as 10.20.0.0/16: the HAProxy nodes must reach port 9777, and no one else."
  }
}

variable "gke_node_tags" {
  type        = list(string)
  description = "Network tags of the GKE nodes that run hastate (the targets of the firewall rules)."
  validation {
    condition     = length(var.gke_node_tags) > 0 && alltrue([for t in var.gke_node_tags : can(regex("^[a-z]([-a-z0-9]{0,61}[a-z0-9])?$", t))])
    error_message = "gke_node_tags must list the GKE nodes' network tags (at least one; lower-case, as GCP tags are): without one a rule would target every VM of the network."
  }
}

variable "health_check_ranges" {
  type        = list(string)
  description = "Source ranges of Google's load balancer health checks."
  default     = ["35.191.0.0/16", "130.211.0.0/22"]
  validation {
    condition     = length(var.health_check_ranges) > 0 && alltrue([for c in var.health_check_ranges : can(cidrhost(c, 0)) && strcontains(c, "/")])
    error_message = "health_check_ranges must be CIDRs."
  }
}

variable "gke_node_ranges" {
  type        = list(string)
  description = "CIDRs of the GKE nodes' subnetwork (primary range): with the reserved address, the firewall rules' destination_ranges."
  validation {
    condition     = length(var.gke_node_ranges) > 0 && alltrue([for c in var.gke_node_ranges : can(cidrhost(c, 0)) && strcontains(c, "/")])
    error_message = "gke_node_ranges must be one or more CIDRs, e.g. 10.128.0.0/20."
  }
}

variable "firewall_logging" {
  type        = bool
  description = "Firewall Rules Logging on both rules (connections allowed, without metadata): who reached 9777 and the health check port, for an audit or a blocked HAProxy."
  default     = true
}

variable "health_check_port" {
  type        = number
  description = "The node port Google's health checks probe: the chart's agentService.healthCheckNodePort, pinned (externalTrafficPolicy Local), or 10256, kube-proxy's (Cluster)."
  validation {
    condition     = var.health_check_port == 10256 || (var.health_check_port >= 30000 && var.health_check_port <= 32767)
    error_message = "health_check_port must be the agent Service's pinned healthCheckNodePort (30000-32767) or 10256."
  }
}

variable "kv_prefix" {
  type        = string
  description = "Consul KV prefix hastate mirrors (the chart's consul.kvPrefix), ending with a slash."
  default     = "hastate/"
  validation {
    condition     = endswith(var.kv_prefix, "/")
    error_message = "kv_prefix must end with a slash, e.g. hastate/."
  }
}

variable "create_writer_token" {
  type        = bool
  description = "Also create a token with the writer policy (for a pipeline or ChatOps); operators usually get the policy through their own login."
  default     = false
}

variable "labels" {
  type        = map(string)
  description = "Labels put on the reserved address."
  default     = {}
}
