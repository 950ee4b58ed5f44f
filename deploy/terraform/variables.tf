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

variable "haproxy_source_tags" {
  type        = list(string)
  description = "Network tags of the HAProxy VMs allowed to reach the agent port 9777 (with or instead of haproxy_source_ranges)."
  default     = []
}

variable "haproxy_source_ranges" {
  type        = list(string)
  description = "CIDRs of the HAProxy VMs allowed to reach the agent port 9777 (with or instead of haproxy_source_tags)."
  default     = []
}

variable "gke_node_tags" {
  type        = list(string)
  description = "Network tags of the GKE nodes that run hastate (the targets of the firewall rules)."
}

variable "health_check_ranges" {
  type        = list(string)
  description = "Source ranges of Google's load balancer health checks."
  default     = ["35.191.0.0/16", "130.211.0.0/22"]
}

variable "health_check_ports" {
  type        = list(string)
  description = "Node ports the health checks probe: kube-proxy's 10256 (externalTrafficPolicy Cluster) and the Service's health check node port range (Local)."
  default     = ["10256", "30000-32767"]
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
