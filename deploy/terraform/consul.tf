# The policies' rules live in policies/*.hcl.tftpl: Consul's own rule
# language, rendered here with the prefix. The e2e tests render the same
# files for a real Consul with ACLs on and default deny (internal/testenv,
# ShippedPolicy), and deploy/test checks that this file uses them, so a
# rule the code needs and the policy lacks fails `make test`.

# hastate only reads KV: read on the prefix, and the local agent's
# configuration for the datacenter name; nothing else.
resource "consul_acl_policy" "hastate" {
  name        = "${var.name}-read"
  description = "hastate replicas: read ${var.kv_prefix} (desired state, meta and config) and the agent's datacenter"
  rules       = templatefile("${path.module}/policies/read.hcl.tftpl", { kv_prefix = var.kv_prefix })
}

# A local token: valid only in the datacenter that made it (the Consul the
# provider talks to, the one the replicas read), never replicated to other
# datacenters. hastate reads its own datacenter's Consul only, so a leaked
# read token reads nothing elsewhere.
resource "consul_acl_token" "hastate" {
  description = "hastate replicas (${var.name})"
  policies    = [consul_acl_policy.hastate.name]
  local       = true
}

# Operators, ChatOps and pipelines write the desired state, its meta keys
# and the config keys (ramp policy, migration marker); they read the whole
# prefix, which every write is decided from.
resource "consul_acl_policy" "writer" {
  name        = "${var.name}-write"
  description = "hastate writers: read ${var.kv_prefix}; write its state/, meta/ and config/"
  rules       = templatefile("${path.module}/policies/writer.hcl.tftpl", { kv_prefix = var.kv_prefix })
}

resource "consul_acl_token" "writer" {
  count       = var.create_writer_token ? 1 : 0
  description = "hastate writer (${var.name}): pipelines and ChatOps"
  policies    = [consul_acl_policy.writer.name]
  local       = false
}
