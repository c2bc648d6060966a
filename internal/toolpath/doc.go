// Package toolpath finds the external programs servemesh runs (Envoy,
// Consul): an explicit path, else an environment variable, else the
// project's .tools/bin (what `make tools` installs) next to the running
// binary or in the working directory or a parent, else $PATH.
package toolpath
