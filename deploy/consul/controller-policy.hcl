# The servemesh controller's Consul policy: least privilege.
#
# Replace NODE with the Consul node name of the agent the controller talks to
# (its leader-election check is registered there).

# The desired state, the leader lock and the pending records: the only keys
# it writes.
key_prefix "servemesh/" {
  policy = "write"
}

# Sessions for the leader lock, on its Consul node. Its TTL check belongs to
# its servemesh-controller instance (service write, below), not to the node.
session "NODE" {
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

# Its servemesh-controller instance (whose TTL check the leader lock is
# bound to) and its Connect certificate (xDS over TLS).
service "servemesh-controller" {
  policy = "write"
}
