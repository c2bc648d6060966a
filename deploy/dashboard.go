package deploy

import (
	"encoding/json"
	"fmt"
	"os"
)

// Query is one query of a panel of the Grafana dashboard.
type Query struct {
	Panel, Expr string
}

// DashboardQueries reads the queries of every panel of the Grafana
// dashboard at path (grafana/servemesh.json).
func DashboardQueries(path string) ([]Query, error) {
	raw, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var dash struct {
		Panels []struct {
			Title   string `json:"title"`
			Targets []struct {
				Expr string `json:"expr"`
			} `json:"targets"`
		} `json:"panels"`
	}
	if err := json.Unmarshal(raw, &dash); err != nil {
		return nil, fmt.Errorf("the dashboard %s is not valid JSON: %w", path, err)
	}
	var out []Query
	for _, p := range dash.Panels {
		for _, q := range p.Targets {
			out = append(out, Query{Panel: p.Title, Expr: q.Expr})
		}
	}
	return out, nil
}
