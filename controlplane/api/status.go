package api

import (
	"context"
	"net/http"
)

// StatusReport is the answer to GET /v1/status: what is configured next to
// what is happening.
type StatusReport struct {
	Endpoints []EndpointStatus `json:"endpoints"`
	Backends  []BackendStatus  `json:"backends"`
	Nodes     []NodeStatus     `json:"nodes"`
}

// EndpointStatus is one endpoint's policy and its backends' live rates.
type EndpointStatus struct {
	Name     string                  `json:"name"`
	Route    string                  `json:"route,omitempty"`
	Backends []EndpointBackendStatus `json:"backends"`
}

// EndpointBackendStatus is one backend of an endpoint: configured weight or
// shadow proportion next to its live request and error rates.
type EndpointBackendStatus struct {
	Backend     string  `json:"backend"`
	Weight      float64 `json:"weight"`
	Shadow      float64 `json:"shadow,omitempty"`
	RequestRate float64 `json:"request_rate"`
	ErrorRate   float64 `json:"error_rate"`
}

// BackendStatus is one backend's replicas and load.
type BackendStatus struct {
	Name        string  `json:"name"`
	Desired     int     `json:"desired"`
	Running     int     `json:"running"`
	Draining    int     `json:"draining"`
	Autoscaled  bool    `json:"autoscaled"`
	InFlight    float64 `json:"in_flight"`
	RequestRate float64 `json:"request_rate"`
	ErrorRate   float64 `json:"error_rate"`
}

// NodeStatus says whether a node's Envoy runs the latest config.
type NodeStatus struct {
	ID        string `json:"id"`
	Connected bool   `json:"connected"`
	InSync    bool   `json:"in_sync"`
	NACKs     int    `json:"nacks"`
	LastNACK  string `json:"last_nack,omitempty"`
}

// Status reads the controller's status report.
func (c *Client) Status(ctx context.Context) (StatusReport, error) {
	var out StatusReport
	return out, c.do(ctx, http.MethodGet, "/v1/status", nil, &out)
}
