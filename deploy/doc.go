// Package deploy holds servemesh's deployment assets, such as the Grafana
// dashboard in grafana/servemesh.json, and the tests that keep them in step
// with the code.
package deploy
