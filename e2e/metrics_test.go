//go:build e2e

package e2e

import (
	"net/http"
	"strings"
	"testing"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/servemesh/servemesh/internal/testutil"
)

// scrapeMetric reads addr's /metrics and sums the samples of metric whose
// labels include every given name/value pair (labels alternate names and
// values). found is false when no sample matched: a metric that is not
// there is never read as 0.
func scrapeMetric(t *testing.T, addr, metric string, labels ...string) (sum float64, found bool) {
	t.Helper()
	status, _, body := testutil.Get(t, "http://"+addr+"/metrics")
	if status != http.StatusOK {
		t.Fatalf("%s/metrics: status %d: %s", addr, status, body)
	}
	parser := expfmt.NewTextParser(model.UTF8Validation)
	families, err := parser.TextToMetricFamilies(strings.NewReader(body))
	if err != nil {
		t.Fatalf("%s/metrics: %v", addr, err)
	}
	family := families[metric]
	if family == nil {
		return 0, false
	}
samples:
	for _, m := range family.GetMetric() {
		have := map[string]string{}
		for _, l := range m.GetLabel() {
			have[l.GetName()] = l.GetValue()
		}
		for i := 0; i+1 < len(labels); i += 2 {
			if have[labels[i]] != labels[i+1] {
				continue samples
			}
		}
		found = true
		switch {
		case m.GetCounter() != nil:
			sum += m.GetCounter().GetValue()
		case m.GetGauge() != nil:
			sum += m.GetGauge().GetValue()
		case m.GetUntyped() != nil:
			sum += m.GetUntyped().GetValue()
		case m.GetHistogram() != nil: // its observations
			sum += float64(m.GetHistogram().GetSampleCount())
		}
	}
	return sum, found
}

// metricValue is scrapeMetric for a metric that must be there: a missing
// one fails the test (it was renamed, or never exported).
func metricValue(t *testing.T, addr, metric string, labels ...string) float64 {
	t.Helper()
	v, found := scrapeMetric(t, addr, metric, labels...)
	if !found {
		t.Fatalf("%s/metrics has no %s%v; a check on it cannot pass by its absence", addr, metric, labels)
	}
	return v
}
