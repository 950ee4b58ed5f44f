output "address" {
  description = "The reserved internal IP: the chart's agentService.loadBalancerIP and HAProxy's agent-addr."
  value       = google_compute_address.agent.address
}

output "dns_name" {
  description = "The DNS name of the address."
  value       = google_dns_record_set.agent.name
}

output "hastate_token_accessor_id" {
  description = "Accessor ID of hastate's read token (read the secret with `consul acl token read -id <accessor>` and put it in the chart's consul.existingSecret)."
  value       = consul_acl_token.hastate.accessor_id
}

output "writer_token_accessor_id" {
  description = "Accessor ID of the writer token, null unless create_writer_token."
  value       = one(consul_acl_token.writer[*].accessor_id)
}

output "writer_policy_name" {
  description = "The Consul policy to attach to operators' and ChatOps' roles."
  value       = consul_acl_policy.writer.name
}

output "haproxy_server_line" {
  description = "The haproxy.cfg server line to use, with <backend>, <server> and <addr>:<port> to fill in."
  value       = "server <server> <addr>:<port> check agent-check agent-addr ${google_compute_address.agent.address} agent-port 9777 agent-inter 2s agent-send \"<backend>/<server>\\n\""
}

output "haproxy_cidrs" {
  description = "The chart's haproxyCIDRs: the same sources as the firewall rule, for the loadBalancerSourceRanges GKE makes its own rule from."
  value       = var.haproxy_source_ranges
}
