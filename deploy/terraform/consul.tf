# hastate only reads KV: read on the prefix, nothing else.
resource "consul_acl_policy" "hastate" {
  name        = "${var.name}-read"
  description = "hastate replicas: read ${var.kv_prefix} (desired state and config)"
  rules       = <<-EOT
    key_prefix "${var.kv_prefix}" {
      policy = "read"
    }
  EOT
}

resource "consul_acl_token" "hastate" {
  description = "hastate replicas (${var.name})"
  policies    = [consul_acl_policy.hastate.name]
  local       = false
}

# Operators, ChatOps and pipelines write the desired state and the ramp
# policy; nothing else under the prefix.
resource "consul_acl_policy" "writer" {
  name        = "${var.name}-write"
  description = "hastate writers: write ${var.kv_prefix}state/ and ${var.kv_prefix}config/"
  rules       = <<-EOT
    key_prefix "${var.kv_prefix}state/" {
      policy = "write"
    }
    key_prefix "${var.kv_prefix}config/" {
      policy = "write"
    }
  EOT
}

resource "consul_acl_token" "writer" {
  count       = var.create_writer_token ? 1 : 0
  description = "hastate writer (${var.name}): pipelines and ChatOps"
  policies    = [consul_acl_policy.writer.name]
  local       = false
}
