# The servemesh controller's Consul policy: least privilege.
#
# Replace NODE with the Consul node name of the agent the controller talks to
# (its leader-election check is registered there).

# The desired state, the leader lock and the pending records: the only keys
# it writes.
key_prefix "servemesh/" {
  policy = "write"
}

# Sessions for the leader lock, on its Consul node; its own TTL check there.
session "NODE" {
  policy = "write"
}
node "NODE" {
  policy = "write"
}

# Reads the live nodes, replicas and their health: never writes them.
node_prefix "" {
  policy = "read"
}
service_prefix "" {
  policy = "read"
}
agent_prefix "" {
  policy = "read"
}

# Its Connect certificate (xDS over TLS), for the service servemesh-controller;
# not needed with --plaintext.
service "servemesh-controller" {
  policy = "write"
}
