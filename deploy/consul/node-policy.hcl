# What every servemesh node's token shares: least privilege.
#
# Each node's token also gets two identities of its own, which no other
# node's has (see README.md):
#   - the node identity of its Consul node: it registers services on that
#     Consul node only;
#   - the service identity servemesh-node-<id>: its agent's registration of
#     the node and the node's Connect certificate.
# So a node can take neither another node's identity nor the controller's.

# Reads the desired state; never writes it.
key_prefix "servemesh/" {
  policy = "read"
}

# Registers and heartbeats its replicas, instances of their backends'
# services, and gets those backends' Connect certificates (its inbound
# listener presents them). Backend services are all named
# servemesh-backend-<backend>: a node writes no other service, so no
# external service's instances and no servemesh identity. (Which node may
# serve which backend is the controller's placement; the controller serves
# an instance only where it is placed, registered by that node.)
service_prefix "servemesh-backend-" {
  policy = "write"
}
