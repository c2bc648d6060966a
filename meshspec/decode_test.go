package meshspec

import (
	"strings"
	"testing"
)

func TestDecodeJSONIsStrict(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{`{"name": "a", "replica": []}`, `unknown field "/replica"`},
		{`{"NAME": "a"}`, `unknown field "/NAME"`},
		{`{"name": "a", "Config": {}}`, `unknown field "/Config"`},
		{`{"name": "a", "config": {"num_Replicas": 1}}`, `unknown field "/config/num_Replicas"`},
		{`{"name": "a", "name": "b"}`, `duplicate`},
		{`{"name": 7}`, `field "name" must be a string, not JSON number`},
		{`{"name": "a", "config": {"num_replicas": "2"}}`, `field "config.num_replicas" must be a whole number, not JSON string`},
		{`{"name": "a", "config": {"num_replicas": 2.5}}`, `config.num_replicas`},
		{`{"name": "a",`, `malformed JSON`},
		{`{"name": "a"} {"name": "b"}`, `malformed JSON`},
		{``, `malformed JSON`},
	} {
		var b Backend
		err := DecodeJSON([]byte(tc.in), &b)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("DecodeJSON(%s) = %v; want an error with %q", tc.in, err, tc.want)
		}
	}
	var b Backend
	if err := DecodeJSON([]byte(`{"name": "a", "config": {"num_replicas": 2, "autoscaling": {"min_replicas": 1, "max_replicas": 2, "target_in_flight_requests": 1}}}`), &b); err != nil || b.Config.NumReplicas != 2 || b.Config.Autoscaling.MaxReplicas != 2 {
		t.Fatalf("a valid backend: %+v, %v", b, err)
	}
}
