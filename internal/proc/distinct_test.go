package proc

import (
	"strings"
	"testing"
)

func TestCheckDistinct(t *testing.T) {
	for name, c := range map[string]struct {
		ls   []Listener
		want string
	}{
		"distinct":             {[]Listener{{"--public", "127.0.0.2:8080"}, {"--mesh", "127.0.0.1:15001"}, {"--metrics-listen", "127.0.0.1:0"}}, ""},
		"port 0 twice":         {[]Listener{{"--mesh", "127.0.0.1:0"}, {"--metrics-listen", "127.0.0.1:0"}}, ""},
		"same port, other IPs": {[]Listener{{"--public", "127.0.0.2:8080"}, {"--inbound", "127.0.0.3:8080"}}, ""},
		"same address": {[]Listener{{"--public", "127.0.0.2:8080"}, {"--mesh", "127.0.0.1:15001"}, {"--metrics-listen", "127.0.0.1:15001"}},
			"--mesh 127.0.0.1:15001 and --metrics-listen 127.0.0.1:15001 are the same address: give each listener its own port"},
		"every IP":     {[]Listener{{"--public", "0.0.0.0:8080"}, {"--inbound", "10.0.0.7:8080"}}, "--public 0.0.0.0:8080 and --inbound 10.0.0.7:8080"},
		"every IP, v6": {[]Listener{{"--public", "[::]:8080"}, {"--inbound", "10.0.0.7:8080"}}, "same address"},
		"no host":      {[]Listener{{"--public", ":8080"}, {"--inbound", "10.0.0.7:8080"}}, "same address"},
	} {
		t.Run(name, func(t *testing.T) {
			err := CheckDistinct(c.ls)
			if c.want == "" {
				if err != nil {
					t.Fatal(err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("err = %v, want %q", err, c.want)
			}
		})
	}
}
