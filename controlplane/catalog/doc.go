// Package catalog reads replicas from Consul's catalog and health view and
// turns the desired state into the data plane's view of it.
//
// Watcher keeps one blocking query per watched service (a backend's name, or
// an external backend's service), so a replica's health change reaches the
// data plane in one round trip. DataPlaneView merges those instances into a
// model whose backends all list plain replicas: a process backend gets its
// placed replicas that Consul knows (healthy when their check passes,
// draining when their placement drains), an external backend gets its
// service's passing instances.
package catalog
