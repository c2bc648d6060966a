# A servemesh agent's Consul policy: least privilege.
#
# It reads the desired state and never writes it; it registers its node
# (service servemesh-agent) and its replicas (services named after their
# backends) on the Consul agent it talks to, and nothing on another node.

key_prefix "servemesh/" {
  policy = "read"
}

# Registers and heartbeats services: its own and its replicas'. The same
# right gets the Connect certificates of its node (servemesh-node-<id>) and
# of the backends it runs replicas of, for mTLS.
service_prefix "" {
  policy = "write"
}

# Reads nodes (its registrations belong to the node of the Consul agent it
# talks to); writes none.
node_prefix "" {
  policy = "read"
}
