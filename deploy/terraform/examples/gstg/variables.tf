variable "environment" {
  type        = string
  description = "Environment name used in resource names and labels."
  default     = "gstg"
}

variable "project" {
  type        = string
  description = "GCP project of the environment's VPC."
}

variable "region" {
  type        = string
  description = "GCP region of the environment's ops GKE cluster."
}

variable "network" {
  type        = string
  description = "The environment's VPC network."
}

variable "subnetwork" {
  type        = string
  description = "Subnetwork of the ops GKE cluster, for the internal address."
}

variable "dns_managed_zone" {
  type        = string
  description = "The environment's private Cloud DNS zone."
}

variable "dns_domain" {
  type        = string
  description = "The zone's domain, ending with a dot (the record is hastate.<dns_domain>)."
}

variable "network_project" {
  type        = string
  description = "Shared VPC host project of the network, null when the VPC is the project's own."
  default     = null
}

variable "haproxy_cidrs" {
  type        = list(string)
  description = "CIDRs of the environment's HAProxy VMs (also the chart's haproxyCIDRs)."
}

variable "health_check_port" {
  type        = number
  description = "The chart's agentService.healthCheckNodePort (pinned)."
}

variable "gke_node_tags" {
  type        = list(string)
  description = "Network tags of the ops cluster's nodes."
}

variable "kv_prefix" {
  type        = string
  description = "Consul KV prefix (gitlab-haproxy-agent/ keeps the existing runbook's keys)."
  default     = "hastate/"
}

variable "dns_project" {
  type        = string
  description = "Project of the Cloud DNS zone (often the Shared VPC host project), null when it is project."
  default     = null
}

variable "gke_node_ranges" {
  type        = list(string)
  description = "CIDRs of the ops GKE cluster's node subnetwork (the firewall rules' destinations besides the address)."
}
